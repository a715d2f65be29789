"""Sharding: mesh and rule semantics in-process; sharded == single-device on 8 fake CPU devices in a subprocess.

The parity checks need `--xla_force_host_platform_device_count=8` before jax starts, and the
test session has already started jax, so this file re-runs itself as a script:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/test_sharding.py fsdp=8 fsdp=4,tensor=2
"""

import functools
import os
import subprocess
import sys
import tempfile

if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    )
    os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import (
    AbstractMesh,  # noqa: E402
    PartitionSpec as P,
)

from mocojax import hf, model, momentum, sampling, sharding  # noqa: E402

MESH = AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor"))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_parse_and_resolve_mesh():
    assert sharding.parse_mesh("fsdp=4, tensor=2") == (("fsdp", 4), ("tensor", 2))
    assert sharding.parse_mesh({"data": 2, "fsdp": -1}) == (("data", 2), ("fsdp", -1))
    assert sharding.resolve_mesh_shape(sharding.DEFAULT_MESH, 8) == (
        ("data", "fsdp", "tensor"),
        (1, 8, 1),
    )
    assert sharding.resolve_mesh_shape((("fsdp", -1), ("tensor", 2)), 8) == (
        ("fsdp", "tensor"),
        (4, 2),
    )
    with pytest.raises(ValueError, match="needs 6 devices"):
        sharding.resolve_mesh_shape((("fsdp", 3), ("tensor", 2)), 8)
    with pytest.raises(ValueError, match="at most one"):
        sharding.resolve_mesh_shape((("fsdp", -1), ("tensor", -1)), 8)
    with pytest.raises(ValueError, match="name=size"):
        sharding.parse_mesh("fsdp")


def test_logical_spec_rules():
    spec = functools.partial(sharding.logical_spec, mesh=MESH)
    assert spec(("layers", "embed", "heads", "head_dim"), (3, 64, 4, 16)) == P(
        None, "fsdp", "tensor", None
    )
    assert spec(("batch", "length"), (8, 5)) == P(("data", "fsdp"), None)
    # A dim the axis does not divide is replicated (with a warning), the others keep theirs.
    assert spec(("embed", "kv_heads"), (63, 3)) == P(None, None)
    # An axis shards one dim only: the second dim asking for fsdp is replicated.
    assert spec(("vision_merged", "embed"), (64, 64)) == P("fsdp", None)
    # Rules naming an axis the mesh lacks replicate that dim.
    assert sharding.logical_spec(("heads",), (4,), AbstractMesh((8,), ("fsdp",))) == P(None)
    with pytest.raises(ValueError, match="does not divide"):
        spec(("batch",), (6,))
    with pytest.raises(ValueError, match="no sharding rule"):
        spec(("embedd",), (8,))


def test_every_param_axis_has_a_rule_and_8b_shards_fully_on_fsdp8():
    cfg = model.preset("8b")
    mesh = AbstractMesh((1, 8, 1), ("data", "fsdp", "tensor"))
    shapes = model.abstract_params(cfg)
    specs = jax.tree.map(
        lambda a, s: sharding.logical_spec(a, s.shape, mesh),
        model.param_axes(cfg),
        shapes,
        is_leaf=lambda x: isinstance(x, tuple),
    )
    big = [
        s
        for s, x in zip(
            jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P)), jax.tree.leaves(shapes)
        )
        if np.prod(x.shape) > 1e6
    ]
    assert big and all("fsdp" in tuple(s) for s in big)


def test_remat_changes_no_result():
    cfg = model.tiny()
    params = model.init_params(cfg, 0)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 200, (2, 8)), jnp.int32)
    mask = jnp.ones_like(ids)
    positions = jnp.broadcast_to(jnp.arange(8), (3, 2, 8))

    def loss(c, p):
        return model.apply(c, p, ids, mask, positions)[0].sum()

    (a, ga), (b, gb) = (
        jax.jit(jax.value_and_grad(functools.partial(loss, c)))(params)
        for c in (cfg, cfg.replace(remat=True))
    )
    np.testing.assert_allclose(a, b, rtol=1e-6)
    # Recomputation fuses differently: equal to float32 rounding relative to each gradient's scale.
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5 * np.abs(y).max()),
        ga,
        gb,
    )


def test_plan_fakes_the_mesh_size_from_either_flag_form():
    from mocojax import plan

    assert plan.fake_device_count(["--preset", "8b", "--mesh", "fsdp=16"]) == 16
    assert plan.fake_device_count(["--mesh=fsdp=4,tensor=2"]) == 8
    assert plan.fake_device_count(["--mesh", "fsdp=4", "--devices", "32"]) == 32
    assert plan.fake_device_count(["--devices=2", "--mesh=fsdp=8"]) == 2
    assert plan.fake_device_count([]) == 8


def test_plan_counts_one_prompt_cache_per_group_with_shared_prompt_cache():
    """The memory plan's sampler rows with model.shared_prompt_cache: the decode loop's KV cache
    is the rows' own slots plus one prompt cache per group (hand-counted bytes), not every row's
    prompt + own slots, and XLA's arguments of the loop shrink with it."""
    from mocojax import plan

    mesh = sharding.make_mesh("fsdp=1")
    prompts, n, prompt_length, cache_length = 2, 4, 16, 48
    rows = {}
    for shared in (False, True):
        cfg = sharding.model_config(model.tiny(shared_prompt_cache=shared), mesh)
        out = plan.plan(
            cfg,
            mesh,
            sharding.DEFAULT_RULES,
            sft_global_batch=2,
            rl_accum=1,
            length=32,
            decode_rows_per_device=prompts * n,
            cache_length=cache_length,
            prompt_length=prompt_length,
            num_samples=n,
            rl_new_tokens=0,
        )
        rows[shared] = {r.name: r for r in out}
    t = model.tiny().text
    per_slot = 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * 4  # k and v, float32
    copied = prompts * n * cache_length * per_slot
    kept = (prompts * n * (cache_length - prompt_length) + prompts * prompt_length) * per_slot
    decode = {s: rows[s]["sampler decode loop"] for s in rows}
    assert decode[False].analytic["kv_cache"] == copied
    assert decode[True].analytic["kv_cache"] == kept
    assert decode[True].arguments < decode[False].arguments
    assert rows[True]["sampler prefill"].outputs < rows[False]["sampler prefill"].outputs


def test_sharded_steps_match_single_device_on_8_fake_devices():
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    result = subprocess.run(
        [sys.executable, __file__, "fsdp=8", "fsdp=4,tensor=2"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert result.stdout.count("match") == 2, result.stdout


# ------------------------------------------------------------------ the subprocess (8 devices)
def _inputs(cfg, rng, rows=8, length=16):
    """Returns a batch dict with one image per row, left padding on odd rows: ids/masks [B, L], positions [3, B, L]."""
    ids = rng.integers(0, 240, (rows, length))
    image = [cfg.vision_start_token_id] + [cfg.image_token_id] * 4 + [cfg.vision_end_token_id]
    ids[:, 3 : 3 + len(image)] = image
    mask = np.ones_like(ids)
    mask[1::2, :2] = 0
    grid = np.array([[1, 4, 4]] * rows)
    inputs = model.prepare_inputs(cfg, ids, mask, grid)
    pixel_values = rng.standard_normal((rows * 16, cfg.vision.patch_dim)).astype(np.float32)
    return {
        "input_ids": ids.astype(np.int32),
        "attention_mask": mask.astype(np.int32),
        "positions": inputs.positions,
        "loss_mask": mask.astype(np.int32),
        "pixel_values": pixel_values,
        "vision": inputs.vision,
    }


RL = dict(
    grad_accum_steps=2,
    num_samples=4,
    adv_eps=1e-6,
    clip_eps=0.2,
    clip_eps_high=0.28,
    kl_beta=0.0,
    aggregation="seq_mean_token_mean",
)


def _rl_batch(cfg, rng, groups=4, new_tokens=6):
    """Returns the GRPO trainer's batch (`rl.train_batch`) of a hand-made rollout: `groups` image
    prompts, RL["num_samples"] captions each with varying lengths and rewards."""
    import rl_patterns

    from mocojax.train import rl

    settings = ml_collections.ConfigDict(RL)
    n = settings.num_samples
    prompts = _inputs(cfg, rng, rows=groups)
    prompt = {
        "input_ids": prompts["input_ids"],
        "attention_mask": prompts["attention_mask"],
        "pixel_values": prompts["pixel_values"],
        "image_grid_thw": np.array([[1, 4, 4]] * groups),
    }
    rows = groups * n
    rollout = rl_patterns.hand_rollout(  # drawn in the order the Rollout's fields list them
        list(range(groups)),
        prompt,
        tokens=rng.integers(0, 240, (rows, new_tokens)),
        logprobs=(-rng.uniform(0.5, 6.0, (rows, new_tokens))).astype(np.float32),
        lengths=rng.integers(1, new_tokens + 1, rows),
        rewards=rng.uniform(size=(groups, n)).astype(np.float32),
    )
    return rl.train_batch(cfg, rollout, settings, rl.advantages(rollout, settings))


def _run(cfg, mesh, sft_batch, rl_batch, sample_args):
    """Returns every output the parity test compares, computed on `mesh` by the trainers' own steps."""
    from mocojax.train import rl, sft, step as step_lib

    cfg = sharding.model_config(cfg, mesh)
    # eps well above rounding noise: Adam maps a gradient that is noise, |g| << eps, to ~lr * g / eps
    # instead of ~lr * sign(noise), which would differ between meshes by lr.
    optimizer = optax.adamw(1e-4, eps=1e-6, weight_decay=0.01)
    state, state_sh = sharding.init_train_state(
        cfg, mesh, optimizer, jax.random.PRNGKey(0), with_momentum=False
    )
    # Steps donate the state, so every output is copied to the host as soon as it exists.
    out = {"init": jax.tree.map(np.asarray, state["params"])}
    params_sh = state_sh["params"]

    forward = jax.jit(
        functools.partial(model.apply, cfg),
        in_shardings=(
            params_sh,
            *(
                sharding.batch_sharding(mesh, x.shape, d)
                for x, d in (
                    (sft_batch["input_ids"][0], 0),
                    (sft_batch["attention_mask"][0], 0),
                    (sft_batch["positions"][0], 1),
                )
            ),
            sharding.replicated(mesh),
            sharding.replicated(mesh),
        ),
    )
    first = jax.tree.map(lambda x: x[0], sft_batch)
    out["logits"] = forward(
        state["params"],
        first["input_ids"],
        first["attention_mask"],
        first["positions"],
        first["pixel_values"],
        first["vision"],
    )[0]

    # The SFT trainer's step (sft.make_train_step) on its own batch placement.
    sft_step = sft.make_train_step(cfg, optimizer, mesh, state_sh)
    for i in range(2):
        state, metrics = sft_step(state, step_lib.place_batch(mesh, sft_batch, sft.BATCH_DIMS))
        out[f"sft_loss_{i}"] = np.asarray(metrics["loss"])
    out["sft_params"] = jax.tree.map(np.asarray, state["params"])
    # The GRPO trainer's step (rl.make_grpo_step) on rl.place_batch.
    grpo_step = rl.make_grpo_step(cfg, optimizer, ml_collections.ConfigDict(RL), state_sh, mesh)
    for i in range(2):
        state, metrics = grpo_step(state, rl.place_batch(mesh, rl_batch), None)
        assert int(metrics["skipped"]) == 0 and int(metrics["no_signal_skipped"]) == 0
        out[f"rl_loss_{i}"] = np.asarray(metrics["loss"])
    out["rl_params"] = jax.tree.map(np.asarray, state["params"])
    assert jax.tree.all(jax.tree.map(lambda a, s: a.sharding == s, state["params"], params_sh))
    # The RL loop's EMA (momentum.ema_update through momentum.sync) keeps the params' shardings.
    phi = momentum.ema_update(
        jax.device_put(momentum.init_momentum(out["init"]), params_sh), state["params"], 0.9
    )
    assert jax.tree.all(
        jax.tree.map(lambda a, s: a.sharding.is_equivalent_to(s, a.ndim), phi, params_sh)
    )
    out["momentum"] = phi

    # The public sampler on the (sharded) initial params: 3 image prompts, not a multiple of the
    # 8 data shards, so filler rows are added and dropped; greedy, 2 samples each. Decoding starts
    # from the initial params, equal on every mesh, so it compares the sampler itself rather than
    # the last bits of four optimizer steps, which k_norm amplifies.
    init = jax.device_put(out["init"], params_sh)
    ids, mask, pixels, grid = sample_args
    out["generate"] = jax.tree.map(
        np.asarray,
        sampling.generate(cfg, init, ids, mask, pixels, grid, max_new_tokens=6, num_samples=2),
    )
    out["score"] = np.asarray(
        sampling.sequence_logprobs(
            cfg,
            init,
            ids,
            mask,
            pixels,
            grid,
            completion=out["generate"].tokens,
            completion_mask=np.ones_like(out["generate"].tokens),
            num_samples=2,
        )
    )

    place = sharding.placer(cfg, mesh)
    placed = jax.tree_util.tree_map_with_path(
        lambda p, x: place(".".join(k.key for k in p), x), out["init"]
    )
    assert jax.tree.all(jax.tree.map(lambda a, s: a.sharding == s, placed, params_sh))
    out["placed"] = placed
    # HF loading reads each tensor straight onto its sharding.
    with tempfile.TemporaryDirectory() as hf_dir:
        hf.save_pretrained(hf_dir, cfg, out["init"])
        _, loaded = hf.load_pretrained(hf_dir, jnp.float32, place=place)
    assert jax.tree.all(jax.tree.map(lambda a, s: a.sharding == s, loaded, params_sh))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), loaded, out["init"])
    return jax.tree.map(np.asarray, out), state_sh


def _child(mesh_specs):
    jax.config.update("jax_default_matmul_precision", "highest")
    assert jax.device_count() == 8, jax.devices()
    cfg = model.tiny()
    rng = np.random.default_rng(0)
    sft_batch = jax.tree.map(lambda x: x[None], _inputs(cfg, rng))
    sft_batch["role"] = rng.integers(0, 3, (1, 8)).astype(np.int32)
    rl_batch = _rl_batch(cfg, rng)
    prompts = _inputs(cfg, rng, rows=3)
    sample_args = (
        prompts["input_ids"],
        prompts["attention_mask"],
        prompts["pixel_values"],
        np.array([[1, 4, 4]] * 3),
    )

    reference, _ = _run(
        cfg,
        sharding.make_mesh("fsdp=1", devices=jax.devices()[:1]),
        sft_batch,
        rl_batch,
        sample_args,
    )
    for spec in mesh_specs:
        mesh = sharding.make_mesh(spec)
        got, state_sh = _run(cfg, mesh, sft_batch, rl_batch, sample_args)
        sharded = [s for s in jax.tree.leaves(state_sh["params"]) if not s.is_fully_replicated]
        assert len(sharded) > 20, f"{spec}: only {len(sharded)} parameters are sharded"
        for key in reference:
            diff = max(
                float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0
                for a, b in zip(
                    jax.tree.leaves(reference[key]), jax.tree.leaves(got[key]), strict=True
                )
            )
            assert diff <= 1e-5, f"{spec}: {key} differs from one device by {diff:.2e}"
        assert (reference["generate"].tokens == got["generate"].tokens).all()
        assert got["generate"].tokens.shape == (6, 6) and got["score"].shape == (6, 6)
        print(f"{spec}: {len(reference)} outputs match one device (<= 1e-5)", flush=True)


if __name__ == "__main__":
    _child(sys.argv[1:])
