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
import functools  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from mocojax import model, sharding  # noqa: E402

# Split out (move only, #14); re-exported so `plan.<name>` keeps working.
from mocojax.plan_rows import (  # noqa: E402, F401
    Row,
    _activation_estimate,
    _compile,
    _grpo_row,
    _optimizer,
    _sampler_rows,
    _sds,
    _Settings,
    _sft_row,
    _train_state,
    _vision_estimate,
    _vision_inputs,
)

GB = 1e9


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

    Long because of the argparse declarations (19 flags, most one argument per line as ruff formats
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
        "--shared-prompt-cache",
        action="store_true",
        help="model.shared_prompt_cache: one KV cache per prompt for its N samples (sampler and "
        "the RL update's scoring), not N copies",
    )
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
        shared_prompt_cache=args.shared_prompt_cache,
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
        f"logits_chunk={cfg.logits_chunk}, shared_prompt_cache={cfg.shared_prompt_cache}, "
        f"mesh {dict(mesh.shape)} ({mesh.devices.size} x {args.hbm_gb:g} GB)"
    )
    print(table(rows, args.hbm_gb * GB))
    print(f"wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
