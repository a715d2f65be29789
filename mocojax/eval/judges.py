"""Pluggable judges and readers for the evaluation protocols (win rate, blind ranking, caption VQA).

A judge answers three kinds of request, always in TEXT, and the protocols parse that text
tolerantly (never raising), so the exact oracle goes through the same parsers as a model:

  compare(records, pairs)            -> one verdict per pair ("Caption 1 is better" / "Caption 2
                                        is better" / "Tie", the CapArena format)
  rank(records, caption_lists)       -> one "Ranking: 2 > 1 = 3" / "Hallucinated: 2" text per image
  read(records, captions, questions) -> one "id | answer" text per caption (caption-only VQA)

Implementations:
  OracleJudge   the toy world's exact scorer (built from `toyworld.parse_caption`): compares and
                ranks by exact caption F1, flags invented objects, answers from the parsed caption.
  ModelJudge    a model in a judge / reader role behind any TextGenerator: a mocojax checkpoint
                or HF directory (CheckpointGenerator), or a remote OpenAI-compatible endpoint
                (EndpointGenerator, through mocojax.endpoint's client).
Prompts follow roles.py's style: one instruction, numbered inputs, tight line formats.
"""

import os
from typing import Protocol

from mocojax.data import toyworld as tw

PAIRWISE_INSTRUCTION = (
    "Compare two captions of this image. The better caption is accurate and detailed; invented "
    "objects count against it. End with one line: Caption 1 is better, Caption 2 is better, or Tie."
)
RANK_INSTRUCTION = (
    "Rank the captions of this image from best to worst: accurate, detailed, nothing invented. "
    "First line: Ranking: caption numbers best first, separated by > (= for a tie). Second line: "
    "Hallucinated: the numbers of the captions that invent an object, or none."
)
READER_INSTRUCTION = (
    "Answer each question using only the caption. One line per question: id | answer. If the "
    "caption does not say, answer Not Given."
)
NOT_GIVEN = "Not Given"


def _numbered(captions):
    return "\n".join(f"Caption {k}: {caption}" for k, caption in enumerate(captions, 1))


def pairwise_prompt(caption1, caption2):
    """Returns the pairwise judge's prompt (the image goes with it when the judge sees images)."""
    return f"{PAIRWISE_INSTRUCTION}\n{_numbered([caption1, caption2])}"


def rank_prompt(captions):
    """Returns the blind-ranking judge's prompt for anonymised, shuffled captions."""
    return f"{RANK_INSTRUCTION}\n{_numbered(captions)}"


def reader_prompt(caption, questions):
    """Returns the caption-only VQA reader's prompt: caption first, then numbered questions (no image)."""
    numbered = "\n".join(f"{k} | {q}" for k, q in enumerate(questions, 1))
    return f"{READER_INSTRUCTION}\nCaption:\n{caption}\nQuestions:\n{numbered}"


class TextGenerator(Protocol):
    """Anything that completes prompts: a local checkpoint or a remote endpoint."""

    name: str

    def complete(self, prompts, images):
        """Returns one completion per prompt; images[i] is a PIL image, a toy Scene, or None (text only)."""


class CheckpointGenerator:
    """Greedy completions from a mocojax model (a workdir checkpoint or an HF directory)."""

    def __init__(self, name, cfg, params, processor, *, batch_size, max_new_tokens, image_size):
        self.name, self.cfg, self.params, self.processor = name, cfg, params, processor
        self.batch_size, self.max_new_tokens, self.image_size = (
            batch_size,
            max_new_tokens,
            image_size,
        )

    def complete(self, prompts, images):
        from mocojax.eval import toyworld_eval

        examples = []
        for prompt, image in zip(prompts, images):
            example = {"role": "judge" if image is None else "policy", "prompt": prompt}
            if isinstance(image, tw.Scene):
                example["scene"] = image
            elif image is not None:
                example["image"] = image
            examples.append(example)
        return toyworld_eval.generate_texts(
            self.cfg,
            self.params,
            self.processor,
            examples,
            self.batch_size,
            self.max_new_tokens,
            self.image_size,
        )


class EndpointGenerator:
    """A remote OpenAI-compatible chat endpoint (base_url, model): greedy completions through
    mocojax.endpoint's client (retries, concurrency limit, timeout, a disk cache under cache_dir)."""

    def __init__(
        self,
        base_url,
        model,
        api_key_env="OPENAI_API_KEY",
        *,
        max_tokens=256,
        cache_dir=None,
        concurrency=8,
        image_size=128,
        timeout=120.0,
        max_retries=5,
    ):
        if not base_url.startswith(("http://", "https://")) or not model:
            raise ValueError(
                f"endpoint {base_url!r} model {model!r}: want openai:http(s)://host/v1#model"
            )
        self.name, self.base_url, self.model, self.api_key_env = (
            f"{model}@{base_url}",
            base_url,
            model,
            api_key_env,
        )
        self.max_tokens, self.image_size = max_tokens, image_size
        self.client_args = dict(
            api_key=os.environ.get(api_key_env) if api_key_env else None,
            concurrency=concurrency,
            timeout=timeout,
            max_retries=max_retries,
            cache_dir=cache_dir,
        )

    def _image(self, image):
        from mocojax import processing

        if isinstance(image, tw.Scene):
            return tw.render(image, self.image_size)
        return image if not isinstance(image, (str, os.PathLike)) else processing.load_image(image)

    def complete(self, prompts, images):
        from mocojax import endpoint

        bodies = [
            {
                "messages": [endpoint.user_message(p, [] if i is None else [self._image(i)])],
                "temperature": 0,
                "max_tokens": self.max_tokens,
            }
            for p, i in zip(prompts, images)
        ]
        with endpoint.EndpointClient(self.base_url, self.model, **self.client_args) as client:
            return endpoint.texts(client.chat_many(bodies, desc=self.name))


def image_of(record):
    """Returns what a judge that sees images gets for a record: its toy Scene or its image path."""
    return record.get("scene") or record.get("image")


class ModelJudge:
    """A model in the judge / reader role; `sees_image` gives pairwise and ranking prompts the image
    (CapArena judges see it); the VQA reader never sees it."""

    def __init__(self, generator, sees_image=True):
        self.generator, self.sees_image, self.name = generator, sees_image, generator.name

    def _images(self, records):
        return [image_of(r) if self.sees_image else None for r in records]

    def compare(self, records, pairs):
        return self.generator.complete(
            [pairwise_prompt(a, b) for a, b in pairs], self._images(records)
        )

    def rank(self, records, caption_lists):
        return self.generator.complete(
            [rank_prompt(c) for c in caption_lists], self._images(records)
        )

    def read(self, records, captions, questions):
        prompts = [
            reader_prompt(c, [q["question"] for q in qs]) for c, qs in zip(captions, questions)
        ]
        return self.generator.complete(prompts, [None] * len(prompts))


def _scene(record):
    if "scene" not in record:
        raise ValueError(
            f"record {record.get('id')!r}: the oracle judge needs toy-world scenes "
            "(config.data.source='toyworld'); use a model judge for other images"
        )
    return record["scene"]


def _f1(scene, caption):
    return tw.caption_metrics(scene, caption)["f1"]


class OracleJudge:
    """The toy world's exact judge and reader: a ceiling no model judge can beat on this world."""

    name = "oracle"

    def compare(self, records, pairs):
        verdicts = []
        for record, (a, b) in zip(records, pairs):
            scene = _scene(record)
            fa, fb = _f1(scene, a), _f1(scene, b)
            verdict = "Tie" if abs(fa - fb) < 1e-9 else f"Caption {1 if fa > fb else 2} is better"
            verdicts.append(f"Exact F1: caption 1 {fa:.3f}, caption 2 {fb:.3f}.\n{verdict}")
        return verdicts

    def rank(self, records, caption_lists):
        texts = []
        for record, captions in zip(records, caption_lists):
            scene = _scene(record)
            metrics = [tw.caption_metrics(scene, c) for c in captions]
            order = sorted(range(len(captions)), key=lambda k: -metrics[k]["f1"])
            ranking = str(order[0] + 1)
            for prev, k in zip(order, order[1:]):
                tie = abs(metrics[prev]["f1"] - metrics[k]["f1"]) < 1e-9
                ranking += f" {'=' if tie else '>'} {k + 1}"
            flagged = [str(k + 1) for k, m in enumerate(metrics) if m["hallucinated"]]
            texts.append(f"Ranking: {ranking}\nHallucinated: {', '.join(flagged) or 'none'}")
        return texts

    def read(self, records, captions, questions):
        texts = []
        for caption, qs in zip(captions, questions):
            mentions, _ = tw.parse_caption(caption)
            texts.append(
                "\n".join(f"{k} | {oracle_answer(mentions, q)}" for k, q in enumerate(qs, 1))
            )
        return texts


def _find(mentions, **wanted):
    return [m for m in mentions if all(getattr(m, a) == v for a, v in wanted.items())]


def oracle_answer(mentions, question):
    """Returns the exact answer a careful reader gives to a toy question (vqa.scene_questions) from a
    caption's parsed mentions: the caption's word, or Not Given when it does not say. Presence is
    answered "no" when the caption names other objects but not this one (a detailed caption lists
    everything), and Not Given for a caption that names nothing."""
    kind, obj = question["kind"], question.get("object", {})
    if not mentions:
        return NOT_GIVEN
    if kind == "count":
        return str(len(mentions))
    if kind == "presence":
        return "yes" if _find(mentions, shape=obj["shape"], colour=obj["colour"]) else "no"
    if kind == "colour":
        found = _find(mentions, shape=obj["shape"], position=obj["position"])
        value = found[0].colour if found else None
    else:  # size / place of the named shape + colour
        found = _find(mentions, shape=obj["shape"], colour=obj["colour"])
        value = (found[0].size if kind == "size" else found[0].position) if found else None
    return value or NOT_GIVEN
