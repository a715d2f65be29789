"""Losses as pure functions of arrays: SFT NLL, GRPO advantages, GRPO surrogate, k3 KL.

Conventions shared by every function here:
- Position alignment: `logits[:, t]` predicts `targets[:, t]`. The caller shifts
  (`targets = input_ids[:, 1:]`, `logits = logits[:, :-1]`), so no function here shifts.
- Masks are 0/1 arrays of any dtype; only their truthiness matters.
- Log-probabilities and losses are float32 whatever the logits' dtype: bf16 has 8 bits of
  mantissa, too few for a log-sum-exp over a 151k vocabulary or for ratios exp(lp - old)
  that must resolve 1 +- 0.2.
"""

from typing import Optional

import jax
import jax.numpy as jnp

AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")


def token_logprobs(logits, targets):
    """Returns log p(targets[b, t] | logits[b, t]) as float32 [B, L]; logits [B, L, V]."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {logits.shape} and targets {targets.shape} disagree on [B, L].")
    # log_softmax gathered at the target, so no [B, L, V] log-probabilities are returned.
    # The upcast comes first: a bf16 log-sum-exp over a large vocabulary is off by ~1e-2.
    logits = logits.astype(jnp.float32)
    log_normaliser = jax.nn.logsumexp(logits, axis=-1)  # [B, L]
    target_logits = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)
    return target_logits[..., 0] - log_normaliser


def chunked_token_logprobs(hidden, targets, logits_fn, chunk: int = 0):
    """Returns token_logprobs(logits_fn(hidden), targets), float32 [B, L], chunk positions at a time.

    hidden [B, L, D] are the states whose logits_fn(h) [B, c, V] predict targets [B, L]. With
    0 < chunk < L the positions go through a lax.map of ceil(L / chunk) chunks and each chunk's
    logits are recomputed in the backward pass (jax.checkpoint), so neither the float32
    [B, L, V] logits nor their gradient is ever held: at most [B, chunk, V] of them. The values
    and gradients are those of the unchunked computation.
    """
    if hidden.shape[:2] != targets.shape:
        raise ValueError(f"hidden {hidden.shape} and targets {targets.shape} disagree on [B, L].")
    rows, length = targets.shape
    if chunk <= 0 or chunk >= length:
        return token_logprobs(logits_fn(hidden), targets)
    num = -(-length // chunk)
    pad = num * chunk - length
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(rows, num, chunk, -1).swapaxes(0, 1)
    t = jnp.pad(targets, ((0, 0), (0, pad))).reshape(rows, num, chunk).swapaxes(0, 1)
    one = jax.checkpoint(lambda ht: token_logprobs(logits_fn(ht[0]), ht[1]))
    out = jax.lax.map(one, (h, t))  # [num, B, chunk]
    return out.swapaxes(0, 1).reshape(rows, num * chunk)[:, :length]


def per_group_sums(token_nll, loss_mask, group_ids, num_groups: int):
    """Returns (nll_sums [num_groups], token_counts [num_groups]) of per-token NLLs [B, L] over
    masked tokens, float32; group_ids [B] assigns each row to a group (the SFT role), or
    [B, L] each token (packed rows hold several records).

    The mixed SFT loss is sum(nll_sums) / sum(token_counts): the per-group mean losses
    nll_sums / token_counts add up to it weighted by token counts.
    """
    mask = loss_mask.astype(jnp.float32)
    if group_ids.shape == token_nll.shape:
        return (
            jax.ops.segment_sum((token_nll * mask).ravel(), group_ids.ravel(), num_groups),
            jax.ops.segment_sum(mask.ravel(), group_ids.ravel(), num_groups),
        )
    if group_ids.shape != token_nll.shape[:1]:
        raise ValueError(
            f"group_ids {group_ids.shape} must be [B] or [B, L] for tokens {token_nll.shape}."
        )
    row_nll = jnp.sum(token_nll * mask, axis=-1)  # [B]
    row_count = jnp.sum(mask, axis=-1)  # [B]
    nll_sums = jax.ops.segment_sum(row_nll, group_ids, num_segments=num_groups)
    token_counts = jax.ops.segment_sum(row_count, group_ids, num_segments=num_groups)
    return nll_sums, token_counts


def grpo_advantages(rewards, eps: float = 1e-6):
    """Returns (r - mean) / (std + eps) per group, float32 [G, N]; rewards [G, N].

    std is the population std (ddof=0): it is defined for any N >= 1 (the sample std of one
    rollout is NaN) and it is what makes a group's advantages have unit variance. TRL and
    verl use the sample std; the two differ by sqrt(N / (N - 1)) (1.03 at N = 16), a global
    rescale of the advantages that the optimiser's learning rate absorbs. A group whose
    rewards are all equal gets advantages exactly 0 (no gradient), also for eps = 0 and when
    rounding in the mean leaves a tiny nonzero std.
    """
    rewards = rewards.astype(jnp.float32)
    flat = zero_variance_groups(rewards)[:, None]  # [G, 1]
    mean = jnp.mean(rewards, axis=-1, keepdims=True)
    std = jnp.std(rewards, axis=-1, keepdims=True)
    return jnp.where(flat, 0.0, (rewards - mean) / jnp.where(flat, 1.0, std + eps))


def zero_variance_groups(rewards):
    """Returns a bool [G] mask of groups whose N rewards are all equal; rewards [G, N]."""
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [G, N], got shape {rewards.shape}.")
    return jnp.max(rewards, axis=-1) == jnp.min(rewards, axis=-1)


def k3_kl(logprobs, ref_logprobs):
    """Returns the k3 estimator of KL(pi || ref) per token, float32 [B, T]: e^d - d - 1, d = ref - lp."""
    log_ratio = ref_logprobs.astype(jnp.float32) - logprobs.astype(jnp.float32)
    return jnp.exp(log_ratio) - log_ratio - 1.0


def _masked_mean(values, mask):
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _aggregate(per_token, mask, aggregation):
    """Reduces per-token losses [B, T] to a scalar as GRPO, DAPO or Dr. GRPO do."""
    if aggregation == "seq_mean_token_mean":
        # GRPO: 1/G sum_i 1/|o_i| sum_t. Rows without a valid token (padding rows) are left
        # out of the outer mean rather than diluting it.
        row_tokens = jnp.sum(mask, axis=-1)  # [B]
        row_means = jnp.sum(per_token * mask, axis=-1) / jnp.maximum(row_tokens, 1.0)
        row_valid = (row_tokens > 0).astype(jnp.float32)
        return jnp.sum(row_means * row_valid) / jnp.maximum(jnp.sum(row_valid), 1.0)
    if aggregation == "token_mean":
        return _masked_mean(per_token, mask)
    if aggregation == "seq_mean_token_sum_norm":
        # Dr. GRPO: a constant normaliser (batch x max length T) so a sequence's weight does not
        # depend on its length; T is the padded generation length, i.e. max_new_tokens.
        return jnp.sum(per_token * mask) / (mask.shape[0] * mask.shape[1])
    raise ValueError(f"Unknown aggregation {aggregation!r}; expected one of {AGGREGATIONS}.")


def grpo_loss(
    logprobs,
    old_logprobs,
    advantages,
    mask,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: Optional[float] = None,
    kl_beta: float = 0.0,
    ref_logprobs=None,
    aggregation: str = "seq_mean_token_mean",
):
    """Returns (clipped-surrogate GRPO loss to minimise, metrics); [B, T] inputs, advantages [B]
    (one per sequence, broadcast over its tokens) or [B, T] (one per token, e.g. LOOP-GRPO's
    span-aligned advantages in mocojax.loop_grpo).

    Per token: -min(rho A, clip(rho, 1 - clip_eps, 1 + clip_eps_high) A) + kl_beta k3(lp, ref)
    with rho = exp(logprobs - old_logprobs); clip_eps_high defaults to clip_eps (DAPO's
    clip-higher sets it larger). Only `logprobs` should carry gradients.

    metrics (float32 scalars over valid tokens): "loss", "pg_loss", "clip_frac_low" (A < 0 and
    rho < 1 - clip_eps: the clip zeroes the gradient), "clip_frac_high" (A > 0 and
    rho > 1 + clip_eps_high), "ratio_mean", "ratio_min", "ratio_max", and "kl" when
    ref_logprobs is given (it is reported even when kl_beta = 0).

    Long because the docstring and the argument checks (aggregation, shapes, clip and KL settings)
    take about half of it; the loss is the dozen lines after them, and the metrics reuse its ratio,
    advantages and mask, so they stay in the same function.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"Unknown aggregation {aggregation!r}; expected one of {AGGREGATIONS}.")
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {logprobs.shape}.")
    named = {"old_logprobs": old_logprobs, "mask": mask}
    if ref_logprobs is not None:
        named["ref_logprobs"] = ref_logprobs
    for name, array in named.items():
        if array.shape != logprobs.shape:
            raise ValueError(f"{name} {array.shape} must match logprobs {logprobs.shape}.")
    if advantages.shape not in (logprobs.shape[:1], logprobs.shape):
        raise ValueError(
            f"advantages {advantages.shape} must be [B] = {logprobs.shape[:1]} or "
            f"[B, T] = {logprobs.shape}."
        )
    clip_eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not (0.0 <= clip_eps < 1.0 and clip_eps_high >= 0.0):
        raise ValueError(
            f"Need 0 <= clip_eps < 1 and clip_eps_high >= 0, got {clip_eps}, {clip_eps_high}."
        )
    if kl_beta < 0.0:
        raise ValueError(f"kl_beta must be >= 0, got {kl_beta}.")
    if kl_beta > 0.0 and ref_logprobs is None:
        raise ValueError("kl_beta > 0 needs ref_logprobs.")

    mask = mask.astype(jnp.float32)
    logprobs = logprobs.astype(jnp.float32)
    advantages = advantages.astype(jnp.float32)
    advantages = advantages[:, None] if advantages.ndim == 1 else advantages  # [B, 1] or [B, T]
    ratio = jnp.exp(logprobs - old_logprobs.astype(jnp.float32))  # [B, T]
    clipped_ratio = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps_high)
    per_token = -jnp.minimum(ratio * advantages, clipped_ratio * advantages)
    pg_loss = _aggregate(per_token, mask, aggregation)
    loss = pg_loss

    metrics = {"pg_loss": pg_loss}
    if ref_logprobs is not None:
        kl = k3_kl(logprobs, ref_logprobs)
        metrics["kl"] = _masked_mean(kl, mask)
        if kl_beta > 0.0:
            loss = loss + kl_beta * _aggregate(kl, mask, aggregation)

    valid = mask > 0
    any_valid = jnp.any(valid)
    ratio = jax.lax.stop_gradient(ratio)
    metrics.update(
        loss=loss,
        clip_frac_low=_masked_mean(((advantages < 0) & (ratio < 1.0 - clip_eps)), mask),
        clip_frac_high=_masked_mean(((advantages > 0) & (ratio > 1.0 + clip_eps_high)), mask),
        ratio_mean=_masked_mean(ratio, mask),
        # An all-masked batch reports ratio 1 rather than +-inf.
        ratio_min=jnp.where(any_valid, jnp.min(jnp.where(valid, ratio, jnp.inf)), 1.0),
        ratio_max=jnp.where(any_valid, jnp.max(jnp.where(valid, ratio, -jnp.inf)), 1.0),
    )
    return loss, metrics
