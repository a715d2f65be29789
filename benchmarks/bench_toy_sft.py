"""The default toy job's SFT throughput, before / after packing and chunked attention, on CPU.

  python benchmarks/bench_toy_sft.py --batches 8

Takes the first --batches batches of the default toy-world SFT stage (configs/toyworld.py:paper:
role-grouped batches of 16, the shipped toy base model) and times, for each variant, the host
micro-batching (packing included) + the jitted step + fetching the metrics over those batches,
after a first pass that compiles every shape. Tokens are real (non-padding) tokens; target
tokens are the loss-masked ones. Every variant trains from the same state on the same batches,
and the loss of each batch is printed beside the baseline's (it must agree to float32 rounding).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The repository root, for `configs` (and this checkout's mocojax) when run as a script.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from profile_sft import host_batches, toy_setup  # noqa: E402

from mocojax.train import sft, state as state_lib  # noqa: E402

VARIANTS = {
    "baseline": dict(pack=False, attention_chunk=0),
    "pack": dict(pack=True, attention_chunk=0),
    "attention_chunk=64": dict(pack=False, attention_chunk=64),
    "pack + attention_chunk=64": dict(pack=True, attention_chunk=64),
}


def run_variant(config, cfg, params, batches, pack, attention_chunk):
    """Returns (seconds of the timed pass, [loss per batch], rows per batch)."""
    cfg = cfg.replace(attention_chunk=attention_chunk)
    optimizer = state_lib.make_optimizer(config.optimizer, config.sft.num_steps)
    step = jax.jit(lambda s, b: sft.train_step(cfg, optimizer, s, b), donate_argnums=0)
    data = config.data

    def one_pass(state):
        losses, rows = [], []
        for batch in batches:
            micro = sft.micro_batches(
                cfg,
                batch,
                config.sft.grad_accum_steps,
                data.max_patches,
                pack,
                data.pack_row_multiple,
            )
            state, metrics = step(state, jax.device_put(micro))
            metrics = jax.device_get(metrics)
            losses.append(float(metrics["loss"]))
            rows.append(micro["input_ids"].shape[1])
        return state, losses, rows

    fresh = lambda: jax.tree.map(
        jnp.copy, state_lib.init_state(params, optimizer, jax.random.key(0))
    )
    one_pass(fresh())  # compiles every shape
    state = fresh()
    t0 = time.perf_counter()
    _, losses, rows = one_pass(state)
    return time.perf_counter() - t0, losses, rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--scenes", type=int, default=400)
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {list(VARIANTS)}"
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.variants.split(",") if name not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
    config, setup, train = toy_setup(args.scenes)
    cfg, params = setup.model_config, setup.load_params()
    batches = [b for b, _ in host_batches(config, setup, train, args.batches)]
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    target = sum(int(b["loss_mask"].sum()) for b in batches)
    roles = [int(b["role"][0]) for b in batches]
    print(
        f"{len(batches)} batches (roles {roles}), {real:,} real tokens, {target:,} target tokens, "
        f"{sum(b['input_ids'].size for b in batches):,} padded slots unpacked"
    )
    print(
        "\n| variant | rows per batch | s | real tok/s | target tok/s | vs baseline | max |loss diff| |"
    )
    print("|---|---|---|---|---|---|---|")
    base = None
    for name in args.variants.split(","):
        seconds, losses, rows = run_variant(config, cfg, params, batches, **VARIANTS[name])
        base = base or (seconds, losses)
        diff = np.abs(np.asarray(losses) - np.asarray(base[1])).max()
        print(
            f"| {name} | {' '.join(map(str, rows))} | {seconds:.2f} | {real / seconds:,.0f} | "
            f"{target / seconds:,.0f} | {base[0] / seconds:.2f}x | {diff:.1e} |",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
