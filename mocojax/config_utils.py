"""Up-front validation of experiment configs, and the objects a config describes (model, processor, data).

`validate(config, stages)` runs before anything is compiled or loaded and raises ValueError
naming the offending key (`config.optimizer.warmup_ratio=1.5: ...`).
"""

import dataclasses
import importlib
import json
import os
from typing import Callable

import jax
import numpy as np

from mocojax import hf, model, processing, roles, sharding
from mocojax.data import (
    records as records_lib,
    toybase,
    toyloop,
    toypairs,
    toyroles,
    toyworld as tw,
)
from mocojax.train import rl_config

DATA_SOURCES = ("toyworld", "jsonl")
# optimizer.<key>: (low, high, low inclusive, high inclusive), as rl_config.RANGES; all finite.
OPTIMIZER_RANGES = {
    "lr": (0.0, None, False, True),
    "warmup_ratio": (0.0, 1.0, True, False),
    "end_lr_ratio": (0.0, 1.0, True, True),
    "b1": (0.0, 1.0, True, False),
    "b2": (0.0, 1.0, True, False),
    "eps": (0.0, None, False, True),
    "weight_decay": (0.0, None, True, True),
    "grad_clip_norm": (0.0, None, False, True),
}
# Mesh axis names the sharding rules use; any other name would be silently replicated.
MESH_AXES = ("data", "fsdp", "tensor")
DTYPES = ("float32", "bfloat16")


def use_compile_cache(path):
    """Turns on JAX's persistent compilation cache in `path` for every program: a later run that
    compiles the same programs (another seed, a resumed run, the next row of a grid) loads them."""
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _fail(key, value, reason):
    raise ValueError(f"config.{key}={value!r}: {reason}")


def _get(config, key):
    node = config
    for part in key.split("."):
        if part not in node:
            raise ValueError(f"config.{key} is missing")
        node = node[part]
    return node


def _check(config, key, ok, reason):
    value = _get(config, key)
    try:
        good = ok(value)
    except TypeError:
        good = False
    if not good:
        _fail(key, value, reason)


def _positive_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def validate(config, stages):
    """Raises ValueError naming the first bad key; `stages` are the names the runner knows.

    One function on purpose: it is a flat list of per-key checks in the order the config is read
    (stages, seed, mesh, model, data, optimizer, sft, eval, export, rl), and later checks lean on
    earlier keys (data.tasks and rl.evals on data.source, sft.global_batch_size on
    sft.grad_accum_steps); splitting it would scatter the order that decides which bad key is named
    first.
    """
    _check(
        config,
        "stages",
        lambda v: len(v) > 0 and all(isinstance(s, str) for s in v),
        "must list at least one stage",
    )
    for stage in config.stages:
        if stage not in stages:
            _fail(
                "stages", tuple(config.stages), f"unknown stage {stage!r}; known: {sorted(stages)}"
            )
    _check(config, "seed", lambda v: isinstance(v, int), "must be an int")
    if "loop" in config.stages:  # ACE-Cap's evidence loop (mocojax.train.loop)
        if "loop" not in config:
            _fail("stages", tuple(config.stages), "the 'loop' stage needs a config.loop block")
        importlib.import_module("mocojax.train.loop").validate(config.loop)
    try:
        axes = sharding.parse_mesh(config.mesh or None)
        for name, size in axes:
            if name not in MESH_AXES:
                raise ValueError(f"unknown axis {name!r}; the sharding rules use {MESH_AXES}")
            if size < 1 and size != -1:
                raise ValueError(
                    f"axis {name!r} has size {size}; sizes are >= 1, or -1 for the devices left over"
                )
        sharding.resolve_mesh_shape(axes, jax.device_count())
    except ValueError as e:
        _fail("mesh", config.mesh, str(e))
    for key in ("model.dtype", "model.param_dtype"):
        _check(config, key, lambda v: v in DTYPES, f"must be one of {DTYPES}")
    _check(config, "model.remat", lambda v: isinstance(v, bool), "must be True or False")
    _check(
        config,
        "model.logits_chunk",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "must be an int >= 0 (0: the whole sequence at once)",
    )
    if "attention_chunk" in config.model:
        _check(
            config,
            "model.attention_chunk",
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "must be an int >= 0 (0: all queries at once)",
        )
    if "shared_prompt_cache" in config.model:
        _check(
            config,
            "model.shared_prompt_cache",
            lambda v: isinstance(v, bool),
            "must be True or False",
        )
    if config.model.init_from:
        _check(
            config,
            "model.init_from",
            lambda v: os.path.isfile(os.path.join(v, "config.json")),
            "must be an HF Qwen3-VL directory with config.json",
        )
    elif config.data.source != "toyworld":
        _fail(
            "model.init_from",
            config.model.init_from,
            "is required (an HF directory) unless data.source='toyworld'",
        )
    else:
        try:
            model.tiny(**config.model.tiny)
        except (TypeError, ValueError) as e:
            _fail("model.tiny", dict(config.model.tiny), str(e))
    _check(config, "data.source", lambda v: v in DATA_SOURCES, f"must be one of {DATA_SOURCES}")
    if (
        config.model.init_from
        and config.data.source == "toyworld"
        and config.data.get("tasks", "roles") == "roles"
    ):
        _check_base_overlap(config)
    if "tasks" in config.data:
        _check(config, "data.tasks", lambda v: v in ("roles", "base"), "must be 'roles' or 'base'")
        if config.data.tasks == "base" and config.data.source != "toyworld":
            _fail(
                "data.tasks",
                config.data.tasks,
                "'base' tasks exist for data.source='toyworld' only",
            )
    if "policy_drop" in config.data:
        _check(
            config,
            "data.policy_drop",
            lambda v: isinstance(v, (int, float)) and 0 <= v < 1,
            "must be a number in [0, 1)",
        )
    if config.data.get("task_mix"):
        try:
            toybase.parse_task_mix(config.data.task_mix)
        except ValueError as e:
            _fail("data.task_mix", config.data.task_mix, str(e))
    if config.data.source == "jsonl":
        _check(config, "data.train_path", os.path.isfile, "must be an existing JSONL file")
        _check(
            config,
            "data.eval_path",
            lambda v: not v or os.path.isfile(v),
            "must be empty or a JSONL file",
        )
    else:
        for key in ("data.num_train_scenes", "data.num_eval_scenes"):
            _check(config, key, _positive_int, "must be a positive int")
        _check(
            config,
            "data.mix",
            lambda v: len(v) == 3 and all(isinstance(n, int) and n >= 0 for n in v) and sum(v) > 0,
            "must be (policy, generator, judge) record counts per scene",
        )
    _check(config, "data.image_size", _positive_int, "must be a positive int")
    _check(
        config,
        "data.length_buckets",
        lambda v: len(v) > 0 and all(_positive_int(b) for b in v) and list(v) == sorted(set(v)),
        "must be increasing positive ints",
    )
    _check(config, "data.group_by_role", lambda v: isinstance(v, bool), "must be True or False")
    if "judge_per_item" in config.data:
        _check(
            config,
            "data.judge_per_item",
            lambda v: isinstance(v, bool),
            "must be True (one Judge call per rubric item) or False (one per caption)",
        )
    if "judge_pairs" in config.data:
        _check(
            config,
            "data.judge_pairs",
            lambda v: (
                v is False
                or (
                    v is True
                    and config.data.get("judge_per_item")
                    and config.data.source == "toyworld"
                )
            ),
            "must be False, or True with data.judge_per_item=True on data.source='toyworld' "
            "(minimal pairs are built from the toy world's exact content)",
        )
    if "judge_item_form" in config.data:
        _check(
            config,
            "data.judge_item_form",
            lambda v: (
                v == "rubric" or (v in roles.CHECK_FORMS and config.data.get("judge_per_item"))
            ),
            "must be 'rubric', or 'check' / 'echo' / 'reason' / 'lead' with "
            "data.judge_per_item=True (the per-item Judge asked 'Check: <criterion>' and "
            "answering yes / no; after restating the criterion; after the criterion and a "
            "rationale; asked with the criterion before the caption)",
        )
    if "judge_rationale" in config.data:
        _check(
            config,
            "data.judge_rationale",
            lambda v: (
                v == "verdict" or (v in toyroles.RATIONALES and config.data.source == "toyworld")
            ),
            f"must be one of {toyroles.RATIONALES} ('mentions' on data.source='toyworld': the "
            "caption's mentions of the item's shape, read with the toy world's parser)",
        )
    if "loop_mix" in config.data:
        _check(
            config,
            "data.loop_mix",
            lambda v: (
                len(tuple(v)) == 2
                and all(isinstance(n, int) and n >= 0 for n in v)
                and (not any(v) or config.data.source == "toyworld")
            ),
            "must be (Instruct, Composer) record counts per scene, two ints >= 0; records exist "
            "for data.source='toyworld' only (mocojax/data/toyloop.py)",
        )
    for key in (
        *toyroles.RUBRIC_DEFAULTS,
        "judge_repeats",
        "judge_fragments",
        "judge_recolours",
        "judge_pair_absent",
        "generator_reference_order",
    ):
        if key in config.data:
            _check(config, f"data.{key}", lambda v: isinstance(v, bool), "must be True or False")
    shares = {
        "generator_other_image": "of the Generator's SFT records shown another scene's image",
        "weak_swap_colours": "of the weak captions' wrong colours taken from another object",
    }
    for key, what in shares.items():
        if key in config.data:
            _check(
                config,
                f"data.{key}",
                lambda v: (
                    isinstance(v, (int, float))
                    and not isinstance(v, bool)
                    and 0.0 <= v <= 1.0
                    and (v == 0 or config.data.source == "toyworld")
                ),
                f"must be a share in [0, 1] ({what}); non-zero for data.source='toyworld' only",
            )
    if config.data.get("unbound_items", False):
        _check(
            config,
            "data.unbound_items",
            lambda v: (
                config.data.source == "toyworld"
                and all(
                    config.data.get(k, False)
                    for k in ("absent_shapes", "count_items", "count_floor")
                )
                and not any(config.data.get(k, False) for k in ("only_item", "every_object"))
            ),
            "True needs data.source='toyworld' with data.absent_shapes, data.count_items and "
            "data.count_floor True (the shape items it keeps) and data.only_item and "
            "data.every_object False (their items bind a colour to a shape)",
        )
    if "pair_tokens" in config.data:
        _check(
            config,
            "data.pair_tokens",
            lambda v: v is False or (v is True and config.data.source == "toyworld"),
            "must be False, or True on data.source='toyworld' (the toy tokenizer's pair tokens)",
        )
    if "strict" in config.data:
        _check(
            config,
            "data.strict",
            lambda v: isinstance(v, bool),
            "must be True (raise on a bad record) or False (skip and count)",
        )
    _check(
        config,
        "data.max_patches",
        lambda v: v is None or _positive_int(v),
        "must be None or a positive int",
    )
    for key in ("data.min_pixels", "data.max_pixels", "data.max_length"):
        if key.split(".")[1] in config.data:
            _check(
                config,
                key,
                lambda v: v is None or _positive_int(v),
                "must be None or a positive int",
            )
    if config.data.get("min_pixels") and config.data.get("max_pixels"):
        _check(
            config,
            "data.min_pixels",
            lambda v: v <= config.data.max_pixels,
            f"must be <= data.max_pixels={config.data.max_pixels}",
        )
    for key, bounds in OPTIMIZER_RANGES.items():
        _check(
            config,
            "optimizer." + key,
            lambda v: rl_config.in_range(v, *bounds),
            "must be " + rl_config.describe_range(*bounds),
        )
    if "max_skipped_steps" in config.optimizer:
        _check(config, "optimizer.max_skipped_steps", _positive_int, "must be a positive int")
    for key in (
        "num_steps",
        "global_batch_size",
        "grad_accum_steps",
        "eval_every",
        "checkpoint_every",
        "keep_checkpoints",
    ):
        _check(config, "sft." + key, _positive_int, "must be a positive int")
    split = config.sft.grad_accum_steps * jax.process_count()
    _check(
        config,
        "sft.global_batch_size",
        lambda v: v % split == 0,
        f"must be a multiple of grad_accum_steps x processes = {split}",
    )
    if "warmup" in config.stages:
        _check_warmup(config, split)
    for key in ("num_scenes", "batch_size", "max_new_tokens"):
        _check(config, "eval." + key, _positive_int, "must be a positive int")
    if config.eval.get("policy_samples", 0):
        _check(config, "eval.policy_samples", _positive_int, "must be 0 (off) or a positive int")
        _check(
            config,
            "eval.policy_temperature",
            lambda v: v > 0,
            "must be > 0: policy_samples draws captions (greedy is policy/*)",
        )
    _check(
        config,
        "eval.stage",
        lambda v: (
            isinstance(v, str)
            and v.split(",")
            and all(part.strip() in SCORED_STAGES for part in v.split(","))
        ),
        f"must be a comma-separated list of {SCORED_STAGES}, e.g. 'sft,rl'",
    )
    _check(
        config,
        "export.stage",
        lambda v: v in ("warmup", "sft", "rl"),
        "must be 'warmup', 'sft' or 'rl'",
    )
    _check(
        config,
        "export.step",
        lambda v: isinstance(v, int) and v >= -1,
        "must be -1 (latest) or a step",
    )
    if "rl" in config.stages:
        if "rl" not in config:
            _fail(
                "rl", None, "the rl stage needs an `rl` block (mocojax.train.rl_config.rl_defaults)"
            )
        rl_config.validate(config.rl)
        if config.rl.evals == "toyworld" and config.data.source != "toyworld":
            _fail(
                "rl.evals",
                config.rl.evals,
                f"scores against the toy world's truth; data.source is {config.data.source!r} "
                '(use "" for no RL evals)',
            )


BASE_MANIFEST = "toybase.json"


def write_base_manifest(config, out_dir, step):
    """Writes <out_dir>/toybase.json: which toy scenes a base model trained on (so no eval uses them)."""
    seen, built_by = [], []
    # A base continued from another base (model.init_from) has seen that base's scenes too.
    parent = os.path.join(config.model.init_from, BASE_MANIFEST) if config.model.init_from else ""
    if parent and os.path.isfile(parent):
        with open(parent) as f:
            manifest = json.load(f)
        seen, built_by = list(manifest["scenes_seen"]), [manifest["built_by"]]
    seen.append(
        {
            "seed": config.data.seed,
            "start": 0,
            "count": config.data.num_train_scenes + config.data.num_eval_scenes,
        }
    )
    if config.sft.get("init_stage") == "vision":  # the tower was pretrained on its own scenes
        from mocojax.train import toyvision

        seen.append(
            {
                "seed": config.data.seed + toyvision.SEED_OFFSET,
                "start": 0,
                "count": config.vision.num_steps * config.vision.batch_size,
            }
        )
    built_by.append(
        config.export.get("built_by")
        or "python -m mocojax.main --config configs/toybase.py"
        + (f" (task mix {config.data.task_mix})" if config.data.get("task_mix") else "")
    )
    with open(os.path.join(out_dir, BASE_MANIFEST), "w") as f:
        json.dump(
            {
                "step": step,
                "scenes_seen": seen,
                "image_size": config.data.image_size,
                "built_by": " then ".join(built_by),
            },
            f,
            indent=1,
        )


def _check_base_overlap(config):
    """Refuses a toy run whose held-out eval scenes the base model (model.init_from) trained on."""
    path = os.path.join(config.model.init_from, BASE_MANIFEST)
    if not os.path.isfile(path):
        return
    with open(path) as f:
        seen = json.load(f)["scenes_seen"]
    start = config.data.num_train_scenes
    stop = start + max(config.eval.num_scenes, config.data.num_eval_scenes)
    for block in seen:
        if (
            block["seed"] == config.data.seed
            and block["start"] < stop
            and start < block["start"] + block["count"]
        ):
            _fail(
                "data.seed",
                config.data.seed,
                f"the base model {config.model.init_from} trained on scenes {block['start']}.."
                f"{block['start'] + block['count'] - 1} of this seed, which hold the held-out scenes "
                f"{start}..{stop - 1}; pick another data seed (seen: {sorted({b['seed'] for b in seen})})",
            )


@dataclasses.dataclass
class Setup:
    """What a config describes, built without compiling anything."""

    model_config: model.ModelConfig
    processor: processing.Processor
    tokenizer_path: str
    # load_params(place=None): initial parameters, HF weights or a fresh tiny init;
    # place(dotted_path, host_array) -> jax.Array puts each one on its sharding (sharding.placer).
    load_params: Callable[..., dict]


# The stages whose checkpoints the eval stage scores (config.eval.stage).
SCORED_STAGES = ("warmup", "sft", "rl")


def _check_warmup(config, split):
    """The warm-up stage's keys (mocojax.train.sft.run_warmup): SFT on config.warmup.mix before
    the role SFT stage, which must then start from it."""
    if "warmup" not in config:
        _fail(
            "stages",
            tuple(config.stages),
            "the 'warmup' stage needs a config.warmup block (mix, num_steps, global_batch_size; "
            "configs/toyworld.py has one)",
        )
    if config.data.source != "toyworld":
        _fail("stages", tuple(config.stages), "the 'warmup' stage builds toy-world role records")
    _check(
        config,
        "warmup.mix",
        lambda v: len(v) == 3 and all(isinstance(n, int) and n >= 0 for n in v),
        "must be (policy, generator, judge) record counts per scene",
    )
    if "loop_mix" in config.warmup:
        _check(
            config,
            "warmup.loop_mix",
            lambda v: len(v) == 2 and all(isinstance(n, int) and n >= 0 for n in v),
            "must be (instruct, composer) record counts per scene, as data.loop_mix",
        )
    if not sum(config.warmup.mix) + sum(config.warmup.get("loop_mix", (0, 0))):
        _fail(
            "warmup.mix",
            tuple(config.warmup.mix),
            "the warm-up has no records: give warmup.mix (or warmup.loop_mix) a positive count",
        )
    for key in ("num_steps", "global_batch_size"):
        _check(config, "warmup." + key, _positive_int, "must be a positive int")
    if config.warmup.get("restart_at", 0):
        _check(
            config,
            "warmup.restart_at",
            lambda v: isinstance(v, int) and 0 < v < config.warmup.num_steps,
            f"must be 0 (one cosine) or a step in (0, warmup.num_steps={config.warmup.num_steps})",
        )
    _check(
        config,
        "warmup.global_batch_size",
        lambda v: v % split == 0,
        f"must be a multiple of sft.grad_accum_steps x processes = {split}",
    )
    stages = tuple(config.stages)
    if "sft" in stages and stages.index("sft") < stages.index("warmup"):
        _fail("stages", stages, "'warmup' trains what 'sft' starts from: list it before 'sft'")
    if "sft" in stages and config.sft.get("init_stage", "") != "warmup":
        _fail(
            "sft.init_stage",
            config.sft.get("init_stage", ""),
            "the stages run 'warmup' and then 'sft', but sft would not start from the warm-up; "
            "set --config.sft.init_stage=warmup (or drop 'warmup' from config.stages)",
        )


def _round_up(n, multiple):
    return -(-n // multiple) * multiple


def vocab_size_for(tokenizer) -> int:
    """Returns the vocabulary size of a model built for the tokenizer: its size rounded up to 64."""
    return _round_up(len(tokenizer), 64)


def _learned_roles(config):
    """Returns the roles a model learns or plays in the config's stages (toy-world role data):
    role SFT records in data.mix, or an RL rubric role that is not the exact one."""
    if config.data.source != "toyworld" or config.data.get("tasks", "roles") != "roles":
        return ()
    out = set()
    mixes = [("sft", config.data.mix), ("warmup", config.get("warmup", {}).get("mix", ()))]
    for stage, mix in mixes:
        if stage in config.stages:
            out |= {role for role, n in zip(("generator", "judge"), tuple(mix)[1:]) if n}
    if "rl" in config.stages and config.rl.get("reward", "rubric") == "rubric":
        out |= {role for role in ("generator", "judge") if config.rl.get(role) != "exact"}
    return tuple(sorted(out))


def check_rubric_vocabulary(config, tokenizer, tokenizer_path):
    """Raises ValueError when a model must write or read rubric items (`_learned_roles`) whose
    words the tokenizer maps to its unknown token: such items could be neither written nor read,
    and the run would train on "<unk>" silently. Today: `data.count_items` ("mentions at most
    two circles": the toy tokenizer has no " most" or plural shapes) and `data.count_floor`
    ("mentions at least two circles")."""
    roles_learned = _learned_roles(config)
    keys = {"at_most": "count_items", "at_least": "count_floor"}
    kinds = [kind for kind, key in keys.items() if config.data.get(key, False)]
    if not roles_learned or not kinds:
        return
    unk = tokenizer.unk_token_id
    criteria = [
        toyroles.item_of(toyroles.Fact(kind, tw.Mention(shape), value=n)).criterion
        for kind in kinds
        for shape in tw.SHAPES
        for n in toyroles.COUNT_WORDS[:2]
    ]
    unread = [c for c in criteria if unk is not None and unk in tokenizer(c)["input_ids"]]
    if unread:
        raise ValueError(
            f"config.data.{'/'.join(keys[k] for k in kinds)}=True: the tokenizer "
            f"{tokenizer_path} cannot spell "
            f"{len(unread)} count items (e.g. {unread[0]!r} has an unknown word), yet the "
            f"{' and the '.join(roles_learned)} would be learned or played by the model; use count "
            "items with the exact roles (rl.generator=rl.judge='exact', Policy-only SFT "
            "data.mix=(1,0,0)) or a data.tokenizer that has their words"
        )


def build_setup(config, workdir):
    """Returns the Setup: the toy world builds its tokenizer into <workdir>/tokenizer."""
    data = config.data
    pair_tokens = data.get("pair_tokens", False)
    # count items ("mentions at most two circles", "... at least ...") need words the shipped
    # tokenizer lacks (count_floor implies the count tokens: the plural shapes)
    count_tokens = data.get("count_items", False) or data.get("count_floor", False)
    floor_tokens = data.get("count_floor", False)
    # the evidence loop's records (data.loop_mix, or warmup.loop_mix) need the loop prompts'
    # words; every stage of a workdir builds the same tokenizer
    warmup_loop_mix = config.warmup.get("loop_mix", (0, 0)) if "warmup" in config else (0, 0)
    loop_tokens = any(data.get("loop_mix", (0, 0))) or any(warmup_loop_mix)
    if data.tokenizer:
        tokenizer_path = data.tokenizer
    elif config.model.init_from and not (pair_tokens or count_tokens or loop_tokens):
        tokenizer_path = config.model.init_from
    else:
        tokenizer_path = toyroles.build_tokenizer(
            os.path.join(workdir, "tokenizer"),
            pair_tokens=pair_tokens,
            count_tokens=count_tokens,
            loop_tokens=loop_tokens,
            floor_tokens=floor_tokens,
        )
    tokenizer = processing.load_tokenizer(tokenizer_path)
    check_rubric_vocabulary(config, tokenizer, tokenizer_path)
    processor = processing.Processor(
        tokenizer,
        min_pixels=data.min_pixels,
        max_pixels=data.max_pixels,
        max_length=data.max_length,
    )
    dtypes = dict(
        param_dtype=config.model.param_dtype,
        dtype=config.model.dtype,
        remat=config.model.remat,
        logits_chunk=config.model.logits_chunk,
        attention_chunk=config.model.get("attention_chunk", 0),
        shared_prompt_cache=config.model.get("shared_prompt_cache", False),
    )
    if config.model.init_from:
        cfg = model.ModelConfig.from_pretrained(config.model.init_from, **dtypes)
        if len(tokenizer) > cfg.text.vocab_size:
            raise ValueError(
                f"the tokenizer {tokenizer_path} has {len(tokenizer)} tokens but the model "
                f"{config.model.init_from} has {cfg.text.vocab_size} embedding rows"
                + (" (data.pair_tokens adds 30 tokens to the toy tokenizer)" if pair_tokens else "")
                + (" (data.count_items adds 6)" if count_tokens else "")
                + (" (data.count_floor adds 1)" if floor_tokens else "")
                + (" (data.loop_mix adds 36)" if loop_tokens else "")
            )

        def load_params(place=None):
            return hf.load_pretrained(
                config.model.init_from, dtype=cfg.param_dtype, compute_dtype=cfg.dtype, place=place
            )[1]
    else:
        cfg = model.tiny(
            vocab_size=vocab_size_for(tokenizer),
            image_token_id=processor.image_token_id,
            video_token_id=processor.video_token_id,
            vision_start_token_id=processor.vision_start_token_id,
            vision_end_token_id=processor.vision_end_token_id,
            **config.model.tiny,
            **dtypes,
        )

        def load_params(place=None):
            params = model.init_params(cfg, config.seed)
            if place is None:
                return params
            return jax.tree_util.tree_map_with_path(
                lambda path, x: place(".".join(str(k.key) for k in path), np.asarray(x)), params
            )

    return Setup(cfg, processor, tokenizer_path, load_params)


def sft_examples(config, processor=None):
    """Returns (train examples, held-out examples) of the config's data source (processor: see user_examples)."""
    data = config.data
    if data.source == "toyworld" and data.get("tasks", "roles") == "base":
        mix = toybase.parse_task_mix(data.get("task_mix", ""))
        return (
            toybase.base_records(data.seed, data.num_train_scenes, task_mix=mix),
            toybase.base_records(
                data.seed, data.num_eval_scenes, start=data.num_train_scenes, task_mix=mix
            ),
        )
    if data.source == "toyworld":
        options = dict(
            policy_drop=data.get("policy_drop", 0.0),
            judge_repeats=data.get("judge_repeats", False),
            judge_fragments=data.get("judge_fragments", False),
            judge_recolours=data.get("judge_recolours", False),
            judge_pair_absent=data.get("judge_pair_absent", False),
            generator_reference_order=data.get("generator_reference_order", False),
            generator_other_image=data.get("generator_other_image", 0.0),
            weak_swap_colours=data.get("weak_swap_colours", 0.0),
            **toyroles.rubric_options(data),
        )
        train = toyroles.sft_records(data.seed, data.num_train_scenes, tuple(data.mix), **options)
        held_out = toyroles.sft_records(
            data.seed, data.num_eval_scenes, tuple(data.mix), start=data.num_train_scenes, **options
        )
    else:
        train, held_out = (
            user_examples(config, path, processor) if path else []
            for path in (data.train_path, data.eval_path)
        )
    if data.get("judge_per_item", False):
        train, held_out = records_lib.judge_items(train), records_lib.judge_items(held_out)
        if data.get("judge_pairs", False):  # every item seen with both labels (toypairs)
            train = toypairs.judge_minimal_pairs(train, data.seed)
            held_out = toypairs.judge_minimal_pairs(held_out, data.seed)
        elif data.source == "toyworld":  # no item kind may be answered by its usual label
            train = toyroles.balance_judge_items(train, data.seed)
            held_out = toyroles.balance_judge_items(held_out, data.seed)
    if data.get("judge_rationale", "verdict") == "mentions":
        train, held_out = (toyroles.with_mention_rationales(x) for x in (train, held_out))
    if data.get("judge_per_item", False):
        form = records_lib.judge_item_form(data)
        if form != "rubric":
            train, held_out = (records_lib.check_form(x, form) for x in (train, held_out))
    loop_mix = tuple(data.get("loop_mix", (0, 0)))
    if data.source == "toyworld" and any(loop_mix):  # ACE-Cap's Instruct and Composer records
        k = config.loop.max_questions if "loop" in config else 3
        train = train + toyloop.sft_records(data.seed, data.num_train_scenes, loop_mix, 0, k)
        held_out = held_out + toyloop.sft_records(
            data.seed, data.num_eval_scenes, loop_mix, data.num_train_scenes, k
        )
    return train, held_out


def user_records(config, path):
    """Returns the image records of a user JSONL file (records.load_jsonl), strict per data.strict."""
    data = config.data
    return records_lib.load_jsonl(
        path, image_root=data.image_root or None, strict=data.get("strict", False)
    )[0]


def user_examples(config, path, processor=None):
    """Returns the SFT role examples of a user JSONL file; with the processor, rows longer than
    the largest length bucket are refused here, naming their record (records.check_lengths)."""
    examples = records_lib.sft_examples(user_records(config, path))
    if processor is None:
        return examples
    return records_lib.check_lengths(
        examples,
        processor,
        tuple(config.data.length_buckets),
        strict=config.data.get("strict", False),
        name=path,
    )[0]
