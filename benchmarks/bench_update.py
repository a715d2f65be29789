"""The default toy job's GRPO update on the sampler's whole caption axis against the axis cut to
the batch's longest caption (`rl.update_length_multiple`, mocojax/train/rl_update.py).

  python benchmarks/bench_update.py --repeats 5     # configs/toyworld.py, the shipped base, multiple 16
  python benchmarks/bench_update.py --tiny          # seconds: the script's check

One RL update's Policy captions (images_per_step images x N samples at the RL temperature, from
the config's initial params), rewards drawn at random (the update's cost does not depend on
them), then the jitted GRPO step (`rl.make_grpo_step`, KL reference forward included when
rl.kl_beta > 0) on the batch that `rl.train_batch` builds with update_length_multiple = 0 (the
sampler's max_new_tokens) and with --multiple (16). Times are the best of --repeats after
one call that compiles; one process, side by side; the losses are printed to show both updates
compute the same numbers.
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs import toyworld  # noqa: E402
from mocojax import config_utils, sharding  # noqa: E402
from mocojax.data import pipeline  # noqa: E402
from mocojax.train import rl as rl_lib, rollout, state as state_lib  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="configs/toyworld.py:tiny (a check)")
    parser.add_argument(
        "--multiple", type=int, default=16, help="rl.update_length_multiple of the cut update"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.multiple < 1:
        parser.error("--repeats and --multiple must be >= 1")
    config = toyworld.get_config("tiny" if args.tiny else "")
    rl = config.rl
    setup = config_utils.build_setup(config, tempfile.mkdtemp())
    mesh = sharding.make_mesh(config.mesh or None)
    cfg, processor, params = setup.model_config, setup.processor, setup.load_params()
    group = next(
        iter(
            pipeline.rl_dataset(
                rl_lib.rl_records(config),
                global_batch_size=rl.images_per_step,
                seed=config.data.seed + 1,
                image_size=config.data.image_size,
            )
        )
    )
    prompt, tokens, logprobs, lengths = rollout.sample_policy(
        cfg, params, processor, [e["image"] for e in group], rl, jax.random.key(0)
    )
    samples = rollout.PolicySamples(
        ids=[e["id"] for e in group],
        prompt=prompt,
        tokens=tokens,
        logprobs=logprobs,
        lengths=lengths,
        captions=None,
        rewards=np.random.default_rng(0).random((len(group), rl.num_samples), np.float32),
    )
    optimizer = rl_lib.rl_optimizer(config)
    step = rl_lib.make_grpo_step(cfg, optimizer, rl)
    ref = params if rl.kl_beta > 0 else None
    print(
        f"{len(group)} images x N = {rl.num_samples} captions of {lengths.min()}-{lengths.max()} "
        f"tokens (mean {lengths.mean():.1f}), sampler axis {rl.max_new_tokens}; "
        f"{rl.grad_accum_steps} micro-batches, kl_beta {rl.kl_beta}; best of {args.repeats}"
    )
    rows = {}
    for name, multiple in (("whole axis", 0), (f"cut (multiple {args.multiple})", args.multiple)):
        rl.update_length_multiple = multiple
        batch = rl_lib.place_batch(
            mesh, rl_lib.train_batch(cfg, samples, rl, rl_lib.advantages(samples, rl))
        )
        times = []
        for i in range(args.repeats + 1):  # the first call compiles
            state = state_lib.init_state(
                jax.tree.map(np.array, params), optimizer, jax.random.key(0)
            )
            jax.block_until_ready(state)
            t0 = time.perf_counter()
            _, metrics = step(state, batch, ref)
            metrics = jax.device_get(metrics)
            if i:
                times.append(time.perf_counter() - t0)
        rows[name] = (batch["completion"].shape[-1], min(times), metrics)
    base = rows["whole axis"][1]
    print("| update | caption axis | seconds | vs whole axis | pg_loss | ratio_mean |")
    print("|---|---|---|---|---|---|")
    for name, (width, seconds, metrics) in rows.items():
        print(
            f"| {name} | {width} | {seconds:.3f} | {seconds / base:.2f}x | "
            f"{float(metrics['pg_loss']):.6g} | {float(metrics['ratio_mean']):.6f} |"
        )


if __name__ == "__main__":
    main()
