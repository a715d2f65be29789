"""Memory and compile plan: compiles the SFT step, the RL update and a sampler decode step for a
preset on a mesh of fake devices, and reports per-device bytes next to an analytic estimate.

  python -m mocojax.plan --preset 8b --mesh fsdp=8 --hbm-gb 80

Run as a program it fakes `--devices` CPU devices (default: the mesh's size) before jax is
imported; nothing is allocated, every array is a ShapeDtypeStruct. The step functions here
(`make_update_step`, `sft_loss_fn`, `rl_loss_fn`, `decode_step`) are the minimal pure steps
the plan compiles and the sharding tests run; the trainers own the real ones.
"""

import os
import sys

if __name__ == "__main__" and "jax" not in sys.modules:
    # Fake devices must be requested before jax initialises its backends.
    _n = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--devices=")), None)
    if _n is None:
        _mesh = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--mesh=")), "fsdp=8")
        _n = 1
        for _item in _mesh.split(","):
            _n *= max(1, int(_item.split("=")[1]))
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_n}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from mocojax import losses, model, sampling, sharding  # noqa: E402
from mocojax.model.rope import vision_metadata  # noqa: E402

GB = 1e9


def _target_logprobs(cfg, params, batch, mesh, rules):
    """Returns log p(input_ids[:, t + 1] | prefix) float32 [B, L-1], as the trainers compute it
    (model.target_logprobs, chunked by cfg.logits_chunk); hidden states pinned to rows."""
    _, aux = model.apply(cfg, params, batch["input_ids"], batch["attention_mask"], batch["positions"],
                         batch.get("pixel_values"), batch.get("vision"), return_hidden=True)
    hidden = aux["hidden"][:, :-1]
    if mesh is not None:
        hidden = sharding.constrain(hidden, mesh, ("batch", "length", None), rules)
    return model.target_logprobs(cfg, params, hidden, batch["input_ids"][:, 1:])


def sft_loss_fn(cfg, params, batch, mesh=None, rules=sharding.DEFAULT_RULES):
    """Returns (mean NLL over loss_mask, metrics) of one micro-batch; batch arrays [B, L], positions [3, B, L]."""
    mask = batch["loss_mask"][:, 1:].astype(jnp.float32)
    nll_sum = -jnp.sum(_target_logprobs(cfg, params, batch, mesh, rules) * mask)
    loss = nll_sum / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, {"loss": loss, "nll_sum": nll_sum, "token_count": jnp.sum(mask)}


def rl_loss_fn(cfg, params, batch, mesh=None, rules=sharding.DEFAULT_RULES, **grpo_kwargs):
    """Returns (GRPO loss, metrics) of one micro-batch; completion_mask/old_logprobs [B, L-1], advantages [B]."""
    logprobs = _target_logprobs(cfg, params, batch, mesh, rules)
    return losses.grpo_loss(logprobs, batch["old_logprobs"], batch["advantages"], batch["completion_mask"], **grpo_kwargs)


def make_update_step(cfg, optimizer, loss_fn, params_shardings=None):
    """Returns step(state, batch) -> (state, metrics): gradients summed over the micro-batches
    on batch's leading axis [A, ...], averaged, then one optimizer update."""

    def step(state, batch):
        params = state["params"]

        def micro(grads, mb):
            (_, metrics), g = jax.value_and_grad(functools.partial(loss_fn, cfg), has_aux=True)(params, mb)
            return jax.tree.map(jnp.add, grads, g), metrics

        grads = jax.tree.map(jnp.zeros_like, params)
        if params_shardings is not None:
            # The scan carry would otherwise be free to live replicated: a full model's grads per device.
            grads = jax.lax.with_sharding_constraint(grads, params_shardings)
        grads, metrics = jax.lax.scan(micro, grads, batch)
        num_micro = jax.tree.leaves(batch)[0].shape[0]
        grads = jax.tree.map(lambda g: g / num_micro, grads)
        updates, opt_state = optimizer.update(grads, state["opt_state"], params)
        new_state = dict(state, params=optax.apply_updates(params, updates), opt_state=opt_state, step=state["step"] + 1)
        return new_state, jax.tree.map(jnp.mean, metrics)

    return step


def decode_step(cfg, params, cache, key_valid, tokens, positions, write_index):
    """Returns (cache, key_valid, next_tokens [B], logprobs [B]) of one greedy step of tokens [B, 1] at slot write_index.

    cache {"k","v"} [layers, B, S, K, H]; key_valid [B, S]; positions [3, B, 1].
    """
    key_valid = jax.lax.dynamic_update_slice_in_dim(key_valid, jnp.ones_like(key_valid[:, :1]), write_index, axis=1)
    logits, aux = model.apply(cfg, params, tokens, jnp.ones_like(tokens), positions,
                              cache=cache, key_valid=key_valid, write_index=write_index)
    logprobs = jax.nn.log_softmax(logits[:, -1])  # [B, V]
    next_tokens = jnp.argmax(logprobs, axis=-1)
    return aux["cache"], key_valid, next_tokens, jnp.take_along_axis(logprobs, next_tokens[:, None], -1)[:, 0]


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


def _compile(fn, *args):
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    return compiled.memory_analysis(), time.perf_counter() - t0


def _activation_estimate(cfg, rows, length, tensor):
    """Returns per-device bytes of the training activations of one micro-batch (remat on)."""
    t, c = cfg.text, jnp.dtype(cfg.dtype).itemsize
    tokens = rows * length
    saved = t.num_hidden_layers * tokens * t.hidden_size * c  # one layer input per layer (remat)
    proj = (t.num_attention_heads + 2 * t.num_key_value_heads) * t.head_dim + 3 * t.intermediate_size
    layer = tokens * (4 * t.hidden_size + proj // tensor) * c  # one layer recomputed in the backward pass
    scores = 2 * rows * (t.num_attention_heads // tensor) * length * length * 4  # XLA attention: scores + probs, f32
    # float32 logits, log-softmax and their gradient: of every position, or of one chunk at a time
    logit_positions = rows * min(cfg.logits_chunk, length) if cfg.logits_chunk else tokens
    logits = 3 * logit_positions * t.vocab_size // tensor * 4
    return saved + layer + scores + logits


def _vision_inputs(cfg, mesh, rows, image_patches, lead=()):
    """Returns abstract (pixel_values [*lead, P, patch_dim], VisionMeta) of `rows` square images of
    image_patches patches each, laid out (and replicated) as the trainers feed them."""
    side = int(round(image_patches ** 0.5))
    if side * side != image_patches or side % cfg.vision.spatial_merge_size:
        raise ValueError(f"--image-patches={image_patches} must be a square of a multiple of {cfg.vision.spatial_merge_size}")
    total = rows * image_patches
    meta = vision_metadata(cfg.vision, np.array([[1, side, side]] * rows), pad_to=total)
    whole = sharding.replicated(mesh)
    pixels = _sds((*lead, total, cfg.vision.patch_dim), cfg.dtype, whole)
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


def _grpo_trainer_row(cfg, mesh, rules, state, state_sh, p_bytes, o_bytes, *, images, accum, num_samples,
                      prompt_length, new_tokens, image_patches):
    """Returns the Row of the RL trainer's jitted update (`rl.make_grpo_step`) on a batch laid out
    as `rl.train_batch` + `rl.place_batch` lay it out: each micro-batch's prompts encoded once and
    their cache repeated for the N captions (`sampling.completion_logprobs`)."""
    from mocojax.train import rl as rl_lib  # the trainer pulls in the data pipeline; only this row needs it

    groups = images // accum
    captions = groups * num_samples
    rows = lambda shape, dim, dtype=jnp.int32: _sds(shape, dtype, sharding.batch_sharding(mesh, shape, dim, rules, strict=False))
    pixel_values, vision = (_vision_inputs(cfg, mesh, groups, image_patches, (accum,)) if image_patches else (None, None))
    prompt = sampling.Prompt(rows((accum, groups, prompt_length), 1), rows((accum, groups, prompt_length), 1),
                             rows((accum, 3, groups, prompt_length), 2), rows((accum, groups), 1), pixel_values, vision)
    batch = {"prompt": prompt, "completion": rows((accum, captions, new_tokens), 1),
             "old_logprobs": rows((accum, captions, new_tokens), 1, jnp.float32),
             "mask": rows((accum, captions, new_tokens), 1), "advantages": rows((accum, captions), 1, jnp.float32),
             "weight": _sds((accum,), jnp.float32, sharding.replicated(mesh))}
    settings = dict(clip_eps=0.2, clip_eps_high=0.2, kl_beta=0.0, aggregation="seq_mean_token_mean",
                    num_samples=num_samples)
    optimizer = optax.adamw(1e-6, weight_decay=0.0)
    policy_sh = {k: v for k, v in state_sh.items() if k != "momentum"}
    policy = {k: v for k, v in state.items() if k != "momentum"}
    step = rl_lib.make_grpo_step(cfg, optimizer, _Settings(**settings), policy_sh, mesh)
    mem, secs = _compile(step, policy, batch, None)
    data_ways = sharding.batch_ways(mesh, rules)
    tensor = mesh.shape.get("tensor", 1)
    # Per device: the captions' rows (prompt cache repeated N times, then the caption tokens).
    per_device = -(-captions // data_ways)
    analytic = {"params": p_bytes, "grads": p_bytes, "adam": o_bytes,
                "activations": _activation_estimate(cfg, per_device, new_tokens, tensor)
                + _activation_estimate(cfg, groups, prompt_length, tensor)}
    if image_patches:
        analytic["vision"] = _vision_estimate(cfg, groups * image_patches, vision.row_len, data_ways)
    images_note = f", {image_patches} patches each" if image_patches else ""
    # The momentum copy is not an argument of the step but stays on the device beside it.
    momentum_bytes = sharding.per_device_bytes(state["momentum"], state_sh["momentum"])
    return Row("RL update (trainer's grpo_step)",
               f"{images} images x {num_samples} captions x {new_tokens} tok after {prompt_length}-tok prompts"
               f"{images_note}, {accum} micro", mem.argument_size_in_bytes, mem.output_size_in_bytes,
               mem.alias_size_in_bytes, mem.temp_size_in_bytes, analytic, secs, beside=momentum_bytes)


@dataclasses.dataclass(frozen=True)
class _Settings:
    """The `rl` config fields make_grpo_step reads."""

    clip_eps: float
    clip_eps_high: float
    kl_beta: float
    aggregation: str
    num_samples: int


def plan(cfg, mesh, rules, *, sft_global_batch, rl_rows_per_device, rl_accum, length, decode_rows_per_device, cache_length,
         image_patches=0, prompt_length=1024, num_samples=16, rl_images=8, rl_new_tokens=512, lr=1e-5):
    """Returns a list of Rows for the SFT step, the RL update, a sampler prefill and a decode step of cfg on mesh.

    image_patches > 0 gives every training row and every prompt one square image of that many
    patches (its image tokens count in `length`); 0 leaves the vision tower out. rl_new_tokens > 0
    adds the RL trainer's own update (`train.rl.grpo_step`) on rl_images groups of num_samples
    captions of rl_new_tokens tokens after prompts of prompt_length tokens.
    """
    data_ways = sharding.batch_ways(mesh, rules)
    tensor = mesh.shape.get("tensor", 1)
    optimizer = optax.adamw(lr, weight_decay=0.0)
    state_sh = sharding.train_state_shardings(cfg, mesh, optimizer, rules)
    abstract = model.abstract_params(cfg)
    state = {
        "params": abstract,
        "opt_state": jax.eval_shape(optimizer.init, abstract),
        "momentum": jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), abstract),
        "step": jax.ShapeDtypeStruct((), jnp.int32),
        "rng": jax.ShapeDtypeStruct((2,), jnp.uint32),
    }
    state = jax.tree.map(lambda x, s: _sds(x.shape, x.dtype, s), state, state_sh)
    p_bytes = sharding.per_device_bytes(abstract, state_sh["params"])
    m_bytes = sharding.per_device_bytes(state["momentum"], state_sh["momentum"])
    o_bytes = sharding.per_device_bytes(state["opt_state"], state_sh["opt_state"])
    rows = []

    def train_row(name, loss_fn, global_rows, accum, extra):
        micro = global_rows // accum
        shapes = {"input_ids": ((accum, micro, length), jnp.int32), "attention_mask": ((accum, micro, length), jnp.int32),
                  "positions": ((accum, 3, micro, length), jnp.int32), **extra(accum, micro)}
        dims = {"positions": 2, "advantages": 1}
        batch = {k: _sds(s, d, sharding.batch_sharding(mesh, s, dims.get(k, 1), rules)) for k, (s, d) in shapes.items()}
        vision = {}
        if image_patches:
            batch["pixel_values"], batch["vision"] = _vision_inputs(cfg, mesh, micro, image_patches, (accum,))
            vision = {"vision": _vision_estimate(cfg, micro * image_patches, batch["vision"].row_len, data_ways)}
        step = make_update_step(cfg, optimizer, functools.partial(loss_fn, mesh=mesh, rules=rules), state_sh["params"])
        jitted = sharding.jit_train_step(step, state_sh, jax.tree.map(lambda x: x.sharding, batch), mesh)
        mem, secs = _compile(jitted, state, batch)
        analytic = {"params": p_bytes, "grads": p_bytes, "adam": o_bytes, "momentum": m_bytes,
                    "activations": _activation_estimate(cfg, micro // data_ways, length, tensor), **vision}
        images = f", {image_patches} patches/row" if image_patches else ""
        rows.append(Row(name, f"{global_rows} rows x {length} tok{images}, {accum} micro", mem.argument_size_in_bytes,
                        mem.output_size_in_bytes, mem.alias_size_in_bytes, mem.temp_size_in_bytes, analytic, secs))

    train_row("SFT step", sft_loss_fn, sft_global_batch, 1,
              lambda a, b: {"loss_mask": ((a, b, length), jnp.int32)})
    rl_rows = rl_rows_per_device * data_ways * rl_accum
    train_row("RL update (GRPO)", rl_loss_fn, rl_rows, rl_accum,
              lambda a, b: {"completion_mask": ((a, b, length - 1), jnp.int32), "old_logprobs": ((a, b, length - 1), jnp.float32),
                            "advantages": ((a, b), jnp.float32)})
    if rl_new_tokens:
        rows.append(_grpo_trainer_row(cfg, mesh, rules, state, state_sh, p_bytes, o_bytes, images=rl_images,
                                      accum=rl_accum, num_samples=num_samples, prompt_length=prompt_length,
                                      new_tokens=rl_new_tokens, image_patches=image_patches))

    t = cfg.text
    b = decode_rows_per_device * data_ways
    # Sampler prefill: the b / N prompts of one sampling call (one image each), encoded once, their
    # cache repeated N times (sampling.prefill_core), reserving the rest of the cache for decoding.
    prompts = max(b // num_samples, 1)
    reserve = cache_length - prompt_length
    prompt_rows = lambda shape, dim: _sds(shape, jnp.int32, sharding.batch_sharding(mesh, shape, dim, rules, strict=False))
    pixel_values, vision = (_vision_inputs(cfg, mesh, prompts, image_patches) if image_patches else (None, None))
    prompt = sampling.Prompt(prompt_rows((prompts, prompt_length), 0), prompt_rows((prompts, prompt_length), 0),
                             prompt_rows((3, prompts, prompt_length), 1), prompt_rows((prompts,), 0), pixel_values, vision)
    prefill_out = jax.eval_shape(functools.partial(sampling.prefill_core, cfg, reserve=reserve, num_samples=num_samples),
                                 state["params"], prompt)
    cache_sh = sharding.kv_cache_shardings(mesh, prefill_out.cache["k"].shape, rules)
    row_sh = lambda x, dim=0: sharding.batch_sharding(mesh, x.shape, dim, rules)
    prefix_sh = sampling.Prefix(cache_sh, row_sh(prefill_out.key_valid), row_sh(prefill_out.next_position),
                                row_sh(prefill_out.last_logits), prefill_out.next_slot)
    jitted = jax.jit(functools.partial(sampling.prefill_core, cfg, reserve=reserve, num_samples=num_samples),
                     out_shardings=prefix_sh)
    mem, secs = _compile(jitted, state["params"], prompt)
    images = f", {image_patches} patches each" if image_patches else ""
    prefill_analytic = {"params": p_bytes, "kv_cache": sharding.per_device_bytes(prefill_out.cache, cache_sh)}
    if image_patches:
        prefill_analytic["vision"] = _vision_estimate(cfg, prompts * image_patches, vision.row_len, data_ways,
                                                      training=False)
    # During RL the sampler runs while the trainer holds Adam's moments and the momentum copy.
    held = o_bytes + m_bytes
    rows.append(Row("sampler prefill", f"{prompts} prompts x {prompt_length} tok{images}, x{num_samples} samples",
                    mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.alias_size_in_bytes,
                    mem.temp_size_in_bytes, prefill_analytic, secs, beside=held))

    cache_shape = (t.num_hidden_layers, b, cache_length, t.num_key_value_heads, t.head_dim)
    cache_sh = sharding.kv_cache_shardings(mesh, cache_shape, rules)
    cache = {k: _sds(cache_shape, cfg.dtype, s) for k, s in cache_sh.items()}
    key_valid = _sds((b, cache_length), jnp.int32, sharding.batch_sharding(mesh, (b, cache_length), 0, rules))
    tokens = _sds((b, 1), jnp.int32, sharding.batch_sharding(mesh, (b, 1), 0, rules))
    positions = _sds((3, b, 1), jnp.int32, sharding.batch_sharding(mesh, (3, b, 1), 1, rules))
    write_index = _sds((), jnp.int32, sharding.replicated(mesh))
    row_sh = sharding.batch_sharding(mesh, (b,), 0, rules)
    jitted = jax.jit(
        functools.partial(decode_step, cfg),
        in_shardings=(state_sh["params"], cache_sh, key_valid.sharding, tokens.sharding, positions.sharding, write_index.sharding),
        out_shardings=(cache_sh, key_valid.sharding, row_sh, row_sh),
        donate_argnums=(1, 2),
    )
    mem, secs = _compile(jitted, state["params"], cache, key_valid, tokens, positions, write_index)
    cache_bytes = sharding.per_device_bytes(cache, cache_sh)
    rows.append(Row("decode step", f"{b} rows, cache {cache_length}", mem.argument_size_in_bytes, mem.output_size_in_bytes,
                    mem.alias_size_in_bytes, mem.temp_size_in_bytes,
                    {"params": p_bytes, "kv_cache": cache_bytes, "logits": b // data_ways * t.vocab_size // tensor * 4 * 2}, secs,
                    beside=held))
    return rows


def table(rows, hbm_bytes) -> str:
    """Returns a markdown table of rows with a fits / does-not-fit verdict against hbm_bytes per device."""
    lines = ["| program | shape | args GB | outputs GB | aliased GB | temps GB | held beside GB | peak GB | analytic GB (parts) | verdict | compile s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        analytic = {**r.analytic, **({"held beside": r.beside} if r.beside else {})}
        parts = ", ".join(f"{k} {v / GB:.1f}" for k, v in analytic.items())
        verdict = "fits" if r.peak <= hbm_bytes else "does not fit"
        lines.append(f"| {r.name} | {r.shape} | {r.arguments / GB:.1f} | {r.outputs / GB:.1f} | {r.aliased / GB:.1f} | "
                     f"{r.temporaries / GB:.1f} | {r.beside / GB:.1f} | {r.peak / GB:.1f} | {sum(analytic.values()) / GB:.1f} ({parts}) | {verdict} | {r.compile_s:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="8b", help="2b, 4b, 8b, 32b or tiny")
    parser.add_argument("--mesh", default="fsdp=8", help="e.g. fsdp=8 or fsdp=4,tensor=2 (sizes; -1 = the rest)")
    parser.add_argument("--devices", type=int, default=None, help="fake devices (default: the mesh's size)")
    parser.add_argument("--hbm-gb", type=float, default=80.0, help="memory per device")
    parser.add_argument("--param-dtype", default="float32")
    parser.add_argument("--dtype", default="bfloat16", help="compute dtype")
    parser.add_argument("--no-remat", action="store_true")
    parser.add_argument("--logits-chunk", type=int, default=512,
                        help="positions per chunk of the training log-softmax (0: all at once)")
    parser.add_argument("--length", type=int, default=2048, help="tokens per training row (image tokens included)")
    parser.add_argument("--sft-global-batch", type=int, default=64)
    parser.add_argument("--rl-rows-per-device", type=int, default=8)
    parser.add_argument("--rl-accum", type=int, default=2)
    parser.add_argument("--decode-rows-per-device", type=int, default=16, help="rows sampled at once (8 images x 16 samples over 8 devices)")
    parser.add_argument("--cache-length", type=int, default=2048)
    parser.add_argument("--image-patches", type=int, default=1024,
                        help="patches of the one image per training row / prompt (a square of an even side; 1024 = "
                             "a 512x512 image, 256 image tokens); 0 leaves the vision tower out")
    parser.add_argument("--prompt-length", type=int, default=1024, help="tokens per sampler prompt (image tokens included)")
    parser.add_argument("--num-samples", type=int, default=16, help="samples per prompt (N)")
    parser.add_argument("--rl-images", type=int, default=8, help="images (groups) per RL update, for the trainer's step")
    parser.add_argument("--rl-new-tokens", type=int, default=512,
                        help="caption tokens per RL sample for the trainer's step (0: leave that row out)")
    args = parser.parse_args(argv)
    make = model.tiny if args.preset == "tiny" else functools.partial(model.preset, args.preset)
    cfg = make(param_dtype=args.param_dtype, dtype=args.dtype, remat=not args.no_remat, logits_chunk=args.logits_chunk)
    mesh = sharding.make_mesh(args.mesh)
    cfg = sharding.model_config(cfg, mesh)
    t0 = time.perf_counter()
    rows = plan(cfg, mesh, sharding.DEFAULT_RULES, sft_global_batch=args.sft_global_batch, rl_rows_per_device=args.rl_rows_per_device,
                rl_accum=args.rl_accum, length=args.length, decode_rows_per_device=args.decode_rows_per_device,
                cache_length=args.cache_length, image_patches=args.image_patches, prompt_length=args.prompt_length,
                num_samples=args.num_samples, rl_images=args.rl_images, rl_new_tokens=args.rl_new_tokens)
    n = model.count_params(model.abstract_params(cfg))
    print(f"{args.preset}: {n / 1e9:.2f}B params, {args.param_dtype} params, {args.dtype} compute, remat={cfg.remat}, "
          f"logits_chunk={cfg.logits_chunk}, "
          f"mesh {dict(mesh.shape)} ({mesh.devices.size} x {args.hbm_gb:g} GB)")
    print(table(rows, args.hbm_gb * GB))
    print(f"wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
