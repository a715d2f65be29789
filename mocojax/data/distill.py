"""The role SFT set built by teachers through OpenAI-compatible endpoints (`python -m mocojax.distill`).

From image records with references (records.py, PixMo-Cap or DenseFusion rows) it asks, per image:

  policy      the teacher's caption(s) of the image: the Policy's SFT targets (`policy_targets`)
  candidates  M captions sampled from the STUDENT (a checkpoint or an endpoint), unless the record
              already has candidates: what the Generator writes its rubric against
  generator   a rubric from (image, references, candidates), the exact prompt of roles.generator_messages
  judge       per candidate, decisions against that rubric (roles.judge_messages, no image)

and, with rubric_mode="committee" (RubiCap), the rubric instead comes from a committee:
  committee   K teacher captions (K teachers, or one teacher sampled K times)
  consensus   the facts at least ceil(K/2) of them state, from the rubric writer (the generator
              teacher), in the rubric line format with the number of agreeing captions as weight
  generator   a rubric of the candidates' deficiencies against those facts, severity weights 3/2/1

Every teacher reply is checked with the project's parsers (roles.parse_rubric / parse_decisions;
captions must be non-empty and, unless keep_truncated, not cut at max_tokens). A reply with any
problem is counted, logged in the ledger with the parser's problems, and asked again (sampled, a new
seed) up to max_asks times in all; then that output is dropped. Bad output is never written.

Files (OUT is the records JSONL, the format of records.py, which loads straight into SFT):
  OUT                  one image record per image with at least one usable output
  OUT.ledger.jsonl     the write-ahead log: a first line with the run's options, then one line per
                       finished image (status written / dropped, its record, counts, rejected replies)
  OUT.summary.json     counts over the whole ledger (every run), rewritten at the end of each run
  OUT.cache/           the endpoint replies (mocojax.endpoint's cache): a rerun re-sends nothing

Each image's ledger line is appended and fsynced before its record line; on start, a torn last line
(a kill mid-write) is cut from both files, and a record the ledger has but OUT lacks is appended,
so after kill -9 the same command resumes without losing or duplicating a record. Images are done
chunk by chunk (all requests of a chunk in flight together); a kill loses at most the chunk in
flight, whose replies are in the cache.

Endpoint failures: a request the endpoint refuses as malformed (HTTP 400 / 413 / 422, e.g. an image
over its size limit) is counted as an error of that image's role and not re-asked; anything else
after the client's retries (unreachable, timeouts, 401/403/404, 5xx, 429) stops the run with a
DistillError naming it; the images finished before are kept, the chunk in flight is not written.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os

from PIL import Image

from mocojax import endpoint, processing, roles
from mocojax.data import distill_files, records as records_lib, sources

# Split out (move only, #14); re-exported so `distill.<name>` keeps working.
from mocojax.data.distill_ask import (  # noqa: F401
    REQUEST_ERRORS,
    DistillError,
    _fatal,
    _Image,
    _Job,
    _reply_texts,
    _truncated,
    ask,
    check_candidates,
    check_caption,
    check_consensus,
    check_decisions,
    check_rubric,
    openai_messages,
)
from mocojax.data.distill_clients import (  # noqa: F401
    CommandSession,
    LocalClient,
    define_command_flags,
    load_command_images,
    make_client,
    session,
)
from mocojax.data.distill_files import (  # noqa: F401
    _RECORD_OPTIONS,
    _append,
    _entry,
    _header,
    _read_lines,
    format_summary,
    ledger_path,
    open_outputs,
    summarize,
)

RUBRIC_MODES = ("generator", "committee")

CONSENSUS_INSTRUCTION = (
    "Here are {k} captions of this image by different describers. List the facts about the image "
    "(objects, attributes, positions, text, context) that at least {need} of them state and that the "
    "image confirms. One fact per line: id | number of captions that state it | fact | caption numbers."
)
COMMITTEE_INSTRUCTION = (
    "Write a rubric to grade captions of this image. The consensus facts are the truth. Diagnose what "
    "the candidate captions missed or got wrong against them, one binary, easy-to-check item per "
    "deficiency. One item per line: id | weight | criterion | check. Weights: 3 critical (main subject "
    "wrong or missing, a major invented element), 2 important (a secondary object missing, a wrong "
    "attribute), 1 minor (vague wording, a missing detail)."
)


@dataclasses.dataclass
class Options:
    """What distill asks and keeps (docs/distill.md lists them with the command-line flags)."""

    num_policy: int = 1  # teacher captions per image (Policy targets)
    keep_references: bool = False  # also keep the references as Policy targets
    num_candidates: int = 4  # M student captions per image (when the record has none)
    num_judged: int = 0  # candidates judged per image (0: all)
    max_asks: int = 3  # asks per output in all (1 + re-asks of bad replies)
    policy_max_tokens: int = 512
    candidate_max_tokens: int = 512
    rubric_max_tokens: int = 1024
    judge_max_tokens: int = 1024
    temperature: float = 0.0  # a teacher's first ask
    # re-asks, extra Policy captions, committee captions from one teacher
    sample_temperature: float = 0.7
    student_temperature: float = 1.0
    keep_truncated: bool = False  # keep captions cut at max_tokens
    rubric_mode: str = "generator"
    committee_size: int = 3  # K (with one committee teacher; else the number of committee teachers)
    max_rubric_items: int = 20
    seed: int = 0
    chunk_size: int = 32  # images whose requests are in flight together
    # Larger images are sent downscaled (aspect kept): a photo as a PNG data URL must stay under the
    # endpoints' body limits (mocojax.serve: 32 MB; hosted APIs about 20 MB).
    image_max_pixels: int = 1600 * 1600

    def check(self):
        """Raises ValueError naming the first bad option."""
        positive = (
            "num_candidates",
            "max_asks",
            "policy_max_tokens",
            "candidate_max_tokens",
            "rubric_max_tokens",
            "judge_max_tokens",
            "committee_size",
            "max_rubric_items",
            "chunk_size",
            "image_max_pixels",
        )
        for key in positive:
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)!r}: must be an int >= 1")
        if self.num_policy < 0 or self.num_judged < 0:
            raise ValueError("num_policy and num_judged must be >= 0")
        if self.rubric_mode not in RUBRIC_MODES:
            raise ValueError(f"rubric_mode={self.rubric_mode!r}: must be one of {RUBRIC_MODES}")
        if self.rubric_mode == "committee" and self.committee_size < 2:
            raise ValueError(
                f"committee_size={self.committee_size}: a committee needs >= 2 captions"
            )
        for key in ("temperature", "sample_temperature", "student_temperature"):
            if not 0 <= getattr(self, key) <= 2:
                raise ValueError(f"{key}={getattr(self, key)!r}: must be in [0, 2]")
        if self.sample_temperature == 0:
            raise ValueError("sample_temperature=0: re-asks and extra captions must sample (> 0)")


@dataclasses.dataclass
class Teachers:
    """The clients of each part (anything with chat_many(bodies, return_exceptions=, desc=) and
    close(): endpoint.EndpointClient or LocalClient). `committee` is a list (one caption each), or
    one client asked committee_size times; `student` may be None when every record has candidates."""

    policy: object
    generator: object
    judge: object
    student: object = None
    committee: list = dataclasses.field(default_factory=list)
    names: dict = dataclasses.field(default_factory=dict)  # part -> spec, for the ledger header


# ------------------------------------------------------------------------------------------------
# One chunk of images
# ------------------------------------------------------------------------------------------------


def _job(image, part, client, messages, max_tokens, check, temperature, **kw):
    return _Job(
        image,
        part,
        client,
        openai_messages(messages, image.image_url),
        max_tokens,
        check,
        temperature,
        **kw,
    )


def _committee_jobs(images, teachers, options):
    clients = teachers.committee or [teachers.policy]
    draws = (
        [(c, 0) for c in clients]
        if len(clients) > 1
        else [(clients[0], d) for d in range(options.committee_size)]
    )
    jobs = {}
    for image in images:
        jobs[image.record["id"]] = [
            _job(
                image,
                "committee",
                client,
                roles.policy_messages(None),
                options.policy_max_tokens,
                lambda r: check_caption(r, options.keep_truncated),
                options.temperature if draw == 0 else options.sample_temperature,
                draw=draw,
            )
            for client, draw in draws
        ]
    return jobs


def _rubric_jobs(images, candidates, teachers, options):
    """Returns {id: generator job} for the images that have candidates (runs the committee first).

    Long because it holds both rubric modes: the generator mode's one job per image, and the
    committee mode's two asked rounds (committee captions, then consensus facts) whose results build
    the Generator jobs it returns.
    """
    ready = [i for i in images if candidates.get(i.record["id"])]
    if options.rubric_mode == "generator":
        return {
            i.record["id"]: _job(
                i,
                "generator",
                teachers.generator,
                roles.generator_messages(None, i.record["references"], candidates[i.record["id"]]),
                options.rubric_max_tokens,
                lambda r: check_rubric(r, options.max_rubric_items),
                options.temperature,
            )
            for i in ready
        }
    committee = _committee_jobs(ready, teachers, options)
    ask([j for js in committee.values() for j in js], options, "committee captions")
    consensus = {}
    for image in ready:
        captions = [j.result for j in committee[image.record["id"]] if j.result is not None]
        if len(captions) < 2:
            image.errors.append(f"committee: {len(captions)} usable captions, need 2")
            continue
        text = (
            CONSENSUS_INSTRUCTION.format(k=len(captions), need=math.ceil(len(captions) / 2))
            + "\n"
            + "\n".join(f"{k}. {c}" for k, c in enumerate(captions, 1))
        )
        consensus[image.record["id"]] = _job(
            image,
            "consensus",
            teachers.generator,
            roles.prompt_messages(text, image.image_url),
            options.rubric_max_tokens,
            lambda r, k=len(captions): check_consensus(r, k, options.max_rubric_items),
            options.temperature,
        )
        image.committee = captions
    ask(list(consensus.values()), options, "consensus facts")
    jobs = {}
    for rid, job in consensus.items():
        if job.result is None:
            continue
        job.image.consensus = job.result
        text = (
            f"{COMMITTEE_INSTRUCTION}\nConsensus facts:\n"
            + "\n".join(f"{k}. {f}" for k, f in enumerate(job.result, 1))
            + "\nCandidates:\n"
            + "\n".join(f"{k}. {c}" for k, c in enumerate(candidates[rid], 1))
        )
        jobs[rid] = _job(
            job.image,
            "generator",
            teachers.generator,
            roles.prompt_messages(text, job.image.image_url),
            options.rubric_max_tokens,
            lambda r: check_rubric(r, options.max_rubric_items),
            options.temperature,
        )
    return jobs


def fit_image(image, max_pixels):
    """Returns the PIL image, downscaled (aspect kept, bicubic) when it has more than max_pixels."""
    if image.width * image.height <= max_pixels:
        return image
    scale = math.sqrt(max_pixels / (image.width * image.height))
    return image.resize(
        (max(1, int(image.width * scale)), max(1, int(image.height * scale))),
        Image.Resampling.BICUBIC,
    )


def distill_chunk(records, teachers, options, image_root):
    """Returns one ledger entry per record of a chunk (asks every part; raises DistillError).

    Long because it is the chunk's rounds of asks read top to bottom: load and downscale the images,
    Policy captions and student candidates in one round, rubrics (`_rubric_jobs`), then Judge
    decisions on the judged candidates, each round built from the previous one's results and each
    `_job` call naming its role's prompt, token limit, checker and temperature.
    """
    images = []
    for record in records:
        image = _Image(record)
        image.image_url = endpoint.image_data_url(
            fit_image(processing.load_image(record["image"]), options.image_max_pixels)
        )
        images.append(image)
    # Policy captions and student candidates do not depend on each other: one round of asks.
    policy = {
        i.record["id"]: [
            _job(
                i,
                "policy",
                teachers.policy,
                roles.policy_messages(None),
                options.policy_max_tokens,
                lambda r: check_caption(r, options.keep_truncated),
                options.temperature if d == 0 else options.sample_temperature,
                draw=d,
            )
            for d in range(options.num_policy)
        ]
        for i in images
    }
    need = [i for i in images if not i.record.get("candidates")]
    student = {
        i.record["id"]: _job(
            i,
            "candidates",
            teachers.student,
            roles.policy_messages(None),
            options.candidate_max_tokens,
            lambda r: check_candidates(r, options.num_candidates),
            options.student_temperature,
            n=options.num_candidates,
        )
        for i in need
    }
    ask([j for js in policy.values() for j in js] + list(student.values()), options, "captions")
    candidates = {}
    for image in images:
        rid = image.record["id"]
        given = [c["caption"] for c in image.record.get("candidates") or []]
        candidates[rid] = given or (student[rid].result or [])[: options.num_candidates]
    rubric_jobs = _rubric_jobs(images, candidates, teachers, options)
    ask(list(rubric_jobs.values()), options, "rubrics")
    judge_jobs = []
    for rid, job in rubric_jobs.items():
        if job.result is None:
            continue
        judged = candidates[rid][: options.num_judged or None]
        judge_jobs += [
            _job(
                job.image,
                "judge",
                teachers.judge,
                roles.judge_messages(job.result, caption),
                options.judge_max_tokens,
                lambda r, n=len(job.result): check_decisions(r, n),
                options.temperature,
                draw=k,
            )
            for k, caption in enumerate(judged)
        ]
    ask(judge_jobs, options, "decisions")
    judged = collections.defaultdict(dict)
    for job in judge_jobs:
        if job.result is not None:
            judged[job.image.record["id"]][f"c{job.draw}"] = job.result
    return [
        _entry(
            image,
            policy[image.record["id"]],
            candidates[image.record["id"]],
            rubric_jobs.get(image.record["id"]),
            judged[image.record["id"]],
            options,
            image_root,
        )
        for image in images
    ]


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------


def load_images(source, path, image_dir=None, strict=False):
    """Returns (image records, image root) of a source: "jsonl" (records.py; image_dir overrides the
    JSONL's folder as image root), "pixmo_cap" or "densefusion" (sources.py; image_dir required)."""
    if source == "jsonl":
        root = image_dir or os.path.dirname(os.path.abspath(path))
        return records_lib.load_jsonl(path, image_root=root, strict=strict)[0], root
    if not image_dir:
        raise ValueError(f"source {source!r} needs the image folder (--image_dir)")
    loader = {"pixmo_cap": sources.load_pixmo_cap, "densefusion": sources.load_densefusion}.get(
        source
    )
    if loader is None:
        raise ValueError(f"source {source!r}: want jsonl, pixmo_cap or densefusion")
    return loader(path, image_dir, strict=strict)[0], image_dir


def run(records, teachers, options, out, image_root, *, source="", progress=True):
    """Writes the role SFT set of `records` to `out` (resuming a killed run); returns the summary."""
    options.check()
    if options.rubric_mode == "committee" and len(teachers.committee) == 1:
        raise ValueError(
            "one committee teacher: give it as the policy teacher and set committee_size"
        )
    lacking = [r["id"] for r in records if not r.get("candidates")]
    if lacking and teachers.student is None:
        raise ValueError(
            f"image {lacking[0]} (and {len(lacking) - 1} more) has no candidates: give a student"
        )

    def postfix(entries):
        summary = summarize(entries)
        return dict(
            written=summary["images"]["written"],
            dropped=summary["images"]["dropped"],
            bad=sum(c["bad"] for c in summary["parts"].values()),
        )

    entries = distill_files.run_ledgered(
        records,
        out,
        _header(options, teachers, source),
        lambda chunk: distill_chunk(chunk, teachers, options, image_root),
        options.chunk_size,
        desc="distill",
        progress=progress,
        postfix=postfix,
    )
    clients = {
        name: getattr(client, "stats", {})
        for name, client in (
            ("policy", teachers.policy),
            ("generator", teachers.generator),
            ("judge", teachers.judge),
            ("student", teachers.student),
        )
        if client is not None
    }
    return distill_files.write_summary(out, summarize(entries, clients), image_root)
