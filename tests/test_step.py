"""The trainer core (mocojax/train/step.py) by hand: accumulation, the guarded update, image spans."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mocojax.train import state as state_lib, step as step_lib


def _loss(params, micro):
    """sum_i w x_i^2 and (the row count) of one micro-batch: d/dw = sum_i x_i^2."""
    return params["w"] * jnp.sum(micro["x"] ** 2), {"rows": jnp.float32(micro["x"].shape[0])}


def test_accumulate_sums_values_and_gradients_over_micro_batches():
    batch = {"x": jnp.array([[1.0, 2.0], [3.0, 0.0], [0.0, 1.0]])}  # [A=3, b=2]
    params = {"w": jnp.float32(2.0)}
    grads, (loss, aux) = jax.jit(lambda p, b: step_lib.accumulate(_loss, p, b))(params, batch)
    # sum x^2 = 1 + 4 + 9 + 0 + 0 + 1 = 15: loss 2 x 15 = 30, d/dw 15, 3 micro-batches of 2 rows.
    assert float(loss) == 30.0 and float(grads["w"]) == 15.0 and float(aux["rows"]) == 6.0
    assert grads["w"].dtype == jnp.float32
    no_grads, (values, _) = step_lib.accumulate(_loss, params, batch, with_grad=False)
    assert no_grads is None and float(values) == 30.0


def test_update_keeps_params_without_signal_and_skips_non_finite():
    optimizer = optax.sgd(0.5)
    state = state_lib.init_state({"w": jnp.float32(1.0)}, optimizer, jax.random.key(0))
    grads = {"w": jnp.float32(2.0)}
    moved, metrics = step_lib.update(state, grads, optimizer, jnp.float32(1.0))
    assert float(moved["params"]["w"]) == 0.0 and int(metrics["skipped"]) == 0  # 1 - 0.5 x 2
    kept, metrics = step_lib.update(
        state, grads, optimizer, jnp.float32(1.0), has_signal=jnp.bool_(False)
    )
    assert (
        float(kept["params"]["w"]) == 1.0
        and int(kept["step"]) == 1
        and int(metrics["skipped"]) == 0
    )
    skipped, metrics = step_lib.update(state, grads, optimizer, jnp.float32(np.nan))
    assert (
        float(skipped["params"]["w"]) == 1.0
        and int(skipped["step"]) == 1
        and int(metrics["skipped"]) == 1
    )


def test_split_images_gives_each_micro_batch_its_images_and_patches():
    grid = np.array([[1, 2, 2], [1, 4, 4], [1, 2, 4]])  # 4, 16 and 8 patches
    # Rows 0-1 (micro 0) hold images 0 and 1; rows 2-3 (micro 1) hold image 2 (row 3 has none).
    spans = step_lib.split_images(grid, np.array([1, 1, 1, 0]), 2)
    assert [g.tolist() for g, _ in spans] == [[[1, 2, 2], [1, 4, 4]], [[1, 2, 4]]]
    assert [(s.start, s.stop) for _, s in spans] == [(0, 20), (20, 28)]
    with pytest.raises(ValueError, match="does not split into 3"):
        step_lib.split_images(grid, np.array([1, 1, 1, 0]), 3)
