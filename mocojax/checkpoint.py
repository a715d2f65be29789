"""Orbax checkpoints of a train state, exact resume, and HF export of any checkpoint.

Layout: <workdir>/checkpoints/<stage>/<step>/ with three items:
  params  the parameter tree (restorable alone, for eval and export)
  state   everything else in the train state (opt_state, step, rng as raw key data, momentum...)
  extra   JSON: the grain iterator state, the skipped-update count, anything host-side
"""

import logging
import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from mocojax import hf, model

_READ_ONLY = ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, create=False)


def stage_dir(workdir, stage):
    """Returns the directory holding a stage's checkpoints."""
    return os.path.join(os.path.abspath(workdir), "checkpoints", stage)


def _to_storable(state):
    rest = {k: v for k, v in state.items() if k != "params"}
    rest["rng"] = jax.random.key_data(rest["rng"])  # orbax stores plain arrays, not typed keys
    return state["params"], rest


class Manager:
    """Saves the checkpoints the trainer asks for, keeps the last `keep`, restores the latest."""

    def __init__(self, workdir, stage, *, keep):
        self._directory = stage_dir(workdir, stage)
        self._options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._manager = self._open()

    def _open(self):
        return ocp.CheckpointManager(
            self._directory, options=self._options, item_names=("params", "state", "extra")
        )

    def _set_aside(self, steps):
        """Moves broken step directories to <stage dir>.broken/<step> and reopens the manager."""
        aside = self._directory + ".broken"
        os.makedirs(aside, exist_ok=True)
        for step in steps:
            target = os.path.join(aside, str(step))
            if os.path.exists(target):
                target += f".{len(os.listdir(aside))}"
            os.replace(os.path.join(self._directory, str(step)), target)
            logging.warning(
                "moved the broken checkpoint %s to %s",
                os.path.join(self._directory, str(step)),
                target,
            )
        self._manager.close()
        self._manager = self._open()

    def save(self, step, state, extra):
        """Writes checkpoint `step` asynchronously (state arrays are copied before the call returns)."""
        params, rest = _to_storable(state)
        self._manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                state=ocp.args.StandardSave(rest),
                extra=ocp.args.JsonSave(extra),
            ),
        )

    def restore_latest(self, abstract_state):
        """Returns (state, extra) of the latest checkpoint that restores, or None when there is none.

        abstract_state is the state's pytree of jax.ShapeDtypeStruct (jax.eval_shape of init).
        A newer checkpoint that does not restore (truncated array file, emptied metadata) is
        skipped with a warning naming it; once an older one restores, the broken ones are moved to
        <stage dir>.broken/<step>, so a later save of that step number does not collide with them.
        With none that restores, raises RuntimeError naming the stage directory (nothing moved).
        """
        params = abstract_state["params"]
        rest = {k: v for k, v in abstract_state.items() if k != "params"}
        # The key's raw data, placed like the key: without a sharding orbax would take the saved
        # one, which a checkpoint written by several processes cannot give a single process.
        rng = abstract_state["rng"]
        data = jax.eval_shape(jax.random.key_data, rng)
        sharding = getattr(rng, "sharding", None) or jax.sharding.NamedSharding(
            jax.sharding.Mesh(np.asarray(jax.devices()), ("devices",)), jax.sharding.PartitionSpec()
        )
        rest["rng"] = jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
        args = ocp.args.Composite(
            params=ocp.args.StandardRestore(params),
            state=ocp.args.StandardRestore(rest),
            extra=ocp.args.JsonRestore(),
        )
        step, restored, broken = _restore_newest(self._manager, self._directory, args)
        if step is None:
            return None
        if broken:
            self._set_aside(broken)
        state = dict(restored["state"], params=restored["params"])
        state["rng"] = jax.random.wrap_key_data(state["rng"])
        return state, restored["extra"]

    def close(self):
        """Waits for pending writes and releases the manager."""
        self._manager.wait_until_finished()
        self._manager.close()


def _restore_newest(manager, directory, args):
    """Returns (step, manager.restore(step, args), newer broken steps) of the newest checkpoint
    that restores, or (None, None, []) when there are none. Each that fails is logged with a
    warning naming its directory; when all fail, raises RuntimeError naming `directory`."""
    broken = []
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            return step, manager.restore(step, args=args), broken
        except Exception as error:  # orbax / tensorstore / json raise many types for a damaged file
            lines = str(error).strip().splitlines() or [""]
            logging.warning(
                "checkpoint %s does not restore (%s: %s); trying the next older one",
                os.path.join(directory, str(step)),
                type(error).__name__,
                lines[0][:300],
            )
            broken.append(step)
    if broken:
        raise RuntimeError(
            f"no checkpoint under {directory} restores (broken steps {broken}); "
            "move or remove them to start over"
        )
    return None, None, []


def latest_step(workdir, stage):
    """Returns the latest finished checkpoint step of a stage, or None."""
    path = stage_dir(workdir, stage)
    if not os.path.isdir(path):
        return None
    with ocp.CheckpointManager(path, options=_READ_ONLY) as manager:
        return manager.latest_step()


def kept_steps(workdir, stage):
    """Returns the sorted finished checkpoint steps of a stage; FileNotFoundError naming the
    directory when the stage has none."""
    path = stage_dir(workdir, stage)
    steps = []
    if os.path.isdir(path):
        with ocp.CheckpointManager(path, options=_READ_ONLY) as manager:
            steps = sorted(manager.all_steps())
    if not steps:
        raise FileNotFoundError(f"{path}: no checkpoints of stage {stage!r}")
    return steps


def restore_params(workdir, stage, cfg, step=None, shardings=None):
    """Returns (params, step) of a stage's checkpoint (when step is None: the newest that restores,
    with a warning naming each newer broken one; RuntimeError naming the directory when none does).

    With `shardings` (a params tree of NamedShardings) each array is read straight onto its
    sharding, on any mesh. Without, arrays keep their saved sharding when this run has the
    devices it was saved on; otherwise (e.g. a 2-process checkpoint read by one process) they
    come back replicated on every device.
    """
    replicated = jax.sharding.NamedSharding(
        jax.sharding.Mesh(jax.devices(), ("devices",)), jax.sharding.PartitionSpec()
    )
    abstract = model.abstract_params(cfg)
    if shardings is not None:
        abstract = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
        )
    path = stage_dir(workdir, stage)
    args = ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract, fallback_sharding=replicated)
    )
    with ocp.CheckpointManager(
        path, options=_READ_ONLY, item_names=("params", "state", "extra")
    ) as manager:
        if step is not None:  # an explicit step: no fallback to another one
            return manager.restore(step, args=args)["params"], step
        step, restored, _ = _restore_newest(manager, path, args)
    if step is None:
        raise FileNotFoundError(f"no {stage} checkpoint under {path}")
    return restored["params"], step


def export_hf(workdir, stage, cfg, out_dir, tokenizer_path, step=None):
    """Writes checkpoint `step` (latest when None) of `stage` as an HF directory; returns the step."""
    params, step = restore_params(workdir, stage, cfg, step)
    hf.save_pretrained(out_dir, cfg, params, tokenizer_path=tokenizer_path)
    logging.info("exported %s step %d to %s", stage, step, out_dir)
    return step
