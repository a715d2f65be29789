"""The real SFT trainer multi-host: `python -m mocojax.main` on 2 processes x 4 fake CPU devices
(gloo on loopback) checkpoints, resumes exactly, and ends where one process with 8 devices ends.
"""

import importlib.util
import os
import shutil
import subprocess
import sys

import jax
import numpy as np

from mocojax import checkpoint, config_utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("toyworld_config", os.path.join(ROOT, "configs", "toyworld.py"))
toyworld = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(toyworld)
NUM_STEPS = 4


def _command(workdir, *extra):
    # 8 rows = one per device; one micro-batch of 8 rows needs up to 8 x 64 image patches.
    return [sys.executable, "-m", "mocojax.main", "--config", "configs/toyworld.py:tiny", "--workdir", str(workdir),
            "--config.stages=('sft',)", "--config.mesh=data=2,fsdp=4", f"--config.sft.num_steps={NUM_STEPS}",
            "--config.sft.global_batch_size=8", "--config.sft.grad_accum_steps=1", "--config.data.max_patches=512",
            "--config.sft.checkpoint_every=2", "--config.sft.keep_checkpoints=10", "--config.sft.eval_every=100",
            *extra]


def _run(command, env):
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
    return result.stdout


def _multi(workdir, env):
    launch = [os.path.join(ROOT, "launch/local_multiprocess.sh"), "2", "-d", "4", "--"]
    return _run(launch + _command(workdir, "--config.distributed.enabled=True"), env)


def _final_params(workdir):
    cfg = config_utils.build_setup(toyworld.get_config("tiny"), str(workdir)).model_config
    params, step = checkpoint.restore_params(str(workdir), "sft", cfg)
    assert step == NUM_STEPS
    return params


def test_main_two_processes_resume_and_match_one_process(tmp_path):
    # One persistent compilation cache: the two 2-process runs compile their programs once.
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    env.pop("XLA_FLAGS", None)
    multi = tmp_path / "multi"
    out = _multi(multi, env)
    assert sorted(os.listdir(checkpoint.stage_dir(multi, "sft"))) == ["2", str(NUM_STEPS)]
    assert os.path.exists(multi / "metrics.jsonl") and "[1] == sft summary" not in out  # process 0 writes alone
    first = _final_params(multi)

    # Drop the last checkpoint: the rerun resumes from step 2 (params, Adam state, data position).
    shutil.rmtree(os.path.join(checkpoint.stage_dir(multi, "sft"), str(NUM_STEPS)))
    out = _multi(multi, env)
    assert "[0] == sft summary" in out
    resumed = _final_params(multi)
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    single = tmp_path / "single"
    _run(_command(single), dict(env, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8"))
    want = _final_params(single)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(want)[0], jax.tree.leaves(resumed), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, err_msg=jax.tree_util.keystr(path))
