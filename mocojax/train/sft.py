"""Stage I: shared multi-role SFT. A pure jitted train step and the training loop.

Gradient accumulation is a `lax.scan` over micro-batches inside one jitted step (not
`optax.MultiSteps`): each micro-batch contributes its NLL *sum*, and the sum of gradients is
divided once by the global batch's target-token count, so an accumulated step equals the
unaccumulated step on the same global batch (token-weighted, as `sft_loss` is). MultiSteps
would average per-micro-batch means (weighting short-target micro-batches up), keep a
params-sized accumulator in the optimiser state and make one "step" mean several calls.
"""

import functools
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np

from mocojax import checkpoint, config_utils, losses, model
from mocojax import metrics as metrics_lib
from mocojax.data import pipeline
from mocojax.data import records as records_lib
from mocojax.model.rope import VisionMeta, pad_vision_metadata
from mocojax.train import state as state_lib

NUM_ROLES = len(records_lib.ROLES)


def _next_power_of_two(n):
    return 1 << max(0, int(n) - 1).bit_length()


def _empty_vision_meta():
    return VisionMeta(rot_pos=np.zeros((0, 2), np.int32), interp_idx=np.zeros((0, 4), np.int32),
                      interp_w=np.zeros((0, 4), np.float32), segment=np.zeros((0,), np.int32))


def micro_batches(cfg, batch, num_micro, max_patches=None):
    """Returns a host batch split into num_micro micro-batches, stacked on a leading [A] axis (numpy).

    input_ids / attention_mask / loss_mask [A, b, L], role [A, b], positions [A, 3, b, L],
    pixel_values [A, P, patch_dim] and vision (VisionMeta of [A, P, ...]). Every micro-batch gets
    the same P patch slots (max_patches, or the next power of two of the largest need; padding
    patches are inert), so the step sees few shapes; P >= 1 even without images, so
    the pytree structure never changes between steps.
    """
    input_ids = batch["input_ids"]
    rows = input_ids.shape[0]
    if rows % num_micro:
        raise ValueError(f"batch of {rows} rows does not split into {num_micro} micro-batches")
    size = rows // num_micro
    grid = batch["image_grid_thw"]
    grid = np.zeros((0, 3), np.int64) if grid is None else np.asarray(grid).reshape(-1, 3)
    images_per_row = (input_ids == cfg.vision_start_token_id).sum(1)
    image_start = np.concatenate([[0], np.cumsum(images_per_row)])
    patch_start = np.concatenate([[0], np.cumsum(grid.prod(-1))])
    spans = [(image_start[a * size], image_start[(a + 1) * size]) for a in range(num_micro)]
    need = max(patch_start[i1] - patch_start[i0] for i0, i1 in spans)
    num_patches = max_patches or _next_power_of_two(max(need, 1))
    if need > num_patches:
        raise ValueError(f"a micro-batch holds {need} image patches, more than data.max_patches={max_patches}")
    out = {k: [] for k in ("input_ids", "attention_mask", "loss_mask", "role", "positions", "pixel_values", "vision")}
    for a, (i0, i1) in enumerate(spans):
        part = slice(a * size, (a + 1) * size)
        sub_grid = grid[i0:i1] if i1 > i0 else None
        inputs = model.prepare_inputs(cfg, input_ids[part], batch["attention_mask"][part], sub_grid,
                                      batch["mm_token_type_ids"][part])
        vision = (model.vision_metadata(cfg.vision, sub_grid) if i1 > i0 else _empty_vision_meta())
        pixels = np.zeros((num_patches, cfg.vision.patch_dim), np.float32)
        if i1 > i0:
            pixels[:patch_start[i1] - patch_start[i0]] = batch["pixel_values"][patch_start[i0]:patch_start[i1]]
        out["input_ids"].append(input_ids[part])
        out["attention_mask"].append(batch["attention_mask"][part])
        out["loss_mask"].append(batch["loss_mask"][part])
        out["role"].append(batch["role"][part])
        out["positions"].append(inputs.positions.astype(np.int32))
        out["pixel_values"].append(pixels)
        out["vision"].append(pad_vision_metadata(vision, num_patches))
    stacked = {k: np.stack(v) for k, v in out.items() if k != "vision"}
    stacked["vision"] = jax.tree.map(lambda *xs: np.stack(xs), *out["vision"])
    return stacked


def batch_nll(cfg, params, micro):
    """Returns (nll_sum, token_count, role_nll_sums [R], role_token_counts [R]) of one micro-batch."""
    pixel_values = micro["pixel_values"].astype(jnp.dtype(cfg.dtype))
    logits, _ = model.apply(cfg, params, micro["input_ids"], micro["attention_mask"], micro["positions"],
                            pixel_values, micro["vision"])
    # logits[:, t] predicts input_ids[:, t + 1]; loss_mask marks target tokens of input_ids.
    logits, targets, mask = logits[:, :-1], micro["input_ids"][:, 1:], micro["loss_mask"][:, 1:]
    _, sums = losses.sft_loss(logits, targets, mask)
    role_nll, role_tokens = losses.per_group_nll(logits, targets, mask, micro["role"], NUM_ROLES)
    return sums["nll_sum"], sums["token_count"], role_nll, role_tokens


def _accumulate(cfg, params, batch, with_grad):
    """Returns (grads or None, nll_sum, token_count, role_nll [R], role_tokens [R]) summed over micro-batches."""
    zeros_r = jnp.zeros((NUM_ROLES,), jnp.float32)

    def micro_step(carry, micro):
        if with_grad:
            (nll, aux), grads = jax.value_and_grad(
                lambda p: (lambda out: (out[0], out[1:]))(batch_nll(cfg, p, micro)), has_aux=True)(params)
            carry_grads = jax.tree.map(jnp.add, carry[0], grads)
        else:
            nll, *aux = batch_nll(cfg, params, micro)
            carry_grads = carry[0]
        tokens, role_nll, role_tokens = aux
        return (carry_grads, carry[1] + nll, carry[2] + tokens, carry[3] + role_nll, carry[4] + role_tokens), None

    grads0 = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params) if with_grad else None
    init = (grads0, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), zeros_r, zeros_r)
    carry, _ = jax.lax.scan(micro_step, init, batch)
    return carry


def _role_metrics(prefix, role_nll, role_tokens):
    out = {}
    for r, name in enumerate(records_lib.ROLES):
        out[f"{prefix}loss_{name}"] = role_nll[r] / jnp.maximum(role_tokens[r], 1.0)
        out[f"{prefix}tokens_{name}"] = role_tokens[r]
    return out


def train_step(cfg, optimizer, state, batch):
    """Returns (new state, metrics) after one optimiser update on a batch with a leading micro-batch axis."""
    grads, nll, tokens, role_nll, role_tokens = _accumulate(cfg, state["params"], batch, with_grad=True)
    denom = jnp.maximum(tokens, 1.0)
    loss = nll / denom
    grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), grads, state["params"])
    new_state, update_metrics = state_lib.apply_gradients(state, grads, optimizer, loss)
    metrics = {"loss": loss, "target_tokens": tokens, **update_metrics, **_role_metrics("", role_nll, role_tokens)}
    return new_state, metrics


def eval_step(cfg, params, batch):
    """Returns the summed NLL and token counts of a batch, overall and per role (for held-out loss)."""
    _, nll, tokens, role_nll, role_tokens = _accumulate(cfg, params, batch, with_grad=False)
    return {"nll": nll, "tokens": tokens, "role_nll": role_nll, "role_tokens": role_tokens}


def make_train_step(cfg, optimizer):
    """Returns the jitted train step (state donated)."""
    return jax.jit(functools.partial(train_step, cfg, optimizer), donate_argnums=(0,))


def evaluate_loss(cfg, params, eval_step_fn, batches, num_micro, max_patches):
    """Returns held-out mean NLL overall and per role over an iterable of host batches."""
    total = None
    for batch in batches:
        out = jax.device_get(eval_step_fn(params, micro_batches(cfg, batch, num_micro, max_patches)))
        total = out if total is None else jax.tree.map(np.add, total, out)
    result = {"eval/loss": float(total["nll"] / max(total["tokens"], 1.0))}
    for r, name in enumerate(records_lib.ROLES):
        result[f"eval/loss_{name}"] = float(total["role_nll"][r] / max(total["role_tokens"][r], 1.0))
    return result


def run_sft(config, workdir):
    """Runs (or resumes) Stage I as the config says; returns the final metrics dict."""
    sft = config.sft
    setup = config_utils.build_setup(config, workdir)
    cfg, processor = setup.model_config, setup.processor
    train_examples, eval_examples = config_utils.sft_examples(config)
    optimizer = state_lib.make_optimizer(config.optimizer, sft.num_steps)
    proc = jax.process_index(), jax.process_count()
    num_micro = sft.grad_accum_steps
    data = pipeline.sft_dataset(train_examples, processor, global_batch_size=sft.global_batch_size,
                                seed=config.data.seed, process_index=proc[0], process_count=proc[1],
                                buckets=tuple(config.data.length_buckets), image_size=config.data.image_size)
    data_iter = iter(data)
    manager = checkpoint.Manager(workdir, "sft", keep=sft.keep_checkpoints)
    abstract = jax.eval_shape(lambda: state_lib.init_state(
        model.abstract_params(cfg), optimizer, jax.random.key(0)))
    restored = manager.restore_latest(abstract)
    if restored is None:
        state = state_lib.init_state(setup.load_params(), optimizer, jax.random.key(config.seed))
        extra = {"skipped": 0}
    else:
        state, extra = restored
        data_iter.set_state(extra["data"])
        logging.info("resumed SFT from step %d", int(state["step"]))
    start = int(state["step"])
    step_fn = make_train_step(cfg, optimizer)
    eval_fn = jax.jit(functools.partial(eval_step, cfg))

    def eval_batches():
        dataset = pipeline.sft_dataset(eval_examples, processor, global_batch_size=sft.global_batch_size,
                                       seed=0, num_epochs=1, process_index=proc[0], process_count=proc[1],
                                       buckets=tuple(config.data.length_buckets),
                                       image_size=config.data.image_size)
        return iter(dataset)

    writer = metrics_lib.MetricWriter(workdir, "sft", total_steps=sft.num_steps, initial_step=start)
    skipped = extra["skipped"]
    last = {}
    for step in range(start + 1, sft.num_steps + 1):
        t0 = time.perf_counter()
        host_batch = next(data_iter)
        batch = micro_batches(cfg, host_batch, num_micro, config.data.max_patches)
        state, step_metrics = step_fn(state, batch)
        step_metrics = jax.device_get(step_metrics)
        skipped += int(step_metrics["skipped"])
        seconds = time.perf_counter() - t0
        real_tokens = int(host_batch["attention_mask"].sum()) * proc[1]
        last = {k: float(v) for k, v in step_metrics.items()}
        last.update(skipped_total=skipped, tokens_per_s=real_tokens / seconds, step_time_s=seconds,
                    lr=float(state_lib.learning_rate_schedule(config.optimizer.lr, sft.num_steps,
                                                              config.optimizer.warmup_ratio,
                                                              config.optimizer.end_lr_ratio)(step - 1)))
        if eval_examples and (step % sft.eval_every == 0 or step == sft.num_steps):
            last.update(evaluate_loss(cfg, state["params"], eval_fn, eval_batches(), num_micro,
                                      config.data.max_patches))
        writer.write(step, last, tokens=real_tokens)
        if step % sft.checkpoint_every == 0 or step == sft.num_steps:
            manager.save(step, state, {"data": data_iter.get_state(), "skipped": skipped})
    manager.close()
    writer.close()
    return last
