"""Hand-computed checks of the EMA update, its (m, H) special cases and schedules, float32
accumulation, role copies and tracking diagnostics."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mocojax import momentum


def _tree(a, c):
    return {"a": jnp.asarray(a, jnp.float32), "b": {"c": jnp.asarray(c, jnp.float32)}}


def _scalar_tree(x):
    return {"w": jnp.asarray([x], jnp.float32)}


def _run(schedule, steps, phi0=0.0):
    """Policy trajectory theta_t = t (one scalar); returns phi after each update."""
    phi = momentum.init_momentum(_scalar_tree(phi0))
    history = []
    for step in range(1, steps + 1):
        phi, _ = schedule.update(phi, _scalar_tree(float(step)), step)
        history.append(float(phi["w"][0]))
    return history


def test_ema_update_exact_on_small_tree():
    phi = momentum.init_momentum(_tree([1.0, 2.0], [[4.0]]))
    theta = _tree([3.0, 0.0], [[0.0]])
    new = momentum.ema_update(phi, theta, 0.75)
    # 0.75 * 1 + 0.25 * 3 = 1.5; 0.75 * 2 + 0.25 * 0 = 1.5; 0.75 * 4 = 3 (all exact in binary).
    np.testing.assert_array_equal(new["a"], [1.5, 1.5])
    np.testing.assert_array_equal(new["b"]["c"], [[3.0]])
    assert jax.tree.structure(new) == jax.tree.structure(theta)


def test_ema_update_donates_old_momentum_and_keeps_params():
    params = _tree([1.0, 2.0], [[4.0]])
    phi = momentum.init_momentum(params)
    new = momentum.ema_update(phi, params, 0.5)
    assert phi["a"].is_deleted()
    # init_momentum made a copy, so donating phi did not free the (float32) params.
    assert not params["a"].is_deleted()
    np.testing.assert_array_equal(new["a"], params["a"])


def test_ema_update_is_float32_for_bf16_params_and_rejects_bf16_momentum():
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _tree([1.0, 2.0], [[4.0]]))
    phi = momentum.init_momentum(params)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(phi))
    new = momentum.ema_update(phi, params, 0.9)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(new))
    with pytest.raises(TypeError, match="float32"):
        momentum.ema_update(params, params, 0.9)


def test_float32_accumulation_moves_where_bf16_stalls():
    # theta = 1.25 (bf16), phi_0 = 1, m = 0.99. Each step should add 0.01 x 0.25 = 0.0025,
    # but half a bf16 ulp at 1.0 is 2^-8 = 0.0039: a bf16 momentum rounds back to 1 forever.
    m, steps = 0.99, 100
    theta = {"w": jnp.full((4,), 1.25, jnp.bfloat16)}
    phi_bf16 = {"w": jnp.ones((4,), jnp.bfloat16)}
    phi = momentum.init_momentum({"w": jnp.ones((4,), jnp.bfloat16)})
    bf16_step = jax.jit(
        lambda p, t: jax.tree.map(
            lambda a, b: (m * a.astype(jnp.float32) + (1 - m) * b.astype(jnp.float32)).astype(
                jnp.bfloat16
            ),
            p,
            t,
        )
    )
    for _ in range(steps):
        phi_bf16 = bf16_step(phi_bf16, theta)
        phi = momentum.ema_update(phi, theta, m)
    np.testing.assert_array_equal(phi_bf16["w"].astype(jnp.float32), np.ones(4))  # stalled
    # Closed form: phi_t = 1.25 - 0.25 m^t = 1.25 - 0.25 x 0.366032 = 1.158492.
    np.testing.assert_allclose(phi["w"], 1.25 - 0.25 * m**steps, rtol=1e-5)


def test_frozen_never_runs_an_update():
    schedule = momentum.MomentumSchedule(m=1.0, every=1)
    assert schedule.kind == "frozen"
    phi = momentum.init_momentum(_scalar_tree(2.0))
    # theta is NaN: any arithmetic would poison phi (0 x NaN = NaN); frozen must skip it.
    new, m = schedule.update(phi, _scalar_tree(math.nan), step=1)
    assert new is phi and m == 1.0
    assert _run(schedule, 3, phi0=2.0) == [2.0, 2.0, 2.0]


def test_copy_every_step_is_bitwise():
    schedule = momentum.MomentumSchedule(m=0.0, every=1)
    assert schedule.kind == "copy"
    theta = {"w": jax.random.normal(jax.random.key(1), (64,))}
    phi = momentum.init_momentum({"w": jax.random.normal(jax.random.key(2), (64,))})
    # phi + (theta - phi) would not be bitwise theta; 0 * phi + 1 * theta is.
    new, _ = schedule.update(phi, theta, step=1)
    np.testing.assert_array_equal(new["w"], theta["w"])
    assert _run(schedule, 3) == [1.0, 2.0, 3.0]


def test_periodic_copy():
    schedule = momentum.MomentumSchedule(m=0.0, every=3)
    assert schedule.kind == "periodic_copy"
    # Syncs after updates 3 and 6 only: phi = theta_3 = 3, then theta_6 = 6.
    assert _run(schedule, 7) == [0.0, 0.0, 3.0, 3.0, 3.0, 6.0, 6.0]


def test_ema_with_interval():
    schedule = momentum.MomentumSchedule(m=0.5, every=2)
    assert schedule.kind == "ema"
    # Sync at step 2: 0.5 x 0 + 0.5 x 2 = 1; at step 4: 0.5 x 1 + 0.5 x 4 = 2.5.
    assert _run(schedule, 5) == [0.0, 1.0, 1.0, 2.5, 2.5]


def test_byol_cosine_values():
    schedule = momentum.byol_cosine(0.99, 1.0, total_syncs=4)
    # m(k) = 1 - 0.01 (cos(pi k / 4) + 1) / 2; k = 1: 1 - 0.01 x 0.853553 = 0.991464.
    expected = [0.99, 0.9914644660940673, 0.995, 0.9985355339059327, 1.0, 1.0]
    np.testing.assert_allclose([schedule(k) for k in range(6)], expected, rtol=1e-12)


def test_scheduled_m_counted_by_sync():
    schedule = momentum.MomentumSchedule(m=momentum.byol_cosine(0.5, 1.0, 2), every=2)
    assert schedule.kind == "scheduled"
    # Syncs at steps 2, 4, 6 use counts 0, 1, 2 -> m = 0.5, 0.75, 1.0.
    assert [schedule.m_at(s) for s in (2, 4, 6)] == [0.5, 0.75, 1.0]
    # Step 2: 0.5 x 0 + 0.5 x 2 = 1; step 4: 0.75 x 1 + 0.25 x 4 = 1.75; step 6: m = 1, frozen.
    assert _run(schedule, 6) == [0.0, 1.0, 1.0, 1.75, 1.75, 1.75]


def test_optax_schedule_counted_by_step():
    linear = optax.linear_schedule(init_value=0.5, end_value=1.0, transition_steps=4)
    schedule = momentum.MomentumSchedule(m=linear, every=2, count_by="step")
    # Sync after update s uses m(s - 1): s = 2 -> 0.5 + 0.5 x 1/4 = 0.625; s = 4 -> 0.875.
    np.testing.assert_allclose([schedule.m_at(2), schedule.m_at(4)], [0.625, 0.875])
    # Step 2: 0.375 x 2 = 0.75; step 4: 0.875 x 0.75 + 0.125 x 4 = 1.15625.
    np.testing.assert_allclose(_run(schedule, 4), [0.0, 0.75, 0.75, 1.15625], rtol=1e-6)


def test_is_sync_step():
    assert [momentum.is_sync_step(s, 5) for s in (0, 1, 4, 5, 10)] == [
        False,
        False,
        False,
        True,
        True,
    ]
    with pytest.raises(ValueError, match="H"):
        momentum.is_sync_step(3, 0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(m=1.5), "in \\[0, 1\\]"),
        (dict(m=-0.1), "in \\[0, 1\\]"),
        (dict(every=0), "H"),
        (dict(every=2.5), "H"),
        (dict(count_by="epoch"), "count_by"),
    ],
)
def test_schedule_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        momentum.MomentumSchedule(**kwargs)


def test_schedule_value_validated_when_used():
    schedule = momentum.MomentumSchedule(m=lambda count: 1.2)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        schedule.m_at(1)


def test_tracking_diagnostics_hand_computed():
    theta = {"w": jnp.array([3.0, 0.0], jnp.bfloat16), "b": jnp.array([4.0], jnp.bfloat16)}
    phi = {"w": jnp.zeros(2), "b": jnp.zeros(1)}
    diag = momentum.tracking_diagnostics(
        theta, phi, 0.75, theta_to_phi_prev=jnp.float32(4.0), policy_displacement=3.0
    )
    # e = ||(3, 0, 4)|| = 5; u = (1 - 0.75) x 4 = 1; Delta as given.
    assert {k: float(v) for k, v in diag.items()} == {
        "m": 0.75,
        "tracking_error": 5.0,
        "policy_displacement": 3.0,
        "momentum_update": 1.0,
    }
    assert diag["tracking_error"].dtype == jnp.float32


def test_sync_every_two_updates_by_hand():
    """H = 2, m = 0.5: nothing moves after update 1; after update 2 phi = 0.5 phi_0 + 0.5 theta_2,
    Delta spans both updates, and u equals the distance phi actually moved."""
    roles = momentum.RoleMomentum(generator="ema", judge="frozen")
    schedule = momentum.MomentumSchedule(m=0.5, every=2)
    theta_0 = _tree([0.0, 0.0], [[0.0]])
    copies = roles.init(theta_0)
    reference = momentum.displacement_reference(theta_0, schedule)
    theta_1 = _tree([1.0, 0.0], [[0.0]])
    copies, diag, reference = momentum.sync(
        roles, schedule, copies, theta_1, 1, update_norm=1.0, theta_at_sync=reference
    )
    assert set(diag) == {"tracking_error_frozen"} and float(diag["tracking_error_frozen"]) == 1.0
    assert float(copies["ema"]["a"][0]) == 0.0
    theta_2 = _tree([3.0, 0.0], [[4.0]])
    copies, diag, reference = momentum.sync(
        roles, schedule, copies, theta_2, 2, update_norm=2.0, theta_at_sync=reference
    )
    # phi_2 = (1.5, 0, 2); e = ||(1.5, 0, 2)|| = 2.5; u = ||phi_2 - 0|| = 2.5; Delta = ||theta_2 - theta_0|| = 5.
    np.testing.assert_array_equal(copies["ema"]["a"], [1.5, 0.0])
    np.testing.assert_array_equal(copies["ema"]["b"]["c"], [[2.0]])
    assert {k: float(v) for k, v in diag.items()} == {
        "tracking_error_frozen": 5.0,
        "m": 0.5,
        "momentum_update": 2.5,
        "tracking_error": 2.5,
        "policy_displacement": 5.0,
    }
    np.testing.assert_array_equal(reference["a"], theta_2["a"])  # the next Delta starts here
    np.testing.assert_array_equal(copies["frozen"]["a"], [0.0, 0.0])
    # H = 1 keeps no reference: Delta is the update's own norm.
    assert momentum.displacement_reference(theta_0, momentum.MomentumSchedule(m=0.5)) is None


def test_momentum_update_norm_without_keeping_phi_prev():
    theta = _tree([3.0, 1.0], [[2.0]])
    phi_prev = momentum.init_momentum(_tree([1.0, 1.0], [[0.0]]))
    keep = jax.tree.map(jnp.copy, phi_prev)
    before = momentum.tree_distance(theta, phi_prev)  # ||(2, 0, 2)|| = sqrt 8
    phi = momentum.ema_update(phi_prev, theta, 0.75)
    # u = (1 - m) ||theta - phi_prev|| = 0.25 sqrt 8.
    np.testing.assert_allclose(momentum.tree_distance(phi, keep), 0.25 * before, rtol=1e-6)
    np.testing.assert_allclose(before, math.sqrt(8.0), rtol=1e-6)


def test_role_momentum_shared_by_default():
    roles = momentum.RoleMomentum()
    params = _scalar_tree(1.0)
    state = roles.init(params)
    assert roles.copies == ("ema",)
    assert roles.params_for("generator", state, params) is roles.params_for("judge", state, params)


def test_role_momentum_generator_ema_judge_frozen():
    roles = momentum.RoleMomentum(generator="ema", judge="frozen")
    assert roles.copies == ("ema", "frozen")
    state = roles.init(_scalar_tree(0.0))
    schedule = momentum.MomentumSchedule(m=0.5, every=1)
    for step in (1, 2):
        state, _, _ = momentum.sync(
            roles, schedule, state, _scalar_tree(float(step)), step, update_norm=0.0
        )
    # EMA copy: 0.5 x 0 + 0.5 x 1 = 0.5, then 0.5 x 0.5 + 0.5 x 2 = 1.25; frozen stays 0.
    assert float(roles.params_for("generator", state, None)["w"][0]) == 1.25
    assert float(roles.params_for("judge", state, None)["w"][0]) == 0.0


def test_role_momentum_policy_source_and_validation():
    roles = momentum.RoleMomentum(generator="policy", judge="frozen")
    params = _scalar_tree(3.0)
    state = roles.init(params)
    assert roles.copies == ("frozen",)
    assert roles.params_for("generator", state, params) is params
    # No EMA copy: the sync moves nothing.
    assert (
        momentum.sync(roles, momentum.MomentumSchedule(), state, params, 1, update_norm=0.0)[0]
        is state
    )
    with pytest.raises(ValueError, match="judge"):
        momentum.RoleMomentum(judge="shared")
    with pytest.raises(ValueError, match="role"):
        roles.params_for("policy", state, params)
