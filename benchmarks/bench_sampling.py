"""Sampling throughput on CPU: mocojax.sampling.generate against transformers' generate.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_sampling.py

Both sample (temperature 1, no top-k/top-p, no EOS) 4 prompts x 16 samples x 64 new tokens from
the same random weights, text-only and with one image per prompt. transformers expands each
prompt 16 times (num_return_sequences) and re-encodes it; mocojax encodes it once and shares
its KV cache. A last table compares mocojax's shared prefill against 16 separate prefills of
the same B prompts (concatenated, then one decode of the 64 rows), and mocojax with its prompt
cache kept once per prompt (`shared_prompt_cache`: the 16 rows read one copy) against the cache
copied to the 16 rows. `--text_len 1024` makes the prompts long (decoding then reads a long
prompt cache at every token, where the shared cache matters most).
Times are the best of --repeats runs after a warm-up call (compilation reported apart).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration  # noqa: E402

from mocojax import hf, model, sampling  # noqa: E402

CONFIGS = {
    "tiny": model.tiny(),
    "small": model.tiny(
        vocab_size=4096,
        hidden_size=256,
        num_layers=6,
        num_heads=8,
        num_kv_heads=2,
        head_dim=32,
        vision_depth=4,
        vision_hidden=128,
        deepstack=(1, 2),
        image_token_id=4090,
        video_token_id=4091,
        vision_start_token_id=4088,
        vision_end_token_id=4089,
    ),
}
PROMPTS, SAMPLES, NEW_TOKENS, TEXT_LEN, GRID = 4, 16, 64, 48, (1, 16, 16)


def build(cfg):
    """Returns (transformers model, our params) holding the same random weights."""
    torch.manual_seed(0)
    d = {
        k: v
        for k, v in cfg.to_hf_dict().items()
        if k not in ("architectures", "model_type", "dtype")
    }
    ref = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**d)).float().eval()
    with tempfile.TemporaryDirectory() as path:
        ref.save_pretrained(path)
        _, params = hf.load_pretrained(path, dtype=jnp.float32)
    return ref, params


def prompts(cfg, with_image: bool, rng, text_len: int = TEXT_LEN):
    """Returns (ids [B, L], mask, pixel_values or None, grid or None): text, optionally one image, text."""
    merge = cfg.vision.spatial_merge_size
    image = (
        [cfg.vision_start_token_id]
        + [cfg.image_token_id] * (np.prod(GRID) // merge**2)
        + [cfg.vision_end_token_id]
    )
    rows = [
        list(rng.integers(0, cfg.vision_start_token_id, text_len // 2))
        + (image if with_image else [])
        + list(rng.integers(0, cfg.vision_start_token_id, text_len // 2))
        for _ in range(PROMPTS)
    ]
    ids = np.array(rows, np.int64)
    if not with_image:
        return ids, np.ones_like(ids), None, None
    pixels = rng.standard_normal((PROMPTS * int(np.prod(GRID)), cfg.vision.patch_dim)).astype(
        np.float32
    )
    return ids, np.ones_like(ids), pixels, np.array([GRID] * PROMPTS)


def best_time(fn, repeats):
    """Returns (first call seconds, best of `repeats` later calls)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return first, min(times)


def ours(cfg, params, ids, mask, pixels, grid, num_samples):
    def run():
        out = sampling.generate(
            cfg,
            params,
            ids,
            mask,
            pixels,
            grid,
            max_new_tokens=NEW_TOKENS,
            num_samples=num_samples,
            temperature=1.0,
            rng=jax.random.key(0),
        )
        jax.block_until_ready(out.tokens)

    return run


def separate(cfg, params, ids, mask, pixels, grid):
    """Returns a run that prefills the B prompts 16 times (as 16 expanded copies would) and decodes the 64 rows."""

    def run():
        prefixes = [
            sampling.prefill(cfg, params, ids, mask, pixels, grid, reserve=NEW_TOKENS)
            for _ in range(SAMPLES)
        ]
        rows = jax.tree.map(
            lambda *xs: jnp.concatenate(xs), *[dataclasses.replace(p, cache=None) for p in prefixes]
        )
        caches = jax.tree.map(
            lambda *xs: jnp.concatenate(xs, axis=1), *[p.cache for p in prefixes]
        )  # rows: axis 1
        prefix = dataclasses.replace(rows, cache=caches)
        out = sampling.decode(
            cfg, params, prefix, max_new_tokens=NEW_TOKENS, temperature=1.0, rng=jax.random.key(0)
        )
        jax.block_until_ready(out.tokens)

    return run


def theirs(ref, cfg, ids, mask, pixels, grid):
    inputs = dict(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
    if pixels is not None:
        inputs.update(
            pixel_values=torch.as_tensor(pixels),
            image_grid_thw=torch.as_tensor(grid),
            mm_token_type_ids=torch.as_tensor((ids == cfg.image_token_id).astype(np.int64)),
        )

    def run():
        with torch.no_grad():
            ref.generate(
                **inputs,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                num_return_sequences=SAMPLES,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                eos_token_id=None,
                pad_token_id=0,
            )

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="tiny,small")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--text_len", type=int, default=TEXT_LEN, help="text tokens per prompt (half each side)"
    )
    parser.add_argument(
        "--no_transformers", action="store_true", help="skip transformers (mocojax rows only)"
    )
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count())
    tokens = PROMPTS * SAMPLES * NEW_TOKENS
    rows, shared_rows = [], []
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        ref, params = build(cfg)
        for with_image in (False, True):
            ids, mask, pixels, grid = prompts(
                cfg, with_image, np.random.default_rng(0), args.text_len
            )
            first, ours_s = best_time(
                ours(cfg, params, ids, mask, pixels, grid, SAMPLES), args.repeats
            )
            shared_cfg = cfg.replace(shared_prompt_cache=True)
            _, kept_s = best_time(
                ours(shared_cfg, params, ids, mask, pixels, grid, SAMPLES), args.repeats
            )
            hf_s = float("nan")
            if not args.no_transformers:
                _, hf_s = best_time(theirs(ref, cfg, ids, mask, pixels, grid), args.repeats)
            label = f"{name} ({model.count_params(params) / 1e6:.1f}M), {'image' if with_image else 'text'}, L={ids.shape[1]}"
            print(
                label,
                f"ours {ours_s:.2f} s, shared prompt cache {kept_s:.2f} s, transformers {hf_s:.2f} s",
                flush=True,
            )
            rows.append(
                f"| {label} | {tokens / ours_s:,.0f} | {tokens / kept_s:,.0f} | {tokens / hf_s:,.0f} "
                f"| {hf_s / ours_s:.1f}x | {hf_s / kept_s:.1f}x | {ours_s / kept_s:.2f}x | {first - ours_s:.1f} s |"
            )
            _, separate_s = best_time(separate(cfg, params, ids, mask, pixels, grid), args.repeats)
            shared_rows.append(
                f"| {label} | {ours_s:.2f} s | {separate_s:.2f} s | {separate_s / ours_s:.2f}x |"
            )
    print(
        f"{PROMPTS} prompts x {SAMPLES} samples x {NEW_TOKENS} new tokens, {jax.devices()[0].device_kind}, "
        f"{os.cpu_count()} CPU threads\n"
    )
    print(
        "| config, prompt | mocojax tokens/s | mocojax, shared prompt cache | transformers tokens/s "
        "| speed-up | speed-up, shared | shared vs copied | mocojax compile |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n| config, prompt | shared prefill (N=16) | 16 separate prefills | ratio |")
    print("|---|---|---|---|")
    print("\n".join(shared_rows))


if __name__ == "__main__":
    main()
