"""Long prompts under two bucket rules, side by side in one run: the sampler's padding cost.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_buckets.py --lengths 1090 --repeats 2

For each prompt length (4 prompts x 16 samples x 64 new tokens, text-only and with one image, the
same random weights as benchmarks/bench_sampling.py) it times `sampling.prefill` of the 4 prompts
and the whole `sampling.generate` with the prompt cache copied to the 16 rows and kept once
(`shared_prompt_cache`), once under `sampling.bucket` (four sizes per octave above 1024) and once
under the rule it replaced (multiples of 1024 above 1024), then transformers' `generate` once.
Times are the best of --repeats runs after a warm-up call.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_sampling as bench  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from mocojax import sampling  # noqa: E402


def multiples_of_1024(n: int, minimum: int = 16) -> int:
    """The bucket rule before session 38: a power of two up to 1024 (as now), then a multiple of 1024."""
    return sampling.bucket(n, minimum) if n <= 1024 else -(-n // 1024) * 1024


RULES = {"multiples of 1024": multiples_of_1024, "four per octave": sampling.bucket}


def measure(cfg, params, ids, mask, pixels, grid, repeats):
    """Returns (padded width, prefill s, copied-cache generate s, shared-cache generate s)."""

    def prefill():
        prefix = sampling.prefill(cfg, params, ids, mask, pixels, grid, reserve=bench.NEW_TOKENS)
        jax.block_until_ready(jax.tree.leaves(prefix))

    _, prefill_s = bench.best_time(prefill, repeats)
    _, copied_s = bench.best_time(
        bench.ours(cfg, params, ids, mask, pixels, grid, bench.SAMPLES), repeats
    )
    shared = cfg.replace(shared_prompt_cache=True)
    _, shared_s = bench.best_time(
        bench.ours(shared, params, ids, mask, pixels, grid, bench.SAMPLES), repeats
    )
    return sampling.bucket(ids.shape[1]), prefill_s, copied_s, shared_s


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="small", choices=sorted(bench.CONFIGS))
    parser.add_argument(
        "--lengths", default="1090", help="comma-separated prompt lengths in tokens (> 1024)"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no_transformers", action="store_true")
    args = parser.parse_args(argv)
    cfg = bench.CONFIGS[args.config]
    ref, params = bench.build(cfg)
    tokens = bench.PROMPTS * bench.SAMPLES * bench.NEW_TOKENS
    current = sampling.bucket
    rows = []
    for length in map(int, args.lengths.split(",")):
        for with_image in (True, False):
            # bench.prompts gives text_len text tokens, plus the image's tokens with an image:
            # search the text length whose prompt is `length` tokens long.
            text_len = length
            ids, mask, pixels, grid = bench.prompts(
                cfg, with_image, np.random.default_rng(0), text_len
            )
            text_len -= ids.shape[1] - length
            ids, mask, pixels, grid = bench.prompts(
                cfg, with_image, np.random.default_rng(0), text_len
            )
            label = f"{'image' if with_image else 'text'}, L = {ids.shape[1]}"
            hf_s = float("nan")
            if not args.no_transformers:
                _, hf_s = bench.best_time(
                    bench.theirs(ref, cfg, ids, mask, pixels, grid), args.repeats
                )
            try:
                for name, rule in RULES.items():
                    sampling.bucket = rule
                    width, prefill_s, copied_s, shared_s = measure(
                        cfg, params, ids, mask, pixels, grid, args.repeats
                    )
                    print(
                        f"{label}, {name}: padded to {width}, prefill {prefill_s:.2f} s, "
                        f"copied {copied_s:.2f} s, shared {shared_s:.2f} s, transformers {hf_s:.2f} s",
                        flush=True,
                    )
                    rows.append(
                        f"| {label} | {name} | {width:,} | {prefill_s:.2f} s | {tokens / copied_s:,.0f} "
                        f"| {tokens / shared_s:,.0f} | {tokens / hf_s:,.0f} | {hf_s / copied_s:.1f}x "
                        f"| {hf_s / shared_s:.1f}x |"
                    )
            finally:
                sampling.bucket = current
    print(
        f"\n{bench.PROMPTS} prompts x {bench.SAMPLES} samples x {bench.NEW_TOKENS} new tokens, "
        f"{args.config} config, {jax.devices()[0].device_kind}, {os.cpu_count()} CPU threads\n"
    )
    print(
        "| prompt | buckets | padded to | prefill of the prompts | mocojax, copied (tokens/s) "
        "| mocojax, shared prompt cache | transformers | copied vs transformers "
        "| shared vs transformers |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return rows


if __name__ == "__main__":
    main()
