"""Caption-only VQA (Prism / CapRL): questions with exact answers about each image are answered
by a text-only reader from the caption alone, "Not Given" allowed.

On the toy world the questions come from the scene: how many objects; the colour of the shape
at a named cell; the size and the place of a named colour + shape; and presence of one object
that is there and one that is not. Answers are normalised to the world's canonical words
(big -> large, upper left -> top left, two -> 2). Scores: accuracy (right / asked) and the G2P
score, the mean of +1 right, -0.5 Not Given, -1 wrong; an unreadable answer counts wrong and is
counted in "unreadable".
"""

import re

import numpy as np

from mocojax.data import toyworld as tw

NOT_GIVEN = "not given"
G2P = {"right": 1.0, "not_given": -0.5, "wrong": -1.0}
KINDS = ("count", "colour", "size", "place", "presence")
_NUMBERS = {
    w: str(k)
    for k, w in enumerate(
        ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    )
}
_YES, _NO = {"yes", "y", "true", "present"}, {"no", "n", "false", "absent", "none"}
_NOT_GIVEN_PHRASES = (
    "not given",
    "notgiven",
    "not stated",
    "not mentioned",
    "not said",
    "unknown",
    "n/a",
    "cannot tell",
    "can't tell",
    "not specified",
)
_LINE = re.compile(r"^\s*+(?:q\s*+)?(\d{1,9})\s*+[|.):]\s*+(.*)$", re.I)
MAX_ANSWER_CHARS = 20_000


def _where(position):
    return "at the center" if position == "center" else f"at the {position}"


def scene_questions(scene):
    """Returns the questions of a scene: dicts {kind, question, answer, object} (exact answers)."""
    rng = np.random.default_rng([7, *map(ord, scene.id)])
    questions = [
        {
            "kind": "count",
            "question": "How many objects are there?",
            "answer": str(len(scene.objects)),
        }
    ]
    for obj in scene.objects:
        ref = {"shape": obj.shape, "colour": obj.colour, "position": obj.position}
        questions += [
            {
                "kind": "colour",
                "question": f"What colour is the {obj.shape} {_where(obj.position)}?",
                "answer": obj.colour,
                "object": ref,
            },
            {
                "kind": "size",
                "question": f"What size is the {obj.colour} {obj.shape}?",
                "answer": obj.size,
                "object": ref,
            },
            {
                "kind": "place",
                "question": f"Where is the {obj.colour} {obj.shape}?",
                "answer": obj.position,
                "object": ref,
            },
        ]
    present = scene.objects[int(rng.integers(len(scene.objects)))]
    used = {(o.shape, o.colour) for o in scene.objects}
    free = [(s, c) for s in tw.SHAPES for c in tw.COLOURS if (s, c) not in used]
    shape, colour = free[int(rng.integers(len(free)))]
    for (shape_, colour_), answer in (
        ((present.shape, present.colour), "yes"),
        ((shape, colour), "no"),
    ):
        questions.append(
            {
                "kind": "presence",
                "question": f"Is there a {colour_} {shape_}?",
                "answer": answer,
                "object": {"shape": shape_, "colour": colour_},
            }
        )
    return questions


def normalise_answer(text, kind):
    """Returns the canonical answer of a reader's text for a question kind, NOT_GIVEN, or None
    when it reads as neither; never raises."""
    if not isinstance(text, str):
        return None
    low = " ".join(text.lower().split())
    if any(phrase in low for phrase in _NOT_GIVEN_PHRASES):
        return NOT_GIVEN
    words = re.findall(r"[a-z]+|\d+", low)
    if kind == "count":
        found = [w if w.isdigit() else _NUMBERS[w] for w in words if w.isdigit() or w in _NUMBERS]
        return str(int(found[0])) if found and len(found[0]) < 4 else None
    if kind == "colour":
        return next((w for w in words if w in tw.COLOURS), None)
    if kind == "size":
        return next((tw.SIZE_WORDS[w] for w in words if w in tw.SIZE_WORDS), None)
    if kind == "place":
        return tw.position_of(words)
    if kind == "presence":
        return next(("yes" if w in _YES else "no" for w in words if w in _YES | _NO), None)
    return None


def parse_answers(text, num_questions):
    """Returns num_questions raw answers (None where missing) from "id | answer" lines; a bare
    single line answers a single question. The first answer to an id wins; never raises."""
    answers = [None] * num_questions
    if not isinstance(text, str):
        return answers
    lines = [line for line in text[:MAX_ANSWER_CHARS].splitlines() if line.strip()]
    for line in lines:
        match = _LINE.match(line)
        if match is None:
            continue
        k = int(match.group(1)) - 1
        if 0 <= k < num_questions and answers[k] is None:
            answers[k] = match.group(2).strip()
    if num_questions == 1 and answers[0] is None and len(lines) == 1:
        answers[0] = lines[0].strip()
    return answers


def grade(raw, question):
    """Returns "right", "not_given", "wrong" or "unreadable" for a raw answer to a question."""
    answer = normalise_answer(raw, question["kind"])
    if answer is None:
        return "unreadable"
    if answer == NOT_GIVEN:
        return "not_given"
    return "right" if answer == question["answer"] else "wrong"


def caption_vqa(records, captions, reader):
    """Returns accuracy, G2P score and counts of the reader answering each record's scene
    questions from its caption alone (captions aligned with records; None: skipped, counted)."""
    kept = [(r, c) for r, c in zip(records, captions) if c is not None]
    for record, _ in kept:
        if "scene" not in record:
            raise ValueError(
                f"record {record.get('id')!r}: caption VQA questions come from toy-world scenes"
            )
    questions = [scene_questions(r["scene"]) for r, _ in kept]
    texts = reader.read([r for r, _ in kept], [c for _, c in kept], questions) if kept else []
    counts = {"right": 0, "not_given": 0, "wrong": 0, "unreadable": 0}
    by_kind = {kind: [0, 0] for kind in KINDS}  # right, asked
    for text, qs in zip(texts, questions):
        for raw, question in zip(parse_answers(text, len(qs)), qs):
            outcome = grade(raw, question)
            counts[outcome] += 1
            by_kind[question["kind"]][0] += outcome == "right"
            by_kind[question["kind"]][1] += 1
    asked = sum(counts.values())
    score = (
        G2P["right"] * counts["right"]
        + G2P["not_given"] * counts["not_given"]
        + G2P["wrong"] * (counts["wrong"] + counts["unreadable"])
    )
    return {
        "accuracy": counts["right"] / asked if asked else float("nan"),
        "g2p": score / asked if asked else float("nan"),
        "not_given_rate": counts["not_given"] / asked if asked else float("nan"),
        **counts,
        "questions": asked,
        "images": len(kept),
        "skipped_no_caption": len(records) - len(kept),
        "accuracy_by_kind": {k: r / n if n else float("nan") for k, (r, n) in by_kind.items()},
        "reader": getattr(reader, "name", type(reader).__name__),
        "examples": [
            {"id": r.get("id"), "questions": [q["question"] for q in qs[:4]], "answers": t}
            for (r, _), qs, t in zip(kept[:2], questions, texts)
        ],
    }
