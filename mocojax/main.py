"""Runs an experiment's stages in order: python -m mocojax.main --config configs/X.py[:arg] --workdir DIR.

Each stage is `run(config, workdir) -> dict` of final metrics, found by name in STAGES; stages
talk to each other only through the workdir's checkpoints, so any stage can be rerun alone
(`--config.stages='("export",)'`). The RL stage lives in mocojax.train.rl and is imported
only when a config lists it.
"""

import importlib
import json
import logging
import os

import jax
from absl import app, flags, logging as absl_logging
from ml_collections import config_flags

from mocojax import checkpoint, config_utils, distributed, workdir_lock
from mocojax.train import sft

DEFAULT_COMPILE_CACHE = "~/.cache/mocojax/jax"

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (configs/*.py[:arg]).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and exports.")
_BREAK_LOCK = flags.DEFINE_bool(
    "break_lock",
    False,
    "Take over a workdir whose lock names a run on another host (after making sure it is gone).",
)
_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache",
    "",
    "JAX's persistent compilation cache: a directory, or 'off'. Default: $JAX_COMPILATION_CACHE_DIR "
    f"when set, else {DEFAULT_COMPILE_CACHE} for a one-process run (a rerun, another seed or a "
    "resumed run loads the programs an earlier run compiled) and off for a multi-process one.",
)


def run_rl(config, workdir):
    """Stage II: Policy RL with momentum transfer (mocojax.train.rl)."""
    return importlib.import_module("mocojax.train.rl").run_rl(config, workdir)


def eval_stages(config):
    """Returns the stages whose checkpoints the eval stage scores: config.eval.stage, e.g. "sft,rl"."""
    return tuple(part.strip() for part in config.eval.stage.split(",") if part.strip())


def run_eval(config, workdir):
    """Scores the latest checkpoint of each of config.eval.stage ("sft", "rl" or "sft,rl") on
    held-out toy-world scenes; writes <workdir>/eval_<stage>_<step>.json for each."""
    if config.data.source != "toyworld":
        raise ValueError(
            f"config.data.source={config.data.source!r}: the eval stage scores the toy world only"
        )
    from mocojax.eval import toybase_eval, toyworld_eval

    setup = config_utils.build_setup(config, workdir)
    # A base-pretraining run (data.tasks="base") is scored on its own tasks, not the roles.
    scorer = toybase_eval if config.data.get("tasks", "roles") == "base" else toyworld_eval
    results = {}
    for stage in eval_stages(config):
        params, step = checkpoint.restore_params(workdir, stage, setup.model_config)
        result = scorer.evaluate(
            setup.model_config, params, setup.processor, **toyworld_eval.held_out_kwargs(config)
        )
        result = {"stage": stage, "step": step, **result}
        with open(os.path.join(workdir, f"eval_{stage}_{step}.json"), "w") as f:
            json.dump(result, f, indent=1)
        print(toyworld_eval.format_table(result), flush=True)
        results[stage] = result
    return results


def run_export(config, workdir):
    """Writes a checkpoint of config.export.stage as an HF directory (with the tokenizer files)."""
    setup = config_utils.build_setup(config, workdir)
    out_dir = config.export.out_dir or os.path.join(workdir, "hf")
    step = None if config.export.step == -1 else config.export.step
    step = checkpoint.export_hf(
        workdir, config.export.stage, setup.model_config, out_dir, setup.tokenizer_path, step
    )
    # A toy base, or a model continued from one for others to start from (export.built_by set:
    # configs/toybase_check.py), records the scenes it trained on so no eval uses them.
    if config.data.get("tasks", "roles") == "base" or config.export.get("built_by"):
        config_utils.write_base_manifest(config, out_dir, step)
    return {"step": step, "out_dir": out_dir}


def run_loop(config, workdir):
    """ACE-Cap's evidence loop trained with LOOP-GRPO (mocojax.train.loop, configs/acecap_loop.py)."""
    return importlib.import_module("mocojax.train.loop").run_loop(config, workdir)


def run_vision(config, workdir):
    """Toy base, step one: pretrain the vision tower on labelled cells (mocojax.train.toyvision)."""
    return importlib.import_module("mocojax.train.toyvision").run_vision(config, workdir)


STAGES = {
    "vision": run_vision,
    "warmup": sft.run_warmup,
    "sft": sft.run_sft,
    "rl": run_rl,
    "loop": run_loop,
    "eval": run_eval,
    "export": run_export,
}
MULTI_HOST_STAGES = ("warmup", "sft", "rl")
TRAINING_STAGES = ("vision", "warmup", "sft", "rl", "loop")


def config_file_name(workdir, stages):
    """Returns the name of the file the run's config is written to in its workdir: config.json,
    which describes the checkpoints (`mocojax.serve` reads it), for a run that trains or for the
    first run into the workdir; a later eval or export run writes config_<stages>.json beside
    it, so scoring a checkpoint with other settings does not overwrite how it was trained."""
    if set(stages) & set(TRAINING_STAGES) or not os.path.exists(
        os.path.join(workdir, "config.json")
    ):
        return "config.json"
    return f"config_{'_'.join(stages)}.json"


def run(config, workdir, break_lock=False, lock_held=False):
    """Validates the config, then runs its stages in order; returns {stage: final metrics}.

    The workdir is locked while the stages run (mocojax.workdir_lock: a second run into the same
    workdir stops at once; break_lock takes over a lock left on another host). lock_held: the
    caller holds that lock already (mocojax.ablate holds it around a grid run)."""
    config_utils.validate(config, STAGES)
    if jax.process_count() > 1 and set(config.stages) - set(MULTI_HOST_STAGES):
        raise ValueError(
            f"config.stages={tuple(config.stages)}: only {MULTI_HOST_STAGES} run on several processes; "
            "run the other stages as a single-process command on the same --workdir"
        )
    os.makedirs(workdir, exist_ok=True)
    results = {}
    with workdir_lock.hold(workdir, distributed.is_main() and not lock_held, break_lock):
        if distributed.is_main():
            with open(os.path.join(workdir, config_file_name(workdir, config.stages)), "w") as f:
                f.write(config.to_json_best_effort(indent=1))
        for stage in config.stages:
            logging.info("stage %s", stage)
            results[stage] = STAGES[stage](config, workdir)
    return results


def compile_cache_dir(flag, environ, process_count):
    """Returns the persistent compilation cache directory main turns on, or None: the --compile_cache
    flag's directory; none for "off" or when $JAX_COMPILATION_CACHE_DIR is set (JAX reads it
    itself); else DEFAULT_COMPILE_CACHE for a one-process run (several processes: off)."""
    if flag == "off" or (not flag and environ.get("JAX_COMPILATION_CACHE_DIR")):
        return None
    if flag:
        return os.path.expanduser(flag)
    return os.path.expanduser(DEFAULT_COMPILE_CACHE) if process_count == 1 else None


class _DropReadOnlyNotice(logging.Filter):
    """Drops orbax's warning that a checkpoint directory is read only: eval and export open
    checkpoints read only on purpose, so the line says nothing a user should act on."""

    def filter(self, record):
        return "Given directory is read only" not in record.getMessage()


def main(argv):
    # orbax logs every checkpoint step at INFO; --verbosity=0 brings it back.
    absl_logging.set_verbosity(absl_logging.WARNING)
    absl_logging.get_absl_logger().addFilter(_DropReadOnlyNotice())
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _WORKDIR.value is None:
        raise app.UsageError("--workdir is required")
    # Before validation: it counts devices, and jax.distributed must start before any device use.
    distributed.initialize(_CONFIG.value.get("distributed"))
    cache = compile_cache_dir(_COMPILE_CACHE.value, os.environ, jax.process_count())
    if cache:
        try:
            config_utils.use_compile_cache(cache)
        except OSError as e:  # e.g. a read-only home: the run goes on, compiling every program
            logging.warning("no persistent compilation cache (%s); --compile_cache=DIR sets one", e)
    run(_CONFIG.value, _WORKDIR.value, _BREAK_LOCK.value)


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main)
