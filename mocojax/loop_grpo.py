"""LOOP-GRPO (ACE-Cap, seed 002): span-aligned advantages for a multi-turn Composer, as pure functions.

A rollout g of one image: the Captioner's c_0, then T_g <= K questions q_t (each answered by the
vision role; answers are observations), then READY (the Composer stops) or a forced finalisation
at the budget K, then the final caption c^F from the evidence E_g = (c_0, (q_t, a_t)...). With
R_G the G2P reward (mocojax.acecap) of a serialised text:
    r^0 = R_G(c_0),  r^E_g = R_G(ser(E_g)),  r^E_{g,-t} = R_G(ser(E_g without pair t)),  r^F_g = R_G(c^F_g)
    question   u^Q_{g,t} = r^E_g - r^E_{g,-t} - c_Q          (leave-one-out, not adjacent differences)
    base       b_g = (r^F_g - r^0) + lambda [min(r^E_g, r^F_g) - r^0]
    stop       u^S_g = b_g - c_S T_g                         (only when the Composer said READY)
    synthesis  u^F_g = b_g
Advantages are normalised within each action type tau over the image's G rollouts,
A = (u - mu_tau) / (sigma_tau + eps_norm) (population std; a type whose utilities are all equal
gets 0, as in losses.grpo_advantages), and each span's tokens get their span's advantage; every
other token (prompts, answers, scheduler tokens, padding) is masked. A forced finalisation at K
creates no stop span and its rollout is left out of the stop type's mean and std. The loss is the
GRPO clipped ratio on those tokens with a masked token average and a masked token-average KL:
losses.grpo_loss with [B, T] advantages and aggregation "token_mean" (`loop_loss`).

Defaults (`loop_defaults`; the paper gives no values): see the comments there.
"""

import jax.numpy as jnp
import ml_collections
import numpy as np

from mocojax import losses
from mocojax.train import rl_config

# Token span kinds of a flattened Composer rollout [B, L].
SPAN_NONE, SPAN_QUESTION, SPAN_STOP, SPAN_FINAL = 0, 1, 2, 3


def loop_defaults() -> ml_collections.ConfigDict:
    """Returns the LOOP-GRPO config block: c_q, c_s, lam, max_questions (K), eps_norm."""
    loop = ml_collections.ConfigDict()
    # Cost of one question, in R_G units (R_G in [-1, 1]). A toy image has 6-15 MCQ items, so one
    # item turned from Not Given into right moves R_G by 1.5 / 15 = 0.1 or more: a question must
    # recover a fifth of that to be worth asking.
    loop.c_q = 0.02
    # Length cost on the stop action per question asked; half of c_q, so the stop span is taught
    # to stop early more gently than each question is taught to be worth its cost.
    loop.c_s = 0.01
    # lambda: weight of the evidence-retention bottleneck min(r^E, r^F) - r^0 against the final
    # caption's own gain; 1 weighs them equally.
    loop.lam = 1.0
    # K: the question budget. The paper's budget study finds K = 2-4 the accuracy-cost sweet spot;
    # toy scenes have 1-4 objects and c_0 usually names some of them.
    loop.max_questions = 3
    loop.eps_norm = 1e-6  # as rl.adv_eps
    return loop


_RANGES = {
    "c_q": (0.0, None, True, True),
    "c_s": (0.0, None, True, True),
    "lam": (0.0, None, True, True),
    "eps_norm": (0.0, None, False, True),
}


def validate(loop) -> None:
    """Raises ValueError naming the first bad key of a `loop_defaults` block."""
    for key, bounds in _RANGES.items():
        if not rl_config.in_range(loop[key], *bounds):
            raise ValueError(
                f"config.loop.{key}={loop[key]!r}: must be {rl_config.describe_range(*bounds)}"
            )
    k = loop.max_questions
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"config.loop.max_questions={k!r}: must be a positive int")


def question_utilities(r_evidence, r_leave_one_out, asked, c_q):
    """Returns u^Q float32 [G, K] = r^E_g - r^E_{g,-t} - c_Q where asked, 0 elsewhere.

    r_evidence [G]; r_leave_one_out [G, K] (R_G of the evidence without pair t); asked bool [G, K].
    """
    r_evidence, r_loo = (
        jnp.asarray(r_evidence, jnp.float32),
        jnp.asarray(r_leave_one_out, jnp.float32),
    )
    if r_loo.shape != jnp.shape(asked) or r_loo.shape[:1] != r_evidence.shape:
        raise ValueError(
            f"r_leave_one_out {r_loo.shape} and asked {jnp.shape(asked)} must be [G, K] "
            f"with G = {r_evidence.shape[0]}"
        )
    return jnp.where(jnp.asarray(asked, bool), r_evidence[:, None] - r_loo - c_q, 0.0)


def base_utilities(r_final, r_evidence, r_initial, lam):
    """Returns b_g float32 [G] = (r^F_g - r^0) + lambda [min(r^E_g, r^F_g) - r^0]; inputs [G]."""
    r_final, r_evidence, r_initial = (
        jnp.asarray(x, jnp.float32) for x in (r_final, r_evidence, r_initial)
    )
    return (r_final - r_initial) + lam * (jnp.minimum(r_evidence, r_final) - r_initial)


def stop_utilities(base, num_questions, c_s):
    """Returns u^S_g float32 [G] = b_g - c_S T_g; base, num_questions [G]."""
    return jnp.asarray(base, jnp.float32) - c_s * jnp.asarray(num_questions, jnp.float32)


def normalise_within_type(utilities, mask, eps):
    """Returns float32 advantages (u - mu) / (sigma + eps) over the masked entries of utilities
    (any shape), 0 on unmasked ones; mu, sigma: mean and population std of the masked entries.
    All-equal masked utilities (one instance included) give exactly 0."""
    u, m = jnp.asarray(utilities, jnp.float32), jnp.asarray(mask, bool)
    count = jnp.maximum(jnp.sum(m), 1)
    mean = jnp.sum(jnp.where(m, u, 0.0)) / count
    std = jnp.sqrt(jnp.sum(jnp.where(m, (u - mean) ** 2, 0.0)) / count)
    flat = jnp.max(jnp.where(m, u, -jnp.inf)) == jnp.min(jnp.where(m, u, jnp.inf))
    return jnp.where(m & ~flat, (u - mean) / jnp.where(flat, 1.0, std + eps), 0.0)


def loop_advantages(u_question, asked, u_stop, stopped, u_final, eps_norm):
    """Returns (A^Q [G, K], A^S [G], A^F [G]) for one image's G rollouts, each action type
    normalised on its own: questions over all asked (g, t), stops over the rollouts that said
    READY (a forced finalisation has no stop action: A^S 0 there), syntheses over all G."""
    return (
        normalise_within_type(u_question, asked, eps_norm),
        normalise_within_type(u_stop, stopped, eps_norm),
        normalise_within_type(u_final, jnp.ones(jnp.shape(u_final), bool), eps_norm),
    )


def group_advantages(r_initial, r_evidence, r_leave_one_out, r_final, asked, stopped, loop):
    """Returns (A^Q [G, K], A^S [G], A^F [G]) of one image's G rollouts from their G2P rewards and
    the `loop_defaults` block: the utilities above with loop.c_q, c_s, lam, normalised per type
    with loop.eps_norm. asked bool [G, K] must be a prefix of each row (questions are asked in
    order), K = loop.max_questions; a rollout that asked K questions was finalised by force and
    cannot have stopped. Raises ValueError on inconsistent inputs."""
    asked, stopped = np.asarray(asked, bool), np.asarray(stopped, bool)
    if asked.ndim != 2 or asked.shape[1] != loop.max_questions:
        raise ValueError(
            f"asked {asked.shape} must be [G, K] with K = loop.max_questions = {loop.max_questions}"
        )
    num_questions = asked.sum(-1)
    if (asked != (np.arange(asked.shape[1]) < num_questions[:, None])).any():
        raise ValueError("asked must mark the first T_g questions of each rollout")
    if (stopped & (num_questions == loop.max_questions)).any():
        raise ValueError(
            "a rollout that asked K questions was finalised by force: it has no stop action"
        )
    base = base_utilities(r_final, r_evidence, r_initial, loop.lam)
    return loop_advantages(
        question_utilities(r_evidence, r_leave_one_out, asked, loop.c_q),
        asked,
        stop_utilities(base, num_questions, loop.c_s),
        stopped,
        base,
        loop.eps_norm,
    )


def token_advantages(span_kind, span_index, adv_question, adv_stop, adv_final, stopped):
    """Returns (A^tok float32 [B, L], loss mask float32 [B, L]) of flattened Composer rollouts.

    span_kind int [B, L] (SPAN_* per token), span_index int [B, L] (the question t of a
    SPAN_QUESTION token, 0-based); adv_question [B, K], adv_stop, adv_final [B], stopped bool [B].
    Question tokens get A^Q_{g,t}, READY tokens A^S_g (only where stopped), final-caption tokens
    A^F_g; every other token has advantage 0 and mask 0.
    """
    kind, index = jnp.asarray(span_kind), jnp.asarray(span_index)
    adv_question = jnp.asarray(adv_question, jnp.float32)
    if kind.shape != index.shape or kind.ndim != 2:
        raise ValueError(f"span_kind {kind.shape} and span_index {index.shape} must both be [B, L]")
    question = kind == SPAN_QUESTION
    safe_index = jnp.clip(jnp.where(question, index, 0), 0, adv_question.shape[1] - 1)
    a_question = jnp.take_along_axis(adv_question, safe_index, axis=1)
    stop = (kind == SPAN_STOP) & jnp.asarray(stopped, bool)[:, None]
    final = kind == SPAN_FINAL
    adv = jnp.where(question, a_question, 0.0)
    adv = jnp.where(stop, jnp.asarray(adv_stop, jnp.float32)[:, None], adv)
    adv = jnp.where(final, jnp.asarray(adv_final, jnp.float32)[:, None], adv)
    return adv, (question | stop | final).astype(jnp.float32)


def loop_loss(
    logprobs,
    old_logprobs,
    token_adv,
    mask,
    *,
    clip_eps=0.2,
    clip_eps_high=None,
    kl_beta=0.0,
    ref_logprobs=None,
):
    """Returns (L_LOOP, metrics): -sum M min(rho A, clip(rho) A) / sum M + beta masked-mean k3 KL;
    [B, T] inputs (losses.grpo_loss with token advantages and aggregation "token_mean")."""
    return losses.grpo_loss(
        logprobs,
        old_logprobs,
        token_adv,
        mask,
        clip_eps=clip_eps,
        clip_eps_high=clip_eps_high,
        kl_beta=kl_beta,
        ref_logprobs=ref_logprobs,
        aggregation="token_mean",
    )


def span_layout(span_lengths):
    """Returns (span_kind int32 [L], span_index int32 [L]) of one rollout from its pieces in order:
    (kind, length) pairs, questions numbered 0, 1, .. in order of appearance."""
    kinds, indices, asked = [], [], 0
    for kind, length in span_lengths:
        if kind not in (SPAN_NONE, SPAN_QUESTION, SPAN_STOP, SPAN_FINAL) or length < 0:
            raise ValueError(f"bad span ({kind!r}, {length!r})")
        kinds += [kind] * length
        indices += [asked if kind == SPAN_QUESTION else 0] * length
        asked += kind == SPAN_QUESTION
    return np.asarray(kinds, np.int32), np.asarray(indices, np.int32)
