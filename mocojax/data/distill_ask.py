"""Asking teachers with checks and re-asks, for distill: the per-image and per-output state of a chunk
(_Image, _Job), the reply checks (check_caption, check_candidates, check_rubric, check_decisions,
check_consensus) and `ask`, which re-asks bad replies up to max_asks times. Split from
mocojax/data/distill.py, which re-exports these names."""

from __future__ import annotations

import collections
import dataclasses
import math

from mocojax import endpoint, roles

# Statuses the endpoint answers for a request that is itself unusable: not retried, not fatal.
REQUEST_ERRORS = (400, 413, 422)


class DistillError(RuntimeError):
    """A run that cannot go on (an endpoint that does not answer, a damaged or mismatched output)."""


# ------------------------------------------------------------------------------------------------
# Asking with checks and re-asks
# ------------------------------------------------------------------------------------------------


def openai_messages(messages, image_url):
    """Returns roles.* messages (processing's format) as OpenAI messages, images as image_url."""
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [
                {"type": "image_url", "image_url": {"url": image_url}}
                if part["type"] == "image"
                else {"type": "text", "text": part["text"]}
                for part in content
            ]
        out.append({"role": message["role"], "content": content})
    return out


@dataclasses.dataclass
class _Image:
    """One image's state while its chunk is in flight."""

    record: dict
    image_url: str = ""
    asked: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    bad: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    errors: list = dataclasses.field(default_factory=list)
    rejects: list = dataclasses.field(default_factory=list)
    # committee mode: the usable committee captions, then the consensus facts
    committee: list = None
    consensus: list = None


@dataclasses.dataclass
class _Job:
    """One output to obtain: a prompt, its client and the check its reply must pass."""

    image: _Image
    part: str
    client: object
    messages: list
    max_tokens: int
    check: object  # reply -> (value, problems)
    temperature: float
    draw: int = 0  # distinguishes outputs of the same prompt (extra captions): seeds differ
    n: int = 1
    result: object = None

    def body(self, attempt, options):
        temperature = (
            self.temperature if attempt == 0 else max(self.temperature, options.sample_temperature)
        )
        body = {
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            "temperature": temperature,
        }
        if self.n > 1:
            body["n"] = self.n
        if temperature > 0:
            body["seed"] = options.seed + 1000 * attempt + self.draw
        return body


def _reply_texts(reply):
    return [(c["message"].get("content") or "", c.get("finish_reason")) for c in reply["choices"]]


def check_caption(reply, keep_truncated=False):
    """Returns (caption, problems) of a Policy / committee reply."""
    text, finish = _reply_texts(reply)[0]
    if not text.strip():
        return None, ["empty caption"]
    if finish == "length" and not keep_truncated:
        return None, ["caption cut at max_tokens (finish_reason length)"]
    return text.strip(), []


def check_candidates(reply, n):
    """Returns (the non-empty student captions, problems): problems when fewer than n came back."""
    texts = [t.strip() for t, _ in _reply_texts(reply) if t.strip()]
    return texts, [] if len(texts) >= n else [f"{len(texts)} non-empty captions of {n}"]


def _truncated(reply):
    return (
        ["reply cut at max_tokens (finish_reason length)"]
        if _reply_texts(reply)[0][1] == "length"
        else []
    )


def check_rubric(reply, max_items):
    """Returns (rubric items, problems) of a Generator reply, through roles.parse_rubric."""
    items, problems = roles.parse_rubric(_reply_texts(reply)[0][0], max_items=max_items)
    return items, _truncated(reply) + problems


def check_decisions(reply, num_items):
    """Returns (decisions, problems) of a Judge reply, through roles.parse_decisions."""
    decisions, problems = roles.parse_decisions(_reply_texts(reply)[0][0], num_items)
    return decisions, _truncated(reply) + problems


def check_consensus(reply, k, max_items):
    """Returns (facts held by >= ceil(k/2) captions, problems): the rubric parser reads
    ``id | count | fact | captions`` lines, the count in the weight field."""
    need = math.ceil(k / 2)
    items, problems = roles.parse_rubric(_reply_texts(reply)[0][0], max_items=max_items)
    problems = _truncated(reply) + problems
    problems += [
        f"fact {f.criterion!r}: {f.weight:g} captions of {k}" for f in items if f.weight > k
    ]
    facts = [f.criterion for f in items if f.weight >= need]
    if items and not facts:
        problems.append(f"no fact stated by {need} or more captions")
    return facts, problems


def _fatal(error):
    return not isinstance(error, endpoint.EndpointError) or error.status not in REQUEST_ERRORS


def ask(jobs, options, desc):
    """Fills job.result for every job whose reply passes its check within options.max_asks asks;
    counts asks, bad replies, drops and request errors on each job's image. Raises DistillError on
    an endpoint failure that is not the request's own fault."""
    pending = list(jobs)
    for attempt in range(options.max_asks):
        if not pending:
            break
        retry = []
        by_client = collections.defaultdict(list)
        for job in pending:
            by_client[id(job.client)].append(job)
        for group in by_client.values():
            replies = group[0].client.chat_many(
                [job.body(attempt, options) for job in group],
                return_exceptions=True,
                desc=f"{desc} ask {attempt + 1}",
            )
            for job, reply in zip(group, replies):
                job.image.asked[job.part] += 1
                if isinstance(reply, BaseException):
                    if _fatal(reply):
                        raise DistillError(
                            f"{job.part} request for image {job.image.record['id']}: {reply}"
                        )
                    job.image.errors.append(f"{job.part}: {reply}")
                    continue
                value, problems = job.check(reply)
                if problems:
                    job.image.bad[job.part] += 1
                    job.image.rejects.append(
                        {
                            "part": job.part,
                            "ask": attempt + 1,
                            "problems": problems[:10],
                            "text": _reply_texts(reply)[0][0][:2000],
                        }
                    )
                    retry.append(job)
                else:
                    job.result = value
        pending = retry
    for job in pending:
        job.image.dropped[job.part] += 1
