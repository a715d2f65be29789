"""ACE-Cap's Gold-MCQ and G2P reward (seed 002, METHOD.md) as pure functions.

A Gold-MCQ item is a question about the image with lettered options A.. (the gold answer is one
of them) and a last option E = "Not Given" that is never the gold answer. A frozen text-only
judge reads a candidate text and picks one letter per item; the item scores
    s_j = +1 (the gold letter), -0.5 (E, the text does not say), -1 (another letter),
and R_G(y) = mean_j s_j in [-1, 1]: supported facts score above omitted ones, omitted above
contradicted ones. A judge's answer that names no offered letter is unreadable and scores -1,
like a wrong answer (as in caption-only VQA), and is counted.

On the toy world the questions and gold answers are caption-only VQA's (`eval.vqa.scene_questions`):
count, colour at a cell, size, place, presence. The distractors come from the world's own answer
domain of the question's kind, up to three of them, so an item offers A-D where the world has
four or more values (count, colour, place) and A-B where it has two (size: small / large;
presence: yes / no). Padding a two-valued question with values the world never uses would add
options a judge can rule out without reading the text. The options are shuffled with a seed of
the scene id, so the gold letter is spread over A-D and the same scene always gets the same items.

The exact judge (`oracle_choice`) answers from the text's parse as caption-only VQA's oracle reader
does; a value the text states that is not among the options gets E (no offered option is
supported), so a contradiction costs -1 only when the stated value is one of the distractors.
"""

import re
from typing import NamedTuple

import numpy as np

from mocojax.data import toyworld as tw
from mocojax.eval import judges, vqa

LETTERS = "ABCD"
NOT_GIVEN_LETTER = "E"
NOT_GIVEN_TEXT = "Not Given"
# s_j: the gold letter, E, another letter or an unreadable answer.
SCORES = {"right": vqa.G2P["right"], "not_given": vqa.G2P["not_given"], "wrong": vqa.G2P["wrong"]}
# The world's answer domain per question kind (make_scene draws 1-4 objects).
ANSWER_DOMAINS = {
    "count": ("1", "2", "3", "4"),
    "colour": tuple(tw.COLOURS),
    "size": tw.SIZES,
    "place": tw.POSITIONS,
    "presence": ("yes", "no"),
}

MCQ_INSTRUCTION = (
    "Answer each question using only the text. One line per question: id | letter. If the text "
    f"does not say, answer {NOT_GIVEN_LETTER}."
)

# A bare choice: "B", "(b)", "B.", "B)", "Option B", "Answer: B".
_BARE = re.compile(r"(?:(?:option|answer|choice)\s*:?\s*)?\(?([a-e])\)?[.):]?", re.I)
# A letter with its option text after it: "B. red", "(B) red", "B) red", "B: red".
_WITH_TEXT = re.compile(r"(?:(?i:option|answer|choice)\s*:?\s*)?\(?([A-E])\)?[.):]?\s+(.+)")


class MCQItem(NamedTuple):
    """One Gold-MCQ item: the question, its options (A.. in order; E = Not Given is implicit),
    the gold letter (never E), the question kind and the VQA question dict it was built from."""

    question: str
    options: tuple
    answer: str
    kind: str
    source: dict


def toy_mcq(scene, seed=0):
    """Returns the Gold-MCQ items of a toy scene: list[MCQItem], one per `vqa.scene_questions` question."""
    rng = np.random.default_rng([11, seed, *map(ord, scene.id)])
    items = []
    for question in vqa.scene_questions(scene):
        domain = ANSWER_DOMAINS[question["kind"]]
        if question["answer"] not in domain:
            raise ValueError(
                f"scene {scene.id}: answer {question['answer']!r} to {question['question']!r} "
                f"is outside the world's {question['kind']} values {domain}"
            )
        others = [value for value in domain if value != question["answer"]]
        picked = rng.choice(len(others), size=min(len(LETTERS) - 1, len(others)), replace=False)
        options = [question["answer"]] + [others[int(k)] for k in picked]
        options = tuple(options[int(k)] for k in rng.permutation(len(options)))
        items.append(
            MCQItem(
                question["question"],
                options,
                LETTERS[options.index(question["answer"])],
                question["kind"],
                question,
            )
        )
    return items


# The kind of an item written from text (a teacher's Gold-MCQ of a real image): its options are
# matched by their text alone, not by a toy-world answer domain.
TEXT_KIND = "text"
MAX_OPTION_CHARS = 300
MAX_QUESTION_CHARS = 1000


def mcq_problems(question, options, answer):
    """Returns the problems (list of str; [] when none) of a Gold-MCQ item given as a question,
    2-4 option texts and the gold letter: E = Not Given is implicit and never the gold answer, so
    no option may say "not given" (or any phrase a judge's answer reads as Not Given)."""
    problems = []
    if not isinstance(question, str) or not question.strip():
        problems.append("empty question")
    elif len(question) > MAX_QUESTION_CHARS:
        problems.append(f"question longer than {MAX_QUESTION_CHARS} characters")
    if not isinstance(options, (list, tuple)) or not 2 <= len(options) <= len(LETTERS):
        return problems + [f"want 2-{len(LETTERS)} options, got {options!r:.80}"]
    texts = [o.strip() if isinstance(o, str) else "" for o in options]
    if not all(texts):
        problems.append("an empty option")
    elif any(len(t) > MAX_OPTION_CHARS for t in texts):
        problems.append(f"an option longer than {MAX_OPTION_CHARS} characters")
    elif len({" ".join(t.lower().split()) for t in texts}) < len(texts):
        problems.append("two options say the same")
    elif any(vqa.normalise_answer(t, "") == vqa.NOT_GIVEN for t in texts):
        problems.append(f"an option says Not Given, which only {NOT_GIVEN_LETTER} may")
    if not isinstance(answer, str) or answer.strip().upper() not in LETTERS[: len(options)]:
        problems.append(
            f"gold letter {answer!r} is not one of the options {LETTERS[: len(options)]}"
            + (f" ({NOT_GIVEN_LETTER} = Not Given is never gold)" if answer == "E" else "")
        )
    return problems


def text_item(question, options, answer):
    """Returns the MCQItem of a Gold-MCQ written from text (kind TEXT_KIND); raises ValueError
    naming the problems of a malformed one (`mcq_problems`)."""
    problems = mcq_problems(question, options, answer)
    if problems:
        raise ValueError("; ".join(problems))
    options = tuple(" ".join(o.split()) for o in options)
    return MCQItem(" ".join(question.split()), options, answer.strip().upper(), TEXT_KIND, {})


def item_dict(item):
    """Returns an item as the records' JSON holds it: {"question", "options", "answer"}."""
    return {"question": item.question, "options": list(item.options), "answer": item.answer}


def format_item(item):
    """Returns one item as the judge sees it: the question, then "A. .. B. .. E. Not Given"."""
    lettered = [f"{letter}. {text}" for letter, text in zip(LETTERS, item.options)]
    return " ".join([item.question, *lettered, f"{NOT_GIVEN_LETTER}. {NOT_GIVEN_TEXT}"])


def mcq_prompt(items, text):
    """Returns the text-only judge's prompt: instruction, numbered items, then the text LAST, so
    the N candidate texts of one image share the instruction + questions prefix."""
    numbered = "\n".join(f"{k} | {format_item(item)}" for k, item in enumerate(items, 1))
    return f"{MCQ_INSTRUCTION}\nQuestions:\n{numbered}\nText:\n{text}"


def _offered(item):
    return LETTERS[: len(item.options)] + NOT_GIVEN_LETTER


def parse_choice(raw, item):
    """Returns the letter a judge's answer picks for an item, or None when unreadable.

    Read in order: a bare letter ("B", "(b)", "Option B"); a capital letter followed by its own
    option text ("B. red"); a Not-Given phrase (E); the text of exactly one option ("red", or
    "big" for "large" on toy items), so "C. red" with red at B reads as B (a letter followed by
    another option's text is read by the text). A letter the item does not offer is unreadable.
    Never raises.
    """
    if not isinstance(raw, str):
        return None
    text = " ".join(raw.split()).strip()
    bare = _BARE.fullmatch(text)
    if bare:
        letter = bare.group(1).upper()
        return letter if letter in _offered(item) else None
    with_text = _WITH_TEXT.fullmatch(text)
    if with_text:
        letter, rest = with_text.group(1), with_text.group(2).strip(" .").lower()
        named = (
            NOT_GIVEN_TEXT.lower()
            if letter == NOT_GIVEN_LETTER
            else item.options[LETTERS.index(letter)].lower()
            if letter in _offered(item)
            else None
        )
        if named == rest:
            return letter
    if item.kind in ANSWER_DOMAINS:
        value = vqa.normalise_answer(text, item.kind)
    else:
        value = (
            vqa.NOT_GIVEN
            if vqa.normalise_answer(text, "") == vqa.NOT_GIVEN
            else text.strip(" .").lower()
        )
    if value == vqa.NOT_GIVEN:
        return NOT_GIVEN_LETTER
    matches = [letter for letter, option in zip(LETTERS, item.options) if option.lower() == value]
    return matches[0] if len(matches) == 1 else None


def parse_choices(text, items):
    """Returns (letters [L] with None where unreadable, number unreadable) from a judge's
    "id | answer" lines for items [L]; never raises."""
    answers = vqa.parse_answers(text, len(items))
    choices = [parse_choice(raw, item) for raw, item in zip(answers, items)]
    return choices, sum(choice is None for choice in choices)


def choice_scores(choices, answers):
    """Returns float64 [L]: s_j = +1 for the gold letter, -0.5 for E, -1 for another letter or
    None (unreadable); choices and gold answers [L]."""
    if len(choices) != len(answers):
        raise ValueError(f"{len(choices)} choices for {len(answers)} questions")
    return np.asarray(
        [
            SCORES["right"]
            if c == a
            else SCORES["not_given"]
            if c == NOT_GIVEN_LETTER
            else SCORES["wrong"]
            for c, a in zip(choices, answers)
        ],
        np.float64,
    )


def g2p_reward(choices, answers):
    """Returns R_G = mean_j s_j in [-1, 1] (a float) for one text's choices and the gold letters."""
    if not answers:
        raise ValueError("G2P needs at least one question")
    return float(choice_scores(choices, answers).mean())


def oracle_choice(text, item):
    """Returns the exact judge's letter for a toy item from a text: the option the text states,
    E when it does not say or states a value that is not offered."""
    mentions, _ = tw.parse_caption(text)
    value = judges.oracle_answer(mentions, item.source)
    return LETTERS[item.options.index(value)] if value in item.options else NOT_GIVEN_LETTER
