"""The files of a distill run: the write-ahead ledger and the records file (open_outputs repairs what
a kill left, so a rerun resumes), the ledger entry of a finished image (_entry) and the ledger's
summary (summarize, format_summary). Split from mocojax/data/distill.py, which re-exports these
names."""

from __future__ import annotations

import collections
import json
import logging
import os

from tqdm import tqdm

# Options that change what is written: a resumed run must use the same ones.
_RECORD_OPTIONS = (
    "num_policy",
    "keep_references",
    "num_candidates",
    "num_judged",
    "max_asks",
    "policy_max_tokens",
    "candidate_max_tokens",
    "rubric_max_tokens",
    "judge_max_tokens",
    "temperature",
    "sample_temperature",
    "student_temperature",
    "keep_truncated",
    "rubric_mode",
    "committee_size",
    "max_rubric_items",
    "seed",
    "image_max_pixels",
)


def _entry(image, policy_jobs, candidates, rubric_job, judged, options, image_root):
    """Returns the ledger entry of a finished image: its output record (or None) and its counts."""
    record = image.record
    targets = []
    for job in policy_jobs:
        if job.result is None:
            continue
        if job.result in targets:  # the teacher said the same twice: not a second target
            image.bad["policy"] += 1
            image.dropped["policy"] += 1
            image.rejects.append(
                {"part": "policy", "ask": 0, "problems": ["duplicate caption"], "text": job.result}
            )
            continue
        targets.append(job.result)
    if options.keep_references:
        targets += [r for r in record["references"] if r not in targets]
    out = {
        "id": record["id"],
        "image": os.path.relpath(record["image"], image_root),
        "references": record["references"],
        "policy_targets": targets,
    }
    rubric = rubric_job.result if rubric_job is not None else None
    if rubric:
        out["candidates"] = [{"id": f"c{k}", "caption": c} for k, c in enumerate(candidates)]
        out["rubric"] = [
            {"criterion": i.criterion, "check": i.check, "weight": i.weight} for i in rubric
        ]
        if judged:
            out["decisions"] = {
                cid: [{"value": d.value, "rationale": d.rationale} for d in ds]
                for cid, ds in judged.items()
            }
    written = bool(targets) or bool(rubric)
    entry = {
        "id": record["id"],
        "status": "written" if written else "dropped",
        "record": out if written else None,
        "asked": dict(image.asked),
        "bad": dict(image.bad),
        "dropped": dict(image.dropped),
        "errors": image.errors,
        "rejects": image.rejects,
    }
    if image.committee is not None:
        entry["committee"], entry["consensus"] = image.committee, image.consensus
    return entry


# ------------------------------------------------------------------------------------------------
# Files: the ledger, the records, resume
# ------------------------------------------------------------------------------------------------


def ledger_path(out):
    return out + ".ledger.jsonl"


def _read_lines(path):
    """Returns (rows, byte length of the whole lines): a last line without its newline, or one that
    is not JSON, is a torn write and left out; bad JSON before the last line raises ValueError."""
    if not os.path.exists(path):
        return [], 0
    with open(path, "rb") as f:
        data = f.read()
    rows, good = [], 0
    lines = data.splitlines(keepends=True)
    for k, line in enumerate(lines):
        if not line.endswith(b"\n"):
            break
        try:
            rows.append(json.loads(line))
        except ValueError:
            if k == len(lines) - 1:
                break
            raise ValueError(
                f"{path}: line {k + 1} is not JSON; the file is damaged (move it away to start over)"
            )
        good += len(line)
    if good < len(data):
        logging.warning(
            "%s: cut a torn last line (%d bytes) left by an interrupted run", path, len(data) - good
        )
        with open(path, "r+b") as f:
            f.truncate(good)
            os.fsync(f.fileno())
    return rows, good


def _append(f, row):
    f.write(json.dumps(row, ensure_ascii=False) + "\n")
    f.flush()
    os.fsync(f.fileno())


def _header(options, teachers, source):
    return {
        "options": {k: getattr(options, k) for k in _RECORD_OPTIONS},
        "teachers": teachers.names,
        "source": source,
    }


def open_outputs(out, header):
    """Returns (ledger entries so far, ledger file, records file) opened for appending, after
    repairing what a kill left: torn last lines cut, a ledgered record missing from OUT appended.
    Raises ValueError for files this run cannot continue (other settings, damage, foreign records)."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    rows, _ = _read_lines(ledger_path(out))
    if rows:
        if rows[0].get("options") != header["options"]:
            diff = sorted(
                k
                for k in set(header["options"]) | set(rows[0].get("options", {}))
                if rows[0].get("options", {}).get(k) != header["options"].get(k)
            )
            raise ValueError(
                f"{out}: was started with other settings ({', '.join(diff)}); "
                "rerun with the same flags, or give another --out"
            )
        if rows[0].get("teachers") != header["teachers"]:  # a server restarted on another port, say
            logging.warning(
                "%s: resuming with other teachers %s (started with %s)",
                out,
                header["teachers"],
                rows[0].get("teachers"),
            )
        entries = rows[1:]
    else:
        if os.path.exists(out) and os.path.getsize(out):
            raise ValueError(
                f"{out} exists but has no ledger {ledger_path(out)}; move it away or give another --out"
            )
        entries = []
    written, _ = _read_lines(out)
    ledgered = {e["id"] for e in entries}
    extra = [r.get("id") for r in written if r.get("id") not in ledgered]
    if extra:
        raise ValueError(
            f"{out} holds records the ledger does not list ({extra[:3]}); it was not written by this run"
        )
    ledger = open(ledger_path(out), "a")
    if not rows:
        _append(ledger, header)
    records = open(out, "a")
    have = {r["id"] for r in written}
    for entry in entries:  # killed between the ledger line and the record line
        if entry["status"] == "written" and entry["id"] not in have:
            _append(records, entry["record"])
    return entries, ledger, records


def ledger_counts(entries):
    """Returns the counts every ledger has: images written / dropped, per part asks / bad /
    dropped / errors, and the most common problems (the first of each rejected reply)."""
    parts = collections.defaultdict(collections.Counter)
    problems = collections.Counter()
    for entry in entries:
        for key in ("asked", "bad", "dropped"):
            for part, n in entry[key].items():
                parts[part][key] += n
        for error in entry["errors"]:
            parts[error.split(":")[0]]["errors"] += 1
        for reject in entry["rejects"]:
            problems[reject["problems"][0] if reject["problems"] else "?"] += 1
    status = collections.Counter(e["status"] for e in entries)
    return {
        "images": {"written": status["written"], "dropped": status["dropped"]},
        "parts": {
            p: {k: c[k] for k in ("asked", "bad", "dropped", "errors")}
            for p, c in sorted(parts.items())
        },
        "top_problems": problems.most_common(10),
    }


def summarize(entries, client_stats=None):
    """Returns the counts of a ledger: images written / dropped, per part asks / bad / dropped / errors,
    Policy, Generator and Judge records, and the most common problems."""
    roles_written = collections.Counter()
    for entry in entries:
        record = entry.get("record")
        if record:
            roles_written["policy"] += len(record["policy_targets"])
            roles_written["generator"] += int("rubric" in record)
            roles_written["judge"] += len(record.get("decisions", {}))
    counts = ledger_counts(entries)
    return {
        "images": counts["images"],
        "sft_examples": dict(roles_written),
        "parts": counts["parts"],
        "top_problems": counts["top_problems"],
        "this_run": client_stats or {},
    }


def run_ledgered(records, out, header, process, chunk_size, *, desc, progress, postfix):
    """Returns every ledger entry of `out` after processing the records it has not finished:
    `process(chunk)` -> ledger entries, chunk_size records at a time; each entry is appended to
    the ledger (fsynced) before its record to OUT, so a kill loses at most the chunk in flight
    (open_outputs repairs the rest on the next start). postfix(entries) -> the progress bar's
    counts."""
    entries, ledger, out_file = open_outputs(out, header)
    try:
        done = {e["id"] for e in entries}
        todo = [r for r in records if r["id"] not in done]
        if done:
            logging.warning(
                "%s: resuming, %d of %d images done", out, len(records) - len(todo), len(records)
            )
        bar = tqdm(total=len(todo), desc=desc, unit="image", disable=not progress)
        for start in range(0, len(todo), chunk_size):
            chunk = todo[start : start + chunk_size]
            for entry in process(chunk):
                _append(ledger, entry)
                if entry["status"] == "written":
                    _append(out_file, entry["record"])
                entries.append(entry)
            bar.update(len(chunk))
            bar.set_postfix(**postfix(entries))
        bar.close()
    finally:
        ledger.close()
        out_file.close()
    return entries


def write_summary(out, summary, image_root):
    """Writes OUT.summary.json, with a note when image paths are not relative to OUT's folder."""
    if os.path.abspath(image_root) != os.path.dirname(os.path.abspath(out)):
        summary["note"] = (
            f"image paths are relative to {os.path.abspath(image_root)}, not to the folder of "
            f"{out}: train with --config.data.image_root={os.path.abspath(image_root)}"
        )
    with open(out + ".summary.json", "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def format_summary(summary):
    lines = [
        f"images: {summary['images']['written']} written, {summary['images']['dropped']} dropped; "
        f"SFT examples: {summary['sft_examples']}",
        f"{'part':<12}{'asked':>8}{'bad':>8}{'dropped':>9}{'errors':>8}",
    ]
    for part, c in summary["parts"].items():
        lines.append(f"{part:<12}{c['asked']:>8}{c['bad']:>8}{c['dropped']:>9}{c['errors']:>8}")
    for problem, n in summary["top_problems"][:5]:
        lines.append(f"  {n} x {problem}")
    return "\n".join(lines)
