"""Multi-host: 2 processes x 4 fake CPU devices (gloo on loopback) run SFT and GRPO steps of the
tiny model, checkpoint with orbax, resume, and match one process with 8 devices.

The worker is this file run as a script, once per process, by launch/local_multiprocess.sh:
  launch/local_multiprocess.sh 2 -d 4 -- python tests/test_multihost.py OUT_DIR
"""

import functools
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_two_processes_match_one_process(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    script = os.path.abspath(__file__)
    multi = subprocess.run([os.path.join(ROOT, "launch/local_multiprocess.sh"), "2", "-d", "4", "--", sys.executable, script,
                            str(tmp_path / "multi")], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert multi.returncode == 0, multi.stdout[-6000:] + multi.stderr[-2000:]
    single_env = dict(env, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
    single = subprocess.run([sys.executable, script, str(tmp_path / "single")], env=single_env, cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    got, want = np.load(tmp_path / "multi/result.npz"), np.load(tmp_path / "single/result.npz")
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=1e-5, err_msg=key)


# ------------------------------------------------------------------------------- the worker
def _batches(cfg, rng, accum, rows=8, length=12):
    """Returns a text batch [A, B, L] (positions [A, 3, B, L]) with the RL fields; the same on every process."""
    ids = rng.integers(0, 240, (accum, rows, length)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[:, 1::2, :3] = 0  # left padding
    positions = np.broadcast_to(np.maximum(np.cumsum(mask, -1) - 1, 0)[:, None], (accum, 3, rows, length)).astype(np.int32)
    return {"input_ids": ids, "attention_mask": mask, "positions": positions, "loss_mask": mask,
            "completion_mask": mask[..., 1:], "advantages": rng.standard_normal((accum, rows)).astype(np.float32),
            "old_logprobs": (-rng.uniform(1.0, 6.0, (accum, rows, length - 1))).astype(np.float32)}


def _worker(out_dir):
    import jax
    import optax
    import orbax.checkpoint as ocp

    from mocojax import distributed, model, plan, sharding

    distributed.initialize()
    jax.config.update("jax_default_matmul_precision", "highest")
    assert jax.device_count() == 8, jax.devices()
    mesh = sharding.make_mesh("data=2,fsdp=-1")
    cfg = sharding.model_config(model.tiny(), mesh)
    optimizer = optax.adamw(1e-4, eps=1e-6)
    state, state_sh = sharding.init_train_state(cfg, mesh, optimizer, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    dims = {"positions": 2}

    def local(batch):
        # Each process feeds only its rows of the global batch (dim 1, after the micro-batch dim).
        rows = distributed.process_rows(batch["input_ids"].shape[1])
        return {k: v[:, :, rows] if k == "positions" else v[:, rows] for k, v in batch.items()}

    steps = {}
    for name, loss_fn in (("sft", plan.sft_loss_fn), ("rl", plan.rl_loss_fn)):
        example = _batches(cfg, np.random.default_rng(0), 1 if name == "sft" else 2)
        batch_sh = sharding.batch_shardings(example, mesh, dims, default_dim=1)
        step = plan.make_update_step(cfg, optimizer, functools.partial(loss_fn, mesh=mesh), state_sh["params"])
        steps[name] = (sharding.jit_train_step(step, state_sh, batch_sh, mesh), batch_sh)
    ema = sharding.jit_ema_update(state_sh["params"], mesh)

    def run(state, schedule):
        losses = []
        for name, batch in schedule:
            step, batch_sh = steps[name]
            state, metrics = step(state, distributed.global_batch(local(batch), batch_sh))
            state["momentum"] = ema(state["momentum"], state["params"], 0.9)
            losses.append(float(metrics["loss"]))
        return state, losses

    schedule = [("sft", _batches(cfg, rng, 1)), ("sft", _batches(cfg, rng, 1)), ("rl", _batches(cfg, rng, 2)), ("rl", _batches(cfg, rng, 2))]
    state, losses = run(state, schedule[:2])
    checkpointer = ocp.StandardCheckpointer()
    path = os.path.join(os.path.abspath(out_dir), "ckpt", "2")
    checkpointer.save(path, state)
    checkpointer.wait_until_finished()
    state, tail = run(state, schedule[2:])
    final = distributed.fetch(state)

    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, state_sh)
    resumed, resumed_tail = run(checkpointer.restore(path, abstract), schedule[2:])
    assert resumed_tail == tail, (resumed_tail, tail)
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(distributed.fetch(resumed)), strict=True):
        np.testing.assert_array_equal(a, b)
    if distributed.is_main():
        flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(
            {"params": final["params"], "momentum": final["momentum"]})[0]}
        np.savez(os.path.join(out_dir, "result.npz"), losses=np.array(losses + tail), step=final["step"], **flat)
    distributed.sync("result written")
    print(f"process {jax.process_index()}: losses {losses + tail}, resumed from step 2 identically", flush=True)


if __name__ == "__main__":
    _worker(sys.argv[1])
