"""ACE-Cap's active evidence acquisition (seed 002, docs/acecap.md): batched multi-turn rollouts.

Per image, the Policy (the Captioner) writes one initial caption c_0. G rollouts of the Composer
start from it: text only, the Composer reads c_0 and its question / answer history and replies
`ASK: <question>` or `READY`; the vision Instruct role answers each question from the image; the
answer is an observation (a user message, never trained on). A rollout ends at READY, at an
unparseable reply (a forced READY, counted) or after K questions (the scheduler finalises it by
force); then the Composer writes the final caption c^F from the serialised evidence
E_g = (c_0, (q_t, a_t)...). One model plays every role, by prompt (mocojax.roles).

Batching: each round, all still-active rollouts' Composer turns go through ONE sampler call
(the first round's G rollouts of an image share their prompt, encoded once, its KV cache shared
by the G samples), then all of the round's questions through one Instruct call; the final
captions of all rollouts through one more. A run makes at most 2 + 2K sampler calls, whatever
the batch size.

Span structure for LOOP-GRPO (mocojax.loop_grpo): a rollout's Composer transcript is one chat
conversation, [c_0 prompt] (ASK reply, answer)* [READY reply] [final prompt] (final caption);
its assistant replies are the action spans (question t, stop, final caption) and everything else
(prompts, answers, the scheduler's final prompt, padding) is SPAN_NONE. A forced finalisation
(at K, or after an unparseable reply, which is left out of the transcript) has no stop span.
"""

import dataclasses
import re
from typing import NamedTuple

import jax
import numpy as np

from mocojax import loop_grpo, roles
from mocojax.train import rollout as rollout_lib

ASK, READY = "ask", "ready"
QUESTION_MARK = "Q (asked, not a fact):"  # questions are never evidence, only c_0 and answers
ANSWER_MARK = "A:"

_ASK = re.compile(r"ask\s*:\s*(\S.*)", re.I)
_READY = re.compile(r"ready[.!]?", re.I)


class Action(NamedTuple):
    """A parsed Composer reply: kind ASK (question set), READY, or None (unparseable)."""

    kind: str | None
    question: str = ""


def parse_action(text):
    """Returns the Action of a Composer reply: `ASK: <question>` (any case, the question on one
    line after collapsing whitespace) or `READY` (an optional final . or !); anything else,
    including an empty question or a non-string, is unparseable (kind None). Never raises."""
    if not isinstance(text, str):
        return Action(None)
    text = " ".join(text.split())
    ask = _ASK.fullmatch(text)
    if ask:
        return Action(ASK, ask.group(1))
    return Action(READY) if _READY.fullmatch(text) else Action(None)


def _one_line(text):
    return " ".join(str(text).split())


def serialise_evidence(initial_caption, questions, answers):
    """Returns ser(E) of an evidence state (c_0, (q_t, a_t)...): c_0 verbatim, then per pair a
    line `Q (asked, not a fact): q` and a line `A: a` (whitespace collapsed), in asking order.
    With no pairs it is c_0 itself, so an empty evidence state scores exactly as c_0 does."""
    if len(questions) != len(answers):
        raise ValueError(f"{len(questions)} questions for {len(answers)} answers")
    lines = [initial_caption]
    for question, answer in zip(questions, answers):
        lines += [f"{QUESTION_MARK} {_one_line(question)}", f"{ANSWER_MARK} {_one_line(answer)}"]
    return "\n".join(lines)


def leave_one_out_texts(initial_caption, questions, answers):
    """Returns [T] texts: ser(E without pair t) for each asked question t (for r^E_{g,-t})."""
    return [
        serialise_evidence(
            initial_caption, questions[:t] + questions[t + 1 :], answers[:t] + answers[t + 1 :]
        )
        for t in range(len(questions))
    ]


@dataclasses.dataclass
class EvidenceRollouts:
    """Active evidence acquisition rollouts of B images x G rollouts, rollout r = b * G + j."""

    initial_captions: list  # [B] c_0 per image (shared by its G rollouts)
    num_rollouts: int  # G
    composer_texts: list  # [R][rounds] raw Composer replies, the unparseable one included
    questions: list  # [R][T_r] parsed questions in asking order
    answers: list  # [R][T_r] Instruct answers (observations)
    final_captions: list  # [R] c^F
    asked: np.ndarray  # bool [R, K]: the first T_r entries of each row
    stopped: np.ndarray  # bool [R]: the Composer said READY (a stop span); False when forced
    unparseable: np.ndarray  # bool [R]: finalised by force after an unparseable reply
    transcripts: list  # [R] the Composer's chat conversation, final caption last

    @property
    def num_questions(self) -> np.ndarray:
        """Returns int [R]: T_r, the questions each rollout asked."""
        return self.asked.sum(-1)

    @property
    def forced_ready(self) -> int:
        """Returns the number of rollouts finalised by force after an unparseable reply."""
        return int(self.unparseable.sum())

    def initial_caption(self, r):
        """Returns c_0 of rollout r (its image's)."""
        return self.initial_captions[r // self.num_rollouts]

    def evidence_texts(self):
        """Returns [R] ser(E_r), the texts scored for r^E."""
        return [
            serialise_evidence(self.initial_caption(r), q, a)
            for r, (q, a) in enumerate(zip(self.questions, self.answers))
        ]

    def leave_one_out(self):
        """Returns [R][T_r] ser(E_r without pair t), the texts scored for r^E_{r,-t}."""
        return [
            leave_one_out_texts(self.initial_caption(r), q, a)
            for r, (q, a) in enumerate(zip(self.questions, self.answers))
        ]

    def span_kinds(self, r):
        """Returns the SPAN_* kinds of rollout r's assistant replies in order: a question per
        ASK, a stop if it said READY, the final caption."""
        stop = [loop_grpo.SPAN_STOP] if self.stopped[r] else []
        return [loop_grpo.SPAN_QUESTION] * len(self.questions[r]) + stop + [loop_grpo.SPAN_FINAL]


def composer_layout(processor, rollouts):
    """Returns the flattened Composer transcripts for the loss: a dict of input_ids,
    attention_mask (right padded, the processor's "sft" mode) and span_kind, span_index int32
    [R, L] (loop_grpo.token_advantages' inputs) labelling each input token.

    The assistant replies are the processor's target runs, in order; each run (its <|im_end|>
    included) gets its kind from `EvidenceRollouts.span_kinds` and questions their index t; every
    other token (prompts, answers, the final prompt, padding) is SPAN_NONE. A transcript cut by
    the processor's max_length keeps the spans that remain.
    """
    batch = processor(rollouts.transcripts, mode="sft")
    targets = np.asarray(batch["loss_mask"])
    span_kind, span_index = np.zeros_like(targets), np.zeros_like(targets)
    for r, row in enumerate(targets):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row, [0]])))
        runs = list(zip(edges[::2], edges[1::2]))
        kinds = rollouts.span_kinds(r)
        if len(runs) > len(kinds):
            raise ValueError(f"rollout {r}: {len(runs)} replies for {len(kinds)} actions")
        pieces, end = [], 0
        for (start, stop), kind in zip(runs, kinds):
            pieces += [(loop_grpo.SPAN_NONE, start - end), (kind, stop - start)]
            end = stop
        pieces.append((loop_grpo.SPAN_NONE, len(row) - end))
        span_kind[r], span_index[r] = loop_grpo.span_layout(pieces)
    return {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "span_kind": span_kind.astype(np.int32),
        "span_index": span_index.astype(np.int32),
    }


def acquire_evidence(
    cfg,
    params,
    processor,
    images,
    *,
    num_rollouts,
    max_questions,
    rng,
    temperature=1.0,
    caption_temperature=0.0,
    answer_temperature=0.0,
    caption_max_new_tokens=64,
    action_max_new_tokens=24,
    answer_max_new_tokens=24,
    final_max_new_tokens=96,
    answer_fn=None,
):
    """Returns the EvidenceRollouts of G = num_rollouts rollouts per image, K = max_questions.

    answer_fn(b, question) -> answer, when given, plays the Instruct role for image b instead of
    the model (the toy world's exact answers, `toyloop.instruct_answer`, as RL's exact roles).

    c_0 (the Policy, one per image) and the answers (Instruct) decode at caption_temperature /
    answer_temperature (greedy by default: fixed roles); the Composer's actions and final
    captions at temperature. Each round's Composer turns, each round's answers and the final
    captions are one `rollout.sample_texts` call each; nothing raises on model output.
    """
    sample = _sampler(cfg, params, processor, rng)
    g, num_images = num_rollouts, len(images)
    initial = sample(
        0,
        [roles.policy_messages(image) for image in images],
        caption_max_new_tokens,
        caption_temperature,
    )
    rows = num_images * g
    histories = [roles.composer_messages(initial[r // g]) for r in range(rows)]
    questions, answers = [[] for _ in range(rows)], [[] for _ in range(rows)]
    composer_texts = [[] for _ in range(rows)]
    asked = np.zeros((rows, max_questions), bool)
    stopped, unparseable = np.zeros(rows, bool), np.zeros(rows, bool)
    active = list(range(rows))
    for t in range(max_questions):
        if not active:
            break
        if t == 0:  # every rollout of an image has the same prompt: encode it once, G samples
            texts = sample(1, histories[::g], action_max_new_tokens, temperature, num_samples=g)
        else:
            texts = sample(
                1 + 2 * t, [histories[r] for r in active], action_max_new_tokens, temperature
            )
        askers = []
        for r, text in zip(active, texts):
            composer_texts[r].append(text)
            action = parse_action(text)
            if action.kind is None:
                unparseable[r] = True  # a forced READY: left out of the transcript
                continue
            histories[r] = histories[r] + [roles.composer_reply(text)]
            if action.kind == READY:
                stopped[r] = True
            else:
                questions[r].append(action.question)
                asked[r, t] = True
                askers.append(r)
        if askers and answer_fn is not None:
            replies = [answer_fn(r // g, questions[r][-1]) for r in askers]
        elif askers:
            replies = sample(
                2 + 2 * t,
                [roles.instruct_messages(images[r // g], questions[r][-1]) for r in askers],
                answer_max_new_tokens,
                answer_temperature,
            )
        if askers:
            for r, answer in zip(askers, replies):
                answers[r].append(answer)
                histories[r] = histories[r] + [roles.observation_message(answer)]
        active = askers  # those still asking after K questions are finalised by force
    finals = [
        histories[r]
        + [roles.final_message(serialise_evidence(initial[r // g], questions[r], answers[r]))]
        for r in range(rows)
    ]
    captions = sample(1 + 2 * max_questions, finals, final_max_new_tokens, temperature)
    return EvidenceRollouts(
        initial_captions=initial,
        num_rollouts=g,
        composer_texts=composer_texts,
        questions=questions,
        answers=answers,
        final_captions=captions,
        asked=asked,
        stopped=stopped,
        unparseable=unparseable,
        transcripts=[f + [roles.composer_reply(c)] for f, c in zip(finals, captions)],
    )


def _sampler(cfg, params, processor, rng):
    """Returns sample(call, conversations, max_new_tokens, temperature, num_samples=1) -> texts:
    one `rollout.sample_texts` call with its own key, rows padded to a power of two."""

    def sample(call, conversations, max_new_tokens, temperature, num_samples=1):
        return rollout_lib.sample_texts(
            cfg,
            params,
            processor,
            conversations,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            rng=jax.random.fold_in(rng, call),
            num_samples=num_samples,
            min_rows=1,
        )

    return sample
