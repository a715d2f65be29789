"""Evidence-acquisition transcripts built by hand, for the ACE-Cap loop tests."""

from mocojax import acecap_loop, roles


def transcript(c0, replies, answers, final):
    """A Composer conversation by hand: replies[t] answered by answers[t] while there are
    answers; a trailing reply is the READY; then the final prompt on ser(E) and the caption."""
    messages = roles.composer_messages(c0)
    for t, reply in enumerate(replies):
        messages.append(roles.composer_reply(reply))
        if t < len(answers):
            messages.append(roles.observation_message(answers[t]))
    questions = [acecap_loop.parse_action(r).question for r in replies[: len(answers)]]
    evidence = acecap_loop.serialise_evidence(c0, questions, answers)
    return messages + [roles.final_message(evidence), roles.composer_reply(final)]
