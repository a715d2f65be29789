"""Qwen3-VL-8B-Instruct, Stage I multi-role SFT with the paper's settings (MoCo Rubric, Sec. 4), then export.

  python -m mocojax.main --config configs/qwen3vl_8b_moco.py \
      --config.model.init_from=/ckpt/Qwen3-VL-8B-Instruct \
      --config.data.train_path=/data/sft_train.jsonl --config.data.eval_path=/data/sft_eval.jsonl \
      --workdir /runs/moco_8b

Paper: 20,000 SFT records (10k Policy, 5k Generator, 5k Judge), 300 steps, lr 1e-5, global
batch 64, AdamW, cosine decay, 5% warmup; bf16 compute with fp32 master weights. Records are
JSONL in the format of mocojax/data/records.py (docs/data.md). The `tiny` arg keeps every
setting but shrinks steps and batch for a smoke test on the real checkpoint.
"""

import ml_collections

from configs import toyworld


def get_config(arg=""):
    """Returns the 8B SFT config; arg "tiny" runs 2 steps of batch 8."""
    config = toyworld.get_config()
    config.stages = ("sft", "export")
    config.mesh = "fsdp=-1"  # ZeRO-3 over every device of every host

    config.model.init_from = ""  # required: an HF directory with config.json + safetensors
    config.model.param_dtype = "float32"
    config.model.dtype = "bfloat16"
    # docs/scaling.md: without remat the step needs ~260 GB per device; 512-position chunks keep
    # the float32 [B, L, 151936] logits to [B, 512, V] at a time.
    config.model.remat = True
    config.model.logits_chunk = 512

    config.data.source = "jsonl"
    config.data.train_path = ""  # required
    config.data.eval_path = ""
    config.data.image_root = ""  # "" : relative to each JSONL file
    config.data.tokenizer = ""  # "" : the checkpoint's own tokenizer
    config.data.min_pixels = ml_collections.config_dict.placeholder(int)  # None: the processor's defaults
    config.data.max_pixels = 1024 * 28 * 28
    config.data.max_length = 2048
    config.data.length_buckets = (512, 1024, 1536, 2048)
    config.data.group_by_role = False  # mixed-role batches, as the paper
    config.data.max_patches = ml_collections.config_dict.placeholder(int)

    config.optimizer.lr = 1e-5
    config.optimizer.warmup_ratio = 0.05
    config.optimizer.end_lr_ratio = 0.0
    config.optimizer.b1, config.optimizer.b2, config.optimizer.eps = 0.9, 0.999, 1e-8
    config.optimizer.weight_decay = 0.0
    config.optimizer.grad_clip_norm = 1.0

    config.sft.num_steps = 300
    config.sft.global_batch_size = 64
    config.sft.grad_accum_steps = 8  # micro-batches of 8 rows per step
    config.sft.eval_every = 50
    config.sft.checkpoint_every = 50
    config.sft.keep_checkpoints = 3

    config.eval.stage = "sft"
    config.export.stage = "sft"
    if arg == "tiny":
        config.sft.num_steps = 2
        config.sft.global_batch_size = 8
        config.sft.grad_accum_steps = 1
    elif arg:
        raise ValueError(f"unknown config arg {arg!r}; use '' or 'tiny'")
    return config
