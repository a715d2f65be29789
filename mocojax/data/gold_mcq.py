"""Gold-MCQs of real images, written by a teacher from their reference captions (`python -m
mocojax.gold_mcq`; ACE-Cap's offline Gold-MCQ construction, docs/acecap.md).

Per image record (records.py JSONL, PixMo-Cap or DenseFusion rows):

  writer   a text-only teacher reads the image's references (the gold captions) and writes up to
           num_questions questions, one line each: `id | question | option A | ... | gold letter`
           with 2-4 options (acecap.mcq_problems). Malformed lines are dropped and counted; a reply
           with fewer than min_questions good ones is asked again (sampled, a new seed) up to
           max_asks times in all. Options are then shuffled with a seed of the record id and the
           question, so the gold letter is spread over A-D whatever the teacher's habit.
  verify   (on by default) a text-only judge answers the items in the G2P reward's own prompt
           (acecap.mcq_prompt) twice: from the references, and from no text. An item is kept only
           when the judge picks the gold letter from the references (it is answerable from them)
           and not from no text (it is not guessable without them): the trivial-baseline check of
           every item, so R_G pays only for facts a caption states. A judge reply with unreadable
           answers is asked again like a writer's.

An image with fewer than min_questions items left is dropped (counted, its reasons in the ledger).
OUT holds the written image records in records.py's format, with the Gold-MCQ items in their
`mcq` field (ready for `config.rl.reward="g2p"` with a model judge). The write-ahead ledger
(OUT.ledger.jsonl), the reply cache (OUT.cache/) and the resume after kill -9 are distill's
(mocojax.data.distill_files.open_outputs): rerunning the same command sends nothing twice and
loses or duplicates no record.
"""

from __future__ import annotations

import collections
import dataclasses
import os

import numpy as np

from mocojax import acecap, roles
from mocojax.data import distill_ask, distill_files

WRITER_INSTRUCTION = (
    "Write multiple-choice questions about an image from its captions. Ask only about facts the "
    "captions state (objects, counts, colours, sizes, positions, text, actions, relations), each "
    "answerable from the captions alone, with exactly one right option and plausible wrong ones "
    "for this image. Never offer 'Not Given' or 'none of the above'. One line per question: "
    "id | question | option A | option B | option C | option D | right letter"
)
# What the verifying judge reads when it answers without the references.
NO_TEXT = "(no text)"

# What became of the items, counted per image in the ledger (gold_mcq_chunk).
ITEM_OUTCOMES = (
    "lines",
    "bad_lines",
    "over_limit",
    "unsupported",
    "guessable",
    "unverified",
    "too_few",
    "kept",
)
# Options that change what is written: a resumed run must use the same ones.
RECORD_OPTIONS = (
    "num_questions",
    "min_questions",
    "max_asks",
    "writer_max_tokens",
    "judge_max_tokens",
    "temperature",
    "sample_temperature",
    "seed",
    "verify",
    "shuffle_options",
)


@dataclasses.dataclass
class Options:
    """What gold_mcq asks and keeps (docs/acecap.md lists them with the command-line flags)."""

    num_questions: int = 8  # questions asked of the writer per image (at most this many kept)
    min_questions: int = 3  # fewer good (and verified) items than this: re-ask, then drop the image
    max_asks: int = 3  # asks per output in all (1 + re-asks of bad replies)
    writer_max_tokens: int = 1024
    judge_max_tokens: int = 256
    temperature: float = 0.0  # a teacher's first ask
    sample_temperature: float = 0.7  # re-asks
    seed: int = 0
    verify: bool = True  # keep only items the judge answers from the references, not from no text
    shuffle_options: bool = True
    chunk_size: int = 32  # images whose requests are in flight together

    def check(self):
        """Raises ValueError naming the first bad option."""
        for key in (
            "num_questions",
            "min_questions",
            "max_asks",
            "writer_max_tokens",
            "judge_max_tokens",
            "chunk_size",
        ):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)!r}: must be an int >= 1")
        if self.min_questions > self.num_questions:
            raise ValueError(
                f"min_questions={self.min_questions} > num_questions={self.num_questions}"
            )
        for key in ("temperature", "sample_temperature"):
            if not 0 <= getattr(self, key) <= 2:
                raise ValueError(f"{key}={getattr(self, key)!r}: must be in [0, 2]")
        if self.sample_temperature == 0:
            raise ValueError("sample_temperature=0: re-asks must sample (> 0)")


def writer_prompt(references, num_questions):
    """Returns the writer's text-only prompt: the instruction, how many, then the references."""
    numbered = "\n".join(f"{k}. {r}" for k, r in enumerate(references, 1))
    return f"{WRITER_INSTRUCTION}\nQuestions: {num_questions}\nCaptions:\n{numbered}"


def references_text(references):
    """Returns the one text the verifying judge reads: the references joined, in order."""
    return "\n".join(references)


def parse_questions(text):
    """Returns (items, problems) of a writer's reply: the good `id | question | options | letter`
    lines as acecap.MCQItem (options in the teacher's order, a repeated question dropped), and one
    problem per line that is not one. Never raises."""
    items, problems, seen = [], [], set()
    lines = [line for line in (text or "").splitlines() if line.strip()]
    for k, line in enumerate(lines, 1):
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 5 or not fields[0].rstrip(".").isdigit():
            problems.append(f"line {k}: want 'id | question | 2-4 options | letter'")
            continue
        question, options, letter = fields[1], fields[2:-1], fields[-1].strip("().").upper()
        bad = acecap.mcq_problems(question, options, letter)
        if bad:
            problems.append(f"line {k}: {'; '.join(bad)}")
            continue
        item = acecap.text_item(question, options, letter)
        if item.question.lower() in seen:
            problems.append(f"line {k}: repeats an earlier question")
            continue
        seen.add(item.question.lower())
        items.append(item)
    return items, problems


def shuffled(item, record_id, seed):
    """Returns the item with its options permuted by a seed of (seed, record id, question)."""
    rng = np.random.default_rng([13, seed, *map(ord, f"{record_id}\n{item.question}")])
    order = [int(k) for k in rng.permutation(len(item.options))]
    options = tuple(item.options[k] for k in order)
    gold = item.options[acecap.LETTERS.index(item.answer)]
    return item._replace(options=options, answer=acecap.LETTERS[options.index(gold)])


def check_writer(options):
    """Returns the writer's reply check: (items, problems); the problems of a reply with at least
    min_questions good lines are kept for the ledger but do not re-ask it."""

    def check(reply):
        text, finish = distill_ask._reply_texts(reply)[0]
        items, problems = parse_questions(text)
        if len(items) >= options.min_questions:
            return (items, problems), []
        reason = f"{len(items)} good questions, want >= {options.min_questions}"
        if finish == "length":
            reason += " (cut at max_tokens)"
        return None, [reason, *problems]

    return check


def check_judge(items):
    """Returns the verifying judge's reply check: (letters, problems) with no unreadable answer."""

    def check(reply):
        choices, unreadable = acecap.parse_choices(distill_ask._reply_texts(reply)[0][0], items)
        if unreadable:
            return None, [f"{unreadable} of {len(items)} answers name no offered letter"]
        return choices, []

    return check


def _judge_jobs(image, items, client, options):
    """Returns the two verification jobs of an image: from the references, and from no text."""
    jobs = []
    for part, text in (
        ("judge_references", references_text(image.record["references"])),
        ("judge_no_text", NO_TEXT),
    ):
        messages = distill_ask.openai_messages(
            roles.prompt_messages(acecap.mcq_prompt(items, text)), ""
        )
        jobs.append(
            distill_ask._Job(
                image, part, client, messages, options.judge_max_tokens, check_judge(items), 0.0
            )
        )
    return jobs


def _entry(image, items, counts, image_root):
    """Returns the ledger entry of a finished image: its output record (or None) and its counts."""
    record = image.record
    out = None
    if items:
        out = {
            "id": record["id"],
            "image": os.path.relpath(record["image"], image_root),
            "references": record["references"],
        }
        if "policy_targets" in record:
            out["policy_targets"] = record["policy_targets"]
        if record.get("candidates"):
            out["candidates"] = record["candidates"]
        out["mcq"] = [acecap.item_dict(i) for i in items]
    return {
        "id": record["id"],
        "status": "written" if out else "dropped",
        "record": out,
        "items": dict(counts),
        "asked": dict(image.asked),
        "bad": dict(image.bad),
        "dropped": dict(image.dropped),
        "errors": image.errors,
        "rejects": image.rejects,
    }


def gold_mcq_chunk(records, writer, judge, options, image_root):
    """Returns the ledger entries of a chunk of image records (all requests in flight together)."""
    images = [distill_ask._Image(record) for record in records]
    jobs = [
        distill_ask._Job(
            image,
            "writer",
            writer,
            [
                {
                    "role": "user",
                    "content": writer_prompt(image.record["references"], options.num_questions),
                }
            ],
            options.writer_max_tokens,
            check_writer(options),
            options.temperature,
        )
        for image in images
    ]
    distill_ask.ask(jobs, options, "writer")
    counts = {id(image): collections.Counter() for image in images}
    written = {}
    for job in jobs:
        if job.result is None:
            continue
        items, problems = job.result
        c = counts[id(job.image)]
        c["lines"] += len(items) + len(problems)
        c["bad_lines"] += len(problems)
        c["over_limit"] += max(0, len(items) - options.num_questions)
        items = items[: options.num_questions]
        if problems:
            job.image.rejects.append(
                {"part": "writer", "ask": 0, "problems": problems[:10], "text": ""}
            )
        if options.shuffle_options:
            items = [shuffled(i, job.image.record["id"], options.seed) for i in items]
        written[id(job.image)] = items
    kept = dict(written)
    if options.verify:
        verify = [
            job
            for image in images
            if id(image) in written
            for job in _judge_jobs(image, written[id(image)], judge, options)
        ]
        distill_ask.ask(verify, options, "verify")
        for ref_job, blind_job in zip(verify[::2], verify[1::2]):
            image, items = ref_job.image, written[id(ref_job.image)]
            if ref_job.result is None or blind_job.result is None:
                kept[id(image)] = []
                counts[id(image)]["unverified"] += len(items)
                continue
            keep = []
            for item, from_refs, from_none in zip(items, ref_job.result, blind_job.result):
                if from_refs != item.answer:
                    counts[id(image)]["unsupported"] += 1
                elif from_none == item.answer:
                    counts[id(image)]["guessable"] += 1
                else:
                    keep.append(item)
            kept[id(image)] = keep
    entries = []
    for image in images:
        items = kept.get(id(image), [])
        if len(items) < options.min_questions:
            counts[id(image)]["too_few"] += len(items)
            items = []
        counts[id(image)]["kept"] = len(items)
        entries.append(_entry(image, items, counts[id(image)], image_root))
    return entries


def summarize(entries, client_stats=None):
    """Returns the counts of a ledger: images written / dropped, items by outcome, per part asks /
    bad / dropped / errors, and the most common problems."""
    items = collections.Counter()
    for entry in entries:
        items.update(entry["items"])
    counts = distill_files.ledger_counts(entries)
    return {
        "images": counts["images"],
        "items": {k: items[k] for k in ITEM_OUTCOMES},
        "parts": counts["parts"],
        "top_problems": counts["top_problems"],
        "this_run": client_stats or {},
    }


def format_summary(summary):
    i = summary["items"]
    lines = [
        f"images: {summary['images']['written']} written, {summary['images']['dropped']} dropped",
        f"items: {i['lines']} lines from the writer, {i['bad_lines']} malformed, "
        f"{i['over_limit']} over num_questions, {i['unsupported']} not answerable from the references, {i['guessable']} answerable "
        f"without them, {i['unverified']} unverified, {i['too_few']} on images left with too few; "
        f"{i['kept']} kept",
        f"{'part':<18}{'asked':>8}{'bad':>8}{'dropped':>9}{'errors':>8}",
    ]
    for part, c in summary["parts"].items():
        lines.append(f"{part:<18}{c['asked']:>8}{c['bad']:>8}{c['dropped']:>9}{c['errors']:>8}")
    for problem, n in summary["top_problems"][:5]:
        lines.append(f"  {n} x {problem}")
    return "\n".join(lines)


def run(records, writer, judge, options, out, image_root, *, names=None, source="", progress=True):
    """Writes the Gold-MCQ records of `records` to `out` (resuming a killed run); returns the summary.
    writer / judge: clients with chat_many(bodies, return_exceptions=, desc=) (distill's)."""
    options.check()
    header = {
        "options": {k: getattr(options, k) for k in RECORD_OPTIONS},
        "teachers": names or {},
        "source": source,
    }

    def postfix(entries):
        summary = summarize(entries)
        return dict(
            written=summary["images"]["written"],
            dropped=summary["images"]["dropped"],
            kept_items=summary["items"]["kept"],
        )

    entries = distill_files.run_ledgered(
        records,
        out,
        header,
        lambda chunk: gold_mcq_chunk(chunk, writer, judge, options, image_root),
        options.chunk_size,
        desc="gold_mcq",
        progress=progress,
        postfix=postfix,
    )
    stats = {"writer": getattr(writer, "stats", {})}
    if options.verify:
        stats["judge"] = getattr(judge, "stats", {})
    return distill_files.write_summary(out, summarize(entries, stats), image_root)
