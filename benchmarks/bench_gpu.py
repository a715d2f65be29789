"""GPU readiness (issue #15): model FLOPs utilisation (MFU) of the SFT step and the GRPO update, and
decode tokens/s at N = 16 after a long prompt, for a Qwen3-VL-4B-shaped model cut to a few layers.

  python benchmarks/bench_gpu.py                  # 4B shapes, 4 text + 4 vision layers, bf16
  python benchmarks/bench_gpu.py --shape tiny     # seconds on CPU: checks the script, not a speed
  python benchmarks/bench_gpu.py --peak-tflops 989 --layers 8

The device is jax.devices()[0] (JAX_PLATFORMS picks the backend; without it jax's default). The
model is `model.preset("4b")` with the text decoder cut to --layers and the vision tower to
--vision-layers (DeepStack taps rescaled to the cut depth), params and compute in --dtype
(bfloat16), remat on and the log-softmax in 512-position chunks as the real-model trainer config
(configs/qwen3vl_8b_moco.py) has them, on a one-device mesh; weights are random (no checkpoint is read). Each measurement runs the trainers'
own jitted program, compiled ahead of time (compile seconds reported apart), once to warm up,
then --steps times, each call waited for with jax.block_until_ready:
  sft_step     `sft.make_train_step` on `sft.device_batch` of --rows rows x --seq tokens, one
               image of --image-patches patches per row (its patches / 4 image tokens in the row);
  grpo_update  `rl.make_grpo_step` on `rl.train_batch` of --groups images x --samples captions
               of --new-tokens tokens after --prompt-tokens-token prompts (one image each), one
               micro-batch; every caption token is scored (no padding);
  decode       `sampling.prefill` of one --decode-prompt-token prompt (one image) shared by
               --samples rows, then `sampling.decode` of --decode-tokens tokens per row
               (temperature 1, no EOS, so every row runs to the end); tokens/s = rows x new
               tokens / decode seconds; the prefill's seconds (its host-side prompt preparation
               included) and FLOPs are reported beside.

FLOPs ("flops": model FLOPs per call, analytic, `forward_flops`; a multiply-add is 2 FLOPs;
training = 3 x forward, i.e. remat's recompute is not counted, as MFU's definition has it):
  forward = 2 * P_layer * layers * tokens                 P_layer = q, k, v, o, gate, up, down
          + 4 * heads * head_dim * layers * pairs          QK^T and PV over the (query, key)
                                                           pairs causality keeps: L(L+1)/2 per row
          + 2 * hidden * vocab * logit_positions           LM head
          + 2 * (patch_dim * Dv + depth * (4 Dv^2 + 2 Dv Iv)) * patches       vision tower
          + 4 * Dv * depth * patches_per_image^2 * images                     vision attention
          + 2 * (1 + deepstack) * ((m^2 Dv)^2 + m^2 Dv * hidden) * patches / m^2   mergers
Norms, rope, softmax, biases and the embedding lookup are left out (a few per mille). Tokens,
pairs and logit positions of each program are in `sft_flops`, `grpo_flops`, `prefill_flops`
and `decode_flops`. "xla_flops" is XLA's own count of the compiled train step
(`compiled.cost_analysis()`, null where the backend gives none): hardware FLOPs, so above the
model FLOPs by remat's recomputed forward (about 4/3), the masked half of causal attention
scores, the vision tower's padding slots and the elementwise work.
MFU = model FLOPs / seconds / peak. The peak is --peak-tflops, else PEAK_TFLOPS by
jax.devices()[0].device_kind (datasheet dense bf16 TFLOP/s per chip, no sparsity), else null
(CPU). Output: one JSON line per measurement, then a markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time

import jax
import numpy as np

from mocojax import model, sampling, sharding
from mocojax.plan import _optimizer
from mocojax.train import rl, rl_config, rollout as rollout_lib, sft

# Datasheet dense bf16 TFLOP/s per chip (no sparsity), matched in order against device_kind.
PEAK_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("A100", 312.0),
    ("TPU v5 lite", 197.0),  # v5e
    ("TPU v5e", 197.0),
    ("TPU v6 lite", 918.0),  # v6e (Trillium)
    ("TPU v6e", 918.0),
    ("TPU v5", 459.0),  # v5p
    ("TPU v4", 275.0),
)

# Per-shape defaults of the size flags (a flag given on the command line wins).
DEFAULTS = {
    "4b": dict(
        layers=4,
        vision_layers=4,
        rows=8,
        seq=2048,
        image_patches=1024,
        groups=2,
        prompt_tokens=1024,
        new_tokens=512,
        decode_prompt=2048,
        decode_tokens=256,
        steps=5,
    ),
    "tiny": dict(
        layers=2,
        vision_layers=1,
        rows=2,
        seq=32,
        image_patches=16,
        groups=2,
        prompt_tokens=16,
        new_tokens=8,
        decode_prompt=32,
        decode_tokens=8,
        steps=2,
    ),
}


# ------------------------------------------------------------------------------------ FLOPs
def matmul_params(cfg) -> dict:
    """Returns the weights of cfg's matmuls, grouped by what they multiply: "text_layer" (one
    decoder layer), "lm_head", "vision_patch" (patch embedding), "vision_block" (one block) and
    "merger" (one patch merger; the tower has 1 + len(deepstack) of them)."""
    t, v = cfg.text, cfg.vision
    d, q, kv = t.hidden_size, t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    merged = v.hidden_size * v.spatial_merge_size**2
    return {
        "text_layer": d * q + 2 * d * kv + q * d + 3 * d * t.intermediate_size,
        "lm_head": d * t.vocab_size,
        "vision_patch": v.patch_dim * v.hidden_size,
        "vision_block": 4 * v.hidden_size**2 + 2 * v.hidden_size * v.intermediate_size,
        "merger": merged * merged + merged * v.out_hidden_size,
    }


def forward_flops(cfg, *, tokens, pairs, logit_positions, images=0, image_patches=0) -> int:
    """Returns the forward model FLOPs (module docstring) of the decoder over `tokens` tokens with
    `pairs` causal (query, key) pairs and `logit_positions` LM-head positions, plus the vision
    tower over `images` images of `image_patches` patches each."""
    t, v, w = cfg.text, cfg.vision, matmul_params(cfg)
    layers = t.num_hidden_layers
    flops = 2 * w["text_layer"] * layers * tokens
    flops += 4 * t.num_attention_heads * t.head_dim * layers * pairs
    flops += 2 * w["lm_head"] * logit_positions
    patches = images * image_patches
    flops += 2 * (w["vision_patch"] + v.depth * w["vision_block"]) * patches
    flops += 4 * v.hidden_size * v.depth * image_patches**2 * images
    mergers = 1 + len(v.deepstack_visual_indexes)
    flops += 2 * mergers * w["merger"] * patches // v.spatial_merge_size**2
    return flops


def _causal(n):
    """Returns the (query, key) pairs of causal attention over n tokens."""
    return n * (n + 1) // 2


def sft_flops(cfg, rows, seq, image_patches) -> int:
    """Returns the model FLOPs of one SFT step: forward + backward over rows x seq tokens (one
    image each), the LM head on the seq - 1 positions that predict a next token."""
    return 3 * forward_flops(
        cfg,
        tokens=rows * seq,
        pairs=rows * _causal(seq),
        logit_positions=rows * (seq - 1),
        images=rows,
        image_patches=image_patches,
    )


def grpo_flops(cfg, groups, samples, prompt, new, image_patches) -> int:
    """Returns the model FLOPs of one GRPO update: forward + backward of each group's prompt
    (encoded once, with its image) and its `samples` captions of `new` tokens, each attending to
    the whole prompt and causally to itself; the LM head on each prompt's last position and the
    captions' positions but the last."""
    return 3 * forward_flops(
        cfg,
        tokens=groups * (prompt + samples * new),
        pairs=groups * (_causal(prompt) + samples * (new * prompt + _causal(new))),
        logit_positions=groups * (1 + samples * (new - 1)),
        images=groups,
        image_patches=image_patches,
    )


def prefill_flops(cfg, prompt, image_patches) -> int:
    """Returns the forward FLOPs of one prompt's prefill (one image), LM head on its last position."""
    return forward_flops(
        cfg,
        tokens=prompt,
        pairs=_causal(prompt),
        logit_positions=1,
        images=1,
        image_patches=image_patches,
    )


def decode_flops(cfg, rows, prompt, new) -> int:
    """Returns the forward FLOPs of decoding `new` tokens per row after a `prompt`-token cache: the
    first token comes from the prefill's logits, each later one from one step over one token that
    attends to the prompt and the tokens before it."""
    steps = new - 1
    return forward_flops(
        cfg,
        tokens=rows * steps,
        pairs=rows * (steps * prompt + _causal(steps)),
        logit_positions=rows * steps,
    )


# ------------------------------------------------------------------------------------ setup
def config(shape, layers, vision_layers, dtype, remat):
    """Returns the benchmark's ModelConfig: the 4B preset (or a tiny config) with the decoder cut to
    `layers` and the vision tower to `vision_layers`, DeepStack taps rescaled to the cut depth."""
    if shape == "tiny":
        base = model.tiny()
    else:
        base = model.preset(shape)
    t, v = base.text, base.vision
    for name, value, most in (
        ("layers", layers, t.num_hidden_layers),
        ("vision-layers", vision_layers, v.depth),
    ):
        if not 1 <= value <= most:
            raise ValueError(f"--{name}={value}: the {shape} shape has 1..{most}")
    taps = sorted({i * vision_layers // v.depth for i in v.deepstack_visual_indexes})[:layers]
    return base.replace(
        text=dataclasses.replace(t, num_hidden_layers=layers),
        vision=dataclasses.replace(v, depth=vision_layers, deepstack_visual_indexes=tuple(taps)),
        param_dtype=dtype,
        dtype=dtype,
        remat=remat,
        logits_chunk=512,
    )


def image_rows(cfg, rows, length, image_patches, rng):
    """Returns (input_ids [rows, length] int32, pixel_values [rows * image_patches, patch_dim]
    float32, image_grid_thw [rows, 3]): each row one text token, one square image, then text."""
    side = math.isqrt(image_patches)
    image_tokens = image_patches // cfg.vision.spatial_merge_size**2
    text = rng.integers(0, min(cfg.vision_start_token_id, cfg.image_token_id), (rows, length))
    text[:, 1] = cfg.vision_start_token_id
    text[:, 2 : 2 + image_tokens] = cfg.image_token_id
    text[:, 2 + image_tokens] = cfg.vision_end_token_id
    pixels = rng.standard_normal((rows * image_patches, cfg.vision.patch_dim)).astype(np.float32)
    return text.astype(np.int32), pixels, np.array([[1, side, side]] * rows)


def check_sizes(cfg, args):
    """Raises ValueError naming the flag when the sizes cannot be laid out."""
    merge, side = cfg.vision.spatial_merge_size, math.isqrt(args.image_patches)
    if side * side != args.image_patches or side % merge or not side:
        raise ValueError(
            f"--image-patches={args.image_patches} must be a square of a positive multiple of {merge}"
        )
    room = args.image_patches // merge**2 + 4  # a text token, <vision_start>, <vision_end>, text
    for flag in ("seq", "prompt_tokens", "decode_prompt"):
        if getattr(args, flag) < room:
            raise ValueError(
                f"--{flag.replace('_', '-')}={getattr(args, flag)} leaves no text around "
                f"the image's {room - 4} tokens (at least {room})"
            )
    for flag in ("rows", "groups", "samples", "steps", "new_tokens"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1")
    if args.decode_tokens < 2:
        raise ValueError("--decode-tokens must be >= 2 (the first token comes from the prefill)")


def sft_batch(cfg, mesh, args, rng):
    """Returns the SFT trainer's device batch (`sft.device_batch`): every token a target but the
    row's first."""
    ids, pixels, grid = image_rows(cfg, args.rows, args.seq, args.image_patches, rng)
    ones = np.ones_like(ids)
    host = {
        "input_ids": ids,
        "attention_mask": ones,
        "loss_mask": ones,
        "role": np.zeros(args.rows, np.int32),
        "mm_token_type_ids": (ids == cfg.image_token_id).astype(np.int32),
        "pixel_values": pixels,
        "image_grid_thw": grid,
    }
    return sft.device_batch(cfg, mesh, host, num_micro=1, max_patches=None)


def grpo_batch(cfg, mesh, settings, args, rng):
    """Returns the GRPO trainer's placed batch (`rl.train_batch`, `rl.place_batch`) of a rollout
    of random captions, full length, with rewards that differ within every group."""
    ids, pixels, grid = image_rows(cfg, args.groups, args.prompt_tokens, args.image_patches, rng)
    captions = args.groups * args.samples
    samples = rollout_lib.PolicySamples(
        ids=list(range(args.groups)),
        prompt={
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "pixel_values": pixels,
            "image_grid_thw": grid,
        },
        tokens=rng.integers(0, cfg.vision_start_token_id, (captions, args.new_tokens)),
        logprobs=-rng.uniform(0.5, 6.0, (captions, args.new_tokens)).astype(np.float32),
        lengths=np.full(captions, args.new_tokens),
        captions=[[""] * args.samples] * args.groups,
        rewards=rng.uniform(size=(args.groups, args.samples)).astype(np.float32),
    )
    batch = rl.train_batch(cfg, samples, settings, rl.advantages(samples, settings))
    return rl.place_batch(mesh, batch)


# ------------------------------------------------------------------------------------ timing
def _xla_flops(compiled):
    """Returns XLA's FLOP count of a compiled program, or None where the backend gives none."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - some backends raise instead of returning nothing
        return None
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    flops = (cost or {}).get("flops")
    return float(flops) if flops and flops > 0 else None


def time_train_step(step, state, batch, steps):
    """Returns (state, compile s, mean seconds per call after a warm-up call, XLA FLOPs) of a
    jitted train step (state donated), compiled ahead of time."""
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = compiled(state, batch)
        jax.block_until_ready((state, metrics))
    return state, compile_s, (time.perf_counter() - start) / steps, _xla_flops(compiled)


def time_decode(cfg, params, args, rng):
    """Returns (first call s, mean prefill s, mean decode s) of one shared-prefix generation:
    `sampling.prefill` of one prompt for --samples rows, then `sampling.decode`."""
    ids, pixels, grid = image_rows(cfg, 1, args.decode_prompt, args.image_patches, rng)

    def once(seed):
        start = time.perf_counter()
        prefix = sampling.prefill(
            cfg,
            params,
            ids,
            np.ones_like(ids),
            pixels,
            grid,
            reserve=args.decode_tokens,
            num_samples=args.samples,
        )
        jax.block_until_ready(prefix)
        middle = time.perf_counter()
        out = sampling.decode(
            cfg,
            params,
            prefix,
            max_new_tokens=args.decode_tokens,
            temperature=1.0,
            rng=jax.random.key(seed),
        )
        jax.block_until_ready(out)
        if int(np.asarray(out.lengths).min()) != args.decode_tokens:
            raise RuntimeError("a decode row stopped early; tokens/s would be wrong")
        return middle - start, time.perf_counter() - middle

    first = sum(once(0))
    times = np.array([once(1 + i) for i in range(args.steps)])
    return first, float(times[:, 0].mean()), float(times[:, 1].mean())


def peak_tflops(device_kind, given=None):
    """Returns the peak dense bf16 TFLOP/s of a device: `given`, else PEAK_TFLOPS's first match, else None."""
    if given is not None:
        return given
    return next((peak for name, peak in PEAK_TFLOPS if name.lower() in device_kind.lower()), None)


def record(name, shape, seconds, tokens, flops, peak, device, **extra):
    """Returns one measurement's JSON-ready dict (tflops: achieved model TFLOP/s; mfu: of the peak)."""
    tflops = flops / seconds / 1e12
    return {
        "measurement": name,
        "shape": shape,
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "flops": flops,
        "tflops": tflops,
        "mfu": tflops / peak if peak else None,
        "device": device,
        **extra,
    }


def table(records) -> str:
    """Returns the markdown table of the measurements."""
    fmt = lambda x, spec: "n/a" if x is None else format(x, spec)
    lines = [
        "| measurement | shape | s / call | tokens/s | model TFLOP / call | XLA TFLOP / call | "
        "TFLOP/s | MFU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        xla = r.get("xla_flops")
        lines.append(
            f"| {r['measurement']} | {r['shape']} | {r['seconds']:.4f} | {r['tokens_per_s']:,.0f} | "
            f"{r['flops'] / 1e12:.4g} | {fmt(xla and xla / 1e12, '.4g')} | {r['tflops']:.4g} | "
            f"{fmt(r['mfu'], '.1%')} |"
        )
    return "\n".join(lines)


def run(args, cfg):
    """Returns the three measurements' records of cfg (`main` parses and checks the flags).

    Long because it is the benchmark's script: config, state and batches built, then the three
    measurements in turn, each with its own FLOP count and shape string, the SFT step's state
    handed on to the GRPO update so one train state is ever held.
    """
    device = jax.devices()[0]
    mesh = sharding.make_mesh("fsdp=1", devices=[device])
    cfg = sharding.model_config(cfg, mesh)
    peak, kind = peak_tflops(device.device_kind, args.peak_tflops), device.device_kind
    rng = np.random.default_rng(0)
    optimizer = _optimizer(1e-5)
    state, state_sh = sharding.init_train_state(
        cfg, mesh, optimizer, jax.random.key(0), with_momentum=False
    )
    name = (
        f"{args.shape} ({args.layers} layers, {args.vision_layers} vision layers, "
        f"{model.count_params(state['params']) / 1e6:,.3g}M params), {args.dtype}"
        f"{'' if args.no_remat else ', remat'}"
    )
    print(name, "on", kind, flush=True)
    out = []

    step = sft.make_train_step(cfg, optimizer, mesh, state_sh)
    state, compile_s, secs, xla = time_train_step(
        step, state, sft_batch(cfg, mesh, args, rng), args.steps
    )
    shape = f"{args.rows} rows x {args.seq} tok, {args.image_patches} patches/row"
    flops = sft_flops(cfg, args.rows, args.seq, args.image_patches)
    tokens = args.rows * args.seq
    out.append(
        record(
            "sft_step", shape, secs, tokens, flops, peak, kind, xla_flops=xla, compile_s=compile_s
        )
    )

    settings = rl_config.rl_defaults()
    settings.num_samples, settings.grad_accum_steps = args.samples, 1
    step = rl.make_grpo_step(cfg, optimizer, settings, state_sh, mesh)
    state, compile_s, secs, xla = time_train_step(
        step, state, grpo_batch(cfg, mesh, settings, args, rng), args.steps
    )
    shape = (
        f"{args.groups} images x {args.samples} x {args.new_tokens} tok after "
        f"{args.prompt_tokens}-tok prompts, {args.image_patches} patches/image"
    )
    flops = grpo_flops(
        cfg, args.groups, args.samples, args.prompt_tokens, args.new_tokens, args.image_patches
    )
    tokens = args.groups * (args.prompt_tokens + args.samples * args.new_tokens)
    out.append(
        record(
            "grpo_update",
            shape,
            secs,
            tokens,
            flops,
            peak,
            kind,
            xla_flops=xla,
            compile_s=compile_s,
        )
    )

    first, prefill_s, decode_s = time_decode(cfg, state["params"], args, rng)
    shape = (
        f"N={args.samples} x {args.decode_tokens} new tok after one {args.decode_prompt}-tok "
        f"prompt, {args.image_patches} patches"
    )
    prefill = prefill_flops(cfg, args.decode_prompt, args.image_patches)
    flops = decode_flops(cfg, args.samples, args.decode_prompt, args.decode_tokens)
    out.append(
        record(
            "decode",
            shape,
            decode_s,
            args.samples * args.decode_tokens,
            flops,
            peak,
            kind,
            prefill_seconds=prefill_s,
            prefill_flops=prefill,
            prefill_mfu=prefill / prefill_s / 1e12 / peak if peak else None,
            compile_s=first - prefill_s - decode_s,
        )
    )
    return out


def parse(argv):
    """Returns the parsed flags, the size flags filled from DEFAULTS[--shape] where not given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(DEFAULTS), default="4b")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--no-remat", action="store_true", help="keep every activation")
    parser.add_argument("--peak-tflops", type=float, help="peak TFLOP/s of the device (MFU)")
    sizes = {
        "layers": "decoder layers kept",
        "vision_layers": "vision blocks kept",
        "rows": "SFT rows",
        "seq": "tokens per SFT row (image tokens included)",
        "image_patches": "patches of each image (a square of an even side; patches / 4 tokens)",
        "groups": "images per GRPO update",
        "prompt_tokens": "tokens per GRPO prompt (image tokens included)",
        "new_tokens": "tokens per GRPO caption",
        "decode_prompt": "tokens of the decode prompt (image tokens included)",
        "decode_tokens": "new tokens per decoded row",
        "steps": "timed calls per measurement (after one warm-up call)",
    }
    for key, help_ in sizes.items():
        default = ", ".join(f"{s}: {d[key]}" for s, d in DEFAULTS.items())
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, help=f"{help_} ({default})")
    parser.add_argument(
        "--samples", type=int, default=16, help="N: captions per image, decode rows"
    )
    args = parser.parse_args(argv)
    for key, value in DEFAULTS[args.shape].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        parser.error("--peak-tflops must be > 0")
    return args, parser


def main(argv=None):
    """Prints one JSON line per measurement, then the markdown table; returns the records."""
    args, parser = parse(argv)
    try:
        cfg = config(args.shape, args.layers, args.vision_layers, args.dtype, not args.no_remat)
        check_sizes(cfg, args)
    except ValueError as e:
        parser.error(str(e))
    records = run(args, cfg)
    for r in records:
        print(json.dumps(r), flush=True)
    print()
    print(table(records))
    return records


if __name__ == "__main__":
    main()
