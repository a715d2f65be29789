"""The train state pytree, the optimiser (AdamW + cosine with warmup + clipping) and a skip-if-not-finite update.

The whole state is one dict: {"params", "opt_state", "step", "rng"}; the RL stage adds
"momentum". Every trainer's jitted step maps this dict to a new one (donated).
"""

import jax
import jax.numpy as jnp
import ml_collections
import optax


def learning_rate_schedule(lr, total_steps, warmup_ratio, end_lr_ratio=0.0, restart_at=0):
    """Returns step -> lr: linear warmup over ceil(warmup_ratio * total_steps) steps, then cosine decay.

    restart_at > 0: steps 0..restart_at-1 follow this schedule over restart_at steps (annealed
    to end_lr_ratio), then steps restart_at.. follow the total_steps schedule from its own step
    restart_at on -- the learning rate jumps back up, as when a run annealed over restart_at steps
    is resumed with total_steps (how docs/results.md session 18 first trained a binding Judge).
    """
    if restart_at:
        if not 0 < restart_at < total_steps:
            raise ValueError(f"restart_at={restart_at} must lie in (0, {total_steps})")
        first = learning_rate_schedule(lr, restart_at, warmup_ratio, end_lr_ratio)
        whole = learning_rate_schedule(lr, total_steps, warmup_ratio, end_lr_ratio)
        return optax.join_schedules([first, lambda step: whole(step + restart_at)], [restart_at])
    warmup_steps = int(-(-warmup_ratio * total_steps // 1))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=lr,
        warmup_steps=warmup_steps,
        decay_steps=max(total_steps, warmup_steps + 1),
        end_value=lr * end_lr_ratio,
    )


def optimizer_schedule(opt_config, total_steps):
    """Returns the learning-rate schedule of an `optimizer` config block over total_steps
    (its `restart_at`, when set, as `learning_rate_schedule`'s)."""
    return learning_rate_schedule(
        opt_config.lr,
        total_steps,
        opt_config.warmup_ratio,
        opt_config.end_lr_ratio,
        opt_config.get("restart_at", 0),
    )


def make_optimizer(opt_config, total_steps):
    """Returns the optax transformation of an `optimizer` config block: clip, then AdamW on the schedule."""
    schedule = optimizer_schedule(opt_config, total_steps)
    return optax.chain(
        optax.clip_by_global_norm(opt_config.grad_clip_norm),
        optax.adamw(
            schedule,
            b1=opt_config.b1,
            b2=opt_config.b2,
            eps=opt_config.eps,
            weight_decay=opt_config.weight_decay,
        ),
    )


def stage_optimizer(opt_config, stage):
    """Returns make_optimizer of config.optimizer with a stage block's lr, warmup_ratio and
    end_lr_ratio over its num_steps (config.rl for RL, config.loop for the evidence loop)."""
    opt = ml_collections.ConfigDict(opt_config.to_dict())
    opt.lr, opt.warmup_ratio, opt.end_lr_ratio = stage.lr, stage.warmup_ratio, stage.end_lr_ratio
    return make_optimizer(opt, stage.num_steps)


def init_state(params, optimizer, rng):
    """Returns the train state {"params", "opt_state", "step" (int32 scalar), "rng" (typed key)}."""
    return {
        "params": params,
        "opt_state": optimizer.init(params),
        "step": jnp.zeros((), jnp.int32),
        "rng": rng,
    }


def apply_gradients(state, grads, optimizer, loss):
    """Returns (state with the update applied, skipped 0/1): a non-finite loss, gradient or updated
    parameter (a finite gradient times an overflowing step) keeps the old params and optimiser state
    (the step still advances, so the data moves on)."""
    grad_norm = optax.global_norm(grads)
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    params_finite = jnp.all(jnp.stack([jnp.isfinite(p).all() for p in jax.tree.leaves(params)]))
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & params_finite
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    new_state = dict(
        state,
        params=keep(params, state["params"]),
        opt_state=keep(opt_state, state["opt_state"]),
        step=state["step"] + 1,
    )
    return new_state, {"grad_norm": grad_norm, "skipped": 1 - finite.astype(jnp.int32)}


MAX_SKIPPED_STEPS = 10  # default of optimizer.max_skipped_steps / rl.max_skipped_steps


class SkipGuard:
    """Fails a run after `limit` consecutive skipped (non-finite) updates: past that, every later
    update would be skipped too and the run would "finish" having learnt nothing."""

    def __init__(self, limit, stage, key):
        self.limit, self.stage, self.key, self.run = limit, stage, key, 0

    def update(self, skipped, step, cleanup=()):
        """Counts update `step` (skipped: 1 if it was skipped); at the limit, calls each of cleanup
        (e.g. close the checkpoint manager so pending saves finish) and raises RuntimeError."""
        self.run = self.run + 1 if skipped else 0
        if self.run >= self.limit:
            for close in cleanup:
                close()
            raise RuntimeError(
                f"{self.stage}: {self.run} consecutive updates (to step {step}) were skipped because the loss, "
                f"the gradient or the updated parameters were not finite; stopping (config.{self.key}="
                f"{self.limit}). Check the learning rate and the data; the last checkpoint holds finite params."
            )
