"""SFT train-step throughput (tokens/s), mocojax vs PyTorch (transformers Qwen3-VL + torch AdamW), on CPU.

  python benchmarks/bench_sft.py --sizes tiny,small --steps 5

Both sides train the same model shapes on the same toy-world batch (8 rows, all three roles,
16-token images), fp32, AdamW, full forward + backward + update; the timed steps follow
two warmup steps (compilation excluded). Tokens are the batch's non-padding tokens.

Two mocojax columns, side by side in the same run: the step as the batch comes (8 rows padded to
640) and, with --pack_chunk N > 0 (default 64), the step as the toy job runs it: the records
packed several to a row (`sft.pack_rows`, rows rounded to a multiple of 4) and causal attention N
queries at a time (`model.attention_chunk`). Transformers trains the padded batch (its SDPA
attention on CPU has no padding-free path), so the packed column counts the same real tokens in
fewer slots.
"""

import argparse
import dataclasses
import os
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration  # noqa: E402

from mocojax import config_utils, model, processing  # noqa: E402
from mocojax.data import pipeline, toyroles  # noqa: E402
from mocojax.train import (
    sft,  # noqa: E402
    state as state_lib,  # noqa: E402
)

SIZES = {
    "tiny": dict(
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        vision_depth=1,
        vision_hidden=32,
        deepstack=(0,),
    ),
    "small": dict(
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        vision_depth=2,
        vision_hidden=64,
        deepstack=(0, 1),
    ),
}
OPTIMIZER = ml_collections.ConfigDict(
    dict(
        lr=1e-4,
        warmup_ratio=0.0,
        end_lr_ratio=1.0,
        b1=0.9,
        b2=0.999,
        eps=1e-8,
        weight_decay=0.0,
        grad_clip_norm=1e9,
    )
)


def toy_batch():
    """Returns (processor, one padded SFT batch of 8 toy-world rows)."""
    tokenizer_dir = toyroles.build_tokenizer(tempfile.mkdtemp())
    processor = processing.Processor(
        processing.load_tokenizer(tokenizer_dir), min_pixels=128 * 128, max_pixels=128 * 128
    )
    examples = toyroles.sft_records(seed=0, num_scenes=2)
    return processor, next(
        iter(pipeline.sft_dataset(examples, processor, global_batch_size=8, seed=0, buckets=(640,)))
    )


def bench_jax(cfg, batch, steps, pack=False):
    """Returns (seconds per train step of the jitted mocojax step, rows of its batch); pack: the
    records packed several to a row first (`sft.micro_batches(..., pack=True)`)."""
    optimizer = state_lib.make_optimizer(OPTIMIZER, total_steps=100)
    state = state_lib.init_state(model.init_params(cfg, 0), optimizer, jax.random.key(0))
    step = jax.jit(lambda s, b: sft.train_step(cfg, optimizer, s, b), donate_argnums=0)
    micro = sft.micro_batches(cfg, batch, 1, pack=pack)
    device_batch = jax.device_put(micro)
    for _ in range(2):
        state, metrics = step(state, device_batch)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, device_batch)
    jax.block_until_ready(metrics)
    return (time.perf_counter() - start) / steps, micro["input_ids"].shape[-2]


def bench_torch(cfg, batch, steps):
    """Returns seconds per train step of transformers' Qwen3-VL with torch AdamW (masked-label loss)."""
    hf_model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**cfg.to_hf_dict())).float().train()
    optimizer = torch.optim.AdamW(hf_model.parameters(), lr=1e-4, weight_decay=0.0)
    labels = np.where(batch["loss_mask"] > 0, batch["input_ids"], -100)
    inputs = dict(
        input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
        attention_mask=torch.tensor(batch["attention_mask"]),
        pixel_values=torch.tensor(batch["pixel_values"]),
        image_grid_thw=torch.tensor(batch["image_grid_thw"]),
        mm_token_type_ids=torch.tensor(batch["mm_token_type_ids"]),
        labels=torch.tensor(labels, dtype=torch.long),
    )

    def one_step():
        optimizer.zero_grad(set_to_none=True)
        hf_model(**inputs).loss.backward()
        optimizer.step()

    for _ in range(2):
        one_step()
    start = time.perf_counter()
    for _ in range(steps):
        one_step()
    return (time.perf_counter() - start) / steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--pack_chunk",
        type=int,
        default=64,
        help="> 0: a second mocojax column, packed rows and attention this many queries at a time",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    processor, batch = toy_batch()
    tokens = int(batch["attention_mask"].sum())
    print(
        f"batch: {batch['input_ids'].shape} ({tokens} real tokens), {batch['image_grid_thw'].shape[0]} images"
    )
    packed = f"mocojax packed + chunk {args.pack_chunk}"
    head = ["size", "params", "mocojax tok/s", "PyTorch tok/s", "mocojax / PyTorch"]
    if args.pack_chunk:
        head += [f"{packed} tok/s (rows)", f"{packed} / PyTorch"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    vocab_size = config_utils.vocab_size_for(processor.tokenizer)
    for size in args.sizes.split(","):
        cfg = model.tiny(
            vocab_size=vocab_size,
            image_token_id=processor.image_token_id,
            video_token_id=processor.video_token_id,
            vision_start_token_id=processor.vision_start_token_id,
            vision_end_token_id=processor.vision_end_token_id,
            **SIZES[size],
        )
        (jax_s, _), torch_s = bench_jax(cfg, batch, args.steps), bench_torch(cfg, batch, args.steps)
        cells = [
            size,
            f"{model.count_params(model.abstract_params(cfg)):,}",
            f"{tokens / jax_s:,.0f}",
            f"{tokens / torch_s:,.0f}",
            f"{torch_s / jax_s:.2f}",
        ]
        if args.pack_chunk:
            chunked = dataclasses.replace(cfg, attention_chunk=args.pack_chunk)
            packed_s, rows = bench_jax(chunked, batch, args.steps, pack=True)
            cells += [f"{tokens / packed_s:,.0f} ({rows})", f"{torch_s / packed_s:.2f}"]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
