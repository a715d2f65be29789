"""The trainer core that Stage I SFT and Stage II GRPO share.

A trainer supplies a loss of one micro-batch, `loss_fn(params, micro) -> (loss, aux)`, whose
values are meant to be *summed* over micro-batches (SFT: the NLL sum and token counts; GRPO:
the micro-batch's loss times its weight). This module owns the rest:
  - `accumulate`: a `lax.scan` over the leading micro-batch axis [A] of the batch, summing the
    float32 gradients (a carry pinned to the params' shardings when they are given) and the
    values, inside the one jitted step;
  - `update`: the optimiser update behind the non-finite guard (`state.apply_gradients`), and
    an optional "has signal" switch that keeps params and optimiser state as they were;
  - `jit_step`: jit with the state donated, the new state kept on its shardings and the
    metrics replicated; `place_batch` puts a host batch on the mesh as global arrays;
  - `abstract_state` / `restore_or_init`: the state's shapes with their shardings, the latest
    checkpoint restored onto them, else a fresh state born on them.
`plan.py` and the sharding tests compile the trainers' own steps built from these parts.
"""

import jax
import jax.numpy as jnp
import numpy as np

from mocojax import distributed, model, sharding
from mocojax.train import state as state_lib


def accumulate(loss_fn, params, batch, *, with_grad=True, grads_sharding=None):
    """Returns (grads, sums) of loss_fn(params, micro) -> (loss, aux) over batch's micro-batches.

    batch: a tree whose every leaf has the micro-batch axis [A] first. grads: a float32 tree like
    params, the sum over micro-batches of d loss / d params (None with with_grad=False); sums:
    (loss, aux) summed over micro-batches. grads_sharding (the params' shardings) pins the
    gradient carry: left free, XLA may keep it replicated, a whole model's gradient per device.
    """
    first = jax.tree.map(lambda x: x[0], batch)
    zeros = lambda tree: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), tree)
    sums = zeros(jax.eval_shape(loss_fn, params, first))
    grads = None
    if with_grad:
        grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        if grads_sharding is not None:
            grads = jax.lax.with_sharding_constraint(grads, grads_sharding)

    def micro_step(carry, micro):
        grads, sums = carry
        if with_grad:
            values, micro_grads = jax.value_and_grad(loss_fn, has_aux=True)(params, micro)
            grads = jax.tree.map(jnp.add, grads, micro_grads)
        else:
            values = loss_fn(params, micro)
        return (grads, jax.tree.map(jnp.add, sums, values)), None

    (grads, sums), _ = jax.lax.scan(micro_step, (grads, sums), batch)
    return grads, sums


def update(state, grads, optimizer, loss, *, has_signal=None):
    """Returns (new state, {"grad_norm", "skipped"}) after one optimiser update of state["params"].

    grads are cast to the params' dtypes. A non-finite loss, gradient or result skips the update
    (`state.apply_gradients`); so does has_signal False (a bool scalar: nothing to learn from,
    e.g. a GRPO batch whose every group had equal rewards), which is not counted as skipped.
    The step advances either way, so the data moves on.
    """
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state["params"])
    new_state, metrics = state_lib.apply_gradients(state, grads, optimizer, loss)
    if has_signal is not None:
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(has_signal, a, b), new, old)
        new_state = dict(
            new_state,
            params=keep(new_state["params"], state["params"]),
            opt_state=keep(new_state["opt_state"], state["opt_state"]),
        )
    return new_state, metrics


def jit_step(step_fn, state_shardings=None, mesh=None):
    """Returns jit(step_fn(state, batch, *rest) -> (state, metrics)) with the old state donated;
    with state_shardings (and their mesh) the new state keeps them and the metrics come back
    replicated. The batch comes placed (`place_batch`) or, for an ahead-of-time compile, as
    ShapeDtypeStructs carrying their shardings."""
    out_shardings = (
        None if state_shardings is None else (state_shardings, sharding.replicated(mesh))
    )
    return jax.jit(step_fn, donate_argnums=0, out_shardings=out_shardings)


def place_batch(mesh, batch, batch_dims, *, strict=True):
    """Returns a dict of host arrays (or trees of them) as global arrays on mesh.

    batch_dims: {key: the dim split over the data axes, or None: replicated}. A row dim the data
    axes do not divide raises, or with strict=False is replicated (the RL update's rows follow
    the data, not the mesh).
    """
    out = {}
    for key, value in batch.items():
        dim = batch_dims[key]
        out[key] = distributed.global_from_full(
            value,
            jax.tree.map(
                lambda x: sharding.batch_sharding(mesh, x.shape, dim, strict=strict), value
            ),
        )
    return out


def abstract_state(cfg, optimizer, shardings, extra=None):
    """Returns the train state's ShapeDtypeStructs, each carrying its sharding from `shardings`.

    The state is `state.init_state`'s {"params", "opt_state", "step", "rng"}, plus the entries
    extra(params) returns (e.g. RL's {"momentum": ...}).
    """

    def init(params):
        state = state_lib.init_state(params, optimizer, jax.random.key(0))
        return {**state, **(extra(params) if extra else {})}

    abstract = jax.eval_shape(init, model.abstract_params(cfg))
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )


def restore_or_init(manager, abstract, init):
    """Returns (state, extra): the manager's latest checkpoint restored onto `abstract`'s
    shardings with the extra it was saved with, else (init(), None) for a fresh run."""
    restored = manager.restore_latest(abstract)
    return (init(), None) if restored is None else restored


def split_images(grid, images_per_row, num_micro):
    """Returns, for each of num_micro micro-batches of consecutive rows, (its images' grid rows
    [n, 3], its slice of the flattened patch rows).

    grid [num_images, 3]: every image's (t, h, w), in row order; images_per_row [B].
    """
    rows = len(images_per_row)
    if rows % num_micro:
        raise ValueError(f"batch of {rows} rows does not split into {num_micro} micro-batches")
    size = rows // num_micro
    image_start = np.concatenate([[0], np.cumsum(images_per_row)])
    patch_start = np.concatenate([[0], np.cumsum(grid.prod(-1))])
    spans = []
    for a in range(num_micro):
        i0, i1 = image_start[a * size], image_start[(a + 1) * size]
        spans.append((grid[i0:i1], slice(patch_start[i0], patch_start[i1])))
    return spans


def stack(parts):
    """Returns trees of host arrays stacked on a new leading micro-batch axis [A] (numpy)."""
    return jax.tree.map(lambda *xs: np.stack(xs), *parts)
