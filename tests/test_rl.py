"""Stage II: shared-prefix split, exact gradient accumulation weights, and a tiny end-to-end run.

The end-to-end run uses a random-weight tiny model, which writes no parseable rubric; the two
role functions are wrapped so the model still generates (real sampler, real prompts) but its
parsed output is replaced by a fixed rubric and patterned decisions whose rewards vary within
every group. Everything after that (advantages, GRPO update, EMA, diagnostics, logs) is real.
"""

import dataclasses
import importlib.util
import json
import os
import types

import jax
import ml_collections
import numpy as np
import optax
import pytest
import rl_patterns

from mocojax import config_utils, losses, momentum, roles, sharding as sharding_lib
from mocojax.data import toyroles, toyworld as tw
from mocojax.eval import toyworld_eval
from mocojax.train import rl, rl_config, rl_evals, rl_update, rollout as rollout_lib

CONFIGS = os.path.join(os.path.dirname(__file__), os.pardir, "configs")


def _toy_config():
    spec = importlib.util.spec_from_file_location(
        "toyworld_config", os.path.join(CONFIGS, "toyworld.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config("tiny")  # rl: rl_defaults(tiny=True) with the toy world's evals


def test_split_shared_prefix_rebuilds_every_prompt():
    # Two groups of two left-padded prompts; group 0 shares [5, 6, 7], group 1 shares [9].
    ids = np.array([[0, 5, 6, 7, 1], [5, 6, 7, 2, 3], [0, 0, 9, 4, 4], [0, 9, 8, 8, 8]])
    mask = (ids > 0).astype(np.int32)
    prefix, prefix_mask, tails, tail_mask = rollout_lib.split_shared_prefix(ids, mask, 2)
    assert prefix[0][prefix_mask[0] > 0].tolist() == [5, 6, 7]
    assert prefix[1][prefix_mask[1] > 0].tolist() == [9]
    for row in range(4):
        g = row // 2
        rebuilt = np.concatenate([prefix[g][prefix_mask[g] > 0], tails[row][tail_mask[row] > 0]])
        assert rebuilt.tolist() == ids[row][mask[row] > 0].tolist()
        assert tail_mask[row, 0] == 1  # every continuation keeps at least one token


def test_identical_prompts_keep_one_continuation_token():
    ids = np.array([[3, 4, 5], [3, 4, 5]])
    prefix, prefix_mask, tails, tail_mask = rollout_lib.split_shared_prefix(
        ids, np.ones_like(ids), 2
    )
    assert prefix[0].tolist() == [3, 4] and tails[:, :1].tolist() == [[5], [5]]


@pytest.mark.parametrize("aggregation", rl_config.AGGREGATIONS)
def test_micro_weights_make_accumulated_loss_exact(aggregation):
    rng = np.random.default_rng(0)
    num_micro, rows, width = 2, 6, 5
    logprobs = rng.normal(size=(num_micro * rows, width)).astype(np.float32) - 2.0
    old = logprobs + rng.normal(scale=0.3, size=logprobs.shape).astype(np.float32)
    advantages = rng.normal(size=num_micro * rows).astype(np.float32)
    lengths = rng.integers(0, width + 1, size=num_micro * rows)  # some rows fully masked
    mask = (np.arange(width)[None] < lengths[:, None]).astype(np.float32)
    full, _ = losses.grpo_loss(logprobs, old, advantages, mask, aggregation=aggregation)
    split = lambda x: x.reshape(num_micro, rows, *x.shape[1:])
    weights = rl.micro_weights(split(mask), aggregation)
    accumulated = sum(
        w * losses.grpo_loss(lp, o, a, m, aggregation=aggregation)[0]
        for w, lp, o, a, m in zip(
            weights, split(logprobs), split(old), split(advantages), split(mask)
        )
    )
    np.testing.assert_allclose(accumulated, full, rtol=1e-6)


def test_rl_end_to_end_policy_moves_momentum_is_ema_roles_get_no_gradient(tmp_path, monkeypatch):
    config = _toy_config()
    m = 0.9
    config.rl.momentum, config.rl.sync_every = m, 1
    config.rl.generator, config.rl.judge = "ema", "frozen"  # one EMA copy, one frozen copy
    config.rl.lr, config.rl.warmup_ratio = 1e-2, 0.0  # every one of the 3 updates moves the model
    rl_patterns.patterned_roles(monkeypatch.setattr)

    step_state_keys, trajectory, momenta, objective_change = [], [], [], []
    make_grpo_step, sync = rl.make_grpo_step, momentum.sync

    def recording_make_grpo_step(*args):
        step_fn = make_grpo_step(*args)
        cfg, num_samples = args[0], args[2].num_samples

        @jax.jit
        def weighted_loglik(params, batch):
            """sum_i A_i log pi(caption_i): the quantity a policy-gradient step must raise."""
            total = 0.0
            for a in range(batch["advantages"].shape[0]):
                micro = jax.tree.map(lambda x: x[a], batch)
                logprobs = rl.completion_logprobs(cfg, params, micro, num_samples)
                total += jax.numpy.sum(micro["advantages"][:, None] * logprobs * micro["mask"])
            return total

        def recording_step(state, batch, ref_params):
            step_state_keys.append(sorted(state))
            before = float(weighted_loglik(state["params"], batch))  # state is donated below
            new_state, metrics = step_fn(state, batch, ref_params)
            objective_change.append(float(weighted_loglik(new_state["params"], batch)) - before)
            return new_state, metrics

        return recording_step

    def recording_sync(role_momentum, schedule, copies, params, step, **kwargs):
        trajectory.append(jax.tree.map(np.array, params))
        out = sync(role_momentum, schedule, copies, params, step, **kwargs)
        momenta.append(jax.tree.map(np.array, out[0]))
        return out

    monkeypatch.setattr(rl, "make_grpo_step", recording_make_grpo_step)
    monkeypatch.setattr(momentum, "sync", recording_sync)
    workdir = str(tmp_path)
    last = rl.run_rl(config, workdir)

    steps = config.rl.num_steps
    assert len(trajectory) == steps and last["no_signal_skipped_total"] == 0
    # The jitted update sees only the Policy's state: the momentum is not an input of it.
    assert step_state_keys == [["opt_state", "params", "rng", "step"]] * steps
    # Each update moves the Policy up its own batch's advantage-weighted log-likelihood (a sign
    # error or a one-token shift between logits and caption tokens would lower it).
    assert len(objective_change) == steps and all(change > 0 for change in objective_change), (
        objective_change
    )

    theta_0 = jax.tree.map(np.array, config_utils.build_setup(config, workdir).load_params())
    leaves = lambda tree: [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]
    # The Policy moved at every step.
    previous = leaves(theta_0)
    for theta in trajectory:
        current = leaves(theta)
        assert max(np.abs(a - b).max() for a, b in zip(current, previous)) > 0
        previous = current
    # phi_t = m phi_{t-1} + (1 - m) theta_t with phi_0 = theta_0; the frozen copy never moves.
    phi = leaves(theta_0)
    for theta, copies in zip(trajectory, momenta):
        phi = [m * p + (1 - m) * t for p, t in zip(phi, leaves(theta))]
        for expected, got in zip(phi, leaves(copies["ema"])):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        for initial, got in zip(jax.tree.leaves(theta_0), jax.tree.leaves(copies["frozen"])):
            np.testing.assert_array_equal(got, initial)

    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        logged = [row for row in map(json.loads, f) if row["stage"] == "rl" and row["step"] > 0]
    assert [row["step"] for row in logged] == list(range(1, steps + 1))
    distance = lambda a, b: np.sqrt(sum(np.sum((x - y) ** 2) for x, y in zip(a, b)))
    phi_prev = leaves(theta_0)
    for row, theta, copies in zip(logged, trajectory, momenta):
        np.testing.assert_allclose(
            row["tracking_error"], distance(leaves(theta), leaves(copies["ema"])), rtol=1e-4
        )
        np.testing.assert_allclose(
            row["momentum_update"], distance(leaves(copies["ema"]), phi_prev), rtol=1e-4
        )
        phi_prev = leaves(copies["ema"])
        assert row["zero_variance_frac"] == 0.0 and row["rubric_items"] == 2.0
        for key in (
            "reward_mean",
            "reward_std",
            "clip_frac_low",
            "clip_frac_high",
            "policy_displacement",
            "tracking_error_frozen",
            "generator_problems",
            "judge_problems",
            "caption_tokens",
            "true/caption_f1",
            "time/policy_sampling_s",
            "time/rubric_generation_s",
            "time/judging_s",
            "time/update_s",
        ):
            assert np.isfinite(row[key]), key

    with open(os.path.join(workdir, "rl_samples.jsonl")) as f:
        samples = [json.loads(line) for line in f]
    assert len(samples) == steps * config.rl.images_per_step
    sample = samples[0]
    n = config.rl.num_samples
    assert len(sample["captions"]) == n and len(sample["rewards"]) == n
    assert len(sample["truth"]["f1"]) == n and len(sample["truth"]["item_true"]) == 2
    assert len(sample["truth"]["decision_right"]) == n


def test_judge_gate_refuses_rl_with_a_weak_judge(tmp_path, monkeypatch):
    """A random-weight Judge is far below a 0.99 gate: with judge_gate_refuse RL stops before
    any update, naming the measured balanced accuracy; the gate's numbers are logged at step 0."""
    config = _toy_config()
    config.rl.judge_gate, config.rl.judge_gate_refuse = 0.99, True
    updates = []
    monkeypatch.setattr(rl, "train_batch", lambda *args: updates.append(1))
    with pytest.raises(
        RuntimeError,
        match=r"RL refused: the Judge's balanced accuracy on its worst item kind .* is 0\.\d+",
    ):
        rl.run_rl(config, str(tmp_path))
    assert updates == []

    config.rl.judge_gate_refuse = False  # warn only: RL runs, the gate is logged at step 0
    config.rl.num_steps = 1
    monkeypatch.undo()
    rl_patterns.patterned_roles(monkeypatch.setattr)
    rl.run_rl(config, str(tmp_path / "warned"))
    with open(tmp_path / "warned" / "metrics.jsonl") as f:
        first = next(row for row in map(json.loads, f) if row["stage"] == "rl")
    assert first["step"] == 0 and 0.0 <= first["gate/judge_balanced_accuracy_within_kind"] < 0.99
    assert (
        0.0
        <= first["gate/judge_balanced_accuracy_worst_kind"]
        <= (first["gate/judge_balanced_accuracy_within_kind"])
    )
    assert 0.0 <= first["gate/judge_balanced_accuracy"] <= 1.0
    assert first["gate/judge_num_items"] > 0
    # benchmarks/judge_curve.py reads the run back (config.json, as mocojax.main writes it) and
    # scores the Judge of each kept checkpoint on scenes past the eval's
    with open(tmp_path / "warned" / "config.json", "w") as f:
        f.write(config.to_json_best_effort())
    judge_curve = _benchmark("judge_curve")
    judge_curve.main([str(tmp_path / "warned"), "--stage", "rl", "--scenes", "2"])
    with open(tmp_path / "warned" / "judge_curve_rl.json") as f:
        rows = json.load(f)
    assert [row["step"] for row in rows] == [1] and rows[0]["num_items"] > 0
    assert (
        0.0 <= rows[0]["balanced_accuracy_worst_kind"] <= rows[0]["balanced_accuracy_within_kind"]
    )


def test_exact_roles_replace_the_models_and_are_never_wrong(tmp_path, monkeypatch):
    """rl.generator = rl.judge = "exact": no role model runs (both are made to raise), every
    rubric item is true of its scene, every decision is right, and no role copy is kept."""
    config = _toy_config()
    config.rl.generator, config.rl.judge = "exact", "exact"
    config.rl.num_steps = 2
    config.rl.eval_every, config.rl.val_scenes = 2, 3

    def no_model(*args, **kwargs):
        raise AssertionError("a role model ran although the role is exact")

    monkeypatch.setattr(rollout_lib, "write_rubrics", no_model)
    monkeypatch.setattr(rollout_lib, "judge_captions", no_model)
    monkeypatch.setattr(rl_evals, "judge_gate", no_model)  # no Judge model to gate
    rl.run_rl(config, str(tmp_path))
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [row for row in map(json.loads, f) if row["stage"] == "rl" and row["step"] > 0]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["rubric_items"] >= 1 and row["generator_problems"] == 0.0
        assert row["true/rubric_item_truth"] == 1.0 and row["true/rubric_item_unreadable"] == 0.0
        assert row["true/judge_accuracy"] == 1.0
        assert "tracking_error" not in row  # no momentum copy
    # rl.eval_every = 2: the validation readout at the start (no gate: the Judge is exact) and
    # at step 2, on rl.val_scenes scenes; not at step 1.
    with open(tmp_path / "metrics.jsonl") as f:
        val = {
            row["step"]: row
            for row in map(json.loads, f)
            if row["stage"] == "rl" and "val/policy/f1" in row
        }
    assert sorted(val) == [0, 2] and all(row["val/num_scenes"] == 3 for row in val.values())
    for row in val.values():
        assert 0.0 <= row["val/policy/f1"] <= 1.0 and row["val/policy/caption_words"] > 0
    # benchmarks/role_curve.py reads the saved step-2 checkpoint back on the same range and
    # scores its Policy exactly as the run did in memory (greedy: the same captions), then
    # reads the same checkpoint in the Generator role there
    with open(tmp_path / "config.json", "w") as f:
        f.write(config.to_json_best_effort())
    role_curve = _benchmark("role_curve")
    role_curve.main([str(tmp_path), "--stage", "rl", "--steps", "2", "--scenes", "3"])
    with open(tmp_path / "policy_curve_rl.json") as f:
        (row,) = json.load(f)
    assert row["step"] == 2
    assert {k: row[k] for k in val[2] if k.startswith("val/")} == {
        k: v for k, v in val[2].items() if k.startswith("val/")
    }
    role_curve.main(
        [str(tmp_path), "--role", "generator", "--stage", "rl", "--steps", "2", "--scenes", "3"]
    )
    with open(tmp_path / "generator_curve_rl.json") as f:
        (row,) = json.load(f)
    assert row["step"] == 2 and row["val/num_scenes"] == 3 and row["example"]["target"]
    assert 0.0 <= row["val/generator/rubric_truth_other_scene"] < 1.0
    assert 0.0 <= row["val/generator/rubric_truth_rate"] <= 1.0
    # the probe: each prompt shows the next scene's image (or references); truth is read on the
    # prompt's own scene, so its targets stay exactly true
    scenes = {s.id: s for s in tw.make_scenes(4, 3, start=50)}
    examples = [r for s in scenes.values() for r in toyroles.scene_sft_records(s, 4, (0, 1, 0))]
    for shown, key in (("other-image", "scene"), ("other-references", "references")):
        probed = role_curve.shown_examples(examples, shown)
        for k, (e, p) in enumerate(zip(examples, probed)):
            assert p[key] == examples[(k + 1) % 3][key] and p["scene_id"] == e["scene_id"]
            assert {n: v for n, v in p.items() if n != key} == {
                n: v for n, v in e.items() if n != key
            }
        targets = [p["target"] for p in probed]
        got = toyworld_eval.generator_rubric_metrics(scenes, probed, targets)
        assert got["generator/rubric_truth_rate"] == 1.0
    assert role_curve.shown_examples(examples, "own") == examples
    role_curve.main(
        [str(tmp_path), "--role", "generator", "--stage", "rl", "--steps", "2", "--scenes", "3"]
        + ["--shown", "other-image"]
    )
    with open(tmp_path / "generator_curve_rl_other-image.json") as f:
        assert json.load(f)[0]["val/num_scenes"] == 3
    # --rubric-samples 2: two rubrics drawn at T 1 per prompt (their texts replaced by DRAWS'
    # first two), each prompt's rubric read as their 3-item union (UNION)
    drawn = []

    def two_draws(*args, num_samples, temperature):
        drawn.append((len(args[3]), num_samples, temperature))
        return [DRAWS[row % 2] for row in range(len(args[3]) * num_samples)]

    with monkeypatch.context() as patch:
        patch.setattr(role_curve.toyworld_eval, "generate_texts", two_draws)
        role_curve.main(
            [str(tmp_path), "--role", "generator", "--stage", "rl", "--steps", "2"]
            + ["--scenes", "3", "--rubric-samples", "2", "--rubric-temperature", "1"]
        )
    assert drawn == [(3, 2, 1.0)]
    with open(tmp_path / "generator_curve_rl_draws2-t1.json") as f:
        assert json.load(f)[0]["val/generator/items_per_rubric"] == 3.0
    # benchmarks/paired_gain.py: the checkpoint against itself (its trivial baseline) gains
    # exactly 0 on every scene, and its per-scene means are the run's own validation readout
    paired_gain = _benchmark("paired_gain")
    paired_gain.main([str(tmp_path), "--a", "rl:2", "--b", "rl", "--range", "validation"])
    with open(tmp_path / "paired_rl_2_rl_2_validation.json") as f:
        result = json.load(f)
    f1 = result["f1"]
    assert f1["num_scenes"] == 3 and f1["tied"] == 3 and f1["gain"] == 0.0
    assert f1["ci95"] == [0.0, 0.0] and f1["share_reaching_target"] == 0.0
    assert f1["mean_a"] == pytest.approx(val[2]["val/policy/f1"], abs=1e-12)
    assert result["words"]["mean_b"] == pytest.approx(val[2]["val/policy/caption_words"])
    with pytest.raises(SystemExit):  # a step the run does not keep: a clear error
        paired_gain.main([str(tmp_path), "--a", "rl:7", "--range", "validation"])


def _benchmark(name):
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paired_summary_by_hand():
    """benchmarks/paired_gain.py's paired comparison: per-scene differences [0, 0.2] have mean
    0.1, standard error 0.1 (normal interval 0.1 +- 0.196), and a bootstrap mean of 0, 0.1 or 0.2
    with probabilities 1/4, 1/2, 1/4, so 3/4 of resamples reach a 0.05 target; a constant
    difference has a degenerate interval."""
    paired_gain = _benchmark("paired_gain")
    got = paired_gain.paired_summary([0.5, 0.5], [0.5, 0.7], target=0.05, num_resamples=40000)
    assert got["gain"] == pytest.approx(0.1) and got["mean_b"] == pytest.approx(0.6)
    assert got["normal_ci95"] == pytest.approx([0.1 - 0.196, 0.1 + 0.196])
    assert got["share_reaching_target"] == pytest.approx(0.75, abs=0.01)
    assert got["ci95"] == pytest.approx([0.0, 0.2])
    assert (got["b_higher"], got["b_lower"], got["tied"]) == (1, 0, 1)
    same = paired_gain.paired_summary([0.1, 0.2, 0.3], [0.2, 0.3, 0.4], target=0.05)
    assert same["ci95"] == pytest.approx([0.1, 0.1]) and same["share_reaching_target"] == 1.0
    with pytest.raises(ValueError, match="equal 1-D"):
        paired_gain.paired_summary([0.1, 0.2], [0.1])


def test_validation_range_follows_the_eval_scenes():
    """RL's readout scores scenes after the eval stage's (training 0..n-1, eval n..n+e-1), so a
    setting chosen on it is not chosen on the scenes the results report."""
    config = _toy_config()
    config.data.num_train_scenes, config.eval.num_scenes, config.rl.val_scenes = 4000, 200, 100
    assert rl_evals.validation_range(config) == (4200, 100)


def test_gaming_stop_ends_rl_at_the_warning_and_a_rerun_does_not_resume_it(tmp_path, monkeypatch):
    """rl.gaming_stop: at the update where the gaming watch warns (scripted here at step 2; the
    watch's own rule has a hand test), RL saves that step's checkpoint and stops; run again, it
    returns at once instead of resuming the gamed run."""
    from mocojax import checkpoint

    config = _toy_config()
    config.rl.generator, config.rl.judge = "exact", "exact"
    config.rl.num_steps, config.rl.checkpoint_every, config.rl.gaming_stop = 4, 10, True

    class ScriptedWatch(rl_evals.GamingWatch):
        def update(self, step, metrics):
            if step == 2:
                self.warned_at = step
            return {}

    monkeypatch.setattr(rl_evals, "GamingWatch", ScriptedWatch)
    workdir = str(tmp_path)
    last = rl.run_rl(config, workdir)
    assert last["gaming_stopped_at"] == 2 and checkpoint.latest_step(workdir, "rl") == 2
    with open(tmp_path / "metrics.jsonl") as f:
        steps = [row["step"] for row in map(json.loads, f) if row["stage"] == "rl"]
    assert max(steps) == 2
    assert rl.run_rl(config, workdir) == {"gaming_stopped_at": 2}
    assert checkpoint.latest_step(workdir, "rl") == 2


def test_true_f1_reward_is_each_captions_exact_f1(tmp_path):
    """rl.reward = "true_f1": every logged caption's reward is its exact F1 against the scene
    (computed here again from the caption text), and the step logs the captions' breakdown."""
    from mocojax.data import toyworld as tw

    config = _toy_config()
    config.rl.generator, config.rl.judge = "exact", "exact"
    config.rl.reward = "true_f1"
    config.rl.num_steps = 1
    config.rl.log_samples_every = 1
    rl.run_rl(config, str(tmp_path))
    scenes = {s.id: s for s in tw.make_scenes(config.data.seed, config.data.num_train_scenes)}
    with open(tmp_path / "rl_samples.jsonl") as f:
        groups = [json.loads(line) for line in f]
    assert groups
    for group in groups:
        scene = scenes[group["image_id"]]
        expected = [tw.caption_metrics(scene, c)["f1"] for c in group["captions"]]
        np.testing.assert_allclose(group["rewards"], expected, rtol=1e-6)
        assert group["truth"]["f1"] == pytest.approx(expected)
    with open(tmp_path / "metrics.jsonl") as f:
        row = [r for r in map(json.loads, f) if r["stage"] == "rl" and r["step"] == 1][0]
    assert 0.0 <= row["true/object_recall"] <= 1.0 and row["true/caption_words"] > 0


def test_true_f1_reward_needs_the_exact_roles():
    config = _toy_config()
    config.rl.reward = "true_f1"
    with pytest.raises(ValueError, match="rl.reward='true_f1'.*exact roles"):
        rl_config.validate(config.rl)
    config.rl.reward, config.rl.hallucination_charge = "rubric", 0.15
    with pytest.raises(ValueError, match="hallucination_charge=0.15.*'true_f1' only"):
        rl_config.validate(config.rl)


def test_invention_weight_needs_the_exact_generators_online_rubric():
    config = _toy_config()
    config.rl.invention_weight = 6.0
    with pytest.raises(ValueError, match="invention_weight=6.0.*rl.generator='exact'"):
        rl_config.validate(config.rl)
    config.rl.generator = "exact"
    rl_config.validate(config.rl)
    config.rl.rubrics = "offline"
    with pytest.raises(ValueError, match="invention_weight=6.0.*'offline'"):
        rl_config.validate(config.rl)
    config.rl.rubrics, config.rl.invention_weight = "online", -1.0
    with pytest.raises(ValueError, match="invention_weight=-1.0: must be a finite number >= 0"):
        rl_config.validate(config.rl)


def test_hallucination_charge_by_hand():
    """F1 minus the charge per hallucinated object, on a caption worked by hand."""
    from mocojax.data import toyworld as tw

    scene = tw.Scene("s", "white", (tw.Obj("circle", "red", "large", "top left"),))
    source = rl.TrueF1Source({"s": scene}, hallucination_charge=0.25)
    # circle: 4 of 4 facts right; the star is hallucinated (its 2 stated facts, existence and
    # colour, wrong); 5 scene facts (the circle's 4 and the background)
    caption = "A large red circle at the top left and a blue star."
    precision, recall = 4 / 6, 4 / 5
    f1 = 2 * precision * recall / (precision + recall)
    assert source.reward(scene, caption) == pytest.approx(f1 - 0.25)
    assert source.reward(scene, "A large red circle at the top left on a white background.") == 1.0


def test_exact_roles_by_hand():
    from mocojax.data import toyroles, toyworld as tw

    scene = tw.Scene("s", "white", (tw.Obj("circle", "red", "large", "top left"),))
    exact = toyroles.ExactRoles({"s": scene})
    invented = "A large red circle in the top left and a small blue star in the center. The background is white."
    rubric = exact.rubric("s", [invented])
    assert rubric[0].criterion == "does not mention a blue star"
    assert exact.decisions(rubric, invented)[0] == 0
    assert (
        exact.decisions(rubric, "A big red circle at the top left on a white background.")[0] == 1
    )
    assert exact.decisions([rubric[0]._replace(criterion="is pretty")], invented) == [0]


@pytest.mark.parametrize("form", ["rubric", "check", "reason", "lead"])
def test_per_item_judge_asks_one_item_per_row_in_rl(tmp_path, monkeypatch, form):
    """data.judge_per_item: the real Judge (random weights) is asked once per (caption, item),
    every question in one batch, in the data.judge_item_form's words; each caption gets one
    decision per rubric item. The questions about one caption share its prompt's opening, encoded
    once: the replies are those of every question encoded whole."""
    config = _toy_config()
    config.data.judge_per_item = True
    config.data.judge_item_form = form
    config.rl.num_steps = 1
    judge_items_texts = rollout_lib.judge_items_texts
    asked, sizes = [], []

    def recording_judge(cfg, params, processor, conversations, rl_cfg, rng, group_sizes=None):
        asked.append(conversations)
        sizes.append(group_sizes)
        texts = judge_items_texts(cfg, params, processor, conversations, rl_cfg, rng, group_sizes)
        whole = judge_items_texts(cfg, params, processor, conversations, rl_cfg, rng)
        assert texts == whole
        return texts

    monkeypatch.setattr(rollout_lib, "write_rubrics", rl_patterns.fixed_rubric())
    monkeypatch.setattr(rollout_lib, "judge_items_texts", recording_judge)
    rl.run_rl(config, str(tmp_path))
    # G groups x N captions x 2 items, the two questions about one caption in a row.
    (judge_rows,) = asked
    groups = config.rl.images_per_step * config.rl.num_samples
    assert len(judge_rows) == groups * len(rl_patterns.RUBRIC)
    assert sizes == [[len(rl_patterns.RUBRIC)] * groups]
    texts = [row[0]["content"][0]["text"] for row in judge_rows]
    if form == "rubric":
        assert all(t.count("\n1 | ") == 1 and "\n2 | " not in t for t in texts)
        assert texts[0].endswith("Rubric:\n1 | mentions a red circle | a red circle must be named")
        assert texts[1].endswith("Rubric:\n1 | the background is white | it must be called white")
    elif form == "lead":  # the criterion line first, then the caption
        assert all(t.startswith("Check: ") and "\nCaption: " in t for t in texts)
        assert texts[0].startswith("Check: mentions a red circle\nCaption: ")
        assert texts[1].startswith("Check: the background is white\nCaption: ")
    else:  # the toy base's truth question (the same for the reason form), nothing of the rubric
        assert all(t.startswith("Caption: ") and "Rubric:" not in t for t in texts)
        assert texts[0].endswith("\nCheck: mentions a red circle")
        assert texts[1].endswith("\nCheck: the background is white")
    with open(tmp_path / "metrics.jsonl") as f:
        rows_logged = [row for row in map(json.loads, f) if row["stage"] == "rl"]
    gate = rows_logged[0]
    assert gate["step"] == 0 and gate["gate/judge_num_items"] > 0
    assert rows_logged[-1]["step"] == 1


def test_update_length_by_hand():
    assert rl_update.update_length(np.array([3, 17]), 64, 16) == 32
    assert rl_update.update_length(np.array([16]), 64, 16) == 16
    assert rl_update.update_length(np.array([0, 0]), 64, 16) == 16  # never an empty axis
    assert rl_update.update_length(np.array([60]), 64, 48) == 64  # capped at the sampler's room
    assert rl_update.update_length(np.array([5]), 64, 0) == 64  # 0: the sampler's room, as before
    config = _toy_config()
    config.rl.update_length_multiple = -1
    with pytest.raises(ValueError, match="update_length_multiple"):
        rl_config.validate(config.rl)


def test_trimmed_update_is_the_untrimmed_update(tmp_path):
    """The GRPO step on a batch cut to the longest caption (rounded up to the multiple) gives the
    loss, metrics and gradient of the step on the sampler's whole axis: the cut positions are
    padding the loss never reads. A batch that loses a real token is caught."""
    from mocojax.train import state as state_lib

    config = _toy_config()
    config.rl.warmup_ratio = 0.0  # step 1 moves the params
    config.rl.kl_beta = 0.05  # the default job's KL term, with its reference forward
    setup = config_utils.build_setup(config, str(tmp_path))
    params, cfg, settings = setup.load_params(), setup.model_config, config.rl
    rows, n, width = settings.images_per_step * settings.num_samples, settings.num_samples, 12
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 6, rows)
    lengths[0] = 5  # the longest caption: 5 tokens -> an axis of 8 at multiple 4
    rollout = rl_patterns.toy_rollout(
        config,
        setup,
        tokens=rng.integers(20, 200, size=(rows, width)),
        logprobs=(-rng.uniform(0.5, 6.0, (rows, width))).astype(np.float32),
        lengths=lengths,
        rewards=rng.uniform(size=(rows // n, n)).astype(np.float32),
    )
    # plain SGD: the step moves the params by -lr * gradient (Adam's first step maps a gradient's
    # rounding, where |g| ~ eps, to a large share of lr); lr 1e4 lifts the ~1e-6 gradients well
    # above the params' own float32 spacing, so params - new params reads the gradient exactly
    optimizer = optax.sgd(1e4)
    step = rl.make_grpo_step(cfg, optimizer, settings)
    mesh = sharding_lib.make_mesh(None)

    def update(multiple):
        settings.update_length_multiple = multiple
        batch = rl.train_batch(cfg, rollout, settings, rl.advantages(rollout, settings))
        state = state_lib.init_state(jax.tree.map(np.array, params), optimizer, jax.random.key(0))
        new, metrics = step(state, rl.place_batch(mesh, batch), params)
        return batch["completion"].shape[-1], jax.device_get((new["params"], metrics))

    full_width, (full_params, full) = update(0)
    cut_width, (cut_params, cut) = update(4)
    assert (full_width, cut_width) == (width, 8)
    # Dr. GRPO divides by the padded axis: its batch keeps the sampler's whole axis
    drgrpo = ml_collections.ConfigDict(dict(settings, aggregation="seq_mean_token_sum_norm"))
    assert (
        rl.train_batch(cfg, rollout, drgrpo, rl.advantages(rollout, drgrpo))["completion"].shape[-1]
        == width
    )
    assert float(full["update_norm"]) > 0
    for key in ("loss", "pg_loss", "kl", "ratio_mean", "update_norm"):
        np.testing.assert_allclose(cut[key], full[key], rtol=1e-5, atol=1e-7, err_msg=key)
    for p, a, b in zip(*map(jax.tree.leaves, (params, cut_params, full_params))):
        grad_cut, grad_full = np.asarray(p) - a, np.asarray(p) - b
        scale = np.abs(grad_full).max()
        np.testing.assert_allclose(grad_cut, grad_full, rtol=1e-5, atol=1e-5 * scale)

    # the check can fail: a batch that loses the longest captions' last real token (the axis cut
    # to 4, as rounding down would) scores another loss
    lost = dataclasses.replace(
        rollout, tokens=rollout.tokens[:, :4], logprobs=rollout.logprobs[:, :4]
    )
    settings.update_length_multiple = 0
    batch = rl.train_batch(cfg, lost, settings, rl.advantages(lost, settings))
    state = state_lib.init_state(jax.tree.map(np.array, params), optimizer, jax.random.key(0))
    lost_metrics = jax.device_get(step(state, rl.place_batch(mesh, batch), params)[1])
    lost_ratio, full_ratio = float(lost_metrics["ratio_mean"]), float(full["ratio_mean"])
    assert abs(lost_ratio - full_ratio) > 1e-3 * abs(full_ratio)


def test_rubric_check_by_hand():
    """rl.rubric_check = "references": an item is kept when at least half of the image's
    references meet it (hand-made decisions), and with the exact Judge the check drops exactly
    the items false of the scene when its reference is complete."""
    assert rollout_lib.kept_by_references([[1, 0, 1], [0, 0, 1]], 2).tolist() == [
        True,
        False,
        True,
    ]  # half is enough
    assert rollout_lib.kept_by_references([[1, 0], [0, 1], [0, 1]], 3).tolist() == [False, True]
    # a padded group: the third row is its last reference repeated, not counted
    assert rollout_lib.kept_by_references([[1, 0], [0, 0], [0, 0]], 1).tolist() == [True, False]
    with pytest.raises(ValueError, match="R >= 1"):
        rollout_lib.kept_by_references([[1]], 0)

    scene = tw.Scene("s", "white", (tw.Obj("circle", "red", "large", "top left"),))
    scene2 = tw.Scene("t", "black", (tw.Obj("star", "blue", "small", "center"),))
    exact = toyroles.ExactRoles({"s": scene, "t": scene2})
    item = lambda criterion: roles.RubricItem(criterion, "", 1.0)  # noqa: E731
    rubric = [
        item("mentions a red circle"),  # true
        item("mentions a blue star"),  # false: a misperception written as a requirement
        item("does not mention a green square"),  # true
        item("the background is black"),  # false
    ]
    references = [
        ["A large red circle in the top left. The background is white."],
        # two references, one naming the star, one not: half of them meet its presence item
        [
            "A small blue star in the center on a black background.",
            "A black background.",
        ],
    ]
    rl_cfg = rl_config.rl_defaults(tiny=True)
    rl_cfg.judge = "exact"
    kept, dropped = rollout_lib.check_rubrics(
        None, None, None, [rubric, rubric[:2]], references, rl_cfg, None, exact=exact
    )
    assert [i.criterion for i in kept[0]] == [
        "mentions a red circle",
        "does not mention a green square",
    ]
    assert [i.criterion for i in dropped[0]] == ["mentions a blue star", "the background is black"]
    assert [i.criterion for i in kept[1]] == ["mentions a blue star"]
    assert [i.criterion for i in dropped[1]] == ["mentions a red circle"]
    # benchmarks/role_curve.py --check-references exact: the Generator examples' targets with
    # one false presence item added: the check drops it and only it
    role_curve = _benchmark("role_curve")
    config = _toy_config()
    seed = config.data.seed
    scenes = {s.id: s for s in tw.make_scenes(seed, 4, start=60)}
    examples = [r for s in scenes.values() for r in toyroles.scene_sft_records(s, seed, (0, 1, 0))]
    false = {
        e["scene_id"]: next(
            f"mentions a {c} {shape}"
            for c in tw.COLOURS
            for shape in tw.SHAPES
            if not toyroles.fact_is_true(
                scenes[e["scene_id"]], toyroles.parse_criterion(f"mentions a {c} {shape}")
            )
        )
        for e in examples
    }
    texts = [e["target"] + f"\n99 | 3 | {false[e['scene_id']]} | it is named" for e in examples]
    texts = [roles.format_rubric(roles.parse_rubric(t)[0]) for t in texts]  # renumbered
    setup = types.SimpleNamespace(model_config=None, processor=None)
    got = role_curve.checked_metrics(config, setup, None, scenes, examples, texts, "exact")
    assert got["val/checked/generator/rubric_truth_rate"] == 1.0
    assert got["val/checked/dropped_per_rubric"] == 1.0 and got["val/checked/dropped_true"] == 0.0
    # the trivial baseline: another scene's rubric through the exact check keeps only items true
    # here, fewer of them than this scene's own rubric holds
    assert got["val/checked/other_scene_truth"] == 1.0
    assert got["val/checked/other_scene_items"] < got["val/checked/generator/items_per_rubric"]
    # every item of the exact rubric is true and failed by a shown candidate (that is why it is
    # there); the added false item is useful to no one
    assert got["val/checked/useful_target"] == got["val/checked/generator/items_per_rubric"]
    assert (
        got["val/checked/useful_written"]
        == got["val/checked/useful"]
        == got["val/checked/useful_target"]
    )
    rl_cfg.rubric_check = "reference"
    with pytest.raises(ValueError, match="rl.rubric_check='reference'"):
        rl_config.validate(rl_cfg)
    rl_cfg.rubric_check, rl_cfg.reward = "references", "g2p"
    with pytest.raises(ValueError, match="checks rubrics: rl.reward='rubric'"):
        rl_config.validate(rl_cfg)


def test_rubric_samples_need_a_sampling_model_generator():
    rl_cfg = rl_config.rl_defaults(tiny=True)
    for value in (0, -2):  # the ConfigDict itself refuses a float
        rl_cfg.rubric_samples = value
        with pytest.raises(ValueError, match="rl.rubric_samples.*positive int"):
            rl_config.validate(rl_cfg)
    rl_cfg.rubric_samples = 3
    with pytest.raises(ValueError, match="generator_temperature > 0"):
        rl_config.validate(rl_cfg)
    rl_cfg.generator_temperature = 1.0
    rl_config.validate(rl_cfg)
    for votes in (0, 4):
        rl_cfg.rubric_votes = votes
        with pytest.raises(ValueError, match=r"rl.rubric_votes.*\[1, rl.rubric_samples = 3\]"):
            rl_config.validate(rl_cfg)
    rl_cfg.rubric_votes = 3
    rl_config.validate(rl_cfg)
    rl_cfg.generator = "exact"
    with pytest.raises(ValueError, match="model Generator's rubric writer"):
        rl_config.validate(rl_cfg)


# rl.rubric_samples = 3: what the Generator's three draws of every image decode to (the tiny
# random model writes no rubric); their union, and the items two of them name (rl.rubric_votes).
DRAWS = (
    "1 | 3 | mentions a red circle | named\n2 | 1 | the background is white | called white\n",
    "1 | 2 | The background  is WHITE | again\n2 | 2 | mentions a blue star | named\n",
    "no rubric in this draw",
)
UNION = [
    {"criterion": "mentions a red circle", "check": "named", "weight": 3.0},
    {"criterion": "the background is white", "check": "called white", "weight": 1.0},
    {"criterion": "mentions a blue star", "check": "named", "weight": 2.0},
]


def test_rubric_samples_judge_the_agreed_items_of_each_images_draws_in_rl(tmp_path, monkeypatch):
    """rl.rubric_samples = 3 at T 1, rl.rubric_votes = 2: the real Generator samples 3 rubrics
    per image (its decoded texts replaced by DRAWS, in the sampler's image-major order), and every
    image's rubric, the one judged and logged, is the one item two draws name (in two spellings),
    with its first weight; the unreadable draw adds nothing but its problem. (The plain union,
    rubric_votes = 1: the role_curve probe in test_exact_roles_replace_the_models...)"""
    config = _toy_config()
    config.rl.judge, config.rl.num_steps = "exact", 1
    config.rl.rubric_samples, config.rl.generator_temperature = 3, 1.0
    config.rl.rubric_votes = 2
    write_rubrics, decode_texts = rollout_lib.write_rubrics, rollout_lib.decode_texts
    decoded = []

    def scripted(*args):
        decoded.append(len(decode_texts(*args)))
        return [DRAWS[row % 3] for row in range(decoded[-1])]

    def write(*args):
        monkeypatch.setattr(rollout_lib, "decode_texts", scripted)
        try:
            return write_rubrics(*args)
        finally:
            monkeypatch.setattr(rollout_lib, "decode_texts", decode_texts)

    monkeypatch.setattr(rollout_lib, "write_rubrics", write)
    rl.run_rl(config, str(tmp_path))
    assert decoded == [3 * config.rl.images_per_step]
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [row for row in map(json.loads, f) if row["stage"] == "rl" and row["step"] > 0]
    assert [row["rubric_items"] for row in rows] == [1.0]
    with open(tmp_path / "rl_samples.jsonl") as f:
        samples = [json.loads(line) for line in f]
    assert len(samples) == config.rl.images_per_step
    for sample in samples:
        assert sample["rubric"] == UNION[1:2]
        assert roles.parse_rubric(sample["rubric_text"])[0] == [roles.RubricItem(**UNION[1])]
        # a criterion repeated across draws is agreement, not a parser problem
        assert sample["generator_problems"] == ["draw 2: no rubric items found"]
        assert len(sample["decisions"][0]) == 1  # the exact Judge decided the one item


def test_next_image_shifts_each_images_entry_by_one():
    assert rollout_lib.next_image(["a", "b", "c"], 3) == ["b", "c", "a"]
    assert rollout_lib.next_image(([1], [2]), 2) == [[2], [1]]
    for entries, count in ((["a"], 1), (["a", "b"], 3)):
        with pytest.raises(ValueError, match=">= 2 images per update"):
            rollout_lib.next_image(entries, count)


def test_rubric_source_next_image_is_refused_where_there_is_no_other_image():
    rl_cfg = rl_config.rl_defaults(tiny=True)
    rl_cfg.rubric_source = "next_image"
    rl_config.validate(rl_cfg)
    rl_cfg.rubric_source = "other"
    with pytest.raises(ValueError, match="rl.rubric_source.*must be one of"):
        rl_config.validate(rl_cfg)
    rl_cfg.rubric_source, rl_cfg.images_per_step, rl_cfg.grad_accum_steps = "next_image", 1, 1
    with pytest.raises(ValueError, match="images_per_step >= 2"):
        rl_config.validate(rl_cfg)


def test_rubric_source_next_image_judges_each_image_with_the_next_images_rubric(tmp_path):
    """rl.rubric_source = "next_image" (the rubric reward's trivial baseline) with the world's
    exact Generator and Judge: every image of the update is judged with the exact rubric written
    for the next image (its objects, background and candidates' inventions), so every item of a
    group's logged rubric is true of the next group's scene, and the logged rubric truth, read
    against each group's own scene, falls below the exact rubric's 1.0."""
    config = _toy_config()
    config.rl.generator, config.rl.judge, config.rl.num_steps = "exact", "exact", 1
    config.rl.rubric_source = "next_image"
    rl.run_rl(config, str(tmp_path))
    scenes = {s.id: s for s in tw.make_scenes(config.data.seed, config.data.num_train_scenes)}
    with open(tmp_path / "rl_samples.jsonl") as f:
        samples = [json.loads(line) for line in f]
    assert len(samples) == config.rl.images_per_step >= 2
    for g, sample in enumerate(samples):
        facts = [toyroles.parse_criterion(i["criterion"]) for i in sample["rubric"]]
        assert facts and None not in facts
        following = scenes[samples[(g + 1) % len(samples)]["image_id"]]
        assert all(toyroles.fact_is_true(following, f) for f in facts), (g, sample["rubric"])
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [row for row in map(json.loads, f) if row["stage"] == "rl" and row["step"] > 0]
    assert len(rows) == 1 and rows[0]["true/rubric_item_truth"] < 0.9


def test_rubric_check_drops_the_false_items_of_a_learned_generators_rubric_in_rl(
    tmp_path, monkeypatch
):
    """rl.rubric_check = "references" in RL: the Generator (the tiny model, its parsed rubric
    replaced by one that names a white AND a black background, so an item is false in every
    group) writes; the exact Judge reads each image's complete reference and drops what it
    fails. Every kept item is true of its scene, every dropped one false, and the dropped ones
    are logged and written to rl_samples.jsonl."""
    config = _toy_config()
    config.rl.judge, config.rl.rubric_check, config.rl.num_steps = "exact", "references", 2
    rubric = [
        roles.RubricItem("mentions a red circle", "", 3.0),
        roles.RubricItem("the background is white", "", 1.0),
        roles.RubricItem("the background is black", "", 1.0),
    ]
    monkeypatch.setattr(rollout_lib, "write_rubrics", rl_patterns.fixed_rubric(rubric))
    rl.run_rl(config, str(tmp_path))
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [row for row in map(json.loads, f) if row["stage"] == "rl" and row["step"] > 0]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["true/rubric_item_truth"] == 1.0 and row["true/checked_out_item_truth"] == 0.0
        assert 1.0 <= row["rubric_checked_out"] <= 2.0  # one background at least; the circle
        assert row["rubric_items"] + row["rubric_checked_out"] == 3.0
    scenes = {s.id: s for s in tw.make_scenes(config.data.seed, config.data.num_train_scenes)}
    with open(tmp_path / "rl_samples.jsonl") as f:
        samples = [json.loads(line) for line in f]
    assert samples
    for sample in samples:
        scene = scenes[sample["image_id"]]
        for key, truth in (("rubric", True), ("checked_out", False)):
            for item in sample[key]:
                fact = toyroles.parse_criterion(item["criterion"])
                assert toyroles.fact_is_true(scene, fact) == truth, (key, item, scene)
