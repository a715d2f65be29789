"""Qwen3-VL-8B-Instruct, the method with the paper's settings (MoCo Rubric, Sec. 4): Stage I multi-role
SFT, Stage II Policy RL with online rubrics from the EMA roles (m = 0.99, H = 1), HF export.

  python -m mocojax.main --config configs/qwen3vl_8b_moco.py \
      --config.model.init_from=/ckpt/Qwen3-VL-8B-Instruct \
      --config.data.train_path=/data/sft_train.jsonl --config.data.eval_path=/data/sft_eval.jsonl \
      --workdir /runs/moco_8b

Paper, Stage I: 20,000 SFT records (10k Policy, 5k Generator, 5k Judge), 300 steps, lr 1e-5,
global batch 64, AdamW, cosine decay, 5% warmup; bf16 compute with fp32 master weights.
Stage II: 5,000 RL images, 600 steps, lr 1e-6, per-device batch 8, 2 gradient-accumulation
steps, N = 16 captions per image, M = 4 shown to the Generator, (m, H) = (0.99, 1). On 8
devices that is 8 images x 16 captions per update, 64 rows per micro-batch; the caption,
rubric and decision lengths are ours (the paper gives none). Records are JSONL in the format
of mocojax/data/records.py (docs/data.md); RL reads the image records (id, image,
references) of data.train_path. Memory on 8 x 80 GB: docs/scaling.md. The `tiny` arg keeps
every setting but shrinks steps and batches for a smoke test on the real checkpoint.
"""

import ml_collections

from configs import toyworld


def get_config(arg=""):
    """Returns the 8B SFT config; arg "tiny" runs 2 steps of batch 8."""
    config = toyworld.paper_config()
    config.stages = ("sft", "rl", "export")
    config.mesh = "fsdp=-1"  # ZeRO-3 over every device of every host

    config.model.init_from = ""  # required: an HF directory with config.json + safetensors
    config.model.param_dtype = "float32"
    config.model.dtype = "bfloat16"
    # docs/scaling.md: without remat the step needs ~260 GB per device; 512-position chunks keep
    # the float32 [B, L, 151936] logits to [B, 512, V] at a time.
    config.model.remat = True
    config.model.logits_chunk = 512
    # the toy config's packing and 64-query attention chunks (a CPU measurement) are not measured
    # at this size: one attention call over the whole row, unpacked rows
    config.model.attention_chunk = 0
    config.data.pack = False
    # one KV cache per prompt for its rl.num_samples samples, not one copy per sample: a long
    # image prompt's cache is held and read once per group at every decoded token (the same
    # attention up to float rounding; docs/performance.md)
    config.model.shared_prompt_cache = True

    config.data.source = "jsonl"
    config.data.train_path = ""  # required
    config.data.eval_path = ""
    config.data.image_root = ""  # "" : relative to each JSONL file
    config.data.tokenizer = ""  # "" : the checkpoint's own tokenizer
    config.data.min_pixels = ml_collections.config_dict.placeholder(
        int
    )  # None: the processor's defaults
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
    # fail the run after this many non-finite updates in a row
    config.optimizer.max_skipped_steps = 10
    config.data.strict = False  # True: the first bad record stops the run (BadRecord naming it)

    config.sft.num_steps = 300
    config.sft.global_batch_size = 64
    config.sft.grad_accum_steps = 8  # micro-batches of 8 rows per step
    config.sft.eval_every = 50
    config.sft.checkpoint_every = 50
    config.sft.keep_checkpoints = 3

    rl = config.rl
    rl.evals = ""  # user data has no exact truth to score against
    rl.num_steps = 600
    rl.images_per_step = 8
    rl.grad_accum_steps = 2
    rl.num_samples = 16
    rl.subset_size = 4
    rl.lr = 1e-6
    rl.warmup_ratio = 0.05
    rl.end_lr_ratio = 0.0
    rl.momentum, rl.sync_every = 0.99, 1
    rl.max_new_tokens = 512  # detailed captions
    # the update scores each batch's captions up to its longest, rounded up to 128 (at most 4
    # shapes compile), not the sampler's 512-token room (docs/performance.md)
    rl.update_length_multiple = 128
    rl.generator_max_new_tokens = 1024  # a rubric of ~10-25 weighted items
    rl.judge_max_new_tokens = 1024  # one decision and rationale per item
    rl.log_samples_every = 10
    rl.checkpoint_every = 50
    rl.keep_checkpoints = 3

    config.eval.stage = "rl"
    config.export.stage = "rl"
    if arg == "tiny":
        config.sft.num_steps = 2
        config.sft.global_batch_size = 8
        config.sft.grad_accum_steps = 1
        rl.num_steps = 2
        rl.images_per_step = 2
        rl.grad_accum_steps = 1
        rl.num_samples = 4
        rl.subset_size = 2
        rl.max_new_tokens = rl.generator_max_new_tokens = rl.judge_max_new_tokens = 64
        rl.log_samples_every = rl.checkpoint_every = 1
    elif arg:
        raise ValueError(f"unknown config arg {arg!r}; use '' or 'tiny'")
    return config
