"""ACE-Cap's evidence loop trained with LOOP-GRPO: the `loop` stage (issue 19; docs/acecap.md).

  python -m mocojax.main --config configs/acecap_loop.py --workdir runs/acecap_loop
  python -m mocojax.main --config configs/acecap_loop.py --workdir runs/acecap_loop_control \
      --config.loop.control=True      # the broadcast-advantage GRPO control on the same loop

Per update, for config.loop.images_per_step toy images (toy world only: the reward is R_G on
the scene's Gold-MCQ, read by the exact reader):
  rollouts    `acecap_loop.acquire_evidence`: c_0 from the Policy (greedy), G = loop.num_rollouts
              Composer rollouts per image (ASK / READY at loop.temperature), the Instruct role's
              answers (loop.instruct: "exact", the world's answers, `toyloop.exact_answer`, as
              RL's exact roles; "model", the model itself, greedy), the final captions;
  rewards     `loop_train.score_rollouts` with `loop_train.toy_scorer`: r^0, r^E, r^E_{-t}, r^F;
  advantages  LOOP-GRPO per action type, or with loop.control the GRPO advantage of r^F
              broadcast to every span (`loop_train.rollout_advantages`);
  update      one clipped-ratio step on the Composer's spans (`loop_train.make_loop_step`).
It starts from the workdir's SFT checkpoint (`configs/acecap_loop.py` trains the Composer and
Instruct records of `data.loop_mix` there), checkpoints every loop.checkpoint_every updates
under checkpoints/loop and resumes from the latest (params, optimizer, rng, data position).
After the last update it scores the loop on loop.eval_scenes held-out scenes, greedy, G = 1
(`evaluate`), into <workdir>/eval_loop_<step>.json.
"""

import json
import logging
import os
import time

import jax
import numpy as np

from mocojax import (
    acecap,
    acecap_loop,
    checkpoint,
    config_utils,
    loop_grpo,
    metrics as metrics_lib,
    sharding,
)
from mocojax.data import pipeline, toyloop, toyroles, toyworld as tw
from mocojax.train import loop_train, rl as rl_lib, state as state_lib, step as step_lib
from mocojax.train.sft import BATCH_DIMS


def loop_defaults():
    """Returns the config.loop block: LOOP-GRPO's c_q, c_s, lam, max_questions (K), eps_norm
    (`loop_grpo.loop_defaults`) and the stage's training keys."""
    loop = loop_grpo.loop_defaults()
    loop.control = False  # True: GRPO's r^F advantage broadcast to every span (the control)
    loop.instruct = "exact"  # "exact": the world's answers; "model": the model answers
    loop.num_steps = 200
    loop.images_per_step = 4
    loop.num_rollouts = 4  # G
    loop.lr = 2e-5
    loop.warmup_ratio = 0.0
    loop.end_lr_ratio = 1.0
    loop.clip_eps = 0.2
    loop.temperature = 1.0  # the Composer's actions and final captions
    loop.num_micro = 1
    loop.caption_max_new_tokens = 64
    loop.action_max_new_tokens = 16
    loop.answer_max_new_tokens = 32
    loop.final_max_new_tokens = 96
    loop.checkpoint_every = 20
    loop.keep_checkpoints = 2
    loop.log_samples_every = 5
    loop.eval_scenes = 200  # held-out scenes scored after the last update (0: none)
    loop.eval_at_start = (
        False  # True: also before the first update (eval_loop_0.json: the SFT loop)
    )
    loop.eval_batch = 16
    return loop


def validate(loop):
    """Raises ValueError naming the first bad config.loop key."""
    loop_grpo.validate(loop)
    if loop.instruct not in ("exact", "model"):
        raise ValueError(f"config.loop.instruct={loop.instruct!r}: must be 'exact' or 'model'")
    for key in ("num_steps", "images_per_step", "num_rollouts", "checkpoint_every", "num_micro"):
        if not isinstance(loop[key], int) or loop[key] < 1:
            raise ValueError(f"config.loop.{key}={loop[key]!r}: must be an int >= 1")
    if (loop.images_per_step * loop.num_rollouts) % loop.num_micro:
        raise ValueError(
            f"config.loop.num_micro={loop.num_micro} must divide images_per_step x num_rollouts"
        )
    if not (isinstance(loop.max_questions, int) and loop.max_questions >= 1):
        raise ValueError(f"config.loop.max_questions={loop.max_questions!r}: must be an int >= 1")


def _rollouts(config, cfg, params, processor, images, scenes, rng, *, num_rollouts, temperature):
    """Returns the EvidenceRollouts of images (scenes: theirs, for the exact Instruct)."""
    loop = config.loop
    answer_fn = None
    if loop.instruct == "exact":
        answer_rng = np.random.default_rng(np.asarray(jax.random.key_data(rng)).ravel())

        def answer_fn(b, question):
            return toyloop.exact_answer(scenes[b], question, answer_rng)

    return acecap_loop.acquire_evidence(
        cfg,
        params,
        processor,
        images,
        num_rollouts=num_rollouts,
        max_questions=loop.max_questions,
        rng=rng,
        temperature=temperature,
        caption_max_new_tokens=loop.caption_max_new_tokens,
        action_max_new_tokens=loop.action_max_new_tokens,
        answer_max_new_tokens=loop.answer_max_new_tokens,
        final_max_new_tokens=loop.final_max_new_tokens,
        answer_fn=answer_fn,
    )


def rollout_metrics(scenes, rollouts, rewards):
    """Returns the scalars of a batch of rollouts: rewards, the evidence-retention gap r^E - r^F,
    questions per rollout, READY and forced-READY shares, and the toy truth of c_0 and c^F."""
    g = rollouts.num_rollouts
    initial = [tw.caption_metrics(s, c) for s, c in zip(scenes, rollouts.initial_captions)]
    final = [tw.caption_metrics(scenes[r // g], c) for r, c in enumerate(rollouts.final_captions)]
    return {
        "reward/initial": float(np.mean(rewards.initial)),
        "reward/evidence": float(np.mean(rewards.evidence)),
        "reward/final": float(np.mean(rewards.final)),
        "evidence_retention_gap": float(np.mean(rewards.evidence - rewards.final)),
        "questions_per_rollout": float(np.mean(rollouts.num_questions)),
        "ready_frac": float(np.mean(rollouts.stopped)),
        "forced_ready_frac": float(np.mean(rollouts.unparseable)),
        "true/initial_f1": float(np.mean([m["f1"] for m in initial])),
        "true/final_f1": float(np.mean([m["f1"] for m in final])),
        "true/final_hallucinated": float(np.mean([len(m["hallucinated"]) for m in final])),
        "true/final_words": float(np.mean([len(c.split()) for c in rollouts.final_captions])),
    }


def evaluate(config, cfg, params, processor, rng):
    """Returns the loop's held-out metrics: loop.eval_scenes scenes after the training scenes,
    greedy, one rollout each; c_0 (the Policy alone) and the image-blind F1 beside the final
    caption's, and the share of Gold-MCQ items the exact reader answers right from each
    (caption-only VQA accuracy)."""
    data, loop = config.data, config.loop
    scenes = tw.make_scenes(data.seed, loop.eval_scenes, data.num_train_scenes)
    sums, right = {}, {"initial": [], "final": []}
    for start in range(0, len(scenes), loop.eval_batch):
        batch = scenes[start : start + loop.eval_batch]
        images = [tw.render(s, data.image_size) for s in batch]
        rng_b = jax.random.fold_in(rng, start)
        rollouts = _rollouts(
            config, cfg, params, processor, images, batch, rng_b, num_rollouts=1, temperature=0.0
        )
        score = loop_train.toy_scorer(batch, data.seed)
        rewards = loop_train.score_rollouts(rollouts, score, loop.max_questions)
        for key, value in rollout_metrics(batch, rollouts, rewards).items():
            sums[key] = sums.get(key, 0.0) + value * len(batch)
        for key in right:
            captions = getattr(rollouts, f"{key}_captions")
            for scene, caption in zip(batch, captions):
                items = acecap.toy_mcq(scene, data.seed)
                choices = [acecap.oracle_choice(caption, item) for item in items]
                right[key].append(np.mean([c == i.answer for c, i in zip(choices, items)]))
    out = {key: value / len(scenes) for key, value in sums.items()}
    blind = [
        tw.caption_metrics(s, tw.reference_captions(scenes[(k + 1) % len(scenes)], data.seed)[0])
        for k, s in enumerate(scenes)
    ]
    out["true/f1_image_blind"] = float(np.mean([m["f1"] for m in blind]))
    out["mcq/initial_right_rate"] = float(np.mean(right["initial"]))
    out["mcq/final_right_rate"] = float(np.mean(right["final"]))
    out["num_scenes"] = len(scenes)
    return out


def _sample_rows(step, ids, rollouts, rewards, advantages):
    """Returns one loop_samples.jsonl row per image of a logged update."""
    g = rollouts.num_rollouts
    adv_q, adv_s, adv_f = advantages
    rows = []
    for b, image_id in enumerate(ids):
        span = range(b * g, (b + 1) * g)
        rows.append(
            {
                "step": step,
                "image_id": image_id,
                "initial_caption": rollouts.initial_captions[b],
                "r_initial": float(rewards.initial[b]),
                "rollouts": [
                    {
                        "composer": rollouts.composer_texts[r],
                        "questions": rollouts.questions[r],
                        "answers": rollouts.answers[r],
                        "stopped": bool(rollouts.stopped[r]),
                        "final": rollouts.final_captions[r],
                        "r_evidence": float(rewards.evidence[r]),
                        "r_final": float(rewards.final[r]),
                        "adv_questions": adv_q[r][: len(rollouts.questions[r])].tolist(),
                        "adv_stop": float(adv_s[r]),
                        "adv_final": float(adv_f[r]),
                    }
                    for r in span
                ],
            }
        )
    return rows


def run_loop(config, workdir):
    """Runs (or resumes) the loop stage as config.loop says; returns the final metrics."""
    loop = config.loop
    validate(loop)
    if config.data.source != "toyworld":
        raise ValueError(
            "the loop stage scores R_G on toy-world Gold-MCQs; config.data.source must be "
            "'toyworld' (Gold-MCQs for real images are not built yet, docs/acecap.md)"
        )
    setup = config_utils.build_setup(config, workdir)
    mesh = sharding.make_mesh(config.mesh or None)
    cfg, processor = sharding.model_config(setup.model_config, mesh), setup.processor
    records = toyroles.image_records(config.data.seed, config.data.num_train_scenes)
    scenes = {r["id"]: r["scene"] for r in records}
    data_iter = iter(
        pipeline.rl_dataset(
            records,
            global_batch_size=loop.images_per_step,
            seed=config.data.seed + 2,
            image_size=config.data.image_size,
        )
    )
    optimizer = state_lib.stage_optimizer(config.optimizer, loop)
    shardings = sharding.train_state_shardings(cfg, mesh, optimizer, with_momentum=False)
    manager = checkpoint.Manager(workdir, "loop", keep=loop.keep_checkpoints)

    def init():
        policy = rl_lib.initial_policy(config, workdir, setup, mesh)
        state, _ = sharding.init_train_state(
            cfg, mesh, optimizer, jax.random.key(config.seed + 2), params=policy,
            with_momentum=False,
        )  # fmt: skip
        return state

    abstract = step_lib.abstract_state(cfg, optimizer, shardings)
    state, extra = step_lib.restore_or_init(manager, abstract, init)
    if extra is not None:
        data_iter.set_state(extra["data"])
        logging.info("resumed the loop stage from step %d", int(state["step"]))
    start = int(state["step"])
    step_fn = loop_train.make_loop_step(cfg, optimizer, clip_eps=loop.clip_eps)
    writer = metrics_lib.MetricWriter(
        workdir, "loop", total_steps=loop.num_steps, initial_step=start
    )
    if start == 0 and loop.eval_scenes and loop.eval_at_start:
        _write_eval(config, cfg, state["params"], processor, workdir, 0)
    samples = os.path.join(workdir, "loop_samples.jsonl")
    metrics_lib.truncate_jsonl(samples, lambda row: row.get("step", 0) <= start)
    dims = {**BATCH_DIMS, "advantages": 1, "span_mask": 1, "weight": None}  # [A, b, L] rows
    last = {}
    for step in range(start + 1, loop.num_steps + 1):
        t0 = time.perf_counter()
        group = next(data_iter)
        batch_scenes = [scenes[e["id"]] for e in group]
        rng = jax.random.fold_in(state["rng"], step)
        rollouts = _rollouts(
            config, cfg, state["params"], processor, [e["image"] for e in group], batch_scenes,
            rng, num_rollouts=loop.num_rollouts, temperature=loop.temperature,
        )  # fmt: skip
        t1 = time.perf_counter()
        score = loop_train.toy_scorer(batch_scenes, config.data.seed)
        rewards = loop_train.score_rollouts(rollouts, score, loop.max_questions)
        advantages = loop_train.rollout_advantages(rollouts, rewards, loop, control=loop.control)
        host = loop_train.loop_batch(
            cfg, processor, rollouts, advantages, loop.num_micro, config.data.length_buckets
        )
        device = step_lib.place_batch(mesh, host, dims, strict=False)
        state, step_metrics = step_fn(state, device)
        step_metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
        last = {
            **rollout_metrics(batch_scenes, rollouts, rewards),
            **step_metrics,
            "time/rollout_s": t1 - t0,
            "time/step_s": time.perf_counter() - t0,
        }
        writer.write(step, last, tokens=int(np.asarray(host["span_mask"]).sum()))
        if step % loop.log_samples_every == 0:
            with open(samples, "a") as f:
                for row in _sample_rows(
                    step, [e["id"] for e in group], rollouts, rewards, advantages
                ):
                    f.write(json.dumps(row) + "\n")
        if step % loop.checkpoint_every == 0 or step == loop.num_steps:
            manager.save(step, state, {"data": data_iter.get_state()})
    manager.close()
    writer.close()
    if loop.eval_scenes:
        result = _write_eval(config, cfg, state["params"], processor, workdir, int(state["step"]))
        last = {**last, **{f"eval/{k}": v for k, v in result.items()}}
    return last


def _write_eval(config, cfg, params, processor, workdir, step):
    """Scores the loop on the held-out scenes (`evaluate`) into <workdir>/eval_loop_<step>.json."""
    result = evaluate(config, cfg, params, processor, jax.random.key(config.seed + 3))
    with open(os.path.join(workdir, f"eval_loop_{step}.json"), "w") as f:
        json.dump(result, f, indent=1)
    logging.info("loop eval at step %d: %s", step, result)
    return result
