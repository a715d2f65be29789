"""Stage II: Policy RL with online rubrics and momentum transfer (docs/method.md), end to end.

`run_rl` reads as the paper's update, one iteration per Policy update t:
  rollout     the Policy theta_t samples N captions per image; the Generator and the Judge,
              played by the momentum params phi_t (per `RoleMomentum`), write one rubric per
              image and score all N captions into rewards (`rollout.collect`, host side);
  advantages  group-normalised rewards (`advantages`), zero for groups without signal;
  update      GRPO on the Policy only: `grpo_step` is a pure jitted function of the train state
              {"params", "opt_state", "step", "rng"} and the batch, built on the trainer core
              (`step.accumulate` over micro-batches, `step.update`). The momentum is not an
              input of it, so it gets no gradient by construction;
  sync        after every H updates: phi <- m phi + (1 - m) theta (`momentum.sync`, donating
              phi), i.e. after the group is scored and before the next is evaluated;
  log         metrics, the toy world's exact truth (`rl_evals` hooks), samples, checkpoints.
Sharding: the config's mesh holds the Policy state, its optimiser state and the momentum copies
(FSDP by default), born on their shardings; the sampler runs on the same mesh (see
`sampling`), and the update takes its batch as global arrays. On several processes every
process runs this same loop on the same image group: the rollout's text work is small and
identical everywhere, and each jitted program runs once over the whole mesh.
Whether a group has signal is decided once, by `Rollout.has_signal` (its rubric parsed and its
rewards are not all equal); groups without it are masked out of the loss, and an update where
no group has signal is skipped (params and optimiser state kept) and counted.
config.rl.reward picks what scores the captions (`reward_source`): the rubric reward above, or
ACE-Cap's G2P reward (mocojax.train.g2p: Gold-MCQ and a text-only judge, no Generator), or
(toy world) each caption's exact F1, the ceiling of any caption reward (TrueF1Source).
"""

import dataclasses
import json
import logging
import os
import time

import jax
import numpy as np

from mocojax import (
    checkpoint,
    config_utils,
    metrics as metrics_lib,
    momentum,
    sharding,
)
from mocojax.data import pipeline, records as records_lib, toyroles, toyworld as tw
from mocojax.train import (
    rl_config,
    rl_evals,
    rollout as rollout_lib,
    state as state_lib,
    step as step_lib,
)

# Split out (move only, #14); re-exported so `rl.<name>` keeps working. run_rl calls them by their
# names here, so a test's monkeypatch of rl.train_batch / rl.make_grpo_step reaches the loop.
from mocojax.train.rl_update import (  # noqa: F401
    _METRIC_KEYS,
    BATCH_DIMS,
    _pad_prompt,
    advantages,
    completion_logprobs,
    grpo_step,
    make_grpo_step,
    micro_weights,
    place_batch,
    train_batch,
)


def momentum_schedule(rl):
    """Returns the MomentumSchedule of the config: constant m or BYOL's cosine ramp to 1."""
    m = rl.momentum
    if rl.momentum_schedule == "byol_cosine":
        m = momentum.byol_cosine(rl.momentum, 1.0, max(rl.num_steps // rl.sync_every, 1))
    return momentum.MomentumSchedule(m, every=rl.sync_every)


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
        if rollout.rubric_ok.any()
        else 0.0,
        "rubric_items": float(np.mean([len(r) for r in rollout.rubrics])),
        **(
            {"rubric_checked_out": float(np.mean([len(d) for d in rollout.checked_out]))}
            if rollout.checked_out is not None
            else {}
        ),
    }


def sample_rows(step, rollout, truths):
    """Returns the JSON rows of one step's groups for <workdir>/rl_samples.jsonl."""
    rows = []
    for g, image_id in enumerate(rollout.ids):
        row = {
            "step": step,
            "image_id": image_id,
            "captions": rollout.captions[g],
            "subset": rollout.subsets[g].tolist(),
            "rubric_text": rollout.rubric_texts[g],
            "rubric": [item._asdict() for item in rollout.rubrics[g]],
            **(
                {"checked_out": [item._asdict() for item in rollout.checked_out[g]]}
                if rollout.checked_out is not None
                else {}
            ),
            "generator_problems": rollout.generator_problems[g],
            "decisions": rollout.decisions[g],
            "rewards": rollout.rewards[g].tolist(),
            "has_signal": bool(rollout.has_signal[g]),
        }
        if truths:
            row["truth"] = truths[g]
        rows.append(row)
    return rows


class SamplesFile:
    """<workdir>/rl_samples.jsonl, written by process 0: one row per group of the steps logged."""

    def __init__(self, workdir, start):
        self.path = os.path.join(workdir, "rl_samples.jsonl")
        self.main = jax.process_index() == 0
        if self.main:  # a resumed run writes the samples of the replayed steps again
            metrics_lib.truncate_jsonl(self.path, lambda row: row.get("step", 0) <= start)

    def write(self, rows):
        """Appends the rows of one step's groups (the reward source's `sample_rows`)."""
        if self.main:
            with open(self.path, "a") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")


class RubricSource:
    """The method's reward: online rubrics from the Generator, decisions from the Judge
    (rollout.collect), logged with their toy-world truth (rl_evals)."""

    roles = ("generator", "judge")

    def __init__(self, scenes, judge_per_item=False):
        # judge_per_item: False, or the per-item form (roles.JUDGE_ITEM_FORMS; True: "rubric")
        self.scenes = scenes  # {image id: Scene} on the toy world, else empty
        # the Judge is asked once per rubric item, as config.data.judge_per_item trained it
        self.judge_per_item = judge_per_item

    def collect(self, *args, **kwargs):
        """Returns (Rollout, seconds per phase): rollout.collect."""
        return rollout_lib.collect(*args, judge_per_item=self.judge_per_item, **kwargs)

    def logs(self, rollout):
        """Returns (the step's scalars, the per-group toy truths or [])."""
        truths = [
            rl_evals.toy_truth(self.scenes[image_id], rollout, g)
            for g, image_id in enumerate(rollout.ids)
            if self.scenes
        ]
        return {
            **rollout_metrics(rollout),
            **(rl_evals.truth_metrics(truths, rollout.rewards) if truths else {}),
        }, truths

    def sample_rows(self, step, rollout, truths):
        """Returns the step's rows for <workdir>/rl_samples.jsonl."""
        return sample_rows(step, rollout, truths)


class TrueF1Source(RubricSource):
    """config.rl.reward = "true_f1" (toy world): the exact roles' rollout, each caption rewarded
    with its exact fact-level F1 against the scene instead of the rubric reward -- the ceiling
    of any caption reward, which says whether GRPO raises held-out F1 when the reward is the
    metric itself. The rubric and its decisions are still logged. hallucination_charge
    (config.rl.hallucination_charge) is subtracted per hallucinated object: F1 alone pays for a
    mention that is right more than ~30% of the time, so its optimum mentions more objects and
    hallucinates more (docs/results.md, session 10)."""

    def __init__(self, scenes, hallucination_charge=0.0):
        super().__init__(scenes)
        self.hallucination_charge = hallucination_charge

    def reward(self, scene, caption):
        """Returns the caption's F1 minus the charge per hallucinated object."""
        metrics = tw.caption_metrics(scene, caption)
        return metrics["f1"] - self.hallucination_charge * len(metrics["hallucinated"])

    def collect(self, *args, **kwargs):
        """Returns (Rollout with F1 rewards, seconds per phase)."""
        rollout, seconds = super().collect(*args, **kwargs)
        rewards = [
            [self.reward(self.scenes[image_id], c) for c in captions]
            for image_id, captions in zip(rollout.ids, rollout.captions)
        ]
        return dataclasses.replace(rollout, rewards=np.asarray(rewards, np.float32)), seconds


def reward_source(config, records, initial_policy=None):
    """Returns what collects, scores and logs the Policy's captions, per config.rl.reward: the
    rubric reward (RubricSource; with config.rl.rubrics "offline" / "committee" one fixed rubric
    per image, mocojax.train.offline_rubrics, whose student captions come from theta_0 =
    initial_policy(); with config.rl.train_generator EvoLM's alternating Policy / Generator
    updates, mocojax.train.evolm) or ACE-Cap's G2P reward (mocojax.train.g2p.G2PSource)."""
    if config.rl.reward == "g2p":
        from mocojax.train import g2p

        return g2p.G2PSource(config, records)
    if config.rl.train_generator:
        from mocojax.train import evolm

        return evolm.AlternatingSource(config, records)
    if config.rl.rubrics != "online":
        from mocojax.train import offline_rubrics

        return offline_rubrics.OfflineRubricSource(config, records, initial_policy)
    scenes = {r["id"]: r["scene"] for r in records if "scene" in r}
    if config.rl.reward == "true_f1":
        if len(scenes) != len(records):
            raise ValueError("config.rl.reward='true_f1' needs toy-world scenes (data.source)")
        return TrueF1Source(scenes, config.rl.hallucination_charge)
    return RubricSource(scenes, records_lib.judge_item_form(config.data))


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
        return checkpoint.restore_params(
            workdir, "sft", cfg, shardings=sharding.param_shardings(cfg, mesh)
        )[0]
    logging.warning("no SFT checkpoint in %s: RL starts from the config's initial params", workdir)
    return setup.load_params(place=sharding.placer(cfg, mesh))


def rl_optimizer(config):
    """Returns the Policy's optax optimiser: config.optimizer's AdamW with the rl schedule."""
    return state_lib.stage_optimizer(config.optimizer, config.rl)


def role_momentum_of(rl, source):
    """Returns the RoleMomentum of the config: which parameters play the Generator and the Judge.
    An exact role (toy world), or one the reward source does not use, needs no parameters and
    keeps no copy, as "policy" keeps none."""
    return momentum.RoleMomentum(
        *(
            "policy" if rl[role] == "exact" or role not in source.roles else rl[role]
            for role in ("generator", "judge")
        )
    )


def exact_roles(config, scenes):
    """Returns the toy world's ExactRoles when config.rl plays a role "exact", else None."""
    exact = [role for role in ("generator", "judge") if config.rl[role] == "exact"]
    if exact and config.data.source != "toyworld":
        raise ValueError(f"config.rl.{exact[0]}='exact': exact roles exist for the toy world only")
    if not exact:
        return None
    return toyroles.ExactRoles(
        scenes, invention_weight=config.rl.invention_weight, **toyroles.rubric_options(config.data)
    )


def rl_state(config, workdir, setup, cfg, mesh, optimizer, role_momentum, manager):
    """Returns (train state with "momentum", checkpoint extra or None, ref_params, state shardings).

    The latest RL checkpoint restored onto the state's shardings, else a fresh state: the Policy
    from theta_0 (`initial_policy`), the momentum copies from theta_0 or config.rl.roles_init,
    all born on their shardings. ref_params is theta_0, the KL reference, loaded only when
    rl.kl_beta > 0 (None otherwise).
    """
    rl = config.rl
    state_shardings = sharding.train_state_shardings(cfg, mesh, optimizer, with_momentum=False)
    params_shardings = state_shardings["params"]
    copies_shardings = {name: params_shardings for name in role_momentum.copies}
    policy_0 = initial_policy(config, workdir, setup, mesh) if rl.kl_beta > 0 else None

    def init():
        policy = policy_0 if policy_0 is not None else initial_policy(config, workdir, setup, mesh)
        roles_0 = (
            checkpoint.restore_params(rl.roles_init, "sft", cfg, shardings=params_shardings)[0]
            if rl.roles_init
            else policy
        )
        # Born on their shardings; the state's params are a copy, policy_0 stays the KL reference.
        state, _ = sharding.init_train_state(
            cfg,
            mesh,
            optimizer,
            jax.random.key(config.seed + 1),
            params=policy,
            with_momentum=False,
        )
        state["momentum"] = jax.jit(role_momentum.init, out_shardings=copies_shardings)(roles_0)
        return state

    abstract = step_lib.abstract_state(
        cfg,
        optimizer,
        {**state_shardings, "momentum": copies_shardings},
        extra=lambda params: {"momentum": role_momentum.init(params)},
    )
    state, extra = step_lib.restore_or_init(manager, abstract, init)
    return state, extra, policy_0, state_shardings


def run_rl(config, workdir):
    """Runs (or resumes) Stage II as config.rl says; returns the final step's metrics.

    Per update: rollout (sample, rubric, judge, reward) -> advantages -> GRPO update -> momentum
    sync -> log; what scores the captions is the reward source (`reward_source`), the toy world's
    Judge gate and held-out evals are `rl_evals` hooks. Longer than the codebase's ~60-line norm
    on purpose: set-up then one loop whose body is the paper's update in order, one named call
    per stage; splitting it would hide that order behind a helper.
    """
    rl = config.rl
    rl_config.validate(rl)
    setup = config_utils.build_setup(config, workdir)
    mesh = sharding.make_mesh(config.mesh or None)
    cfg, processor = sharding.model_config(setup.model_config, mesh), setup.processor
    records = rl_records(config)
    scenes = {r["id"]: r["scene"] for r in records if "scene" in r}
    exact = exact_roles(config, scenes)
    source = reward_source(
        config, records, initial_policy=lambda: initial_policy(config, workdir, setup, mesh)
    )
    evals = rl_evals.make(config, processor, cfg)
    optimizer = rl_optimizer(config)
    role_momentum, schedule = role_momentum_of(rl, source), momentum_schedule(rl)
    data_iter = iter(
        pipeline.rl_dataset(
            records,
            global_batch_size=rl.images_per_step,
            seed=config.data.seed + 1,
            image_size=config.data.image_size,
        )
    )
    manager = checkpoint.Manager(workdir, "rl", keep=rl.keep_checkpoints)
    state, extra, ref_params, state_shardings = rl_state(
        config, workdir, setup, cfg, mesh, optimizer, role_momentum, manager
    )
    skipped = 0 if extra is None else extra["no_signal_skipped"]
    stopped_at = None if extra is None else extra.get("gaming_stopped_at")
    if stopped_at is not None and rl.get("gaming_stop", False):
        logging.warning(
            "RL stopped at step %d when its reward was gamed (config.rl.gaming_stop); not "
            "resuming. config.rl.gaming_stop=False continues it.",
            stopped_at,
        )
        manager.close()
        return {"gaming_stopped_at": stopped_at}
    if extra is not None:
        data_iter.set_state(extra["data"])
        logging.info("resumed RL from step %d", int(state["step"]))
    start = int(state["step"])
    step_fn = make_grpo_step(cfg, optimizer, rl, state_shardings, mesh)
    writer = metrics_lib.MetricWriter(workdir, "rl", total_steps=rl.num_steps, initial_step=start)
    guard = state_lib.SkipGuard(rl.max_skipped_steps, "rl", "rl.max_skipped_steps")
    lr = state_lib.learning_rate_schedule(rl.lr, rl.num_steps, rl.warmup_ratio, rl.end_lr_ratio)
    if start == 0 and (
        initial := evals.start(
            state["params"], role_momentum.params_for("judge", state["momentum"], state["params"])
        )
    ):
        writer.write(0, initial)
    theta_at_sync = momentum.displacement_reference(state["params"], schedule)
    samples = SamplesFile(workdir, start)
    watch = rl_evals.GamingWatch(rl.get("gaming_window", 0))
    last = {}
    for step in range(start + 1, rl.num_steps + 1):
        t0 = time.perf_counter()
        copies = state.pop("momentum")
        rollout, seconds = source.collect(
            cfg,
            state["params"],
            role_momentum.params_for("generator", copies, state["params"]),
            role_momentum.params_for("judge", copies, state["params"]),
            processor,
            next(data_iter),
            rl,
            seed=config.seed,
            step=step,
            rng=jax.random.fold_in(state["rng"], step),
            exact=exact,
        )
        t1 = time.perf_counter()
        adv = advantages(rollout, rl)
        state, step_metrics = step_fn(
            state, place_batch(mesh, train_batch(cfg, rollout, rl, adv)), ref_params
        )
        step_metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
        t2 = time.perf_counter()
        state["momentum"], diagnostics, theta_at_sync = momentum.sync(
            role_momentum,
            schedule,
            copies,
            state["params"],
            step,
            update_norm=step_metrics["update_norm"],
            theta_at_sync=theta_at_sync,
        )
        seconds.update(update=t2 - t1, sync=time.perf_counter() - t2)
        skipped += int(step_metrics["no_signal_skipped"])
        source_metrics, truths = source.logs(rollout)
        last = {
            **source_metrics,
            **step_metrics,
            **{k: float(v) for k, v in diagnostics.items()},
            **{f"time/{k}_s": v for k, v in seconds.items()},
            "time/step_s": time.perf_counter() - t0,
            "no_signal_skipped_total": skipped,
            "lr": float(lr(step - 1)),
            **evals.after_update(step, state["params"]),
        }
        last.update(watch.update(step, last))
        writer.write(step, last, tokens=int(rollout.lengths.sum()))
        guard.update(int(step_metrics["skipped"]), step, cleanup=(manager.close, writer.close))
        if step % rl.log_samples_every == 0:
            samples.write(source.sample_rows(step, rollout, truths))
        stop = rl.get("gaming_stop", False) and watch.warned_at == step
        if stop or step % rl.checkpoint_every == 0 or step == rl.num_steps:
            extra = {"data": data_iter.get_state(), "no_signal_skipped": skipped}
            manager.save(step, state, {**extra, "gaming_stopped_at": step} if stop else extra)
        if stop:
            logging.warning("RL stopped at step %d (config.rl.gaming_stop); checkpoint kept", step)
            last["gaming_stopped_at"] = step
            break
    manager.close()
    writer.close()
    return last
