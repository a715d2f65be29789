"""The train state pytree, the optimiser (AdamW + cosine with warmup + clipping) and a skip-if-not-finite update.

The whole state is one dict: {"params", "opt_state", "step", "rng"}; the RL stage adds
"momentum". Every trainer's jitted step maps this dict to a new one (donated).
"""

import jax
import jax.numpy as jnp
import optax


def learning_rate_schedule(lr, total_steps, warmup_ratio, end_lr_ratio=0.0):
    """Returns step -> lr: linear warmup over ceil(warmup_ratio * total_steps) steps, then cosine decay."""
    warmup_steps = int(-(-warmup_ratio * total_steps // 1))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=lr, warmup_steps=warmup_steps,
        decay_steps=max(total_steps, warmup_steps + 1), end_value=lr * end_lr_ratio)


def make_optimizer(opt_config, total_steps):
    """Returns the optax transformation of an `optimizer` config block: clip, then AdamW on the schedule."""
    schedule = learning_rate_schedule(opt_config.lr, total_steps, opt_config.warmup_ratio,
                                      opt_config.end_lr_ratio)
    return optax.chain(
        optax.clip_by_global_norm(opt_config.grad_clip_norm),
        optax.adamw(schedule, b1=opt_config.b1, b2=opt_config.b2, eps=opt_config.eps,
                    weight_decay=opt_config.weight_decay))


def init_state(params, optimizer, rng):
    """Returns the train state {"params", "opt_state", "step" (int32 scalar), "rng" (typed key)}."""
    return {"params": params, "opt_state": optimizer.init(params),
            "step": jnp.zeros((), jnp.int32), "rng": rng}


def apply_gradients(state, grads, optimizer, loss):
    """Returns (state with the update applied, skipped 0/1): a non-finite loss or gradient keeps the old
    params and optimiser state (the step still advances, so the data moves on)."""
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    new_state = dict(state, params=keep(params, state["params"]),
                     opt_state=keep(opt_state, state["opt_state"]), step=state["step"] + 1)
    return new_state, {"grad_norm": grad_norm, "skipped": 1 - finite.astype(jnp.int32)}
