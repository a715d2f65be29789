"""LOOP-GRPO updates on active-evidence rollouts (ACE-Cap, issue 19 part 4; docs/acecap.md).

One update, given `acecap_loop.EvidenceRollouts` of B images x G rollouts:
  score       R_G of c_0, of ser(E_g), of each leave-one-out ser(E_g without pair t) and of c^F
              (`score_rollouts`, with any text scorer; on the toy world `toy_scorer`: the image's
              Gold-MCQ answered by the exact reader from the text's statements, c_0 and the
              answers, never the questions);
  advantages  per image, LOOP-GRPO's per-action-type advantages (`loop_grpo.group_advantages`),
              or the control: GRPO's advantage of r^F within the image's G rollouts broadcast to
              every action span of a rollout (`rollout_advantages(..., control=True)`);
  batch       the Composer transcripts (text only) with each token's advantage and the span mask
              (`loop_batch`: prompts, answers, the scheduler's final prompt and padding masked);
  step        the clipped-ratio loss on the span tokens plus nothing else (`loop_step`, jitted).
              On-policy with one update per rollout batch, so the old log-probabilities are the
              current ones (ratio 1; the gradient is sum_t M_t A_t grad log pi_t / sum_t M_t). The
              transcripts are re-tokenised for the loss (`composer_layout`), so old and new
              log-probabilities are taken on the same tokens by construction.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from mocojax import acecap, acecap_loop, loop_grpo, losses
from mocojax.data import pipeline
from mocojax.train import rl_update, sft, step as step_lib


@dataclasses.dataclass
class LoopRewards:
    """R_G of one batch of evidence rollouts (B images x G rollouts, rollout r = b * G + j)."""

    initial: np.ndarray  # [B] r^0 = R_G(c_0), one per image
    evidence: np.ndarray  # [R] r^E = R_G(ser(E_r))
    leave_one_out: np.ndarray  # [R, K] r^E_{-t} = R_G(ser(E_r without pair t)); 0 where not asked
    final: np.ndarray  # [R] r^F = R_G(c^F_r)


def score_rollouts(rollouts, score_text, max_questions):
    """Returns the LoopRewards of rollouts; score_text(b, text) -> R_G of text for image b.

    An empty evidence state is c_0 itself (`serialise_evidence`), so it scores r^0 exactly.
    """
    g = rollouts.num_rollouts
    initial = [score_text(b, c) for b, c in enumerate(rollouts.initial_captions)]
    evidence = [score_text(r // g, t) for r, t in enumerate(rollouts.evidence_texts())]
    leave_one_out = np.zeros((len(evidence), max_questions), np.float64)
    for r, texts in enumerate(rollouts.leave_one_out()):
        for t, text in enumerate(texts):
            leave_one_out[r, t] = score_text(r // g, text)
    final = [score_text(r // g, c) for r, c in enumerate(rollouts.final_captions)]
    return LoopRewards(
        np.asarray(initial, np.float64),
        np.asarray(evidence, np.float64),
        leave_one_out,
        np.asarray(final, np.float64),
    )


def evidence_statements(text):
    """Returns the statements of a serialised evidence text for a judge that reads facts: c_0 and
    each answer without its `A:` mark; the question lines are dropped (a question states nothing:
    "Is there a blue star?" names no blue star, yet a caption reader would read one)."""
    lines = []
    for line in text.split("\n"):
        if line.startswith(acecap_loop.QUESTION_MARK):
            continue
        if line.startswith(acecap_loop.ANSWER_MARK):
            line = line[len(acecap_loop.ANSWER_MARK) :].strip()
        lines.append(line)
    return "\n".join(lines)


def toy_scorer(scenes, seed=0):
    """Returns score_text(b, text) -> R_G of text on scenes[b]'s Gold-MCQ (`acecap.toy_mcq`),
    each item answered by the exact reader (`acecap.oracle_choice`) from `evidence_statements`."""
    items = [acecap.toy_mcq(scene, seed) for scene in scenes]

    def score_text(b, text):
        statements = evidence_statements(text)
        choices = [acecap.oracle_choice(statements, item) for item in items[b]]
        return acecap.g2p_reward(choices, [item.answer for item in items[b]])

    return score_text


def rollout_advantages(rollouts, rewards, loop, control=False):
    """Returns (A^Q float32 [R, K], A^S [R], A^F [R]) of a batch of rollouts, image by image.

    LOOP-GRPO (control False): `loop_grpo.group_advantages` over each image's G rollouts, with
    the image's r^0 shared by its rollouts. The control (True): GRPO's advantage of r^F within the
    image's G rollouts (`losses.grpo_advantages`, eps loop.eps_norm), the same value on every
    action span of a rollout (each question asked, the stop where it said READY, the final
    caption): credit broadcast over the whole trajectory, as plain GRPO on a multi-turn rollout.
    """
    g, rows, k = rollouts.num_rollouts, len(rollouts.final_captions), loop.max_questions
    asked, stopped = np.asarray(rollouts.asked, bool), np.asarray(rollouts.stopped, bool)
    if asked.shape != (rows, k):
        raise ValueError(
            f"rollouts.asked {asked.shape} must be [R, K] = [{rows}, {k}] (loop.max_questions)"
        )
    adv_q, adv_s, adv_f = (
        np.zeros((rows, k), np.float32),
        np.zeros(rows, np.float32),
        np.zeros(rows, np.float32),
    )
    for b in range(rows // g):
        span = slice(b * g, (b + 1) * g)
        if control:
            a = np.asarray(losses.grpo_advantages(rewards.final[span][None], loop.eps_norm))[0]
            adv_q[span], adv_s[span], adv_f[span] = a[:, None] * asked[span], a * stopped[span], a
            continue
        q, s, f = loop_grpo.group_advantages(
            np.full(g, rewards.initial[b]),
            rewards.evidence[span],
            rewards.leave_one_out[span],
            rewards.final[span],
            asked[span],
            stopped[span],
            loop,
        )
        adv_q[span], adv_s[span], adv_f[span] = q, s, f
    return adv_q, adv_s, adv_f


def padded_length(length, buckets=()):
    """Returns the row length a batch of `length` tokens is padded to: the smallest of `buckets`
    that holds it, else the next multiple of 128 (so the jitted update compiles once per length
    class, not once per update: measured 27 s of each 30 s update on the toy model without it)."""
    fitting = [b for b in buckets if b >= length]
    return min(fitting) if fitting else -(-length // 128) * 128


def loop_batch(cfg, processor, rollouts, advantages, num_micro=1, length_buckets=()):
    """Returns the update's batch with a leading micro-batch axis [A] (numpy): the Composer
    transcripts as `sft.micro_batches` lays out text rows (input_ids, attention_mask, positions
    [A, b, L], ...), "advantages" and "span_mask" float32 [A, b, L] labelling input tokens
    (`loop_grpo.token_advantages`: token i is predicted at position i - 1) and "weight" [A]
    (the token-mean weights of `rl_update.micro_weights`). Rows are right-padded to
    `padded_length(L, length_buckets)` (padding is SPAN_NONE: no loss)."""
    layout = acecap_loop.composer_layout(processor, rollouts)
    layout = pipeline.pad_to(
        layout,
        padded_length(layout["input_ids"].shape[1], length_buckets),
        processor.pad_token_id,
    )
    token_adv, span_mask = loop_grpo.token_advantages(
        layout["span_kind"], layout["span_index"], *advantages, rollouts.stopped
    )
    rows, length = layout["input_ids"].shape
    if rows % num_micro:
        raise ValueError(f"{rows} rollouts do not split into {num_micro} micro-batches")
    host = {
        "input_ids": layout["input_ids"],
        "attention_mask": layout["attention_mask"],
        "loss_mask": np.asarray(span_mask, np.int32),
        "role": np.zeros(rows, np.int32),
        "image_grid_thw": None,
        "pixel_values": None,
        "mm_token_type_ids": np.zeros((rows, length), np.int32),
    }
    batch = sft.micro_batches(cfg, host, num_micro)
    shape = (num_micro, rows // num_micro, length)
    batch["advantages"] = np.asarray(token_adv, np.float32).reshape(shape)
    batch["span_mask"] = np.asarray(span_mask, np.float32).reshape(shape)
    batch["weight"] = rl_update.micro_weights(batch["span_mask"], "token_mean")
    return batch


_METRIC_KEYS = ("pg_loss", "clip_frac_low", "clip_frac_high", "ratio_mean")


def loop_step(cfg, optimizer, loss_kwargs, state, batch):
    """Returns (new train state, metrics) after one LOOP-GRPO update of the params.

    state: {"params", "opt_state", "step", "rng"}; batch from `loop_batch`. Each micro-batch's
    loss is `loop_grpo.loop_loss` on its span tokens (old log-probabilities: the current ones,
    stopped), weighted by its share of the batch's span tokens; a batch without a span token (or
    whose advantages are all 0) still advances the step but changes nothing.
    """

    def micro_loss(params, micro):
        logprobs = sft.next_token_logprobs(cfg, params, micro)
        loss, metrics = loop_grpo.loop_loss(
            logprobs,
            jax.lax.stop_gradient(logprobs),
            micro["advantages"][:, 1:],
            micro["span_mask"][:, 1:],
            **loss_kwargs,
        )
        return loss * micro["weight"], {k: micro["weight"] * metrics[k] for k in _METRIC_KEYS}

    grads, (loss, metric_sums) = step_lib.accumulate(micro_loss, state["params"], batch)
    has_signal = jnp.sum(batch["weight"]) > 0
    new_state, update_metrics = step_lib.update(
        state, grads, optimizer, loss, has_signal=has_signal
    )
    return new_state, {"loss": loss, **metric_sums, **update_metrics}


def make_loop_step(cfg, optimizer, clip_eps=0.2, clip_eps_high=None):
    """Returns the jitted LOOP-GRPO step (train state donated)."""
    loss_kwargs = dict(clip_eps=clip_eps, clip_eps_high=clip_eps_high)

    def step(state, batch):
        return loop_step(cfg, optimizer, loss_kwargs, state, batch)

    return step_lib.jit_step(step)
