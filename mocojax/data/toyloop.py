"""Toy-world SFT records for ACE-Cap's evidence loop (issue 19; docs/acecap.md): the Instruct
role's answers and the Composer's transcripts, every target exact from the scene.

The loop (mocojax.acecap_loop): the Policy writes c_0; the Composer, text only, asks
`ASK: <question>` or says `READY`; the Instruct role answers each question from the image; the
Composer then writes the final caption from ser(E) = c_0 + the (question, answer) pairs. On the
toy world:

- **questions** ask after one shape: "Is there a star?" (`question_about`). The Composer cannot
  see the image; what it can know is which shapes c_0 names, so the teacher below asks after
  the shapes c_0 does not name, in a random order, up to the budget K;
- **answers** (`instruct_answer`) state every object of that shape as the world's captions do
  ("There is a large blue star at the top left.", parsed back exactly by `toyworld.parse_caption`
  and so by the Gold-MCQ's exact reader), or ABSENT_ANSWER when the scene has none. The absent
  answer names no shape on purpose: the toy parser reads "There is no star." as a star (it has
  no negation), so an answer naming the shape would score as an invented object;
- **the teacher transcript** (`teacher_episode`): the questions above, READY when every shape
  c_0 leaves out was asked within K (else the scheduler finalises at K: no stop span), then the
  final caption: c_0's objects and every object an answer stated, with c_0's background.

Records reuse the three SFT role slots by what they read (mocojax.data.records): Instruct
records sit in the "policy" slot (an image and a prompt, `records.conversation`'s "prompt"
form, the same message `roles.instruct_messages` builds), Composer records in the "judge" slot
(text only, a whole multi-turn conversation under "messages" whose assistant turns are all
targets), so per-role losses log them as `loss_policy` / `loss_judge`.
"""

import numpy as np

from mocojax import acecap_loop, roles
from mocojax.data import toyworld as tw

ABSENT_ANSWER = "It is not in the picture."
# The exact Instruct's reply to a question that asks after no single shape (`exact_answer`).
UNANSWERABLE = "The question names nothing."
# c_0: each object is kept with this probability (at least one), the background half the time:
# an initial caption that leaves something to ask about.
INITIAL_DROP = 0.5


def question_about(shape):
    """Returns the Composer's question about one shape."""
    return f"Is there a {shape}?"


def asked_shape(question):
    """Returns the shape a question asks after, or None when it names no shape or several."""
    shapes = {m.shape for m in tw.parse_caption(question)[0]}
    return shapes.pop() if len(shapes) == 1 else None


def instruct_answer(scene, question, rng):
    """Returns the exact answer to a question about `scene`: every object of the asked shape in
    the world's caption language (no background), ABSENT_ANSWER when there is none. A question
    that asks after no single shape raises ValueError naming it (the teacher only asks those)."""
    shape = asked_shape(question)
    if shape is None:
        raise ValueError(f"{question!r} asks after no single shape of {tw.SHAPES}")
    objects = [o for o in scene.objects if o.shape == shape]
    if not objects:
        return ABSENT_ANSWER
    return tw.write_caption([tw.Mention(*_attributes(o)) for o in objects], None, rng)


def exact_answer(scene, question, rng):
    """Returns `instruct_answer`, or UNANSWERABLE (names no shape: the reader learns nothing)
    for a question that asks after no single shape: the loop's exact Instruct never raises on
    what a Composer asks."""
    if asked_shape(question) is None:
        return UNANSWERABLE
    return instruct_answer(scene, question, rng)


def _attributes(obj):
    return obj.shape, obj.colour, obj.size, obj.position


def initial_caption(scene, rng):
    """Returns (c_0, the kept objects): a terse true caption as the Policy writes one."""
    keep = [o for o in scene.objects if rng.random() >= INITIAL_DROP]
    keep = keep or [scene.objects[int(rng.integers(len(scene.objects)))]]
    background = scene.background if rng.random() < 0.5 else None
    caption = tw.write_caption([tw.Mention(*_attributes(o)) for o in keep], background, rng)
    return caption, keep


def teacher_episode(scene, caption, kept, max_questions, rng):
    """Returns the teacher's episode from c_0 = caption (whose objects are `kept`): a dict of
    questions, answers, stopped (said READY) and the final caption."""
    mentions, background = tw.parse_caption(caption)
    named = {m.shape for m in mentions}
    unnamed = [tw.SHAPES[int(i)] for i in rng.permutation(len(tw.SHAPES))]
    unnamed = [s for s in unnamed if s not in named]
    questions = [question_about(s) for s in unnamed[:max_questions]]
    answers = [instruct_answer(scene, q, rng) for q in questions]
    asked = {asked_shape(q) for q in questions}
    found = [o for o in scene.objects if o.shape in asked]
    final = tw.write_caption([tw.Mention(*_attributes(o)) for o in kept + found], background, rng)
    return {
        "questions": questions,
        "answers": answers,
        "stopped": len(unnamed) <= max_questions,
        "final": final,
    }


def transcript(caption, episode):
    """Returns the Composer's conversation of an episode, as `acecap_loop.acquire_evidence`
    builds it: c_0, (ASK reply, answer)*, READY if it stopped, the final prompt and caption."""
    messages = roles.composer_messages(caption)
    for question, answer in zip(episode["questions"], episode["answers"]):
        messages += [
            roles.composer_reply(f"ASK: {question}"),
            roles.observation_message(answer),
        ]
    if episode["stopped"]:
        messages.append(roles.composer_reply("READY"))
    evidence = acecap_loop.serialise_evidence(caption, episode["questions"], episode["answers"])
    return messages + [roles.final_message(evidence), roles.composer_reply(episode["final"])]


def scene_records(scene, seed, mix=(1, 1), max_questions=3):
    """Returns the loop SFT records of one scene: mix = (Instruct, Composer) record counts.

    Instruct records ask after a shape of the scene half the time, another shape otherwise (so
    ABSENT_ANSWER is learned as often as a description); Composer records are teacher episodes
    from fresh initial captions. Deterministic in (seed, scene)."""
    rng = np.random.default_rng([seed, 21, *map(ord, scene.id)])
    num_instruct, num_composer = mix
    present = sorted({o.shape for o in scene.objects})
    absent = [s for s in tw.SHAPES if s not in present]
    records = []
    for k in range(num_instruct):
        pool = present if not absent or rng.random() < 0.5 else absent
        question = question_about(pool[int(rng.integers(len(pool)))])
        records.append(
            {
                "id": f"{scene.id}/instruct{k}",
                "role": "policy",
                "scene_id": scene.id,
                "scene": scene,
                "prompt": f"{roles.INSTRUCT_INSTRUCTION}\nQuestion: {question}",
                "target": instruct_answer(scene, question, rng),
            }
        )
    for k in range(num_composer):
        caption, kept = initial_caption(scene, rng)
        episode = teacher_episode(scene, caption, kept, max_questions, rng)
        records.append(
            {
                "id": f"{scene.id}/composer{k}",
                "role": "judge",
                "scene_id": scene.id,
                "messages": transcript(caption, episode),
            }
        )
    return records


def sft_records(seed, num_scenes, mix=(1, 1), start=0, max_questions=3):
    """Returns the loop SFT records of scenes start..start+num_scenes-1, grouped by scene."""
    return [
        record
        for scene in tw.make_scenes(seed, num_scenes, start)
        for record in scene_records(scene, seed, mix, max_questions)
    ]
