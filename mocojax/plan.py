"""Memory and compile plan: compiles the trainers' real programs (the SFT train step, the GRPO
update, the sampler's prefill and decode loop) for a preset on a mesh of fake devices, and
reports per-device bytes next to an analytic estimate.

  python -m mocojax.plan --preset 8b --mesh fsdp=8 --hbm-gb 80

Run as a program it fakes `--devices` CPU devices (default: the mesh's size) before jax is
imported; nothing is allocated, every array is a ShapeDtypeStruct. Like MaxText's
train_compile.py it never compiles a stand-in: `sft.make_train_step`, `rl.make_grpo_step` and
`sampling`'s jitted prefill / decode are lowered on batches laid out as the trainers lay them out.
"""

import os
import sys


def fake_device_count(argv) -> int:
    """Returns the CPU devices to fake for a command line: --devices, else the product of the
    --mesh sizes (default fsdp=8); both flags read in the --flag=value and --flag value forms."""

    def flag(name):
        for i, arg in enumerate(argv):
            if arg.startswith(f"--{name}="):
                return arg.split("=", 1)[1]
            if arg == f"--{name}" and i + 1 < len(argv):
                return argv[i + 1]
        return None

    if flag("devices") is not None:
        return int(flag("devices"))
    count = 1
    for item in filter(None, (s.strip() for s in (flag("mesh") or "fsdp=8").split(","))):
        count *= max(1, int(item.split("=")[1]))
    return count


if __name__ == "__main__" and "jax" not in sys.modules:
    # Fake devices must be requested before jax initialises its backends.
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={fake_device_count(sys.argv[1:])}"
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from mocojax import model, sampling, sharding  # noqa: E402
from mocojax.model.rope import vision_metadata  # noqa: E402
from mocojax.train import (  # noqa: E402
    sft,
    state as state_lib,
    step as step_lib,
)

GB = 1e9


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


def plan(
    cfg,
    mesh,
    rules,
    *,
    sft_global_batch,
    rl_accum,
    length,
    decode_rows_per_device,
    cache_length,
    image_patches=0,
    prompt_length=1024,
    num_samples=16,
    rl_images=8,
    rl_new_tokens=512,
    lr=1e-5,
):
    """Returns a list of Rows for the SFT step, the RL update, the sampler's prefill and decode loop of cfg on mesh.

    image_patches > 0 gives every training row and every prompt one square image of that many
    patches (its image tokens count in `length`); 0 leaves the vision tower out. rl_new_tokens > 0
    adds the RL update (`train.rl.grpo_step`) on rl_images groups of num_samples captions of
    rl_new_tokens tokens after prompts of prompt_length tokens.

    Long only in lines: the three builders' calls are written one argument per line by ruff format;
    it computes the bytes held beside every program (params, Adam's moments, the momentum copy) once
    and passes them to each.
    """
    optimizer = _optimizer(lr)
    state, state_sh = _train_state(cfg, mesh, optimizer, rules)
    momentum_copy = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), state["params"]
    )
    held = {
        "params": sharding.per_device_bytes(state["params"], state_sh["params"]),
        "adam": sharding.per_device_bytes(state["opt_state"], state_sh["opt_state"]),
        "momentum": sharding.per_device_bytes(momentum_copy, state_sh["params"]),
    }
    rows = [
        _sft_row(
            cfg,
            mesh,
            rules,
            optimizer,
            held,
            global_rows=sft_global_batch,
            accum=1,
            length=length,
            image_patches=image_patches,
        )
    ]
    if rl_new_tokens:
        rows.append(
            _grpo_row(
                cfg,
                mesh,
                rules,
                optimizer,
                held,
                images=rl_images,
                accum=rl_accum,
                num_samples=num_samples,
                prompt_length=prompt_length,
                new_tokens=rl_new_tokens,
                image_patches=image_patches,
            )
        )
    rows += _sampler_rows(
        cfg,
        mesh,
        rules,
        state["params"],
        held,
        rows=decode_rows_per_device * sharding.batch_ways(mesh, rules),
        cache_length=cache_length,
        prompt_length=prompt_length,
        num_samples=num_samples,
        image_patches=image_patches,
    )
    return rows


def table(rows, hbm_bytes) -> str:
    """Returns a markdown table of rows with a fits / does-not-fit verdict against hbm_bytes per device."""
    lines = [
        "| program | shape | args GB | outputs GB | aliased GB | temps GB | held beside GB | peak GB | analytic GB (parts) | verdict | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        analytic = {**r.analytic, **({"held beside": r.beside} if r.beside else {})}
        parts = ", ".join(f"{k} {v / GB:.1f}" for k, v in analytic.items())
        verdict = "fits" if r.peak <= hbm_bytes else "does not fit"
        lines.append(
            f"| {r.name} | {r.shape} | {r.arguments / GB:.1f} | {r.outputs / GB:.1f} | {r.aliased / GB:.1f} | "
            f"{r.temporaries / GB:.1f} | {r.beside / GB:.1f} | {r.peak / GB:.1f} | {sum(analytic.values()) / GB:.1f} ({parts}) | {verdict} | {r.compile_s:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    """Prints the plan table for the preset and mesh on the command line (argv None: sys.argv).

    Long because of the argparse declarations (18 flags, most one argument per line as ruff formats
    them; --devices is read before jax is imported, by `fake_device_count`), followed by the config,
    mesh and `plan` call built from them.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="8b", help="2b, 4b, 8b, 32b or tiny")
    parser.add_argument(
        "--mesh", default="fsdp=8", help="e.g. fsdp=8 or fsdp=4,tensor=2 (sizes; -1 = the rest)"
    )
    parser.add_argument(
        "--devices", type=int, default=None, help="fake devices (default: the mesh's size)"
    )
    parser.add_argument("--hbm-gb", type=float, default=80.0, help="memory per device")
    parser.add_argument("--param-dtype", default="float32")
    parser.add_argument("--dtype", default="bfloat16", help="compute dtype")
    parser.add_argument("--no-remat", action="store_true")
    parser.add_argument(
        "--logits-chunk",
        type=int,
        default=512,
        help="positions per chunk of the training log-softmax (0: all at once)",
    )
    parser.add_argument(
        "--length", type=int, default=2048, help="tokens per training row (image tokens included)"
    )
    parser.add_argument("--sft-global-batch", type=int, default=64)
    parser.add_argument("--rl-accum", type=int, default=2)
    parser.add_argument(
        "--decode-rows-per-device",
        type=int,
        default=16,
        help="rows sampled at once (8 images x 16 samples over 8 devices)",
    )
    parser.add_argument("--cache-length", type=int, default=2048)
    parser.add_argument(
        "--image-patches",
        type=int,
        default=1024,
        help="patches of the one image per training row / prompt (a square of an even side; 1024 = "
        "a 512x512 image, 256 image tokens); 0 leaves the vision tower out",
    )
    parser.add_argument(
        "--prompt-length",
        type=int,
        default=1024,
        help="tokens per sampler prompt (image tokens included)",
    )
    parser.add_argument("--num-samples", type=int, default=16, help="samples per prompt (N)")
    parser.add_argument(
        "--rl-images",
        type=int,
        default=8,
        help="images (groups) per RL update, for the trainer's step",
    )
    parser.add_argument(
        "--rl-new-tokens",
        type=int,
        default=512,
        help="caption tokens per RL sample for the trainer's step (0: leave that row out)",
    )
    args = parser.parse_args(argv)
    make = model.tiny if args.preset == "tiny" else functools.partial(model.preset, args.preset)
    cfg = make(
        param_dtype=args.param_dtype,
        dtype=args.dtype,
        remat=not args.no_remat,
        logits_chunk=args.logits_chunk,
    )
    mesh = sharding.make_mesh(args.mesh)
    cfg = sharding.model_config(cfg, mesh)
    t0 = time.perf_counter()
    rows = plan(
        cfg,
        mesh,
        sharding.DEFAULT_RULES,
        sft_global_batch=args.sft_global_batch,
        rl_accum=args.rl_accum,
        length=args.length,
        decode_rows_per_device=args.decode_rows_per_device,
        cache_length=args.cache_length,
        image_patches=args.image_patches,
        prompt_length=args.prompt_length,
        num_samples=args.num_samples,
        rl_images=args.rl_images,
        rl_new_tokens=args.rl_new_tokens,
    )
    n = model.count_params(model.abstract_params(cfg))
    print(
        f"{args.preset}: {n / 1e9:.2f}B params, {args.param_dtype} params, {args.dtype} compute, remat={cfg.remat}, "
        f"logits_chunk={cfg.logits_chunk}, "
        f"mesh {dict(mesh.shape)} ({mesh.devices.size} x {args.hbm_gb:g} GB)"
    )
    print(table(rows, args.hbm_gb * GB))
    print(f"wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
