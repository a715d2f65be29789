"""The rows of the memory plan: Row (one compiled program's per-device bytes) and the builders that
lower and compile the trainers' real programs on abstract inputs (`_sft_row`, `_grpo_row`,
`_sampler_rows`) with their analytic estimates. Split from mocojax/plan.py, which re-exports these
names and fakes the CPU devices before this module (and jax) is imported."""

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mocojax import sampling, sharding
from mocojax.model.rope import vision_metadata
from mocojax.train import (
    sft,
    state as state_lib,
    step as step_lib,
)


# ------------------------------------------------------------------------------------------ plan
@dataclasses.dataclass
class Row:
    """One compiled program: per-device bytes from XLA and from the analytic estimate."""

    name: str
    shape: str
    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    analytic: dict
    compile_s: float
    beside: int = 0  # bytes the trainer keeps on the device outside the program's arguments

    @property
    def peak(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.beside


def _sds(shape, dtype, sharding_):
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=sharding_)


def _compile(jitted, *args, **kwargs):
    """Returns (XLA's memory analysis, compile seconds) of a jitted function on abstract arguments."""
    t0 = time.perf_counter()
    compiled = jitted.lower(*args, **kwargs).compile()
    return compiled.memory_analysis(), time.perf_counter() - t0


def _activation_estimate(cfg, rows, length, tensor):
    """Returns per-device bytes of the training activations of one micro-batch (remat on)."""
    t, c = cfg.text, jnp.dtype(cfg.dtype).itemsize
    tokens = rows * length
    saved = t.num_hidden_layers * tokens * t.hidden_size * c  # one layer input per layer (remat)
    proj = (
        t.num_attention_heads + 2 * t.num_key_value_heads
    ) * t.head_dim + 3 * t.intermediate_size
    layer = (
        tokens * (4 * t.hidden_size + proj // tensor) * c
    )  # one layer recomputed in the backward pass
    scores = (
        2 * rows * (t.num_attention_heads // tensor) * length * length * 4
    )  # XLA attention: scores + probs, f32
    # float32 logits, log-softmax and their gradient: of every position, or of one chunk at a time
    logit_positions = rows * min(cfg.logits_chunk, length) if cfg.logits_chunk else tokens
    logits = 3 * logit_positions * t.vocab_size // tensor * 4
    return saved + layer + scores + logits


def _vision_inputs(cfg, mesh, rows, image_patches, lead=()):
    """Returns abstract (pixel_values [*lead, P, patch_dim], VisionMeta) of `rows` square images of
    image_patches patches each, laid out (and replicated) as the trainers feed them; image_patches=0
    gives one inert padding patch (SFT batches without images keep P >= 1)."""
    side = int(round(image_patches**0.5))
    if side * side != image_patches or side % cfg.vision.spatial_merge_size:
        raise ValueError(
            f"--image-patches={image_patches} must be a square of a multiple of {cfg.vision.spatial_merge_size}"
        )
    grid = np.array([[1, side, side]] * rows if image_patches else np.zeros((0, 3), np.int64))
    total = max(rows * image_patches, 1)
    meta = vision_metadata(cfg.vision, grid, pad_to=total)
    whole = sharding.replicated(mesh)
    pixels = _sds(
        (*lead, total, cfg.vision.patch_dim), jnp.float32, whole
    )  # host float32, as processed
    return pixels, jax.tree.map(lambda x: _sds((*lead, *x.shape), x.dtype, whole), meta)


def _vision_estimate(cfg, patches, row_len, ways, *, training=True):
    """Returns per-device bytes of the vision tower's activations over `patches` patches: the packed
    layout (2 * ceil(P / R) rows of R slots) split `ways` ways by rows; training (remat on) saves
    every block's input and recomputes one block, inference holds one block."""
    v, c = cfg.vision, jnp.dtype(cfg.dtype).itemsize
    slots = 2 * -(-patches // row_len) * row_len // ways
    saved = v.depth * slots * v.hidden_size * c if training else 0
    block = slots * (6 * v.hidden_size + 2 * v.intermediate_size) * c
    scores = 2 * slots * v.num_heads * row_len * 4
    return saved + block + scores


def _optimizer(lr):
    """Returns the trainers' optimiser (`state.make_optimizer`: clipping, then AdamW on the schedule)."""
    opt = ml_collections.ConfigDict(
        dict(
            lr=lr,
            warmup_ratio=0.05,
            end_lr_ratio=0.1,
            b1=0.9,
            b2=0.999,
            eps=1e-8,
            weight_decay=0.0,
            grad_clip_norm=1.0,
        )
    )
    return state_lib.make_optimizer(opt, total_steps=1000)


def _train_state(cfg, mesh, optimizer, rules):
    """Returns (abstract train state {"params", "opt_state", "step", "rng"} on its shardings, the shardings)."""
    state_sh = sharding.train_state_shardings(cfg, mesh, optimizer, rules, with_momentum=False)
    return step_lib.abstract_state(cfg, optimizer, state_sh), state_sh


def _sft_row(cfg, mesh, rules, optimizer, held, *, global_rows, accum, length, image_patches):
    """Returns the Row of the SFT trainer's jitted step (`sft.make_train_step`) on a batch laid out
    as `sft.micro_batches` + `sft.device_batch` lay it out (rows on dim 1 after the micro-batch axis)."""
    state, state_sh = _train_state(cfg, mesh, optimizer, rules)
    micro = global_rows // accum
    rows = lambda shape, dim: _sds(
        shape, jnp.int32, sharding.batch_sharding(mesh, shape, dim, rules)
    )
    batch = {
        k: rows((accum, micro, length), 1) for k in ("input_ids", "attention_mask", "loss_mask")
    }
    batch["role"] = rows((accum, micro), 1)
    batch["positions"] = rows((accum, 3, micro, length), 2)
    data_ways, tensor = sharding.batch_ways(mesh, rules), mesh.shape.get("tensor", 1)
    analytic = {
        "params": held["params"],
        "grads": held["params"],
        "adam": held["adam"],
        "activations": _activation_estimate(cfg, micro // data_ways, length, tensor),
    }
    # micro_batches always gives the step P >= 1 patch slots (host float32), even without images.
    pixel_values, vision = _vision_inputs(cfg, mesh, micro, image_patches, (accum,))
    batch["pixel_values"], batch["vision"] = pixel_values, vision
    if image_patches:
        analytic["vision"] = _vision_estimate(cfg, micro * image_patches, vision.row_len, data_ways)
    step = sft.make_train_step(cfg, optimizer, mesh, state_sh)
    mem, secs = _compile(step, state, batch)
    images = f", {image_patches} patches/row" if image_patches else ""
    return Row(
        "SFT step (sft.train_step)",
        f"{global_rows} rows x {length} tok{images}, {accum} micro",
        mem.argument_size_in_bytes,
        mem.output_size_in_bytes,
        mem.alias_size_in_bytes,
        mem.temp_size_in_bytes,
        analytic,
        secs,
    )


def _grpo_row(
    cfg,
    mesh,
    rules,
    optimizer,
    held,
    *,
    images,
    accum,
    num_samples,
    prompt_length,
    new_tokens,
    image_patches,
):
    """Returns the Row of the RL trainer's jitted update (`rl.make_grpo_step`) on a batch laid out
    as `rl.train_batch` + `rl.place_batch` lay it out: each micro-batch's prompts encoded once and
    their cache repeated for the N captions (`sampling.completion_logprobs`).

    Long because the step's abstract batch (prompt, completion, logprobs, mask, advantages, weight,
    with their shardings), its compile and the analytic estimate beside the measured bytes all come
    from the same shapes; split, those shapes would be recomputed or passed around.
    """
    from mocojax.train import (
        rl as rl_lib,  # the trainer pulls in the data pipeline; only this row needs it
    )

    state, state_sh = _train_state(cfg, mesh, optimizer, rules)
    groups = images // accum
    captions = groups * num_samples
    rows = lambda shape, dim, dtype=jnp.int32: _sds(
        shape, dtype, sharding.batch_sharding(mesh, shape, dim, rules, strict=False)
    )
    pixel_values, vision = (
        _vision_inputs(cfg, mesh, groups, image_patches, (accum,))
        if image_patches
        else (None, None)
    )
    prompt = sampling.Prompt(
        rows((accum, groups, prompt_length), 1),
        rows((accum, groups, prompt_length), 1),
        rows((accum, 3, groups, prompt_length), 2),
        rows((accum, groups), 1),
        pixel_values,
        vision,
    )
    batch = {
        "prompt": prompt,
        "completion": rows((accum, captions, new_tokens), 1),
        "old_logprobs": rows((accum, captions, new_tokens), 1, jnp.float32),
        "mask": rows((accum, captions, new_tokens), 1),
        "advantages": rows((accum, captions), 1, jnp.float32),
        "weight": _sds((accum,), jnp.float32, sharding.replicated(mesh)),
    }
    settings = _Settings(
        clip_eps=0.2,
        clip_eps_high=0.2,
        kl_beta=0.0,
        aggregation="seq_mean_token_mean",
        num_samples=num_samples,
    )
    step = rl_lib.make_grpo_step(cfg, optimizer, settings, state_sh, mesh)
    mem, secs = _compile(step, state, batch, None)
    data_ways = sharding.batch_ways(mesh, rules)
    tensor = mesh.shape.get("tensor", 1)
    # Per device: the captions' rows (prompt cache repeated N times, then the caption tokens).
    per_device = -(-captions // data_ways)
    analytic = {
        "params": held["params"],
        "grads": held["params"],
        "adam": held["adam"],
        "activations": _activation_estimate(cfg, per_device, new_tokens, tensor)
        + _activation_estimate(cfg, groups, prompt_length, tensor),
    }
    if image_patches:
        analytic["vision"] = _vision_estimate(
            cfg, groups * image_patches, vision.row_len, data_ways
        )
    images_note = f", {image_patches} patches each" if image_patches else ""
    # The momentum copy is not an argument of the step but stays on the device beside it.
    return Row(
        "RL update (rl.grpo_step)",
        f"{images} images x {num_samples} captions x {new_tokens} tok after {prompt_length}-tok prompts"
        f"{images_note}, {accum} micro",
        mem.argument_size_in_bytes,
        mem.output_size_in_bytes,
        mem.alias_size_in_bytes,
        mem.temp_size_in_bytes,
        analytic,
        secs,
        beside=held["momentum"],
    )


@dataclasses.dataclass(frozen=True)
class _Settings:
    """The `rl` config fields make_grpo_step reads."""

    clip_eps: float
    clip_eps_high: float
    kl_beta: float
    aggregation: str
    num_samples: int


def _sampler_rows(
    cfg, mesh, rules, params, held, *, rows, cache_length, prompt_length, num_samples, image_patches
):
    """Returns the Rows of the sampler's jitted prefill (`sampling.prefill`: the rows / N prompts of
    one call, one image each, encoded once and their cache repeated N times) and its jitted decode
    loop (`sampling.decode`, the cache donated) over the rest of the cache.

    Long because the decode row is built from the prefill's outputs: the abstract cache and prefix
    from `jax.eval_shape` of `prefill_core` give the decode loop's inputs and their shardings, so
    the two rows are built in sequence in one function.
    """
    data_ways = sharding.batch_ways(mesh, rules)
    tensor = mesh.shape.get("tensor", 1)
    prompts = max(rows // num_samples, 1)
    reserve = cache_length - prompt_length
    prompt_rows = lambda shape, dim: _sds(
        shape, jnp.int32, sharding.batch_sharding(mesh, shape, dim, rules, strict=False)
    )
    pixel_values, vision = (
        _vision_inputs(cfg, mesh, prompts, image_patches) if image_patches else (None, None)
    )
    prompt = sampling.Prompt(
        prompt_rows((prompts, prompt_length), 0),
        prompt_rows((prompts, prompt_length), 0),
        prompt_rows((3, prompts, prompt_length), 1),
        prompt_rows((prompts,), 0),
        pixel_values,
        vision,
    )
    mem, secs = _compile(
        sampling.prefill_jit, cfg, params, prompt, reserve=reserve, num_samples=num_samples
    )
    prefix = jax.eval_shape(
        functools.partial(sampling.prefill_core, cfg, reserve=reserve, num_samples=num_samples),
        params,
        prompt,
    )
    cache_sh = sharding.kv_cache_shardings(mesh, prefix.cache["k"].shape, rules)
    cache_bytes = sharding.per_device_bytes(prefix.cache, cache_sh)
    shared_cache = None
    if prefix.shared_cache is not None:  # cfg.shared_prompt_cache: the prompts' cache, once
        shared_sh = sharding.kv_cache_shardings(mesh, prefix.shared_cache["k"].shape, rules)
        cache_bytes += sharding.per_device_bytes(prefix.shared_cache, shared_sh)
        shared_cache = {
            k: _sds(v.shape, v.dtype, shared_sh[k]) for k, v in prefix.shared_cache.items()
        }
    images = f", {image_patches} patches each" if image_patches else ""
    prefill_analytic = {"params": held["params"], "kv_cache": cache_bytes}
    if image_patches:
        prefill_analytic["vision"] = _vision_estimate(
            cfg, prompts * image_patches, vision.row_len, data_ways, training=False
        )
    # During RL the sampler runs while the trainer holds Adam's moments and the momentum copy.
    beside = held["adam"] + held["momentum"]
    out = [
        Row(
            "sampler prefill",
            f"{prompts} prompts x {prompt_length} tok{images}, x{num_samples} samples",
            mem.argument_size_in_bytes,
            mem.output_size_in_bytes,
            mem.alias_size_in_bytes,
            mem.temp_size_in_bytes,
            prefill_analytic,
            secs,
            beside=beside,
        )
    ]

    rows_of = lambda x, dtype=None: _sds(
        x.shape, dtype or x.dtype, sharding.batch_sharding(mesh, x.shape, 0, rules, strict=False)
    )
    cache = {k: _sds(v.shape, v.dtype, cache_sh[k]) for k, v in prefix.cache.items()}
    prefix = sampling.Prefix(
        None,
        rows_of(prefix.key_valid),
        rows_of(prefix.next_position),
        rows_of(prefix.last_logits),
        prefix.next_slot,
        shared_cache,
        None if prefix.shared_valid is None else rows_of(prefix.shared_valid),
    )
    sampler = sampling.Sampler(max_new_tokens=reserve, temperature=1.0)
    rng = jax.eval_shape(lambda: jax.random.key(0))
    rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=sharding.replicated(mesh))
    mem, secs = _compile(sampling.decode_jit, cfg, cache, params, prefix, rng, sampler=sampler)
    total = prompts * num_samples
    out.append(
        Row(
            "sampler decode loop",
            f"{total} rows, cache {cache_length}, {reserve} new tokens",
            mem.argument_size_in_bytes,
            mem.output_size_in_bytes,
            mem.alias_size_in_bytes,
            mem.temp_size_in_bytes,
            {
                "params": held["params"],
                "kv_cache": cache_bytes,
                "logits": total // data_ways * cfg.text.vocab_size // tensor * 4 * 2,
            },
            secs,
            beside=beside,
        )
    )
    return out
