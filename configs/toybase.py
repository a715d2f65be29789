"""The toy base model: pretrain the tiny Qwen3-VL-shaped model to see and read the toy world.

The analogue of the pretrained checkpoint the paper starts from. It trains on generic tasks
(`mocojax.data.toybase`: cell-by-cell listings, "what is at the top left?", "where is the red
circle?", captions, and reading captions back) -- never the role prompts -- then scores every
task against its trivial baseline (eval_sft_<step>.json) and exports an HF directory. The
repo ships the result in mocojax/assets/toybase, which configs/toyworld.py:paper starts from
and configs/toybase_check.py continues; this rebuilds it exactly (same seed, same machine type:
the run is deterministic):

  python -m mocojax.main --config configs/toybase.py --workdir runs/toybase \
      --config.export.out_dir=mocojax/assets/toybase
  python -m mocojax.main --config configs/toybase.py:tiny --workdir /tmp/toybase_tiny   # seconds, for tests
"""

import ml_collections

from configs import toyworld


def get_config(arg=""):
    """Returns the base-pretraining config; arg "tiny" shrinks model, data and steps for a smoke run."""
    config = toyworld.paper_config(arg)
    config.stages = ("vision", "sft", "eval", "export")
    config.model.init_from = ""  # from random weights
    config.model.tiny = dict(toyworld.BASE_MODEL)
    config.data.tasks = "base"
    # records per scene and task, e.g. "names=3,attr=3" ("" : toybase.DEFAULT_TASK_MIX)
    config.data.task_mix = ""
    # toy runs evaluate on other seeds (the export writes toybase.json to say so)
    config.data.seed = 0
    config.data.num_train_scenes = 20000
    config.data.num_eval_scenes = 64
    config.data.length_buckets = (64, 128, 192)
    # every image has 36 patches; a batch takes the next power of two
    config.data.max_patches = None
    config.data.group_by_role = True  # image tasks and text tasks in separate batches
    # the shipped base was built unpacked and unchunked: kept so, so this rebuilds it exactly
    config.data.pack = False
    config.model.attention_chunk = 0
    # Step one (mocojax.train.toyvision): the vision tower learns to label each cell's token.
    config.vision = ml_collections.ConfigDict()
    config.vision.num_steps = 600
    config.vision.batch_size = 64
    config.vision.lr = 3e-3
    config.sft.init_stage = "vision"
    config.optimizer.lr = 3e-3
    config.optimizer.warmup_ratio = 0.02
    config.optimizer.end_lr_ratio = 0.1
    config.sft.num_steps = 2500
    config.sft.global_batch_size = 32
    config.sft.eval_every = 500
    config.sft.checkpoint_every = 250
    config.sft.keep_checkpoints = 40
    config.eval.stage = "sft"
    config.eval.num_scenes = 100
    config.eval.batch_size = 100
    config.eval.max_new_tokens = 64
    config.export.stage = "sft"
    if arg == "tiny":
        config.model.tiny = dict(
            hidden_size=32,
            num_layers=2,
            num_heads=2,
            num_kv_heads=1,
            head_dim=16,
            vision_depth=1,
            vision_hidden=32,
            deepstack=(0,),
        )
        config.data.num_train_scenes = 8
        config.data.num_eval_scenes = 2
        config.data.length_buckets = (192,)
        config.sft.num_steps = 3
        config.vision.num_steps = 2
        config.vision.batch_size = 4
        config.sft.global_batch_size = 8
        config.sft.grad_accum_steps = 1
        config.eval.num_scenes = 2
        config.eval.batch_size = 8
        config.eval.max_new_tokens = 8
    return config
