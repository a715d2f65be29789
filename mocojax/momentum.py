"""Momentum (EMA) copy of the Policy that plays the rubric roles: update, (m, H) schedule, diagnostics.

After every H Policy updates: phi <- m * phi + (1 - m) * theta. phi is kept in float32 even
when theta is bf16: bf16 keeps 8 significant bits, so with m = 0.99 the step
0.01 (theta - phi) rounds away whenever it is below half an ulp of phi (about 2^-8 |phi|),
i.e. whenever |theta - phi| < ~0.39 |phi|: a bf16 phi would never move.

Step convention: `step` counts Policy updates done so far (1 after the first update); a sync
happens after update `step` when step % H == 0. Schedules follow optax: they are called with
a 0-based count, the number of syncs already applied (or of Policy updates before this one
when counted by step).
"""

import dataclasses
import functools
import math
from typing import Callable, Union

import jax
import jax.numpy as jnp

MomentumFn = Callable[[int], float]
ROLES = ("generator", "judge")
ROLE_SOURCES = ("ema", "frozen", "policy")


def init_momentum(params):
    """Returns a float32 copy of the parameter tree: phi_0 = theta_0."""
    return jax.tree.map(lambda theta: jnp.array(theta, dtype=jnp.float32, copy=True), params)


@functools.partial(jax.jit, donate_argnums=0)
def ema_update(momentum, params, m):
    """Returns m * momentum + (1 - m) * params as a float32 tree; the old momentum is donated.

    Written as m phi + (1 - m) theta rather than phi + (1 - m)(theta - phi) so that m = 0
    copies theta bit for bit (and m = 1 keeps phi, for finite theta).
    """
    for leaf in jax.tree.leaves(momentum):
        if leaf.dtype != jnp.float32:
            raise TypeError(
                f"momentum leaves must be float32 (build with init_momentum), got {leaf.dtype}."
            )
    m = jnp.asarray(m, jnp.float32)
    return jax.tree.map(
        lambda phi, theta: m * phi + (1.0 - m) * theta.astype(jnp.float32), momentum, params
    )


def _sq_distance(a, b):
    return sum(
        jnp.sum(jnp.square(x.astype(jnp.float32) - y.astype(jnp.float32)))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@jax.jit
def tree_distance(a, b):
    """Returns the global L2 norm ||a - b|| over all leaves of two same-structure trees, float32 []."""
    return jnp.sqrt(_sq_distance(a, b))


def tracking_diagnostics(theta, phi, m, theta_to_phi_prev, policy_displacement):
    """Returns {"m", "momentum_update" u_s, "tracking_error" e_s, "policy_displacement" Delta_s}
    right after a sync with coefficient m (docs/method.md): e_s = ||theta_s - phi_s|| (float32 []),
    u_s = ||phi_s - phi_{s-1}|| and Delta_s = ||theta_s - theta_{s-1}|| as given.

    ema_update donates phi_{s-1}; rather than keeping a copy, u_s is computed from
    theta_to_phi_prev = ||theta_s - phi_{s-1}|| measured before the update, since
    phi_s - phi_{s-1} = (1 - m)(theta_s - phi_{s-1}).
    """
    return {
        "m": m,
        "momentum_update": (1.0 - m) * theta_to_phi_prev,
        "tracking_error": tree_distance(theta, phi),
        "policy_displacement": policy_displacement,
    }


def byol_cosine(base: float = 0.99, final: float = 1.0, total_syncs: int = 1000) -> MomentumFn:
    """Returns count -> m ramping from base to final by a half cosine over total_syncs (BYOL)."""
    if total_syncs < 1:
        raise ValueError(f"total_syncs must be >= 1, got {total_syncs}.")
    for name, value in (("base", base), ("final", final)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"byol_cosine {name} must be in [0, 1], got {value}.")

    def schedule(count):
        progress = min(max(float(count), 0.0), total_syncs) / total_syncs
        return final - (final - base) * (math.cos(math.pi * progress) + 1.0) / 2.0

    return schedule


def is_sync_step(step: int, every: int) -> bool:
    """Returns whether the momentum syncs after Policy update `step` (1-based) for H = every."""
    if every < 1:
        raise ValueError(f"Sync interval H must be >= 1, got {every}.")
    return step >= 1 and step % every == 0


@dataclasses.dataclass(frozen=True)
class MomentumSchedule:
    """The (m, H) rule: m a constant or a schedule of the sync count (or of the step), H >= 1.

    Special cases (docs/method.md): m = 1 frozen roles (no update is run at all), (m, H) = (0, 1)
    copy after every update, m = 0 with H > 1 periodic copy.
    """

    m: Union[float, MomentumFn] = 0.99
    every: int = 1
    count_by: str = "sync"  # "sync": m(count of syncs done); "step": m(step - 1).

    def __post_init__(self):
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"Sync interval H (every) must be an int >= 1, got {self.every!r}.")
        if self.count_by not in ("sync", "step"):
            raise ValueError(f"count_by must be 'sync' or 'step', got {self.count_by!r}.")
        if not callable(self.m):
            _check_m(self.m)

    @property
    def kind(self) -> str:
        """Returns "frozen", "copy", "periodic_copy", "ema" or "scheduled"."""
        if callable(self.m):
            return "scheduled"
        if self.m == 1.0:
            return "frozen"
        if self.m == 0.0:
            return "copy" if self.every == 1 else "periodic_copy"
        return "ema"

    def is_sync(self, step: int) -> bool:
        """Returns whether the momentum syncs after Policy update `step`."""
        return is_sync_step(step, self.every)

    def m_at(self, step: int) -> float:
        """Returns the coefficient m used by the sync after Policy update `step`."""
        if not callable(self.m):
            return float(self.m)
        count = step // self.every - 1 if self.count_by == "sync" else step - 1
        return _check_m(float(self.m(count)))

    def update(self, momentum, params, step: int):
        """Returns (momentum after Policy update `step`, m used or None when nothing ran)."""
        if not self.is_sync(step):
            return momentum, None
        m = self.m_at(step)
        if m == 1.0:
            return momentum, m
        return ema_update(momentum, params, m), m


def _check_m(m: float) -> float:
    if not 0.0 <= m <= 1.0:
        raise ValueError(f"Momentum coefficient m must be in [0, 1], got {m}.")
    return m


@dataclasses.dataclass(frozen=True)
class RoleMomentum:
    """Which parameters play each rubric role: "ema" (the momentum copy, updated by the
    schedule), "frozen" (a copy of the initial params, never updated) or "policy" (the live
    Policy params theta; with no copy kept, the memory-free equivalent of (m, H) = (0, 1)).

    The method is generator = judge = "ema": both roles share ONE momentum copy. The role
    ablation is e.g. generator="ema", judge="frozen".
    """

    generator: str = "ema"
    judge: str = "ema"

    def __post_init__(self):
        for role in ROLES:
            if getattr(self, role) not in ROLE_SOURCES:
                raise ValueError(
                    f"RoleMomentum.{role} must be one of {ROLE_SOURCES}, got "
                    f"{getattr(self, role)!r}."
                )

    @property
    def copies(self) -> tuple[str, ...]:
        """Returns the names of the parameter copies to keep, e.g. ("ema",) or ("ema", "frozen")."""
        return tuple(s for s in ("ema", "frozen") if s in (self.generator, self.judge))

    def init(self, params) -> dict:
        """Returns {copy name: float32 copy of params} for every copy the roles need."""
        return {name: init_momentum(params) for name in self.copies}

    def params_for(self, role: str, momentum: dict, params):
        """Returns the parameter tree that plays `role` ("generator" or "judge")."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}.")
        source = getattr(self, role)
        return params if source == "policy" else momentum[source]


def displacement_reference(params, schedule: MomentumSchedule):
    """Returns the `theta_at_sync` that `sync` starts from: a copy of params when H > 1 (Delta_s
    spans several updates), None when H = 1 (Delta_s is the update's own norm)."""
    return jax.tree.map(jnp.copy, params) if schedule.every > 1 else None


def sync(
    role_momentum: RoleMomentum,
    schedule: MomentumSchedule,
    copies: dict,
    params,
    step: int,
    *,
    update_norm,
    theta_at_sync=None,
):
    """Returns (copies, diagnostics, theta_at_sync) after Policy update `step` (1-based).

    The one place the (m, H) rule meets the roles: at a sync (step % H == 0) the "ema" copy moves
    by `schedule.update` (phi <- m phi + (1 - m) theta, the old phi donated; nothing runs at
    m = 1), the frozen copy never does. diagnostics: "tracking_error_frozen" whenever a frozen
    copy is kept, and at a sync of an "ema" copy `tracking_diagnostics`, with Delta_s the
    update's own norm (update_norm) when H = 1, else measured against theta_at_sync (the params
    at the previous sync, from `displacement_reference`), which comes back refreshed.
    """
    diagnostics = {}
    if "frozen" in copies:
        diagnostics["tracking_error_frozen"] = tree_distance(params, copies["frozen"])
    displacement = update_norm
    if theta_at_sync is not None and schedule.is_sync(step):
        displacement = tree_distance(params, theta_at_sync)
        theta_at_sync = jax.tree.map(jnp.copy, params)
    if "ema" not in copies or not schedule.is_sync(step):
        return copies, diagnostics, theta_at_sync
    m = schedule.m_at(step)
    before = tree_distance(params, copies["ema"])
    ema, _ = schedule.update(copies["ema"], params, step)
    diagnostics.update(tracking_diagnostics(params, ema, m, before, displacement))
    return {**copies, "ema": ema}, diagnostics, theta_at_sync
