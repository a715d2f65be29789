"""The record format for users' own data, its validation, and records -> role conversations.

An image record is one JSON object per line of a JSONL file:

    {"id": "000123",                                   required, unique
     "image": "images/000123.jpg",                     required; relative to image_root
     "references": ["A red car parked ...", "..."],    required: >= 1 non-empty caption
     "policy_targets": ["A red car ..."],              optional: the Policy's targets ([]: none)
     "candidates": [{"id": "c0", "caption": "..."}],   optional: captions to write rubrics for
     "rubric": [{"criterion": "...", "check": "...", "weight": 3}],          optional
     "decisions": {"c0": [{"value": 1, "rationale": "..."}, ...]},        optional
     "mcq": [{"question": "...", "options": ["..", ".."], "answer": "B"}]}  optional

`sft_examples` turns image records into role examples: one Policy example per reference (per
`policy_targets` entry when that field is given, e.g. teacher captions from mocojax.distill); a
Generator example when `rubric` and `candidates` are given; one Judge example per candidate
listed in `decisions` (one decision per rubric item, in rubric order). `mcq` holds the image's
Gold-MCQ items for the G2P reward (`config.rl.reward="g2p"`; `python -m mocojax.gold_mcq` writes
them from the references): 2-4 options, the gold letter among them, E = Not Given implicit and
never gold (acecap.mcq_problems). Without the optional fields an image record serves RL (image +
references) and Policy SFT.

Bad records (missing field, a field of the wrong type, empty caption, missing or unreadable
image file, an image path outside image_root, a rubric weight that is not a finite number > 0,
a decision other than 0/1, a malformed Gold-MCQ item, a duplicate record id, bad JSON; at
conversion, a role example longer than the largest length bucket, see `check_lengths`): with strict=True the reader
raises BadRecord naming the record and the field; by default (config `data.strict=False`) it
skips them, counts them per reason in a LoadReport and logs a summary.

A role example is a dict with "id", "role" ("policy" | "generator" | "judge"), "target" (the
assistant reply to train on), the image ("image": a path, or "scene": a toy-world Scene) for
Policy and Generator, "references" + "candidates" for the Generator, "rubric" (a list of
[criterion, check, weight]) + "caption" for the Judge ("item", one [criterion, check, weight],
instead of "rubric" for a per-item Judge example, see `judge_items`).
"""

import collections
import dataclasses
import json
import logging
import math
import os

from PIL import Image

from mocojax import acecap, processing, roles
from mocojax.data import toyworld

ROLES = ("policy", "generator", "judge")


class BadRecord(ValueError):
    """A record that cannot be used; the message starts with its id (or line number)."""


@dataclasses.dataclass
class LoadReport:
    """What a lenient read kept and skipped: counts per skip reason, first few messages."""

    read: int = 0
    kept: int = 0
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    examples: list = dataclasses.field(default_factory=list)

    def skip(self, reason, message):
        """Counts one skipped record under `reason`; keeps the first 20 messages."""
        self.skipped[reason] += 1
        if len(self.examples) < 20:
            self.examples.append(message)

    def log(self, name):
        """Logs one summary line (a warning when records were skipped)."""
        total = sum(self.skipped.values())
        level = logging.WARNING if total else logging.INFO
        logging.log(
            level,
            "%s: read %d records, kept %d, skipped %d %s",
            name,
            self.read,
            self.kept,
            total,
            dict(self.skipped),
        )
        for message in self.examples[:5]:
            logging.log(level, "  skipped: %s", message)


def bad_record(record_id, reason, detail):
    """Returns a BadRecord for record_id, tagged with a reason (its count key in a LoadReport)."""
    error = BadRecord(f"record {record_id}: {detail}")
    error.reason = reason
    return error


def check_image(path, record_id):
    """Returns path if it is a readable image file; raises BadRecord otherwise."""
    if not os.path.isfile(path):
        raise bad_record(record_id, "missing_image", f"image file {path} does not exist")
    try:
        processing.load_image(path)
    except processing.ImageError as error:
        raise bad_record(record_id, "unreadable_image", str(error)) from None
    return path


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value, record_id, field, required=True):
    """Returns value stripped if it is text (non-empty when required); raises BadRecord naming the field."""
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise bad_record(
            record_id, "bad_field", f"field {field!r} must be text, got {type(value).__name__}"
        )
    if required and not value.strip():
        raise bad_record(record_id, "empty_caption", f"field {field!r} is empty")
    return value.strip()


def _captions(raw, key, record_id, required=True):
    values = raw.get(key)
    if values is None and not required:
        return []
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list) or not values:
        raise bad_record(record_id, "missing_field", f"field {key!r} is missing or not a list")
    return [_text(v, record_id, f"{key}[{k}]") for k, v in enumerate(values)]


def _identifier(value, record_id, field):
    """Returns an id (text or an integer) as a non-empty string; raises BadRecord naming the field."""
    if not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))):
        raise bad_record(
            record_id,
            "bad_field",
            f"field {field!r} must be text or an integer, got {type(value).__name__}",
        )
    if str(value).strip() == "":
        raise bad_record(record_id, "missing_field", f"field {field!r} is empty")
    return str(value)


def image_path(image, image_root, record_id):
    """Returns image_root/image; raises BadRecord if that leaves image_root (an absolute path,
    or '..' segments). The check is on the normalised path: symlinks inside the root are followed
    as the user set them up."""
    if os.path.isabs(image):
        raise bad_record(
            record_id,
            "image_outside_root",
            f"field 'image' {image!r} is an absolute path; give it relative to the image root",
        )
    root = os.path.abspath(image_root or os.curdir)
    path = os.path.abspath(os.path.join(root, image))
    if os.path.commonpath([root, path]) != root:
        raise bad_record(
            record_id,
            "image_outside_root",
            f"field 'image' {image!r} points outside the image root {root}",
        )
    return path


def _candidates(raw, record_id):
    candidates = raw.get("candidates")
    if candidates is None:
        return []
    if not isinstance(candidates, list):
        raise bad_record(
            record_id,
            "bad_field",
            f"field 'candidates' must be a list, got {type(candidates).__name__}",
        )
    out = []
    for k, candidate in enumerate(candidates):
        field = f"candidates[{k}]"
        if not isinstance(candidate, dict):
            raise bad_record(record_id, "bad_field", f"field {field!r} must be an object")
        cid = _identifier(candidate.get("id", f"cand{k}"), record_id, field + ".id")
        if any(c["id"] == cid for c in out):
            raise bad_record(
                record_id, "bad_field", f"field {field + '.id'!r}: duplicate candidate id {cid!r}"
            )
        out.append(
            {"id": cid, "caption": _text(candidate.get("caption"), record_id, field + ".caption")}
        )
    return out


def _rubric(items, record_id):
    if not isinstance(items, list) or not items:
        raise bad_record(record_id, "bad_rubric", "field 'rubric' must be a non-empty list")
    rubric = []
    for k, item in enumerate(items):
        field = f"rubric[{k}]"
        if not isinstance(item, dict):
            raise bad_record(record_id, "bad_rubric", f"field {field!r} must be an object")
        weight = item.get("weight")
        if not _is_number(weight) or not math.isfinite(weight) or weight <= 0:
            raise bad_record(
                record_id,
                "bad_rubric",
                f"field {field + '.weight'!r}={weight!r}: must be a finite number > 0",
            )
        try:
            criterion = _text(item.get("criterion"), record_id, field + ".criterion")
            check = _text(item.get("check"), record_id, field + ".check", required=False)
        except BadRecord as error:
            error.reason = "bad_rubric"
            raise
        rubric.append(roles.RubricItem(criterion, check, float(weight)))
    return rubric


def _decisions(decisions, record, record_id):
    if "rubric" not in record or not isinstance(decisions, dict):
        raise bad_record(
            record_id, "bad_decisions", "decisions need a rubric and a dict by candidate id"
        )
    known = {c["id"] for c in record["candidates"]}
    out = {}
    for cid, per in decisions.items():
        field = f"decisions[{cid!r}]"
        if cid not in known or not isinstance(per, list) or len(per) != len(record["rubric"]):
            raise bad_record(
                record_id,
                "bad_decisions",
                f"{field}: unknown candidate or not one decision per rubric item",
            )
        row = []
        for k, decision in enumerate(per):
            value = decision.get("value") if isinstance(decision, dict) else None
            if not _is_number(value) or value not in (0, 1):
                raise bad_record(
                    record_id, "bad_decisions", f"{field}[{k}].value={value!r}: must be 0 or 1"
                )
            rationale = decision.get("rationale", "")
            if not isinstance(rationale, str):
                raise bad_record(record_id, "bad_decisions", f"{field}[{k}].rationale must be text")
            row.append(roles.Decision(int(value), rationale))
        out[cid] = row
    return out


def _mcq(items, record_id):
    if not isinstance(items, list) or not items:
        raise bad_record(record_id, "bad_mcq", "field 'mcq' must be a non-empty list")
    out = []
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_record(record_id, "bad_mcq", f"field 'mcq[{k}]' must be an object")
        try:
            out.append(
                acecap.text_item(item.get("question"), item.get("options"), item.get("answer"))
            )
        except ValueError as error:
            raise bad_record(record_id, "bad_mcq", f"field 'mcq[{k}]': {error}") from None
    return out


def validate(raw, image_root="", check_images=True):
    """Returns a clean image record from a raw dict; raises BadRecord naming the record and field.

    Every field is type-checked. `image` must stay inside image_root ("" : the current folder).
    """
    if not isinstance(raw, dict):
        raise bad_record("?", "not_an_object", f"expected a JSON object, got {type(raw).__name__}")
    if raw.get("id") is None:
        raise bad_record("?", "missing_field", "field 'id' is missing")
    record_id = _identifier(raw["id"], "?", "id")
    image = raw.get("image")
    if image is None or image == "":
        raise bad_record(record_id, "missing_field", "field 'image' is missing")
    if not isinstance(image, str):
        raise bad_record(
            record_id, "bad_field", f"field 'image' must be text, got {type(image).__name__}"
        )
    path = image_path(image, image_root, record_id)
    if check_images:
        check_image(path, record_id)
    record = {
        "id": record_id,
        "image": path,
        "references": _captions(raw, "references", record_id),
        "candidates": _candidates(raw, record_id),
    }
    if raw.get("policy_targets") is not None:  # [] : no Policy example for this image
        record["policy_targets"] = (
            _captions(raw, "policy_targets", record_id) if raw["policy_targets"] != [] else []
        )
    if raw.get("rubric") is not None:
        record["rubric"] = _rubric(raw["rubric"], record_id)
    if raw.get("decisions") is not None:
        record["decisions"] = _decisions(raw["decisions"], record, record_id)
    if raw.get("mcq") is not None:
        record["mcq"] = _mcq(raw["mcq"], record_id)
    return record


def collect(raw_records, convert, strict=False, name="records"):
    """Returns (records, LoadReport): convert(raw) for each raw record, skipping or raising on bad ones."""
    report, records, seen = LoadReport(), [], set()
    for raw in raw_records:
        report.read += 1
        try:
            record = convert(raw)
            if record["id"] in seen:
                raise bad_record(record["id"], "duplicate_id", "an earlier record has this id")
            seen.add(record["id"])
            records.append(record)
        except BadRecord as error:
            if strict:
                raise
            report.skip(getattr(error, "reason", "bad_record"), str(error))
    report.kept = len(records)
    report.log(name)
    return records, report


def read_rows(path):
    """Yields the rows of a .jsonl file as dicts; a line that is not JSON yields a BadRecord."""
    with open(path) as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as error:
                yield bad_record(f"at line {line_number}", "bad_json", f"not JSON: {error}")


def raise_if_bad(row):
    """Returns row; raises it if read_rows yielded a BadRecord in its place."""
    if isinstance(row, BadRecord):
        raise row
    return row


def load_jsonl(path, image_root=None, strict=False, check_images=True):
    """Returns (image records, LoadReport) from a JSONL file in the format above.

    Image paths are relative to image_root (default: the JSONL file's folder).
    """
    root = os.path.dirname(os.path.abspath(path)) if image_root is None else image_root
    return collect(
        read_rows(path),
        lambda row: validate(raise_if_bad(row), root, check_images),
        strict,
        name=path,
    )


def sft_examples(records):
    """Returns the role examples (dicts, see module doc) that image records support."""
    examples = []
    for record in records:
        for k, reference in enumerate(record.get("policy_targets", record["references"])):
            examples.append(
                {
                    "id": f"{record['id']}/policy{k}",
                    "role": "policy",
                    "image": record["image"],
                    "target": reference,
                }
            )
        rubric = record.get("rubric")
        if rubric and record["candidates"]:
            examples.append(
                {
                    "id": f"{record['id']}/generator",
                    "role": "generator",
                    "image": record["image"],
                    "references": record["references"],
                    "candidates": [c["caption"] for c in record["candidates"]],
                    "target": roles.format_rubric(rubric),
                }
            )
        captions = {c["id"]: c["caption"] for c in record["candidates"]}
        for cid, decisions in record.get("decisions", {}).items():
            examples.append(
                {
                    "id": f"{record['id']}/judge/{cid}",
                    "role": "judge",
                    "rubric": [list(item) for item in rubric],
                    "caption": captions[cid],
                    "target": roles.format_decisions(decisions),
                }
            )
    return examples


def judge_items(examples):
    """Returns the examples with each whole-rubric Judge example split into one per item.

    A per-item example has "item" ([criterion, check, weight]) instead of "rubric", the id
    `<id>/item<k>` and the target line ``1 | 0/1 | rationale`` (config `data.judge_per_item`:
    the Judge is asked once per item, `roles.judge_item_messages`). A target without a readable
    decision for an item raises ValueError naming the example: the split never guesses a label.
    Other examples pass through unchanged.
    """
    out = []
    for example in examples:
        if example["role"] != "judge" or "item" in example:
            out.append(example)
            continue
        rubric = example["rubric"]
        decisions, problems = roles.parse_decisions(example["target"], len(rubric))
        if problems:
            raise ValueError(f"Judge example {example['id']}: {'; '.join(problems)}")
        for k, (item, decision) in enumerate(zip(rubric, decisions)):
            split = {key: value for key, value in example.items() if key != "rubric"}
            split.update(
                id=f"{example['id']}/item{k + 1}",
                item=list(item),
                target=roles.format_decisions([decision]),
            )
            out.append(split)
    return out


def judge_item_form(data):
    """Returns how a data config asks the Judge: False (one call per caption, the whole rubric)
    or the per-item form, one of roles.JUDGE_ITEM_FORMS (data.judge_per_item,
    data.judge_item_form)."""
    if not data.get("judge_per_item", False):
        return False
    return data.get("judge_item_form", "rubric")


def check_form(examples, form="check"):
    """Returns the examples with each per-item Judge example (`judge_items`) in the `check`
    form (config `data.judge_item_form="check"`, `roles.judge_check_messages`): the same item
    and caption, the target "yes" / "no" for the decision its rubric-line target holds, and
    "item_form": "check"; form="echo": the target restates the criterion before yes / no,
    form="reason": the criterion, the rationale its rubric line holds, then yes / no
    (`roles.format_check`); form="lead": the criterion before the caption, yes / no;
    "item_form": the form. Other examples pass through unchanged."""
    if form not in roles.CHECK_FORMS:
        raise ValueError(f"check_form: form must be one of {roles.CHECK_FORMS}, got {form!r}")
    out = []
    for example in examples:
        if example["role"] != "judge" or "item" not in example or "target" not in example:
            out.append(dict(example, item_form=form) if "item" in example else example)
            continue
        (decision,), problems = roles.parse_decisions(example["target"], 1)
        if problems:
            raise ValueError(f"Judge example {example['id']}: {'; '.join(problems)}")
        target = roles.format_check(decision, example["item"][0], form)
        out.append(dict(example, item_form=form, target=target))
    return out


def check_lengths(examples, processor, buckets, strict=False, name="examples"):
    """Returns (the role examples that fit, LoadReport): a row longer than the largest length
    bucket is refused at load, naming its record, instead of at the step that draws it.

    With processor.max_length set, a longer row is kept when the Processor will cut its reply to
    fit (max_length <= the largest bucket, prompt and image tokens shorter than max_length).
    Lengths are exact: image tokens come from the image's size (its header only is read).
    """
    largest = max(buckets)
    max_length = processor.max_length
    report, kept = LoadReport(), []
    for example in examples:
        report.read += 1
        try:
            try:
                total, prompt = example_length(example, processor)
            except (OSError, ValueError) as error:  # ImageError is a ValueError
                raise bad_record(example["id"], "unusable_row", str(error)) from None
            fits = total <= largest or (
                max_length is not None and max_length <= largest and prompt < max_length
            )
            if not fits:
                cut = (
                    ""
                    if max_length is None
                    else f" (data.max_length={max_length} cannot cut it: prompt {prompt} tokens)"
                )
                raise bad_record(
                    example["id"],
                    "too_long",
                    f"role example of {total} tokens is longer than the largest length bucket "
                    f"{largest}{cut}; raise data.length_buckets or set data.max_length",
                )
            kept.append(example)
        except BadRecord as error:
            if strict:
                raise
            report.skip(error.reason, str(error))
    report.kept = len(kept)
    report.log(name)
    return kept, report


def example_length(example, processor):
    """Returns (tokens, prompt tokens) of a role example's SFT row, without decoding its image."""
    image_sizes = []
    if example["role"] != "judge":
        if "scene" in example:
            raise ValueError("example_length reads file images; toy scenes have a fixed size")
        with Image.open(example["image"]) as image:
            image_sizes.append(image.size)
    return processor.sequence_length(conversation(example, example.get("image")), image_sizes)


def conversation(example, image):
    """Returns the HF-style conversation of a role example, ending with its target if it has one.

    `image` is the example's PIL image (ignored by Judge examples, which have none). An example
    with "messages" (text only, role "judge") is that conversation; every assistant turn in it
    is a target.
    """
    role = example["role"]
    if "messages" in example:  # a whole text conversation (data/toyloop.py's Composer records)
        if role != "judge" or "target" in example:
            raise ValueError(
                f"example {example.get('id')}: a 'messages' example is text only (role 'judge') "
                "and its assistant turns are its targets (no 'target')"
            )
        return [dict(m) for m in example["messages"]]
    if "prompt" in example:  # a toy base-model task (data.toybase): one user turn, image optional
        messages = roles.prompt_messages(example["prompt"], image if role != "judge" else None)
    elif role == "policy":
        messages = roles.policy_messages(image)
    elif role == "generator":
        messages = roles.generator_messages(image, example["references"], example["candidates"])
    elif role == "judge" and "item" in example:  # a per-item Judge example (judge_items)
        messages = roles.judge_item_prompt(
            roles.RubricItem(*example["item"]),
            example["caption"],
            example.get("item_form", "rubric"),
        )
    elif role == "judge":
        rubric = [roles.RubricItem(*item) for item in example["rubric"]]
        messages = roles.judge_messages(rubric, example["caption"])
    else:
        raise ValueError(f"example {example.get('id')}: unknown role {role!r}")
    if "target" in example:
        messages.append({"role": "assistant", "content": example["target"]})
    return messages


def example_image(example, image_size=128):
    """Returns the PIL image of a role example (None for the Judge): a toy scene or a file."""
    if example["role"] == "judge":
        return None
    if "scene" in example:
        return toyworld.render(example["scene"], image_size)
    return processing.load_image(example["image"])
