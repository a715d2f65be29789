"""The three roles' prompts, the rubric and decision formats, their parsers and the reward.

One model plays three roles, told apart only by their prompts (docs/method.md):
the Policy captions an image; the Generator writes a rubric from the image, the reference
captions and some candidate captions; the Judge scores ONE caption against the rubric,
without the image.

Formats are tight line formats, because every sampled token costs 16x per image in RL:

  rubric (Generator output), one item per line:   ``id | weight | criterion | check``
  decisions (Judge output), one item per line:    ``id | 0 or 1 | rationale``

The Judge sees the rubric without weights (weights never change a decision), followed by the
caption LAST, so the instruction + rubric prefix is identical for all N captions of a group
and its KV cache can be shared.

The parsers never raise on model output: whatever they cannot use is reported in `problems`
(a list of short strings) and the rest is kept.
"""

import math
import re
from typing import NamedTuple

import numpy as np

POLICY_INSTRUCTION = "Describe this image in detail."

GENERATOR_INSTRUCTION = (
    "Write a rubric to grade captions of this image. Use the reference captions as truth. "
    "Target what the candidate captions missed or got wrong, and add items against objects "
    "they invented. One item per line: id | weight | criterion | check. Weights: 3 main "
    "object missing or invented, 2 wrong attribute, 1 detail."
)

JUDGE_INSTRUCTION = (
    "Grade the caption against each rubric item, using only the caption. One line per item: "
    "id | 1 if the caption meets it, else 0 | short reason."
)

# Weights above this are clipped: one runaway item must not drown the rest of the rubric.
MAX_WEIGHT = 10.0
DEFAULT_WEIGHT = 1.0
DUPLICATE_CRITERION = "duplicate criterion, dropped"  # parse_rubric's problem for a repeated item

_FENCE = re.compile(r"^\s*```")
# Leading decoration a model may put before the id: bullets, "item", "#", "[". Possessive
# quantifiers: adjacent optional runs of spaces never backtrack, so a line of n spaces costs O(n).
_ID_PREFIX = re.compile(
    r"^\s*+(?:[-*]\s*+)?(?:item\s*+)?#?\[?\s*+(\d++)\s*+\]?\s*+[.):]?\s*+", re.I
)
# Longer ids are not item ids (and int() refuses numbers of more than 4,300 digits).
_MAX_ID_DIGITS = 9
_TRUE_WORDS = {"1", "yes", "true", "pass", "met", "y"}
_FALSE_WORDS = {"0", "no", "false", "fail", "unmet", "n"}


class RubricItem(NamedTuple):
    """One rubric item: a criterion, how to check it from the caption, and its weight > 0."""

    criterion: str
    check: str
    weight: float


class Decision(NamedTuple):
    """The Judge's answer for one item: 0/1 and a short rationale (never part of the reward)."""

    value: int
    rationale: str


def _text_message(role, text):
    return {"role": role, "content": [{"type": "text", "text": text}]}


def _image_message(image, text):
    return {
        "role": "user",
        "content": [{"type": "image", "image": image}, {"type": "text", "text": text}],
    }


def policy_messages(image, instruction=POLICY_INSTRUCTION):
    """Returns the Policy conversation: one user turn with the image and the instruction."""
    return [_image_message(image, instruction)]


def prompt_messages(prompt, image=None):
    """Returns a one-turn conversation for a free prompt, with the image first when given."""
    return [_image_message(image, prompt) if image is not None else _text_message("user", prompt)]


def _numbered(captions):
    return "\n".join(f"{k}. {caption}" for k, caption in enumerate(captions, 1))


def generator_messages(image, references, candidates):
    """Returns the Generator conversation: image, references and candidates -> rubric."""
    text = (
        f"{GENERATOR_INSTRUCTION}\nReferences:\n{_numbered(references)}\n"
        f"Candidates:\n{_numbered(candidates)}"
    )
    return [_image_message(image, text)]


def format_rubric_for_judge(rubric_items):
    """Returns the rubric as the Judge sees it: ``id | criterion | check`` lines, no weights."""
    return "\n".join(
        f"{k} | {item.criterion} | {item.check}" for k, item in enumerate(rubric_items, 1)
    )


def judge_messages(rubric_items, caption):
    """Returns the Judge conversation: instruction, rubric, then the caption last; no image."""
    text = (
        f"{JUDGE_INSTRUCTION}\nRubric:\n{format_rubric_for_judge(rubric_items)}\n"
        f"Caption:\n{caption}"
    )
    return [_text_message("user", text)]


def judge_item_messages(item, caption):
    """Returns a one-item Judge conversation: instruction, the caption, then the item last.

    The per-item Judge (config `data.judge_per_item`) is asked once per (caption, item): the
    shape of a single question about a text, with the item right before the answer. Its reply
    is the one line ``1 | 0/1 | rationale`` that `parse_decisions(text, 1)` reads.
    """
    text = f"{JUDGE_INSTRUCTION}\nCaption:\n{caption}\nRubric:\n{format_rubric_for_judge([item])}"
    return [_text_message("user", text)]


# The per-item Judge's `check` form (config `data.judge_item_form="check"`): the caption, then
# "Check: <criterion>", answered "yes" or "no" -- the question form of the toy base's `truth`
# task (mocojax/data/toybase.py), so the Judge role starts from a skill its base was taught.
# The `echo` form (config `data.judge_item_form="echo"`) asks the same question; its reply restates
# the criterion, then says yes or no, so the decision is read where the criterion's last word (the
# shape, the colour-shape pair, the background colour) is the current token.
# The `reason` form (`data.judge_item_form="reason"`) restates the criterion, then gives the
# rationale, then yes / no: the rationale says whether the caption names the item's object ("it
# is named", "it is not mentioned", "it names 2 circles") -- one lookup with the same polarity for
# "mentions a ..." and "does not mention a ..." items, whose decisions are opposite.
# The `lead` form (`data.judge_item_form="lead"`) puts the criterion before the caption
# (``Check: <criterion>`` then ``Caption: <caption>``), answered yes / no.
# Measured from the shipped base (docs/results.md, session 12): only `reason` taught the Judge to
# search a caption for a word (absent-shape items 0.98 after 32,000 Judge-only examples; the
# check form 0.73 after 48,000; echo and lead no better than check).
JUDGE_CHECK_PROMPT = "Check:"
# the per-item forms that ask the check question (`judge_check_messages`), and all per-item forms
CHECK_FORMS = ("check", "echo", "reason", "lead")
JUDGE_ITEM_FORMS = ("rubric",) + CHECK_FORMS


def check_question(caption, criterion):
    """Returns the `check` question: ``Caption: <caption>`` then ``Check: <criterion>``."""
    return f"Caption: {caption}\n{JUDGE_CHECK_PROMPT} {criterion}"


def judge_check_messages(item, caption, lead=False):
    """Returns a one-item Judge conversation in the `check` form (`check_question`; lead: the
    criterion line first, then the caption line); the reply is ``yes`` or ``no``
    (`parse_item_reply`)."""
    if lead:
        return [_text_message("user", f"{JUDGE_CHECK_PROMPT} {item.criterion}\nCaption: {caption}")]
    return [_text_message("user", check_question(caption, item.criterion))]


def judge_item_prompt(item, caption, form="rubric"):
    """Returns the per-item Judge conversation in `form` ("rubric": `judge_item_messages`,
    "check", "echo", "reason" and "lead": `judge_check_messages`)."""
    if form not in JUDGE_ITEM_FORMS:
        raise ValueError(f"unknown per-item Judge form {form!r}; known: {JUDGE_ITEM_FORMS}")
    if form == "rubric":
        return judge_item_messages(item, caption)
    return judge_check_messages(item, caption, lead=form == "lead")


def format_check(decision, criterion=None, form="check"):
    """Returns the per-item Judge's reply in `form`: "check": "yes" when met, else "no";
    "echo": the criterion, then "yes" / "no"; "reason": ``<criterion> | <rationale> | yes``."""
    answer = "yes" if decision.value else "no"
    if form in ("check", "lead"):
        return answer
    if form == "echo":
        return f"{criterion} {answer}"
    return f"{criterion} | {decision.rationale} | {answer}"


def parse_item_reply(text, form="rubric", criterion=None):
    """Returns ([Decision], problems) read from a per-item Judge reply in `form`, as
    `parse_decisions(text, 1)` does for the rubric form. A `check` reply whose first word (an
    `echo` reply whose last word) is neither yes nor no (nor 1/0, true/false ...) counts as 0
    and is reported; an `echo` / `reason` reply that restates another criterion than
    `criterion` (when given) keeps its decision and is reported. `reason` replies are read as
    ``restated | rationale | yes`` (the last field decides)."""
    if form not in JUDGE_ITEM_FORMS:
        raise ValueError(f"unknown per-item Judge form {form!r}; known: {JUDGE_ITEM_FORMS}")
    if form == "rubric":
        return parse_decisions(text, 1)
    if not isinstance(text, str):
        return [Decision(0, "")], [f"decisions are not text: {type(text).__name__}"]
    if form in ("check", "lead"):
        value = _parse_value(text)
    elif form == "echo":
        restated, _, last = text.strip().rpartition(" ")
        value = _parse_value(last)
    else:
        fields = [f.strip() for f in text.split("|")]
        restated, rationale, value = fields[0], " ".join(fields[1:-1]), _parse_value(fields[-1])
    if value is None or (form == "reason" and len(fields) < 3):
        return [Decision(0, "")], [f"unreadable {form} reply {text[:40]!r}, counted as 0"]
    problems = []
    if (
        form in ("echo", "reason")
        and criterion is not None
        and " ".join(restated.split()) != " ".join(criterion.split())
    ):
        problems.append(f"{form} reply restates {restated[:40]!r}, not the item {criterion[:40]!r}")
    return [Decision(value, rationale if form == "reason" else "")], problems


def _format_weight(weight):
    return str(int(weight)) if float(weight).is_integer() else f"{weight:g}"


def format_rubric(rubric_items):
    """Returns the Generator's target text: one ``id | weight | criterion | check`` line per item."""
    return "\n".join(
        f"{k} | {_format_weight(item.weight)} | {item.criterion} | {item.check}"
        for k, item in enumerate(rubric_items, 1)
    )


def format_decisions(decisions):
    """Returns the Judge's target text: one ``id | 0/1 | rationale`` line per item."""
    return "\n".join(f"{k} | {int(d.value)} | {d.rationale}" for k, d in enumerate(decisions, 1))


def _content_lines(text):
    """Returns the non-empty lines of `text` with code-fence lines dropped."""
    return [line for line in text.splitlines() if line.strip() and not _FENCE.match(line)]


def _split_item_line(line):
    """Returns (id, fields after the id) for an item line, or None if it is not one."""
    if "|" not in line:
        return None
    match = _ID_PREFIX.match(line)
    if match is None or len(match.group(1)) > _MAX_ID_DIGITS:
        return None
    rest = line[match.end() :].lstrip()
    if rest.startswith("|"):
        rest = rest[1:]
    return int(match.group(1)), [field.strip() for field in rest.split("|")]


def _parse_weight(field):
    """Returns (weight or None, problem or None) for a weight field."""
    if not field:
        return None, "missing weight"
    try:
        weight = float(field)
    except ValueError:
        return None, f"non-numeric weight {field!r}"
    if not math.isfinite(weight):
        return None, f"non-numeric weight {field!r}"
    return weight, None


def parse_rubric(text, max_items=20):
    """Returns (list[RubricItem], problems) parsed tolerantly from a Generator's output.

    Lines that are not items (reasoning, code fences, trailing prose) are skipped. A missing
    or non-numeric weight becomes DEFAULT_WEIGHT, a non-positive weight drops the item, a
    weight above MAX_WEIGHT is clipped; duplicate criteria are dropped; an unterminated last
    line without all fields is taken as truncated and dropped. Ids are only labels: items are
    renumbered in order of appearance, and duplicate or out-of-order ids are reported.

    Long because each line goes through one sequence of tolerant checks (truncation, id order,
    weight, criterion, check, duplicates, the item cap) whose order decides which problem is
    reported and whether the item is kept; as one loop that order reads top to bottom.
    """
    problems = []
    if not isinstance(text, str):
        return [], [f"rubric is not text: {type(text).__name__}"]
    lines = _content_lines(text)
    truncated_tail = bool(text) and not text.endswith("\n")
    items, seen_ids, seen_criteria, max_id = [], set(), set(), None
    for index, line in enumerate(lines):
        split = _split_item_line(line)
        if split is None:
            continue
        item_id, fields = split
        is_last = index == len(lines) - 1
        if len(fields) < 3 and is_last and truncated_tail:
            problems.append(f"item {item_id}: truncated, dropped")
            continue
        if item_id in seen_ids:
            problems.append(f"item {item_id}: duplicate id")
        elif max_id is not None and item_id != max_id + 1:
            problems.append(f"item {item_id}: out-of-order id")
        seen_ids.add(item_id)
        max_id = item_id if max_id is None else max(max_id, item_id)
        weight, weight_problem = _parse_weight(fields[0])
        if weight is not None or len(fields) >= 3 or not fields[0]:
            fields = fields[1:]
        else:
            # "id | criterion | check": the weight was left out altogether.
            weight_problem = "missing weight"
        if weight is None:
            problems.append(f"item {item_id}: {weight_problem}, using {DEFAULT_WEIGHT:g}")
            weight = DEFAULT_WEIGHT
        elif weight <= 0:
            problems.append(f"item {item_id}: non-positive weight {weight:g}, dropped")
            continue
        elif weight > MAX_WEIGHT:
            problems.append(f"item {item_id}: weight {weight:g} clipped to {MAX_WEIGHT:g}")
            weight = MAX_WEIGHT
        criterion = fields[0] if fields else ""
        check = " | ".join(fields[1:]).strip()
        if not criterion:
            problems.append(f"item {item_id}: empty criterion, dropped")
            continue
        if not check:
            problems.append(f"item {item_id}: missing check")
        key = criterion_key(criterion)
        if key in seen_criteria:
            problems.append(f"item {item_id}: {DUPLICATE_CRITERION}")
            continue
        if len(items) == max_items:
            problems.append(f"more than {max_items} items, rest dropped")
            break
        seen_criteria.add(key)
        items.append(RubricItem(criterion, check, weight))
    if not items:
        problems.append("no rubric items found")
    return items, problems


def criterion_key(criterion):
    """Returns the form two criteria are the same rubric item by: lower case, spaces collapsed."""
    return " ".join(criterion.lower().split())


def merge_rubrics(rubrics, max_items=20, min_votes=1):
    """Returns one rubric, the union of several rubrics written for the same image.

    Items come in order (the first rubric's, then each later one's new items); an item whose
    criterion (`criterion_key`) an earlier rubric already has is left out, the earlier item's
    check and weight kept. min_votes > 1 keeps only the criteria at least that many of the
    rubrics name (agreement between draws); at most max_items items (the Generator's own cap,
    `parse_rubric`).
    """
    votes, first = {}, {}
    for rubric in rubrics:
        for key in {criterion_key(item.criterion) for item in rubric}:
            votes[key] = votes.get(key, 0) + 1
        for item in rubric:
            first.setdefault(criterion_key(item.criterion), item)
    kept = [item for key, item in first.items() if votes[key] >= min_votes]
    return kept[:max_items]


def merge_draws(draws, k, min_votes=1):
    """Returns [len(draws) / k] merged rubrics (`merge_rubrics`) of parsed rubrics drawn k per
    image in a row (the sampler's image-major order: image g's draws at g*k ... g*k + k - 1)."""
    return [
        merge_rubrics(draws[start : start + k], min_votes=min_votes)
        for start in range(0, len(draws), k)
    ]


def _parse_value(field):
    """Returns 0/1 from a decision field, or None when it says neither."""
    words = re.findall(r"[a-z0-9]+", field.lower())
    if not words:
        return None
    if words[0] in _TRUE_WORDS:
        return 1
    if words[0] in _FALSE_WORDS:
        return 0
    return None


def parse_decisions(text, num_items):
    """Returns (list[Decision] of length num_items, problems) parsed from a Judge's output.

    Ids are 1-based rubric item ids. Out-of-range ids are ignored, the first answer to a
    duplicated id wins, and every item without a readable answer counts as 0; each of these
    is reported in `problems`.
    """
    problems = []
    answers = {}
    lines = _content_lines(text) if isinstance(text, str) else []
    if not isinstance(text, str):
        problems.append(f"decisions are not text: {type(text).__name__}")
    for line in lines:
        split = _split_item_line(line)
        if split is None:
            continue
        item_id, fields = split
        if not 1 <= item_id <= num_items:
            problems.append(f"item {item_id}: id out of range 1..{num_items}")
            continue
        if item_id in answers:
            problems.append(f"item {item_id}: duplicate answer, first kept")
            continue
        value = _parse_value(fields[0])
        if value is None:
            problems.append(f"item {item_id}: unreadable decision {fields[0]!r}")
            continue
        answers[item_id] = Decision(value, " | ".join(fields[1:]).strip())
    missing = [k for k in range(1, num_items + 1) if k not in answers]
    if missing:
        problems.append(f"missing decisions for items {missing}, counted as 0")
    decisions = [answers.get(k, Decision(0, "")) for k in range(1, num_items + 1)]
    return decisions, problems


def rubric_reward(weights, decisions):
    """Returns sum(w * b) / sum(w) in [0, 1]: a float for decisions [K], an array for [..., K].

    `decisions` is 0/1 values (any array-like, last axis = items) or a list of Decision.
    An empty rubric, or one with zero total weight, gives 0.
    """
    if len(decisions) and isinstance(decisions[0], Decision):
        decisions = [d.value for d in decisions]
    weights = np.asarray(weights, np.float64)
    values = np.clip(np.asarray(decisions, np.float64), 0.0, 1.0)
    total = weights.sum()
    if weights.size == 0 or total <= 0:
        reward = np.zeros(values.shape[:-1]) if values.ndim > 1 else np.float64(0.0)
    else:
        reward = (values * weights).sum(-1) / total
    return float(reward) if np.ndim(reward) == 0 else reward


# ACE-Cap's active evidence acquisition (seed 002, mocojax.acecap_loop): the Policy writes c_0;
# the Composer, text only, reads c_0 and its question / answer history and asks or stops; the
# vision Instruct role answers one question from the image; the Composer writes the final caption
# from the serialised evidence. The same model plays all of them, by prompt.
COMPOSER_INSTRUCTION = (
    "You cannot see the image; here is a caption of it. Ask one question about the image that "
    "the caption leaves open, as ASK: <question>, or reply READY when the caption and the answers "
    "say enough."
)
INSTRUCT_INSTRUCTION = "Answer the question about this image in one short sentence."
FINAL_INSTRUCTION = (
    "Write the final detailed caption of the image from the evidence below. Only the caption and "
    "the answers are facts; the questions are not."
)


def composer_messages(initial_caption):
    """Returns the Composer's first turn: the instruction and c_0, no image. Later turns append
    its reply (an assistant message) and the answer (a user message: an observation)."""
    return [_text_message("user", f"{COMPOSER_INSTRUCTION}\nCaption:\n{initial_caption}")]


def composer_reply(text):
    """Returns the Composer's reply as the assistant message of its conversation."""
    return _text_message("assistant", text)


def observation_message(answer):
    """Returns an Instruct answer as the user message the Composer reads (never trained on)."""
    return _text_message("user", answer)


def instruct_messages(image, question):
    """Returns the Instruct conversation: the image, the instruction and one Composer question."""
    return [_image_message(image, f"{INSTRUCT_INSTRUCTION}\nQuestion: {question}")]


def final_message(evidence_text):
    """Returns the scheduler's last user message to the Composer: write the final caption from
    the serialised evidence."""
    return _text_message("user", f"{FINAL_INSTRUCTION}\nEvidence:\n{evidence_text}")
