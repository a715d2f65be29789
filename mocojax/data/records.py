"""The record format for users' own data, its validation, and records -> role conversations.

An image record is one JSON object per line of a JSONL file:

    {"id": "000123",                                   required, unique
     "image": "images/000123.jpg",                     required; relative to image_root
     "references": ["A red car parked ...", "..."],    required: >= 1 non-empty caption
     "candidates": [{"id": "c0", "caption": "..."}],   optional: captions to write rubrics for
     "rubric": [{"criterion": "...", "check": "...", "weight": 3}],          optional
     "decisions": {"c0": [{"value": 1, "rationale": "..."}, ...]}}         optional

`sft_examples` turns image records into role examples: one Policy example per reference; a
Generator example when `rubric` and `candidates` are given; one Judge example per candidate
listed in `decisions` (one decision per rubric item, in rubric order). Without the optional
fields an image record serves RL (image + references) and Policy SFT.

Bad records (missing field, empty caption, missing or unreadable image file, malformed
optional fields, bad JSON): with strict=True the reader raises BadRecord naming the record;
by default it skips them, counts them per reason in a LoadReport and logs a summary.

A role example is a dict with "id", "role" ("policy" | "generator" | "judge"), "target" (the
assistant reply to train on), the image ("image": a path, or "scene": a toy-world Scene) for
Policy and Generator, "references" + "candidates" for the Generator, "rubric" (a list of
[criterion, check, weight]) + "caption" for the Judge.
"""

import collections
import dataclasses
import json
import logging
import os

from mocojax import processing, roles
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
        logging.log(level, "%s: read %d records, kept %d, skipped %d %s", name, self.read,
                    self.kept, total, dict(self.skipped))
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


def _captions(raw, key, record_id, required=True):
    values = raw.get(key)
    if values is None and not required:
        return []
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list) or not values:
        raise bad_record(record_id, "missing_field", f"field {key!r} is missing or not a list")
    if any(not isinstance(v, str) or not v.strip() for v in values):
        raise bad_record(record_id, "empty_caption", f"field {key!r} has an empty or non-text caption")
    return [v.strip() for v in values]


def validate(raw, image_root="", check_images=True):
    """Returns a clean image record from a raw dict; raises BadRecord naming the record."""
    if not isinstance(raw, dict):
        raise bad_record("?", "not_an_object", f"expected a JSON object, got {type(raw).__name__}")
    record_id = raw.get("id")
    if record_id is None or str(record_id) == "":
        raise bad_record("?", "missing_field", "field 'id' is missing")
    record_id = str(record_id)
    image = raw.get("image")
    if not isinstance(image, str) or not image:
        raise bad_record(record_id, "missing_field", "field 'image' is missing")
    path = os.path.join(image_root, image)
    if check_images:
        check_image(path, record_id)
    record = {"id": record_id, "image": path,
              "references": _captions(raw, "references", record_id)}
    candidates = raw.get("candidates") or []
    if not isinstance(candidates, list) or any(
            not isinstance(c, dict) or not str(c.get("caption", "")).strip() for c in candidates):
        raise bad_record(record_id, "empty_caption", "a candidate has no caption")
    record["candidates"] = [{"id": str(c.get("id", f"cand{k}")), "caption": c["caption"].strip()}
                            for k, c in enumerate(candidates)]
    if raw.get("rubric") is not None:
        try:
            rubric = [roles.RubricItem(str(i["criterion"]), str(i.get("check", "")),
                                       float(i["weight"])) for i in raw["rubric"]]
        except (KeyError, TypeError, ValueError) as error:
            raise bad_record(record_id, "bad_rubric", f"malformed rubric: {error!r}") from None
        if not rubric or any(item.weight <= 0 for item in rubric):
            raise bad_record(record_id, "bad_rubric", "rubric is empty or has a weight <= 0")
        record["rubric"] = rubric
    if raw.get("decisions") is not None:
        decisions = raw["decisions"]
        if "rubric" not in record or not isinstance(decisions, dict):
            raise bad_record(record_id, "bad_decisions", "decisions need a rubric and a dict by candidate id")
        known = {c["id"] for c in record["candidates"]}
        try:
            record["decisions"] = {
                str(cid): [roles.Decision(int(d["value"]), str(d.get("rationale", ""))) for d in per]
                for cid, per in decisions.items()}
        except (KeyError, TypeError, ValueError) as error:
            raise bad_record(record_id, "bad_decisions", f"malformed decisions: {error!r}") from None
        for cid, per in record["decisions"].items():
            if cid not in known or len(per) != len(record["rubric"]):
                raise bad_record(record_id, "bad_decisions",
                            f"decisions for {cid!r}: unknown candidate or not one per rubric item")
    return record


def collect(raw_records, convert, strict=False, name="records"):
    """Returns (records, LoadReport): convert(raw) for each raw record, skipping or raising on bad ones."""
    report, records = LoadReport(), []
    for raw in raw_records:
        report.read += 1
        try:
            records.append(convert(raw))
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
    return collect(read_rows(path),
                   lambda row: validate(raise_if_bad(row), root, check_images),
                   strict, name=path)


def sft_examples(records):
    """Returns the role examples (dicts, see module doc) that image records support."""
    examples = []
    for record in records:
        for k, reference in enumerate(record["references"]):
            examples.append({"id": f"{record['id']}/policy{k}", "role": "policy",
                             "image": record["image"], "target": reference})
        rubric = record.get("rubric")
        if rubric and record["candidates"]:
            examples.append({"id": f"{record['id']}/generator", "role": "generator",
                             "image": record["image"], "references": record["references"],
                             "candidates": [c["caption"] for c in record["candidates"]],
                             "target": roles.format_rubric(rubric)})
        captions = {c["id"]: c["caption"] for c in record["candidates"]}
        for cid, decisions in record.get("decisions", {}).items():
            examples.append({"id": f"{record['id']}/judge/{cid}", "role": "judge",
                             "rubric": [list(item) for item in rubric], "caption": captions[cid],
                             "target": roles.format_decisions(decisions)})
    return examples


def conversation(example, image):
    """Returns the HF-style conversation of a role example, ending with its target if it has one.

    `image` is the example's PIL image (ignored by Judge examples, which have none).
    """
    role = example["role"]
    if "prompt" in example:  # a toy base-model task (data.toybase): one user turn, image optional
        messages = roles.prompt_messages(example["prompt"], image if role != "judge" else None)
    elif role == "policy":
        messages = roles.policy_messages(image)
    elif role == "generator":
        messages = roles.generator_messages(image, example["references"], example["candidates"])
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
