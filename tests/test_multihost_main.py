"""The real trainers multi-host: `mocojax.main` with stages SFT -> RL on 2 processes x 4 fake CPU
devices (gloo on loopback) checkpoints both stages, resumes both exactly, and ends where one
process with 8 devices ends.

Each process runs this file as a script (the worker below): it wraps the RL roles as
tests/rl_patterns.py does, so that the random-weight model's rollouts carry reward signal and
every RL step updates the Policy, then hands its command line to mocojax.main.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np

from mocojax import checkpoint, config_utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "toyworld_config", os.path.join(ROOT, "configs", "toyworld.py")
)
toyworld = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(toyworld)
SFT_STEPS = RL_STEPS = 4


def _command(workdir, *extra):
    # 8 SFT rows = one per device; one micro-batch of 8 rows needs up to 8 x 64 image patches.
    # RL: 2 images x 4 captions per update; the sampler pads its rows to the 8 data shards.
    return [
        sys.executable,
        os.path.abspath(__file__),
        "--config",
        "configs/toyworld.py:tiny",
        "--workdir",
        str(workdir),
        "--config.stages=('sft','rl')",
        "--config.mesh=data=2,fsdp=4",
        f"--config.sft.num_steps={SFT_STEPS}",
        "--config.sft.global_batch_size=8",
        "--config.sft.grad_accum_steps=1",
        "--config.data.max_patches=512",
        "--config.sft.checkpoint_every=2",
        "--config.sft.keep_checkpoints=10",
        "--config.sft.eval_every=100",
        f"--config.rl.num_steps={RL_STEPS}",
        "--config.rl.checkpoint_every=2",
        "--config.rl.keep_checkpoints=10",
        "--config.rl.lr=1e-3",
        "--config.rl.warmup_ratio=0.0",
        # Adam maps a gradient element at rounding-noise level (|g| << eps) to ~lr * g / eps,
        # not to ~lr * sign(noise), which differs between meshes by up to lr itself.
        "--config.optimizer.eps=1e-6",
        *extra,
    ]


def _run(command, env):
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if result.returncode:
        # The first Python traceback is the cause; the tail is the other process's abort.
        text = result.stdout + result.stderr
        first = text.find("Traceback (most recent call last)")
        cause = text[first : first + 5000] + "\n[...]\n" if first >= 0 else ""
        raise AssertionError(f"exit {result.returncode}\n{cause}{text[-5000:]}")
    return result.stdout


def _multi(workdir, env):
    launch = [os.path.join(ROOT, "launch/local_multiprocess.sh"), "2", "-d", "4", "--"]
    return _run(launch + _command(workdir, "--config.distributed.enabled=True"), env)


def _final_params(workdir, stage, steps):
    cfg = config_utils.build_setup(toyworld.get_config("tiny"), str(workdir)).model_config
    params, step = checkpoint.restore_params(str(workdir), stage, cfg)
    assert step == steps
    return jax.tree.map(np.asarray, params)


def _rl_rows(workdir):
    """Returns {step: logged RL metrics} without the timings."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [row for row in map(json.loads, f) if row["stage"] == "rl" and row["step"] > 0]
    return {
        row["step"]: {
            k: v
            for k, v in row.items()
            if k != "time" and not k.startswith(("time/", "wall", "tokens_per"))
        }
        for row in rows
    }


def _assert_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_main_two_processes_resume_and_match_one_process(tmp_path):
    # One persistent compilation cache: the two 2-process runs compile their programs once.
    env = dict(
        os.environ,
        PYTHONPATH=ROOT,
        JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    env.pop("XLA_FLAGS", None)
    multi = tmp_path / "multi"
    out = _multi(multi, env)
    for stage, steps in (("sft", SFT_STEPS), ("rl", RL_STEPS)):
        assert sorted(os.listdir(checkpoint.stage_dir(multi, stage))) == ["2", str(steps)]
    assert (
        os.path.exists(multi / "metrics.jsonl") and "[1] == sft summary" not in out
    )  # process 0 writes alone
    sft_first, rl_first = (
        _final_params(multi, "sft", SFT_STEPS),
        _final_params(multi, "rl", RL_STEPS),
    )
    rows_first = _rl_rows(multi)
    # Every RL step had signal and moved the Policy; the logs hold one row per step, written once.
    assert sorted(rows_first) == list(range(1, RL_STEPS + 1))
    assert all(
        row["no_signal_skipped"] == 0 and row["update_norm"] > 0 for row in rows_first.values()
    )
    with open(multi / "rl_samples.jsonl") as f:
        assert len(f.readlines()) == RL_STEPS * 2

    # Drop both last checkpoints: the rerun resumes SFT from step 2, then RL from its step 2
    # (params, Adam state, momentum copy, rng, data position).
    for stage, steps in (("sft", SFT_STEPS), ("rl", RL_STEPS)):
        shutil.rmtree(os.path.join(checkpoint.stage_dir(multi, stage), str(steps)))
    out = _multi(multi, env)
    assert "[0] == rl summary" in out
    _assert_equal(sft_first, _final_params(multi, "sft", SFT_STEPS))
    _assert_equal(rl_first, _final_params(multi, "rl", RL_STEPS))
    # The resumed steps 3-4 log the same rewards, losses and momentum tracking errors, bit for bit.
    rows_resumed = _rl_rows(multi)
    for step in (3, 4):
        assert rows_resumed[step] == rows_first[step], step

    single = tmp_path / "single"
    _run(
        _command(single),
        dict(env, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8"),
    )
    for stage, steps, got in (("sft", SFT_STEPS, sft_first), ("rl", RL_STEPS, rl_first)):
        want = _final_params(single, stage, steps)
        for (path, a), b in zip(
            jax.tree_util.tree_flatten_with_path(want)[0], jax.tree.leaves(got), strict=True
        ):
            np.testing.assert_allclose(
                b, a, atol=1e-5, err_msg=f"{stage} {jax.tree_util.keystr(path)}"
            )
    rows_single = _rl_rows(single)
    for step in range(1, RL_STEPS + 1):
        for key in ("reward_mean", "loss", "tracking_error", "caption_tokens"):
            np.testing.assert_allclose(
                rows_first[step][key],
                rows_single[step][key],
                rtol=1e-4,
                atol=1e-6,
                err_msg=f"step {step} {key}",
            )


# ------------------------------------------------------------------------------- the worker
if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rl_patterns
    from absl import app

    from mocojax import main

    rl_patterns.patterned_roles()
    app.run(main.main)
