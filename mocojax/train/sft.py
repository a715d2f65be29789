"""Stage I: shared multi-role SFT. A pure jitted train step and the training loop.

The step is the trainer core's (`train/step.py`) with the NLL plugged in. Gradient accumulation
is a `lax.scan` over micro-batches inside one jitted step (not `optax.MultiSteps`): each
micro-batch contributes its NLL *sum*, and the sum of gradients is divided once by the global
batch's target-token count, so an accumulated step equals the unaccumulated step on the same
global batch (every target token weighs the same). MultiSteps
would average per-micro-batch means (weighting short-target micro-batches up), keep a
params-sized accumulator in the optimiser state and make one "step" mean several calls.
"""

import functools
import logging
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from mocojax import (
    checkpoint,
    config_utils,
    distributed,
    losses,
    metrics as metrics_lib,
    model,
    processing_images,
    sharding,
)
from mocojax.data import pipeline, records as records_lib
from mocojax.model.rope import default_row_len, pad_vision_metadata
from mocojax.train import state as state_lib, step as step_lib

NUM_ROLES = len(records_lib.ROLES)


def _next_power_of_two(n):
    return 1 << max(0, int(n) - 1).bit_length()


def pack_rows(cfg, batch, num_micro=1, row_multiple=4):
    """Returns a right-padded host SFT batch [B, L] with its records packed several to a row.

    Records (the real tokens of each row) go into rows of the same L slots, first-fit in order of
    decreasing length; each packed row keeps its records in batch order. The row count is
    rounded up to a multiple of lcm(row_multiple, num_micro) (few shapes to compile), at most B.
    attention_mask holds each token's segment id (1, 2, ... within a row; 0: padding), so
    attention never crosses records (`model.qwen3_vl.segment_mask`); positions [3, rows, L] are
    each record's own (M-RoPE image positions included: they restart per record); role [rows, L]
    is per token; a record's first token is no target (it would be predicted from the previous
    record); pixel_values / image_grid_thw follow the records' new order. The loss sums and
    token counts are those of the unpacked batch.
    """
    ids, mask = batch["input_ids"], np.asarray(batch["attention_mask"])
    rows, length = ids.shape
    lengths = mask.sum(1)
    if (mask != (np.arange(length)[None] < lengths[:, None])).any():
        raise ValueError("packing needs right-padded rows (attention_mask a 0/1 prefix)")
    grid = batch["image_grid_thw"]
    grid = np.zeros((0, 3), np.int64) if grid is None else np.asarray(grid).reshape(-1, 3)
    positions = model.prepare_inputs(
        cfg, ids, mask, grid if len(grid) else None, batch["mm_token_type_ids"]
    ).positions
    bins, fill = [], []
    for r in np.argsort(-lengths, kind="stable"):
        j = next((j for j, f in enumerate(fill) if f + lengths[r] <= length), len(bins))
        if j == len(bins):
            bins.append([])
            fill.append(0)
        bins[j].append(r)
        fill[j] += lengths[r]
    bins = sorted(sorted(b) for b in bins)
    multiple = int(np.lcm(row_multiple, num_micro))
    num_rows = min(-(-len(bins) // multiple) * multiple, rows)
    out = {k: np.zeros((num_rows, length), np.int32) for k in ("input_ids", "attention_mask")}
    for k in ("loss_mask", "mm_token_type_ids", "role"):
        out[k] = np.zeros((num_rows, length), np.int32)
    out["positions"] = np.zeros((3, num_rows, length), np.int32)
    image_start = np.concatenate([[0], np.cumsum((ids == cfg.vision_start_token_id).sum(1))])
    patch_start = np.concatenate([[0], np.cumsum(grid.prod(-1))])
    images, patches = [], []
    for row, records in enumerate(bins):
        at = 0
        for segment, r in enumerate(records, 1):
            n, span = lengths[r], slice(at, at + lengths[r])
            out["input_ids"][row, span] = ids[r, :n]
            out["attention_mask"][row, span] = segment
            out["loss_mask"][row, span] = batch["loss_mask"][r, :n]
            out["loss_mask"][row, at] = 0
            out["mm_token_type_ids"][row, span] = batch["mm_token_type_ids"][r, :n]
            out["role"][row, span] = batch["role"][r]
            out["positions"][:, row, span] = positions[:, r, :n]
            images += range(image_start[r], image_start[r + 1])
            at += n
    for i in images:
        patches += range(patch_start[i], patch_start[i + 1])
    out["image_grid_thw"] = grid[images] if len(images) else None
    out["pixel_values"] = batch["pixel_values"][patches] if len(images) else None
    return out


def micro_batches(
    cfg, batch, num_micro, max_patches=None, pack=False, pack_row_multiple=4, text_row_len=None
):
    """Returns a host batch split into num_micro micro-batches, stacked on a leading [A] axis (numpy).

    input_ids / attention_mask / loss_mask [A, b, L], role [A, b], positions [A, 3, b, L],
    pixel_values [A, P, patch_dim] and vision (VisionMeta of [A, P, ...]). Every micro-batch gets
    the same P patch slots (max_patches, or the next power of two of the largest need; padding
    patches are inert), so the step sees few shapes; P >= 1 even without images, so
    the pytree structure never changes between steps. pack: records packed several to a row
    first (`pack_rows`: fewer rows b, segment ids in attention_mask, role [A, b, L]).
    text_row_len: the packed vision row length of a batch without images (`text_row_len`; None:
    `default_row_len`'s 16), so a text-only batch (the Judge's) has an image batch's shapes.
    """
    if pack:
        batch = pack_rows(cfg, batch, num_micro, pack_row_multiple)
    input_ids = batch["input_ids"]
    grid = batch["image_grid_thw"]
    grid = np.zeros((0, 3), np.int64) if grid is None else np.asarray(grid).reshape(-1, 3)
    spans = step_lib.split_images(grid, (input_ids == cfg.vision_start_token_id).sum(1), num_micro)
    size = input_ids.shape[0] // num_micro
    need = max(patches.stop - patches.start for _, patches in spans)
    num_patches = max_patches or _next_power_of_two(max(need, 1))
    if need > num_patches:
        raise ValueError(
            f"a micro-batch holds {need} image patches, more than data.max_patches={max_patches}"
        )
    # one packed attention row length, so micro-batches stack
    row_len = default_row_len(grid) if len(grid) or not text_row_len else text_row_len
    parts = []
    for a, (sub_grid, patches) in enumerate(spans):
        rows = slice(a * size, (a + 1) * size)
        if pack:
            positions = batch["positions"][:, rows]
        else:
            positions = model.prepare_inputs(
                cfg,
                input_ids[rows],
                batch["attention_mask"][rows],
                sub_grid if len(sub_grid) else None,
                batch["mm_token_type_ids"][rows],
            ).positions
        vision = model.vision_metadata(cfg.vision, sub_grid, row_len=row_len)
        pixels = np.zeros((num_patches, cfg.vision.patch_dim), np.float32)
        if len(sub_grid):
            pixels[: patches.stop - patches.start] = batch["pixel_values"][patches]
        parts.append(
            {
                "input_ids": input_ids[rows],
                "attention_mask": batch["attention_mask"][rows],
                "loss_mask": batch["loss_mask"][rows],
                "role": batch["role"][rows],
                "positions": positions.astype(np.int32),
                "pixel_values": pixels,
                "vision": pad_vision_metadata(vision, num_patches),
            }
        )
    return step_lib.stack(parts)


def next_token_logprobs(cfg, params, micro):
    """Returns log p(input_ids[:, t + 1] | tokens <= t) float32 [b, L - 1] of one micro-batch
    (`micro_batches`' layout): hidden[:, t] predicts input_ids[:, t + 1]; the log-softmax runs
    cfg.logits_chunk positions at a time (model.target_logprobs)."""
    _, aux = model.apply(
        cfg,
        params,
        micro["input_ids"],
        micro["attention_mask"],
        micro["positions"],
        micro["pixel_values"].astype(jnp.dtype(cfg.dtype)),
        micro["vision"],
        return_hidden=True,
    )
    return model.target_logprobs(cfg, params, aux["hidden"][:, :-1], micro["input_ids"][:, 1:])


def batch_nll(cfg, params, micro):
    """Returns (nll_sum, token_count, role_nll_sums [R], role_token_counts [R]) of one micro-batch."""
    # loss_mask marks target tokens of input_ids; logprobs [:, t] is that of input_ids[:, t + 1].
    mask = micro["loss_mask"][:, 1:]
    logprobs = next_token_logprobs(cfg, params, micro)
    # The mixed loss's sums are the per-role sums added up (one log-softmax, not two).
    role = micro["role"] if micro["role"].ndim == 1 else micro["role"][:, 1:]  # packed: per token
    role_nll, role_tokens = losses.per_group_sums(-logprobs, mask, role, NUM_ROLES)
    return role_nll.sum(), role_tokens.sum(), role_nll, role_tokens


def _micro_loss(cfg, params, micro):
    """Returns (nll_sum, (token_count, role_nll_sums [R], role_token_counts [R])) of one micro-batch:
    the values the trainer core sums over micro-batches."""
    nll, *counts = batch_nll(cfg, params, micro)
    return nll, tuple(counts)


def _role_metrics(role_nll, role_tokens):
    out = {}
    for r, name in enumerate(records_lib.ROLES):
        # NaN, not 0, for a role absent from the batch (role-grouped batches hold one role).
        out[f"loss_{name}"] = jnp.where(
            role_tokens[r] > 0, role_nll[r] / jnp.maximum(role_tokens[r], 1.0), jnp.nan
        )
        out[f"tokens_{name}"] = role_tokens[r]
    return out


def train_step(cfg, optimizer, state, batch, grads_sharding=None):
    """Returns (new state, metrics) after one optimiser update on a batch with a leading micro-batch axis.

    The gradient is the sum over micro-batches of the NLL sums' gradients divided once by the
    global batch's target-token count. grads_sharding: the params' shardings (see step.accumulate).
    """
    grads, (nll, (tokens, role_nll, role_tokens)) = step_lib.accumulate(
        functools.partial(_micro_loss, cfg), state["params"], batch, grads_sharding=grads_sharding
    )
    denom = jnp.maximum(tokens, 1.0)
    loss = nll / denom
    grads = jax.tree.map(lambda g: g / denom, grads)
    new_state, update_metrics = step_lib.update(state, grads, optimizer, loss)
    metrics = {
        "loss": loss,
        "target_tokens": tokens,
        **update_metrics,
        **_role_metrics(role_nll, role_tokens),
    }
    return new_state, metrics


def eval_step(cfg, params, batch):
    """Returns the summed NLL and token counts of a batch, overall and per role (for held-out loss)."""
    _, (nll, (tokens, role_nll, role_tokens)) = step_lib.accumulate(
        functools.partial(_micro_loss, cfg), params, batch, with_grad=False
    )
    return {"nll": nll, "tokens": tokens, "role_nll": role_nll, "role_tokens": role_tokens}


BATCH_DIMS = {
    "input_ids": 1,
    "attention_mask": 1,
    "loss_mask": 1,
    "role": 1,
    "positions": 2,
    "pixel_values": None,
    "vision": None,
}  # [A, b, ...]; patches stay replicated


def make_train_step(cfg, optimizer, mesh, state_shardings):
    """Returns the jitted train step (state donated, gradient carry pinned to the params' shardings)."""
    step = functools.partial(train_step, cfg, optimizer, grads_sharding=state_shardings["params"])
    return step_lib.jit_step(step, state_shardings, mesh)


def global_host_batch(host_batch, pad_token_id, patch_dim):
    """Returns the global batch (every process's host batch, rows in process order), on every process.

    Each process renders only its own rows; they are gathered because image patches and their
    metadata are replicated over the mesh (not split by row), so every process needs all of them.
    Rows are padded to the longest process's length bucket, the one a single process would pick.
    """
    if jax.process_count() == 1:
        return host_batch
    batch = pipeline.pad_to(
        host_batch, distributed.process_max(host_batch["input_ids"].shape[1]), pad_token_id
    )
    # A process without images must still join the gathers of the image fields.
    if batch["image_grid_thw"] is None:
        batch["image_grid_thw"] = np.zeros((0, 3), np.int64)
    if batch["pixel_values"] is None:
        batch["pixel_values"] = np.zeros((0, patch_dim), np.float32)
    batch = {
        k: distributed.gather_rows(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()
    }
    if not len(batch["image_grid_thw"]):
        batch["image_grid_thw"] = batch["pixel_values"] = None
    return batch


def device_batch(
    cfg,
    mesh,
    host_batch,
    num_micro,
    max_patches,
    pack=False,
    pack_row_multiple=4,
    text_row_len=None,
):
    """Returns the micro-batched global batch (jax.Arrays sharded by BATCH_DIMS) of a global host
    batch (pack: records packed several to a row, `pack_rows`; text_row_len: `micro_batches`)."""
    return step_lib.place_batch(
        mesh,
        micro_batches(
            cfg, host_batch, num_micro, max_patches, pack, pack_row_multiple, text_row_len
        ),
        BATCH_DIMS,
    )


def text_row_len(data_config):
    """Returns the packed vision row length of a square image of data.max_pixels when images have
    one area (data.min_pixels == data.max_pixels) and data.max_patches is fixed (the toy world's
    square images: every image batch's row length), else None (today's shapes per batch).

    A batch without images (with group_by_role, every Judge batch) then gets an image batch's
    vision shapes and the step compiles once for both; its loss does not depend on the row
    length (no image token reads the vision tower's output of padding patches).
    """
    area = data_config.get("max_pixels")
    if not data_config.get("max_patches") or not area or data_config.get("min_pixels") != area:
        return None
    side = math.isqrt(area)
    height, width = processing_images.smart_resize(side, side, area, area)
    patch = processing_images.PATCH_SIZE
    return default_row_len([[1, height // patch, width // patch]])


def evaluate_loss(eval_step_fn, params, batches):
    """Returns held-out mean NLL overall and per role over an iterable of device batches."""
    total = None
    for batch in batches:
        out = jax.device_get(eval_step_fn(params, batch))
        total = out if total is None else jax.tree.map(np.add, total, out)
    result = {"eval/loss": float(total["nll"] / max(total["tokens"], 1.0))}
    for r, name in enumerate(records_lib.ROLES):
        if total["role_tokens"][r]:
            result[f"eval/loss_{name}"] = float(total["role_nll"][r] / total["role_tokens"][r])
    return result


def _host_metrics(step_metrics):
    """Returns the step's scalars as floats, without the loss of a role that had no tokens."""
    out = {k: float(v) for k, v in step_metrics.items()}
    for name in records_lib.ROLES:
        if not out[f"tokens_{name}"]:
            del out[f"loss_{name}"]
    return out


def sft_state(config, workdir, setup, cfg, mesh, optimizer, manager):
    """Returns (train state, checkpoint extra or None, state shardings): the latest SFT checkpoint
    restored onto the state's shardings, else a fresh state born on them from config.sft.init_stage's
    checkpoint (e.g. the toy base's vision stage), config.model.init_from, or a fresh init."""
    state_shardings = sharding.train_state_shardings(cfg, mesh, optimizer, with_momentum=False)

    def init():
        init_stage = config.sft.get("init_stage", "")
        if init_stage:
            params = checkpoint.restore_params(
                workdir, init_stage, setup.model_config, shardings=state_shardings["params"]
            )[0]
        elif config.model.init_from:
            params = setup.load_params(place=sharding.placer(cfg, mesh))
        else:
            params = None
        return sharding.init_train_state(
            cfg, mesh, optimizer, jax.random.key(config.seed), params=params, with_momentum=False
        )[0]

    abstract = step_lib.abstract_state(cfg, optimizer, state_shardings)
    return (*step_lib.restore_or_init(manager, abstract, init), state_shardings)


def warmup_config(config):
    """Returns the config the warm-up stage trains with: config.sft's, with config.warmup's
    record mix, steps and batch (e.g. Judge records only, before the role mix), started from
    model.init_from (never from another stage). The evidence loop's records come from
    warmup.loop_mix ((0, 0) when absent: none), not data.loop_mix; warmup.restart_at (0 when
    absent: one cosine) restarts its learning-rate schedule (`state.learning_rate_schedule`)."""
    out = config.copy_and_resolve_references()
    with out.unlocked():
        out.data.mix = tuple(config.warmup.mix)
        out.data.loop_mix = tuple(config.warmup.get("loop_mix", (0, 0)))
        out.sft.num_steps = config.warmup.num_steps
        out.sft.global_batch_size = config.warmup.global_batch_size
        out.sft.init_stage = ""
        out.optimizer.restart_at = config.warmup.get("restart_at", 0)
    return out


def run_warmup(config, workdir):
    """The warm-up stage: SFT on config.warmup's record mix into checkpoints/warmup, which the
    role SFT stage starts from with sft.init_stage="warmup" (docs/training.md)."""
    return run_sft(warmup_config(config), workdir, stage="warmup")


def run_sft(config, workdir, stage="sft"):
    """Runs (or resumes) Stage I as the config says; returns the last step's metrics.

    stage names its checkpoints (<workdir>/checkpoints/<stage>) and metrics rows: "sft", or
    "warmup" for `run_warmup`.

    Long because it is Stage I read top to bottom, like `run_rl`: set-up (mesh, data, optimizer,
    state restored or initialised), then one loop per step (batch, update, metrics, periodic eval,
    skip guard, checkpoint); its closures `dataset` and `device_batches` share the set-up's
    processor, mesh and packing options.
    """
    sft, data_config = config.sft, config.data
    setup = config_utils.build_setup(config, workdir)
    mesh = sharding.make_mesh(config.mesh or None)
    cfg = sharding.model_config(setup.model_config, mesh)
    train_examples, eval_examples = config_utils.sft_examples(config, setup.processor)
    if 0 < len(eval_examples) < sft.global_batch_size:
        logging.warning(
            "%s: the held-out set has %d records, fewer than one batch of %d; no held-out loss "
            "is computed (more data.num_eval_scenes gives one)",
            stage,
            len(eval_examples),
            sft.global_batch_size,
        )
        eval_examples = []
    optimizer = state_lib.make_optimizer(config.optimizer, sft.num_steps)
    schedule = state_lib.optimizer_schedule(config.optimizer, sft.num_steps)
    process_index, process_count = jax.process_index(), jax.process_count()
    num_micro = sft.grad_accum_steps

    def dataset(examples, seed, num_epochs, group_by_role=False):
        return pipeline.sft_dataset(
            examples,
            setup.processor,
            global_batch_size=sft.global_batch_size,
            seed=seed,
            num_epochs=num_epochs,
            process_index=process_index,
            process_count=process_count,
            buckets=tuple(data_config.length_buckets),
            image_size=data_config.image_size,
            group_by_role=group_by_role,
        )

    data_iter = iter(dataset(train_examples, data_config.seed, None, data_config.group_by_role))
    manager = checkpoint.Manager(workdir, stage, keep=sft.keep_checkpoints)
    state, extra, state_shardings = sft_state(config, workdir, setup, cfg, mesh, optimizer, manager)
    skipped = 0
    if extra is not None:
        data_iter.set_state(extra["data"])
        skipped = extra["skipped"]
        logging.info("resumed %s from step %d", stage, int(state["step"]))
    start = int(state["step"])
    step_fn = make_train_step(cfg, optimizer, mesh, state_shardings)
    eval_fn = jax.jit(functools.partial(eval_step, cfg), out_shardings=sharding.replicated(mesh))
    pad_token_id = setup.processor.pad_token_id
    packing = dict(
        pack=data_config.get("pack", False),
        pack_row_multiple=data_config.get("pack_row_multiple", 4),
        text_row_len=text_row_len(data_config),
    )

    def device_batches(host_batches):
        for host_batch in host_batches:
            yield device_batch(
                cfg,
                mesh,
                global_host_batch(host_batch, pad_token_id, cfg.vision.patch_dim),
                num_micro,
                data_config.max_patches,
                **packing,
            )

    writer = metrics_lib.MetricWriter(workdir, stage, total_steps=sft.num_steps, initial_step=start)
    guard = state_lib.SkipGuard(
        config.optimizer.get("max_skipped_steps", state_lib.MAX_SKIPPED_STEPS),
        stage,
        "optimizer.max_skipped_steps",
    )
    last = {}
    for step in range(start + 1, sft.num_steps + 1):
        t0 = time.perf_counter()
        host_batch = global_host_batch(next(data_iter), pad_token_id, cfg.vision.patch_dim)
        batch = device_batch(cfg, mesh, host_batch, num_micro, data_config.max_patches, **packing)
        state, step_metrics = step_fn(state, batch)
        last = _host_metrics(jax.device_get(step_metrics))
        seconds = time.perf_counter() - t0
        skipped += int(last["skipped"])
        tokens = int(host_batch["attention_mask"].sum())
        last.update(
            skipped_total=skipped,
            tokens_per_s=tokens / seconds,
            step_time_s=seconds,
            lr=float(schedule(step - 1)),
        )
        if eval_examples and (step % sft.eval_every == 0 or step == sft.num_steps):
            last.update(
                evaluate_loss(
                    eval_fn, state["params"], device_batches(dataset(eval_examples, 0, 1))
                )
            )
        writer.write(step, last, tokens=tokens)
        guard.update(int(last["skipped"]), step, cleanup=(manager.close, writer.close))
        if step % sft.checkpoint_every == 0 or step == sft.num_steps:
            manager.save(step, state, {"data": data_iter.get_state(), "skipped": skipped})
    manager.close()
    writer.close()
    return last
