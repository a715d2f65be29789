"""LOOP-GRPO updates on evidence rollouts (mocojax.train.loop_train): the toy scorer reads answers,
not questions; rewards, LOOP and broadcast-control advantages of scripted rollouts by hand; one
jitted update on a tiny random model against the policy-gradient reference computed from the
model's own logits."""

import importlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from acecap_helpers import transcript

from mocojax import acecap_loop, config_utils, loop_grpo, model
from mocojax.data import pipeline, toyworld as tw
from mocojax.train import loop_train, state as state_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONE_CIRCLE = tw.Scene("hand-1", "white", (tw.Obj("circle", "red", "large", "top left"),))
C0 = "A red circle."
# On ONE_CIRCLE's six Gold-MCQ items (count, colour at the top left, size, place, a red circle?,
# a green square?): c_0 states count, colour and presence, not size or place: (1 - 0.5 - 0.5 -
# 0.5 + 1 + 1) / 6 = 0.25; with "It is at the top left." colour-at-place and place too: 4.5 / 6.
R0, R_PLACE = 0.25, 0.75


def _rollouts():
    """Two images (both ONE_CIRCLE) x G = 2, K = 2. Image 0: rollout 0 asks "Is there a blue
    star?" (answer: the place), says READY and writes the full caption; rollout 1 says READY at
    once and repeats c_0. Image 1: both rollouts say READY at once and repeat c_0."""
    ask = ["ASK: Is there a blue star?", "READY"]
    full = "A large red circle at the top left."
    rows = [(ask, ["It is at the top left."], full)] + [(["READY"], [], C0)] * 3
    return acecap_loop.EvidenceRollouts(
        initial_captions=[C0, C0],
        num_rollouts=2,
        composer_texts=[replies for replies, _, _ in rows],
        questions=[["Is there a blue star?"], [], [], []],
        answers=[answers for _, answers, _ in rows],
        final_captions=[final for _, _, final in rows],
        asked=np.array([[True, False], [False, False], [False, False], [False, False]]),
        stopped=np.ones(4, bool),
        unparseable=np.zeros(4, bool),
        transcripts=[transcript(C0, *row) for row in rows],
    )


def _loop(max_questions=2):
    loop = loop_grpo.loop_defaults()
    loop.max_questions = max_questions
    return loop


def test_padded_length_uses_the_buckets_then_multiples_of_128():
    assert loop_train.padded_length(100, (128, 384)) == 128
    assert loop_train.padded_length(129, (128, 384)) == 384
    assert loop_train.padded_length(385, (128, 384)) == 512
    assert loop_train.padded_length(1, ()) == 128


def test_toy_scorer_reads_answers_not_questions():
    score = loop_train.toy_scorer([ONE_CIRCLE])
    assert score(0, C0) == pytest.approx(R0)
    evidence = acecap_loop.serialise_evidence(
        C0, ["Is there a blue star?"], ["It is at the top left."]
    )
    assert loop_train.evidence_statements(evidence) == "A red circle.\nIt is at the top left."
    assert score(0, evidence) == pytest.approx(R_PLACE)
    # read as a caption, the question would state a second object (the count answer turns wrong)
    assert score(0, "A red circle.\nIs there a blue star?") < R0


def test_rewards_and_advantages_by_hand():
    rollouts, loop = _rollouts(), _loop()
    rewards = loop_train.score_rollouts(rollouts, loop_train.toy_scorer([ONE_CIRCLE] * 2), 2)
    np.testing.assert_allclose(rewards.initial, [R0, R0])
    np.testing.assert_allclose(rewards.evidence, [R_PLACE, R0, R0, R0])
    np.testing.assert_allclose(rewards.leave_one_out, [[R0, 0], [0, 0], [0, 0], [0, 0]])
    np.testing.assert_allclose(rewards.final, [1.0, R0, R0, R0])
    a_q, a_s, a_f = loop_train.rollout_advantages(rollouts, rewards, loop)
    # image 0: b = (1 - 0.25) + (min(0.75, 1) - 0.25) = 1.25 and 0; stops 1.25 - 0.01 and 0; one
    # question only (u^Q = 0.48): a type with one instance gets 0. Image 1: all equal, all 0.
    std = 1.24 / 2
    np.testing.assert_allclose(a_q, np.zeros((4, 2)))
    np.testing.assert_allclose(a_s, [std / (std + 1e-6), -std / (std + 1e-6), 0, 0], rtol=1e-6)
    np.testing.assert_allclose(a_f, [0.625 / (0.625 + 1e-6), -0.625 / (0.625 + 1e-6), 0, 0])
    # the control: GRPO's advantage of r^F (+-1) on every span of the rollout, the question too
    c_q, c_s, c_f = loop_train.rollout_advantages(rollouts, rewards, loop, control=True)
    one = 0.375 / (0.375 + 1e-6)
    np.testing.assert_allclose(c_q, [[one, 0], [0, 0], [0, 0], [0, 0]], rtol=1e-6)
    np.testing.assert_allclose(c_s, [one, -one, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(c_f, [one, -one, 0, 0], rtol=1e-6)
    with pytest.raises(ValueError, match=r"loop.max_questions"):
        loop_train.rollout_advantages(rollouts, rewards, _loop(3))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.syspath_prepend(REPO)
        config = importlib.import_module("configs.toyworld").get_config("tiny")
    config.model.tiny = dict(config.model.tiny, num_layers=1)
    setup = config_utils.build_setup(config, str(tmp_path_factory.mktemp("tiny")))
    return setup.model_config, setup.processor, setup.load_params()


def test_one_update_is_the_policy_gradient_on_the_span_tokens(tiny):
    """loop_step with SGD(lr 1) moves the params by exactly -grad of -sum M A log pi / sum M,
    log pi from the model's logits (ratio 1: on-policy), where M marks the Composer's replies
    only; its loss is -sum M A / sum M."""
    cfg, processor, params = tiny
    rollouts, loop = _rollouts(), _loop()
    rewards = loop_train.score_rollouts(rollouts, loop_train.toy_scorer([ONE_CIRCLE] * 2), 2)
    advantages = loop_train.rollout_advantages(rollouts, rewards, loop, control=True)
    batch = loop_train.loop_batch(cfg, processor, rollouts, advantages, num_micro=2)
    layout = acecap_loop.composer_layout(processor, rollouts)
    length = layout["input_ids"].shape[1]
    assert batch["input_ids"].shape[-1] == loop_train.padded_length(length) > length
    layout = pipeline.pad_to(layout, loop_train.padded_length(length), processor.pad_token_id)
    mask = batch["span_mask"].reshape(layout["span_kind"].shape)
    np.testing.assert_array_equal(mask, layout["span_kind"] != loop_grpo.SPAN_NONE)
    adv = batch["advantages"].reshape(mask.shape)
    # the question's tokens carry rollout 0's broadcast advantage, the observation none
    question = layout["span_kind"] == loop_grpo.SPAN_QUESTION
    assert question[0].sum() > 0 and not question[1:].any()
    np.testing.assert_allclose(adv[0][question[0]], advantages[0][0, 0])
    expected_loss = -(adv * mask)[:, 1:].sum() / mask[:, 1:].sum()

    def reference_loss(p):
        total, count = 0.0, 0.0
        for a in range(batch["input_ids"].shape[0]):
            micro = jax.tree.map(lambda x: x[a], batch)
            logits = model.apply(
                cfg,
                p,
                micro["input_ids"],
                micro["attention_mask"],
                micro["positions"],
                micro["pixel_values"],
                micro["vision"],
            )[0]
            logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), -1)
            logp = jnp.take_along_axis(logp, micro["input_ids"][:, 1:, None], -1)[..., 0]
            m = micro["span_mask"][:, 1:]
            total += jnp.sum(m * micro["advantages"][:, 1:] * logp)
            count += jnp.sum(m)
        return -total / count

    reference_grads = jax.jit(jax.grad(reference_loss))(params)
    optimizer = optax.sgd(1.0)
    state = state_lib.init_state(params, optimizer, jax.random.key(0))
    step = loop_train.make_loop_step(cfg, optimizer)
    new_state, metrics = step(jax.tree.map(jnp.copy, state), batch)
    assert float(metrics["loss"]) == pytest.approx(expected_loss, rel=1e-5)
    assert float(metrics["ratio_mean"]) == pytest.approx(1.0, abs=1e-6)
    moved = jax.tree.map(lambda new, old: old - new, new_state["params"], params)
    leaves = jax.tree.leaves(jax.tree.map(lambda m, g: (m, g), moved, reference_grads))
    pairs = list(zip(leaves[::2], leaves[1::2]))
    assert any(float(jnp.abs(g).max()) > 0 for _, g in pairs)
    for m, g in pairs:
        np.testing.assert_allclose(np.asarray(m), np.asarray(g), rtol=2e-4, atol=1e-6)


def test_the_loop_stage_runs_logs_evaluates_and_resumes_bitwise(tmp_path, caplog):
    """configs/acecap_loop.py:tiny's loop stage from the config's initial params: two updates
    logged, sampled and checkpointed, the held-out eval written; 2 updates + a resumed third
    give the same params as 3 straight (rng, data position and optimizer state restored)."""
    import json

    from configs import acecap_loop
    from mocojax import checkpoint, main

    def run(workdir, num_steps, eval_at_start=False):
        config = acecap_loop.get_config("tiny")
        config.stages = ("loop",)
        config.loop.num_steps, config.loop.eval_at_start = num_steps, eval_at_start
        main.run(config, str(workdir))
        return config

    config = run(tmp_path / "a", 2, eval_at_start=True)
    with open(tmp_path / "a" / "metrics.jsonl") as f:
        rows = [r for r in map(json.loads, f) if r["stage"] == "loop"]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("reward/initial", "evidence_retention_gap", "questions_per_rollout", "pg_loss"):
        assert key in rows[-1]
    with open(tmp_path / "a" / "loop_samples.jsonl") as f:
        samples = [json.loads(line) for line in f]
    assert [s["step"] for s in samples] == [1, 1, 2, 2]  # images_per_step 2, logged every step
    assert all(len(s["rollouts"]) == config.loop.num_rollouts for s in samples)
    with open(tmp_path / "a" / "eval_loop_2.json") as f:
        result = json.load(f)
    assert result["num_scenes"] == 2 and 0.0 <= result["mcq/final_right_rate"] <= 1.0
    assert os.path.exists(tmp_path / "a" / "eval_loop_0.json")  # eval_at_start: the SFT loop
    with caplog.at_level("INFO"):
        run(tmp_path / "a", 3)
    assert "resumed the loop stage from step 2" in caplog.text
    run(tmp_path / "b", 3)
    cfg = config_utils.build_setup(config, str(tmp_path / "a")).model_config
    resumed, straight = (
        checkpoint.restore_params(str(tmp_path / w), "loop", cfg, step=3)[0] for w in ("a", "b")
    )
    for x, y in zip(jax.tree.leaves(resumed), jax.tree.leaves(straight)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
