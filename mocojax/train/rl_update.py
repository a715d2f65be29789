"""The GRPO update of the RL stage: the batch it trains on (`train_batch` from a rollout and its
`advantages`, laid out on the mesh by `place_batch`, per-micro-batch `micro_weights`) and the
jitted update itself (`grpo_step`, built by `make_grpo_step`). Split from mocojax/train/rl.py,
which re-exports these names; `run_rl` there calls them through its own module, so patching
`rl.train_batch` / `rl.make_grpo_step` still reaches the loop."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from mocojax import losses, momentum, sampling
from mocojax.model.rope import pad_vision_metadata
from mocojax.train import step as step_lib


def _pad_prompt(prompt, length, patches, row_len):
    """Returns a sampling.Prompt left-padded to `length` tokens and `patches` image patches
    (vision attention packed in rows of `row_len` slots, so micro-batches stack)."""
    extra = length - prompt.input_ids.shape[1]
    left = lambda x, axis: np.pad(x, [(extra, 0) if a == axis else (0, 0) for a in range(x.ndim)])
    pixel_values = np.pad(
        prompt.pixel_values, ((0, patches - prompt.pixel_values.shape[0]), (0, 0))
    )
    return dataclasses.replace(
        prompt,
        input_ids=left(prompt.input_ids, 1),
        attention_mask=left(prompt.attention_mask, 1),
        positions=left(prompt.positions, 2),
        pixel_values=pixel_values,
        vision=pad_vision_metadata(prompt.vision, patches, row_len),
    )


def train_batch(cfg, rollout, rl, advantages):
    """Returns the GRPO batch of a Rollout, stacked on a leading micro-batch axis [A] (numpy).

    advantages [G, N] (`advantages`, zero for groups without signal). Micro-batch a holds G / A
    whole groups: "prompt" a sampling.Prompt of their images and Policy prompts (each encoded
    once for its N captions), and for their b = G / A * N captions of T tokens (T =
    `update_length`: the longest caption, rounded up to rl.update_length_multiple): "completion",
    "old_logprobs", "mask" [A, b, T] (zero rows for groups without signal) and "advantages"
    [A, b]. "weight" [A] makes sum_a weight_a * loss_a the loss of the whole batch.
    """
    prompt = rollout.prompt
    num_groups = len(rollout.ids)
    # Dr. GRPO's normaliser is the padded length itself (losses.grpo_loss): its axis stays whole
    multiple = (
        0 if rl.aggregation == FIXED_LENGTH_AGGREGATION else rl.get("update_length_multiple", 0)
    )
    num_new = update_length(rollout.lengths, rollout.tokens.shape[1], multiple)
    grid = np.asarray(prompt["image_grid_thw"]).reshape(-1, 3)
    if grid.shape[0] != num_groups:
        raise ValueError(
            f"expected one image per Policy prompt, got {grid.shape[0]} for {num_groups} prompts"
        )
    spans = step_lib.split_images(grid, np.ones(num_groups, np.int64), rl.grad_accum_steps)
    per_micro = num_groups // rl.grad_accum_steps
    prompts = []
    for a, (sub_grid, patches) in enumerate(spans):
        groups = slice(a * per_micro, (a + 1) * per_micro)
        prompts.append(
            sampling.prepare_prompt(
                cfg,
                prompt["input_ids"][groups],
                prompt["attention_mask"][groups],
                prompt["pixel_values"][patches],
                sub_grid,
                reserve=num_new,
            )
        )
    length = max(p.input_ids.shape[1] for p in prompts)
    patches = max(p.pixel_values.shape[0] for p in prompts)
    row_len = max(p.vision.row_len for p in prompts)
    prompts = [_pad_prompt(p, length, patches, row_len) for p in prompts]

    signal = np.repeat(rollout.has_signal, rl.num_samples)  # [G*N]
    mask = rollout.completion_mask[:, :num_new] * signal[:, None]
    rows = (rl.grad_accum_steps, -1)
    batch = {
        "prompt": step_lib.stack(prompts),
        "completion": rollout.tokens[:, :num_new].astype(np.int32).reshape(*rows, num_new),
        "old_logprobs": rollout.logprobs[:, :num_new].reshape(*rows, num_new),
        "mask": mask.reshape(*rows, num_new),
        "advantages": np.asarray(advantages, np.float32).reshape(rows),
    }
    batch["weight"] = micro_weights(batch["mask"], rl.aggregation)
    return batch


# The aggregation whose loss divides by the padded caption axis (B x T), so T must not vary.
FIXED_LENGTH_AGGREGATION = "seq_mean_token_sum_norm"


def update_length(lengths, max_new_tokens, multiple):
    """Returns the update's caption axis: the longest of `lengths` (tokens per caption, EOS
    included) rounded up to a multiple of `multiple`, at most max_new_tokens (all of it when
    multiple is 0). Positions past every caption's end are padding, masked out of the loss, and a
    caption's logprobs see only its own earlier tokens, so trimming them changes no number the
    loss uses; it only stops the gradient step computing them (a toy update on 32 tokens instead
    of 64 takes 0.56x the time, but each width compiles once: docs/performance.md)."""
    if not multiple:
        return max_new_tokens
    longest = max(int(np.max(lengths, initial=0)), 1)
    return min(max_new_tokens, -(-longest // multiple) * multiple)


def advantages(rollout, rl):
    """Returns GRPO's group-normalised advantages float32 [G, N] of the rollout's rewards, zero in
    groups without signal (`rollout.has_signal`: a rubric that did not parse, or equal rewards)."""
    adv = np.asarray(losses.grpo_advantages(rollout.rewards, rl.adv_eps))
    return (adv * rollout.has_signal[:, None]).astype(np.float32)


# Row dims of the update's batch (after the micro-batch axis); None: replicated.
BATCH_DIMS = {"completion": 1, "old_logprobs": 1, "mask": 1, "advantages": 1, "weight": None}


def place_batch(mesh, batch):
    """Returns a `train_batch` batch as global arrays on `mesh`: rows (dim 1, after the micro-batch
    axis) over the data axes where they divide, else replicated; weights and patches replicated."""
    out = step_lib.place_batch(
        mesh, {k: v for k, v in batch.items() if k != "prompt"}, BATCH_DIMS, strict=False
    )
    out["prompt"] = sampling.place_prompt(mesh, batch["prompt"], stacked=True)
    return out


def micro_weights(mask, aggregation):
    """Returns float32 [A]: micro-batch weights so sum_a w_a loss_a is the full batch's loss.

    mask [A, b, T]. GRPO's mean over sequences weighs a micro-batch by its sequences with a
    valid token, DAPO's token mean by its tokens, Dr. GRPO's constant normaliser by 1 / A.
    """
    if aggregation == "seq_mean_token_mean":
        counts = (mask.sum(-1) > 0).sum(-1)
    elif aggregation == "token_mean":
        counts = mask.sum((1, 2))
    else:
        counts = np.ones(mask.shape[0]) * (mask.sum() > 0)
    return (counts / max(counts.sum(), 1)).astype(np.float32)


def completion_logprobs(cfg, params, micro, num_samples):
    """Returns log pi(caption token) float32 [b, T] of one micro-batch (0 at padding)."""
    return sampling.completion_logprobs(
        cfg,
        params,
        micro["prompt"],
        micro["completion"],
        micro["mask"] > 0,
        num_samples=num_samples,
    )


_METRIC_KEYS = ("pg_loss", "clip_frac_low", "clip_frac_high", "ratio_mean")


def grpo_step(
    cfg, optimizer, loss_kwargs, num_samples, state, batch, ref_params=None, grads_sharding=None
):
    """Returns (new train state, metrics) after one GRPO update of the Policy params.

    state: {"params", "opt_state", "step", "rng"}; batch from `train_batch`. Gradients are
    summed over the [A] micro-batches with their weights; with no valid row at all (no group
    has signal) the update is skipped. ref_params (the initial Policy) feed the k3 KL when
    kl_beta > 0. grads_sharding: the params' shardings (see step.accumulate).
    """
    params = state["params"]
    keys = _METRIC_KEYS + (("kl",) if ref_params is not None else ())

    def micro_loss(p, micro):
        logprobs = completion_logprobs(cfg, p, micro, num_samples)
        ref = None
        if ref_params is not None:
            ref = jax.lax.stop_gradient(completion_logprobs(cfg, ref_params, micro, num_samples))
        loss, metrics = losses.grpo_loss(
            logprobs,
            micro["old_logprobs"],
            micro["advantages"],
            micro["mask"],
            ref_logprobs=ref,
            **loss_kwargs,
        )
        return loss * micro["weight"], {k: micro["weight"] * metrics[k] for k in keys}

    grads, (loss, metric_sums) = step_lib.accumulate(
        micro_loss, params, batch, grads_sharding=grads_sharding
    )
    has_signal = jnp.sum(batch["weight"]) > 0
    new_state, update_metrics = step_lib.update(
        state, grads, optimizer, loss, has_signal=has_signal
    )
    metrics = {
        "loss": loss,
        **metric_sums,
        **update_metrics,
        "no_signal_skipped": 1 - has_signal.astype(jnp.int32),
        "update_norm": momentum.tree_distance(new_state["params"], params),
    }
    return new_state, metrics


def make_grpo_step(cfg, optimizer, rl, state_shardings=None, mesh=None):
    """Returns the jitted GRPO step (train state donated); with state_shardings (and its mesh)
    the new state keeps them, the gradient carry is pinned to the params' and the metrics
    come back replicated."""
    loss_kwargs = dict(
        clip_eps=rl.clip_eps,
        clip_eps_high=rl.clip_eps_high,
        kl_beta=rl.kl_beta,
        aggregation=rl.aggregation,
    )
    grads_sharding = None if state_shardings is None else state_shardings["params"]
    step = functools.partial(
        grpo_step, cfg, optimizer, loss_kwargs, rl.num_samples, grads_sharding=grads_sharding
    )
    return step_lib.jit_step(step, state_shardings, mesh)
