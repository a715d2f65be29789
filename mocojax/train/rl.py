"""Stage II: Policy RL with online rubrics and momentum transfer (METHOD.md), end to end.

Per Policy update t (one `run_rl` iteration):
  rollout   the Policy theta_t samples N captions per image; the Generator and the Judge,
            played by the momentum params phi_t (per `RoleMomentum`), write one rubric per
            image and score all N captions (`rollout.collect`, host side);
  update    GRPO on the Policy only: `grpo_step` is a pure jitted function of the train state
            {"params", "opt_state", "step", "rng"} and the batch, with gradient accumulation
            over micro-batches (`lax.scan`). The momentum is not an input of it, so it gets no
            gradient by construction;
  sync      after every H updates: phi <- m phi + (1 - m) theta (`momentum.ema_update`,
            donating phi), i.e. after the group is scored and before the next is evaluated.
Sharding: the config's mesh holds the Policy state, its optimiser state and the momentum copies
(FSDP by default), born on their shardings; the sampler runs on the same mesh (see
`sampling`), and the update takes its batch as global arrays. On several processes every
process runs this same loop on the same image group: the rollout's text work is small and
identical everywhere, and each jitted program runs once over the whole mesh.
Groups whose rubric did not parse or whose rewards are all equal are masked out of the loss;
an update where no group has signal is skipped (params and optimiser state kept) and counted.
config.rl.reward picks what scores the captions (`reward_source`): the rubric reward above, or
ACE-Cap's G2P reward (mocojax.train.g2p: Gold-MCQ and a text-only judge, no Generator).
"""

import dataclasses
import functools
import json
import logging
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mocojax import checkpoint, config_utils, distributed, losses, model, momentum, sampling, sharding
from mocojax import metrics as metrics_lib
from mocojax.data import pipeline, toyroles
from mocojax.data import toyworld as tw
from mocojax.model.rope import pad_vision_metadata
from mocojax.train import rl_config, rollout as rollout_lib
from mocojax.train import state as state_lib


def _pad_prompt(prompt, length, patches, row_len):
    """Returns a sampling.Prompt left-padded to `length` tokens and `patches` image patches
    (vision attention packed in rows of `row_len` slots, so micro-batches stack)."""
    extra = length - prompt.input_ids.shape[1]
    left = lambda x, axis: np.pad(x, [(extra, 0) if a == axis else (0, 0) for a in range(x.ndim)])
    pixel_values = np.pad(prompt.pixel_values,
                          ((0, patches - prompt.pixel_values.shape[0]), (0, 0)))
    return dataclasses.replace(
        prompt, input_ids=left(prompt.input_ids, 1), attention_mask=left(prompt.attention_mask, 1),
        positions=left(prompt.positions, 2), pixel_values=pixel_values,
        vision=pad_vision_metadata(prompt.vision, patches, row_len))


def train_batch(cfg, rollout, rl):
    """Returns the GRPO batch of a Rollout, stacked on a leading micro-batch axis [A] (numpy).

    Micro-batch a holds G / A whole groups: "prompt" a sampling.Prompt of their images and
    Policy prompts (each encoded once for its N captions), and for their b = G / A * N
    captions of T tokens: "completion", "old_logprobs", "mask" [A, b, T] and "advantages"
    [A, b]. "weight" [A] makes sum_a weight_a * loss_a the loss of the whole batch.
    """
    prompt = rollout.prompt
    num_groups, num_new = len(rollout.ids), rollout.tokens.shape[1]
    per_micro = num_groups // rl.grad_accum_steps
    grid = np.asarray(prompt["image_grid_thw"]).reshape(-1, 3)
    if grid.shape[0] != num_groups:
        raise ValueError(f"expected one image per Policy prompt, got {grid.shape[0]} for "
                         f"{num_groups} prompts")
    patch_start = np.concatenate([[0], np.cumsum(grid.prod(-1))])
    prompts = []
    for a in range(rl.grad_accum_steps):
        g0, g1 = a * per_micro, (a + 1) * per_micro
        prompts.append(sampling.prepare_prompt(
            cfg, prompt["input_ids"][g0:g1], prompt["attention_mask"][g0:g1],
            prompt["pixel_values"][patch_start[g0]:patch_start[g1]], grid[g0:g1],
            reserve=num_new))
    length = max(p.input_ids.shape[1] for p in prompts)
    patches = max(p.pixel_values.shape[0] for p in prompts)
    row_len = max(p.vision.row_len for p in prompts)
    prompts = [_pad_prompt(p, length, patches, row_len) for p in prompts]

    signal = np.repeat(rollout.has_signal, rl.num_samples)  # [G*N]
    mask = rollout.completion_mask * signal[:, None]
    advantages = np.asarray(losses.grpo_advantages(rollout.rewards, rl.adv_eps)).reshape(-1)
    rows = (rl.grad_accum_steps, -1)
    batch = {
        "prompt": jax.tree.map(lambda *xs: np.stack(xs), *prompts),
        "completion": rollout.tokens.astype(np.int32).reshape(*rows, num_new),
        "old_logprobs": rollout.logprobs.reshape(*rows, num_new),
        "mask": mask.reshape(*rows, num_new),
        "advantages": (advantages * signal).astype(np.float32).reshape(rows),
    }
    batch["weight"] = micro_weights(batch["mask"], rl.aggregation)
    return batch


def place_batch(mesh, batch):
    """Returns a `train_batch` batch as global arrays on `mesh`: rows (dim 1, after the micro-batch
    axis) over the data axes where they divide, else replicated; weights and patches replicated."""
    out = {k: distributed.global_from_full(
        v, sharding.batch_sharding(mesh, v.shape, None if k == "weight" else 1, strict=False))
        for k, v in batch.items() if k != "prompt"}
    out["prompt"] = sampling.place_prompt(mesh, batch["prompt"], stacked=True)
    return out


def micro_weights(mask, aggregation):
    """Returns float32 [A]: micro-batch weights so sum_a w_a loss_a is the full batch's loss.

    mask [A, b, T]. GRPO's mean over sequences weighs a micro-batch by its sequences with a
    valid token, DAPO's token mean by its tokens, Dr. GRPO's constant normaliser by 1 / A.
    """
    if aggregation == "seq_mean_token_mean":
        counts = (mask.sum(-1) > 0).sum(-1)
    elif aggregation == "token_mean":
        counts = mask.sum((1, 2))
    else:
        counts = np.ones(mask.shape[0]) * (mask.sum() > 0)
    return (counts / max(counts.sum(), 1)).astype(np.float32)


def completion_logprobs(cfg, params, micro, num_samples):
    """Returns log pi(caption token) float32 [b, T] of one micro-batch (0 at padding)."""
    return sampling.completion_logprobs(cfg, params, micro["prompt"], micro["completion"],
                                        micro["mask"] > 0, num_samples=num_samples)


_METRIC_KEYS = ("pg_loss", "clip_frac_low", "clip_frac_high", "ratio_mean")


def grpo_step(cfg, optimizer, loss_kwargs, num_samples, state, batch, ref_params=None):
    """Returns (new train state, metrics) after one GRPO update of the Policy params.

    state: {"params", "opt_state", "step", "rng"}; batch from `train_batch`. Gradients are
    summed over the [A] micro-batches with their weights; with no valid row at all the update
    is skipped. ref_params (the initial Policy) feed the k3 KL when kl_beta > 0.
    """
    params = state["params"]
    keys = _METRIC_KEYS + (("kl",) if ref_params is not None else ())

    def micro_loss(p, micro):
        logprobs = completion_logprobs(cfg, p, micro, num_samples)
        ref = None
        if ref_params is not None:
            ref = jax.lax.stop_gradient(completion_logprobs(cfg, ref_params, micro, num_samples))
        loss, metrics = losses.grpo_loss(logprobs, micro["old_logprobs"], micro["advantages"],
                                         micro["mask"], ref_logprobs=ref, **loss_kwargs)
        return loss * micro["weight"], metrics

    def accumulate(carry, micro):
        grads_sum, loss_sum, metric_sums = carry
        (loss, metrics), grads = jax.value_and_grad(micro_loss, has_aux=True)(params, micro)
        metric_sums = {k: metric_sums[k] + micro["weight"] * metrics[k] for k in keys}
        return (jax.tree.map(jnp.add, grads_sum, grads), loss_sum + loss, metric_sums), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    init = (zeros, jnp.zeros((), jnp.float32), {k: jnp.zeros((), jnp.float32) for k in keys})
    (grads, loss, metric_sums), _ = jax.lax.scan(accumulate, init, batch)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    updated, update_metrics = state_lib.apply_gradients(state, grads, optimizer, loss)
    has_signal = jnp.sum(batch["weight"]) > 0
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(has_signal, a, b), new, old)
    new_state = dict(updated, params=keep(updated["params"], params),
                     opt_state=keep(updated["opt_state"], state["opt_state"]))
    metrics = {"loss": loss, **metric_sums, **update_metrics,
               "no_signal_skipped": 1 - has_signal.astype(jnp.int32),
               "update_norm": momentum.tree_distance(new_state["params"], params)}
    return new_state, metrics


def make_grpo_step(cfg, optimizer, rl, state_shardings=None, mesh=None):
    """Returns the jitted GRPO step (train state donated); with state_shardings (and its mesh)
    the new state keeps them and the metrics come back replicated."""
    loss_kwargs = dict(clip_eps=rl.clip_eps, clip_eps_high=rl.clip_eps_high,
                       kl_beta=rl.kl_beta, aggregation=rl.aggregation)
    out_shardings = None if state_shardings is None else (state_shardings, sharding.replicated(mesh))
    return jax.jit(functools.partial(grpo_step, cfg, optimizer, loss_kwargs, rl.num_samples),
                   donate_argnums=(0,), out_shardings=out_shardings)


def momentum_schedule(rl):
    """Returns the MomentumSchedule of the config: constant m or BYOL's cosine ramp to 1."""
    m = rl.momentum
    if rl.momentum_schedule == "byol_cosine":
        m = momentum.byol_cosine(rl.momentum, 1.0, max(rl.num_steps // rl.sync_every, 1))
    return momentum.MomentumSchedule(m, every=rl.sync_every)


def sync(role_momentum, schedule, momentum_copies, params, step, policy_displacement):
    """Returns (momentum after Policy update `step`, diagnostics dict) at a sync boundary.

    Diagnostics (METHOD.md): tracking_error e_s = ||theta_s - phi_s||, momentum_update
    u_s = ||phi_s - phi_{s-1}|| = (1 - m) ||theta_s - phi_{s-1}|| (phi_{s-1} is donated, so
    the distance is taken before the update), policy_displacement Delta_s as given by the caller.
    """
    diagnostics = {}
    if "frozen" in momentum_copies:
        diagnostics["tracking_error_frozen"] = momentum.tree_distance(params,
                                                                       momentum_copies["frozen"])
    if "ema" not in momentum_copies or not schedule.is_sync(step):
        return momentum_copies, diagnostics
    m = schedule.m_at(step)
    before = momentum.tree_distance(params, momentum_copies["ema"])
    momentum_copies, _ = role_momentum.update(momentum_copies, params, schedule, step)
    diagnostics.update(m=m, momentum_update=(1.0 - m) * before,
                       tracking_error=momentum.tree_distance(params, momentum_copies["ema"]),
                       policy_displacement=policy_displacement)
    return momentum_copies, diagnostics


def samples_metrics(samples):
    """Returns the per-step scalars of any rollout (rollout.PolicySamples): rewards, signal, sizes."""
    return {
        "reward_mean": float(samples.rewards.mean()),
        "reward_std": float(samples.rewards.std()),
        "reward_group_std": float(samples.rewards.std(-1).mean()),
        "zero_variance_frac": float(samples.zero_variance.mean()),
        "signal_frac": float(samples.has_signal.mean()),
        "caption_tokens": float(samples.lengths.mean()),
        "caption_truncated_frac": float((samples.lengths >= samples.tokens.shape[1]).mean()),
    }


def rollout_metrics(rollout):
    """Returns the per-step scalars of a rubric Rollout: rewards, signal, parse problems, sizes."""
    return {
        **samples_metrics(rollout),
        "rubric_failed_frac": float(1.0 - rollout.rubric_ok.mean()),
        "generator_problems": float(np.mean([len(p) for p in rollout.generator_problems])),
        "judge_problems": float(rollout.judge_problems[rollout.rubric_ok].mean())
        if rollout.rubric_ok.any() else 0.0,
        "rubric_items": float(np.mean([len(r) for r in rollout.rubrics])),
    }


def toy_truth(scene, rollout, g):
    """Returns the exact toy-world truth of group g: per-caption F1 and hallucinations, per-item
    rubric truth (None: not in the world's language) and per-caption, per-item Judge correctness."""
    metrics = [tw.caption_metrics(scene, caption) for caption in rollout.captions[g]]
    facts = [toyroles.parse_criterion(item.criterion) for item in rollout.rubrics[g]]
    item_true = [None if f is None else toyroles.fact_is_true(scene, f) for f in facts]
    decision_right = []
    for caption, values in zip(rollout.captions[g], rollout.decisions[g]):
        mentions, background = tw.parse_caption(caption)
        decision_right.append([None if f is None else
                               int(toyroles.judge_fact(f, mentions, background).value == v)
                               for f, v in zip(facts, values)])
    return {"f1": [m["f1"] for m in metrics],
            "hallucinated": [len(m["hallucinated"]) for m in metrics],
            "item_true": item_true, "decision_right": decision_right}


def truth_metrics(truths, rewards):
    """Returns the step's toy-world truth scalars from toy_truth dicts of its groups; rewards [G, N].
    Only "f1" and "hallucinated" are needed: a reward without rubrics (G2P) gives no "item_true"
    or "decision_right"."""
    f1 = [v for t in truths for v in t["f1"]]
    items = [v for t in truths for v in t.get("item_true", [])]
    decisions = [v for t in truths for row in t.get("decision_right", []) for v in row if v is not None]
    out = {"true/caption_f1": float(np.mean(f1)),
           "true/hallucinated_per_caption": float(np.mean([v for t in truths
                                                           for v in t["hallucinated"]]))}
    if items:
        out["true/rubric_item_truth"] = float(np.mean([bool(v) for v in items]))
        out["true/rubric_item_unreadable"] = float(np.mean([v is None for v in items]))
    if decisions:
        out["true/judge_accuracy"] = float(np.mean(decisions))
    # Does the rubric reward rank captions as the truth does? Pearson r over this step's captions,
    # and (what GRPO uses: ranks within a group) the mean r within groups where both vary.
    if np.std(f1) > 0 and np.std(rewards) > 0:
        out["true/reward_f1_corr"] = float(np.corrcoef(np.ravel(rewards), f1)[0, 1])
    within = within_group_corr(rewards, [t["f1"] for t in truths])
    if within is not None:
        out["true/reward_f1_corr_within"] = within
    return out


def within_group_corr(rewards, f1):
    """Returns the mean over groups of Pearson r(reward, true F1) within the group, or None.

    rewards, f1 [G, N]. Groups where either side is constant carry no ranking and are left out.
    """
    rs = [np.corrcoef(r, f)[0, 1] for r, f in zip(np.asarray(rewards, np.float64), np.asarray(f1, np.float64))
          if np.std(r) > 0 and np.std(f) > 0]
    return float(np.mean(rs)) if rs else None


def sample_rows(step, rollout, truths):
    """Returns the JSON rows of one step's groups for <workdir>/rl_samples.jsonl."""
    rows = []
    for g, image_id in enumerate(rollout.ids):
        row = {"step": step, "image_id": image_id, "captions": rollout.captions[g],
               "subset": rollout.subsets[g].tolist(), "rubric_text": rollout.rubric_texts[g],
               "rubric": [item._asdict() for item in rollout.rubrics[g]],
               "generator_problems": rollout.generator_problems[g],
               "decisions": rollout.decisions[g], "rewards": rollout.rewards[g].tolist(),
               "has_signal": bool(rollout.has_signal[g])}
        if truths:
            row["truth"] = truths[g]
        rows.append(row)
    return rows


class RubricSource:
    """The method's reward: online rubrics from the Generator, decisions from the Judge
    (rollout.collect), logged with their toy-world truth."""

    roles = ("generator", "judge")

    def __init__(self, scenes):
        self.scenes = scenes  # {image id: Scene} on the toy world, else empty

    def collect(self, *args, **kwargs):
        """Returns (Rollout, seconds per phase): rollout.collect."""
        return rollout_lib.collect(*args, **kwargs)

    def logs(self, rollout):
        """Returns (the step's scalars, the per-group toy truths or [])."""
        truths = [toy_truth(self.scenes[image_id], rollout, g) for g, image_id in enumerate(rollout.ids)
                  if self.scenes]
        return {**rollout_metrics(rollout), **(truth_metrics(truths, rollout.rewards) if truths else {})}, truths

    def sample_rows(self, step, rollout, truths):
        """Returns the step's rows for <workdir>/rl_samples.jsonl."""
        return sample_rows(step, rollout, truths)


def reward_source(config, records):
    """Returns what collects, scores and logs the Policy's captions, per config.rl.reward: the
    rubric reward (RubricSource) or ACE-Cap's G2P reward (mocojax.train.g2p.G2PSource)."""
    if config.rl.reward == "g2p":
        from mocojax.train import g2p
        return g2p.G2PSource(config, records)
    return RubricSource({r["id"]: r["scene"] for r in records if "scene" in r})


def rl_records(config):
    """Returns the RL image records {id, references, scene or image path} of the config's data."""
    data = config.data
    if data.source == "toyworld":
        return toyroles.image_records(data.seed, config.rl.num_scenes or data.num_train_scenes)
    return config_utils.user_records(config, data.train_path)


def initial_policy(config, workdir, setup, mesh):
    """Returns theta_0 on its shardings: the latest SFT checkpoint of this workdir, else the
    config's initial params."""
    cfg = setup.model_config
    if checkpoint.latest_step(workdir, "sft") is not None:
        return checkpoint.restore_params(workdir, "sft", cfg,
                                         shardings=sharding.param_shardings(cfg, mesh))[0]
    logging.warning("no SFT checkpoint in %s: RL starts from the config's initial params", workdir)
    return setup.load_params(place=sharding.placer(cfg, mesh))


def rl_optimizer(config):
    """Returns the Policy's optax optimiser: config.optimizer's AdamW with the rl schedule."""
    opt = ml_collections.ConfigDict(config.optimizer.to_dict())
    opt.lr, opt.warmup_ratio, opt.end_lr_ratio = (config.rl.lr, config.rl.warmup_ratio,
                                                  config.rl.end_lr_ratio)
    return state_lib.make_optimizer(opt, config.rl.num_steps)


def _evaluate(config, setup, params, cfg):
    """Returns held-out toy-world caption metrics of the Policy params, prefixed "eval/"."""
    from mocojax.eval import toyworld_eval

    result = toyworld_eval.evaluate(
        cfg, params, setup.processor, seed=config.data.seed,
        start=config.data.num_train_scenes, num_scenes=config.eval.num_scenes,
        batch_size=config.eval.batch_size, max_new_tokens=config.eval.max_new_tokens,
        image_size=config.data.image_size)
    return {f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float))}


def judge_gate(config, setup, judge_params, cfg):
    """Scores the Judge that RL starts with on held-out RL-like toy captions; returns
    {"gate/judge_balanced_accuracy_within_kind", ...}. Below config.rl.judge_gate it warns loudly, or
    raises when config.rl.judge_gate_refuse is set: a Judge that cannot tell a caption that
    meets an item from one that does not gives rewards without signal about quality."""
    from mocojax.eval import toyworld_eval

    rl = config.rl
    gate = toyworld_eval.judge_gate(cfg, judge_params, setup.processor, seed=config.data.seed,
                                    start=config.data.num_train_scenes, num_scenes=rl.judge_gate_scenes,
                                    batch_size=config.eval.batch_size, max_new_tokens=rl.judge_max_new_tokens)
    # Within each item kind: a Judge that only learned each kind's usual answer scores 0.5.
    score = gate["balanced_accuracy_within_kind"]
    message = (f"the Judge's balanced accuracy within item kinds on held-out RL-like captions is "
               f"{score:.3f} (pooled {gate['balanced_accuracy']:.3f}, accuracy {gate['accuracy']:.3f}; "
               f"an always-1 Judge: accuracy {gate['accuracy_always_1']:.3f}, balanced 0.5), "
               f"threshold config.rl.judge_gate={rl.judge_gate}")
    if score < rl.judge_gate:
        if rl.judge_gate_refuse:
            raise RuntimeError(f"RL refused: {message}. Train the roles longer (config.sft.num_steps) "
                               "or set config.rl.judge_gate_refuse=False to run anyway.")
        logging.warning("!" * 80)
        logging.warning("JUDGE GATE FAILED: %s. Rewards will carry little signal about caption quality.", message)
        logging.warning("!" * 80)
    else:
        logging.info("judge gate passed: %s", message)
    return {f"gate/judge_{k}": v for k, v in gate.items()}


def run_rl(config, workdir):
    """Runs (or resumes) Stage II as config.rl says; returns the final step's metrics."""
    rl = config.rl
    rl_config.validate(rl)
    setup = config_utils.build_setup(config, workdir)
    mesh = sharding.make_mesh(config.mesh or None)
    cfg, processor = sharding.model_config(setup.model_config, mesh), setup.processor
    records = rl_records(config)
    scenes = {r["id"]: r["scene"] for r in records if "scene" in r}
    source = reward_source(config, records)
    optimizer = rl_optimizer(config)
    exact_roles = [role for role in ("generator", "judge") if rl[role] == "exact"]
    if exact_roles and config.data.source != "toyworld":
        raise ValueError(f"config.rl.{exact_roles[0]}='exact': exact roles exist for the toy world only")
    exact = toyroles.ExactRoles(scenes) if exact_roles else None
    # An exact role, or one the reward does not use, needs no parameters: it keeps no copy
    # ("policy" keeps none).
    role_momentum = momentum.RoleMomentum(*("policy" if rl[role] == "exact" or role not in source.roles
                                            else rl[role] for role in ("generator", "judge")))
    schedule = momentum_schedule(rl)
    data_iter = iter(pipeline.rl_dataset(records, global_batch_size=rl.images_per_step,
                                         seed=config.data.seed + 1,
                                         image_size=config.data.image_size))
    manager = checkpoint.Manager(workdir, "rl", keep=rl.keep_checkpoints)

    state_shardings = sharding.train_state_shardings(cfg, mesh, optimizer, with_momentum=False)
    params_shardings = state_shardings["params"]
    copies_shardings = {name: params_shardings for name in role_momentum.copies}

    def init(policy, roles_params, rng):
        return {**state_lib.init_state(policy, optimizer, rng),
                "momentum": role_momentum.init(roles_params)}

    abstract_params = model.abstract_params(cfg)
    abstract = jax.eval_shape(init, abstract_params, abstract_params, jax.random.key(0))
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract,
                            {**state_shardings, "momentum": copies_shardings})
    restored = manager.restore_latest(abstract)
    policy_0 = initial_policy(config, workdir, setup, mesh)
    if restored is None:
        roles_0 = (checkpoint.restore_params(rl.roles_init, "sft", cfg, shardings=params_shardings)[0]
                   if rl.roles_init else policy_0)
        # Born on their shardings; the state's params are a copy, policy_0 stays the KL reference.
        state, _ = sharding.init_train_state(cfg, mesh, optimizer, jax.random.key(config.seed + 1),
                                             params=policy_0, with_momentum=False)
        state["momentum"] = jax.jit(role_momentum.init, out_shardings=copies_shardings)(roles_0)
        extra = {"no_signal_skipped": 0}
    else:
        state, extra = restored
        data_iter.set_state(extra["data"])
        logging.info("resumed RL from step %d", int(state["step"]))
    ref_params = policy_0 if rl.kl_beta > 0 else None
    start = int(state["step"])
    step_fn = make_grpo_step(cfg, optimizer, rl, state_shardings, mesh)
    writer = metrics_lib.MetricWriter(workdir, "rl", total_steps=rl.num_steps, initial_step=start)
    guard = state_lib.SkipGuard(rl.max_skipped_steps, "rl", "rl.max_skipped_steps")
    is_toy = config.data.source == "toyworld"
    if is_toy and start == 0 and rl.judge != "exact" and rl.reward == "rubric":
        judge_params = role_momentum.params_for("judge", state["momentum"], state["params"])
        gate = judge_gate(config, setup, judge_params, cfg)
        writer.write(0, {**gate, **(_evaluate(config, setup, state["params"], cfg) if rl.eval_every else {})})
    # Delta_s = ||theta_s - theta_{s-1}|| between syncs; with H = 1 it is the update's norm.
    theta_at_sync = jax.tree.map(jnp.copy, state["params"]) if rl.sync_every > 1 else None
    samples_path = os.path.join(workdir, "rl_samples.jsonl")
    if jax.process_index() == 0:  # a resumed run writes the samples of the replayed steps again
        metrics_lib.truncate_jsonl(samples_path, lambda row: row.get("step", 0) <= start)
    skipped = extra["no_signal_skipped"]
    last = {}
    for step in range(start + 1, rl.num_steps + 1):
        t0 = time.perf_counter()
        group = next(data_iter)
        copies = state.pop("momentum")
        rollout, seconds = source.collect(
            cfg, state["params"], role_momentum.params_for("generator", copies, state["params"]),
            role_momentum.params_for("judge", copies, state["params"]), processor, group, rl,
            seed=config.seed, step=step, rng=jax.random.fold_in(state["rng"], step), exact=exact)
        t1 = time.perf_counter()
        batch = place_batch(mesh, train_batch(cfg, rollout, rl))
        state, step_metrics = step_fn(state, batch, ref_params)
        step_metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
        t2 = time.perf_counter()
        seconds["update"] = t2 - t1
        displacement = step_metrics["update_norm"]
        if theta_at_sync is not None and schedule.is_sync(step):
            displacement = momentum.tree_distance(state["params"], theta_at_sync)
            theta_at_sync = jax.tree.map(jnp.copy, state["params"])
        copies, diagnostics = sync(role_momentum, schedule, copies, state["params"], step,
                                   displacement)
        state["momentum"] = copies
        seconds["sync"] = time.perf_counter() - t2
        skipped += int(step_metrics["no_signal_skipped"])
        source_metrics, truths = source.logs(rollout)
        last = {**source_metrics, **step_metrics, **{k: float(v) for k, v in diagnostics.items()},
                **{f"time/{k}_s": v for k, v in seconds.items()},
                "time/step_s": time.perf_counter() - t0, "no_signal_skipped_total": skipped,
                "lr": float(state_lib.learning_rate_schedule(
                    rl.lr, rl.num_steps, rl.warmup_ratio, rl.end_lr_ratio)(step - 1))}
        if is_toy and rl.eval_every and (step % rl.eval_every == 0 or step == rl.num_steps):
            last.update(_evaluate(config, setup, state["params"], cfg))
        writer.write(step, last, tokens=int(rollout.lengths.sum()))
        guard.update(int(step_metrics["skipped"]), step, cleanup=(manager.close, writer.close))
        if step % rl.log_samples_every == 0 and jax.process_index() == 0:
            with open(samples_path, "a") as f:
                for row in source.sample_rows(step, rollout, truths):
                    f.write(json.dumps(row) + "\n")
        if step % rl.checkpoint_every == 0 or step == rl.num_steps:
            manager.save(step, state, {"data": data_iter.get_state(), "no_signal_skipped": skipped})
    manager.close()
    writer.close()
    return last
