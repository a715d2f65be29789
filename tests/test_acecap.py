"""ACE-Cap: Gold-MCQ items, the option-letter parser, the G2P reward, LOOP-GRPO's utilities,
advantages, span masks and loss (hand-computed numbers), and G2P-reward RL end to end."""

import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mocojax import acecap, loop_grpo
from mocojax.data import toyworld as tw
from mocojax.train import rl_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONE_CIRCLE = tw.Scene("hand-1", "white", (tw.Obj("circle", "red", "large", "top left"),))
COLOUR_ITEM = acecap.MCQItem(
    "What colour is the star?", ("green", "red", "blue", "yellow"), "B", "colour", {}
)
SIZE_ITEM = acecap.MCQItem("What size is the red star?", ("large", "small"), "A", "size", {})


# ---------------------------------------------------------------------------- Gold-MCQ items


def test_toy_mcq_items_of_a_one_object_scene():
    items = acecap.toy_mcq(ONE_CIRCLE)
    # count, colour / size / place of the one object, presence yes and presence no.
    assert [i.kind for i in items] == ["count", "colour", "size", "place", "presence", "presence"]
    gold = {"count": "1", "colour": "red", "size": "large", "place": "top left"}
    for item in items:
        assert item.answer in "ABCD" and item.answer != "E"
        assert len(set(item.options)) == len(item.options)
        value = item.options["ABCD".index(item.answer)]
        if item.kind in gold:
            assert value == gold[item.kind]
        assert set(item.options) <= set(acecap.ANSWER_DOMAINS[item.kind])
    by_kind = {i.kind: i for i in items[:4]}
    assert sorted(by_kind["count"].options) == ["1", "2", "3", "4"]  # A-D: the whole domain
    assert len(by_kind["colour"].options) == 4 and len(by_kind["place"].options) == 4
    assert sorted(by_kind["size"].options) == ["large", "small"]  # a two-valued question: A-B
    yes, no = items[4], items[5]
    assert yes.options[ord(yes.answer) - 65] == "yes" and no.options[ord(no.answer) - 65] == "no"
    assert yes.question == "Is there a red circle?"
    assert acecap.toy_mcq(ONE_CIRCLE) == items  # the same scene always gets the same items


def test_gold_letters_are_spread_over_a_to_d():
    scenes = tw.make_scenes(3, 200)
    letters = [item.answer for s in scenes for item in acecap.toy_mcq(s) if item.kind == "count"]
    counts = {letter: letters.count(letter) for letter in "ABCD"}
    assert min(counts.values()) >= 30, counts  # 200 items, 50 each on average; never E


def test_item_format_lists_not_given_last():
    assert (
        acecap.format_item(SIZE_ITEM) == "What size is the red star? A. large B. small E. Not Given"
    )
    prompt = acecap.mcq_prompt([SIZE_ITEM], "A big star.")
    assert prompt.endswith(
        "1 | What size is the red star? A. large B. small E. Not Given\nText:\nA big star."
    )


# ---------------------------------------------------------------------------- parser and scores


@pytest.mark.parametrize(
    "raw, item, letter",
    [
        ("B", COLOUR_ITEM, "B"),
        ("(c)", COLOUR_ITEM, "C"),
        ("Option D", COLOUR_ITEM, "D"),
        ("answer: a", COLOUR_ITEM, "A"),
        ("B. red", COLOUR_ITEM, "B"),
        ("(B) red", COLOUR_ITEM, "B"),
        ("Option B: red", COLOUR_ITEM, "B"),
        ("C. red", COLOUR_ITEM, "B"),  # letter and text disagree: the text decides
        ("red", COLOUR_ITEM, "B"),
        ("It is blue.", COLOUR_ITEM, "C"),  # an option's text
        ("E", COLOUR_ITEM, "E"),
        ("Not Given", COLOUR_ITEM, "E"),
        ("not stated", COLOUR_ITEM, "E"),
        ("E. Not Given", COLOUR_ITEM, "E"),
        ("big", SIZE_ITEM, "A"),  # the toy world's synonym of an option
        ("C", SIZE_ITEM, None),  # a letter the item does not offer
        ("F", COLOUR_ITEM, None),
        ("purple", COLOUR_ITEM, None),
        ("banana", COLOUR_ITEM, None),
        ("", COLOUR_ITEM, None),
        (None, COLOUR_ITEM, None),
    ],
)
def test_parse_choice(raw, item, letter):
    assert acecap.parse_choice(raw, item) == letter


def test_parse_choices_counts_unreadable_answers():
    text = "Sure.\n1 | B\n3 | ???\n2 | not given\n1 | C"  # the first answer to an id wins
    assert acecap.parse_choices(text, [COLOUR_ITEM, SIZE_ITEM, COLOUR_ITEM]) == (
        ["B", "E", None],
        1,
    )
    assert acecap.parse_choices(None, [COLOUR_ITEM, SIZE_ITEM]) == ([None, None], 2)


def test_scores_and_reward_by_hand():
    np.testing.assert_array_equal(
        acecap.choice_scores(["A", "E", "C", None], ["A", "B", "B", "D"]), [1.0, -0.5, -1.0, -1.0]
    )
    assert acecap.g2p_reward(["A", "E", "C", None], ["A", "B", "B", "D"]) == pytest.approx(-0.375)
    with pytest.raises(ValueError, match="at least one question"):
        acecap.g2p_reward([], [])
    with pytest.raises(ValueError, match="3 choices for 2 questions"):
        acecap.choice_scores(["A", "B", "C"], ["A", "B"])


def _reward(caption, scene):
    items = acecap.toy_mcq(scene)
    return acecap.g2p_reward(
        [acecap.oracle_choice(caption, i) for i in items], [i.answer for i in items]
    )


def test_oracle_g2p_separates_supported_omitted_and_contradicted_facts():
    # Every item right: count 1, colour, size, place, "red circle? yes", "<absent>? no".
    assert (
        _reward("A large red circle in the top left. The background is white.", ONE_CIRCLE) == 1.0
    )
    # Count right, colour-at-top-left Not Given (no place), size wrong (small is offered),
    # place Not Given, both presence items right: (1 - 0.5 - 1 - 0.5 + 1 + 1) / 6.
    assert _reward("A small red circle.", ONE_CIRCLE) == pytest.approx(1.0 / 6.0)
    assert _reward("", ONE_CIRCLE) == -0.5  # says nothing: every item E
    colour = acecap.toy_mcq(ONE_CIRCLE)[1]
    wrong = next(o for o in colour.options if o != "red")
    assert (
        acecap.oracle_choice(f"A large {wrong} circle in the top left.", colour)
        == "ABCD"[colour.options.index(wrong)]
    )
    absent = next(c for c in tw.COLOURS if c not in colour.options)  # stated but not offered: E
    assert acecap.oracle_choice(f"A large {absent} circle in the top left.", colour) == "E"


# ---------------------------------------------------------------------------- LOOP-GRPO


def test_loop_utilities_by_hand():
    r_initial, r_evidence, r_final = [0.0, 0.0, 0.2], [0.5, 0.3, 0.2], [0.4, 0.3, 0.4]
    asked = np.array([[1, 1], [1, 0], [0, 0]], bool)
    r_loo = [[0.25, 0.5], [0.0, 9.0], [9.0, 9.0]]  # 9: not asked, never read
    np.testing.assert_allclose(
        loop_grpo.question_utilities(r_evidence, r_loo, asked, c_q=0.02),
        [[0.23, -0.02], [0.28, 0.0], [0.0, 0.0]],
        atol=1e-7,
    )
    # b = (rF - r0) + lambda [min(rE, rF) - r0], lambda 0.5: 0.4 + 0.2, 0.3 + 0.15, 0.2 + 0.
    base = loop_grpo.base_utilities(r_final, r_evidence, r_initial, lam=0.5)
    np.testing.assert_allclose(base, [0.6, 0.45, 0.2], atol=1e-7)
    np.testing.assert_allclose(
        loop_grpo.stop_utilities(base, [2, 1, 0], c_s=0.01), [0.58, 0.44, 0.2], atol=1e-7
    )
    with pytest.raises(ValueError, match="must be"):
        loop_grpo.question_utilities(r_evidence, r_loo, asked[:, :1], c_q=0.02)


def test_loop_advantages_normalise_each_action_type_and_skip_forced_stops():
    u_question = np.array([[0.23, -0.02], [0.28, 0.0], [0.0, 0.0]])
    asked = np.array([[1, 1], [1, 0], [0, 0]], bool)
    stopped = np.array([False, True, True])  # rollout 0 hit the budget K = 2: no stop action
    a_q, a_s, a_f = loop_grpo.loop_advantages(
        u_question, asked, [0.58, 0.44, 0.2], stopped, [0.6, 0.45, 0.2], eps_norm=1e-6
    )
    # Questions {0.23, -0.02, 0.28}: mean 0.163333, population std 0.131233.
    np.testing.assert_allclose(a_q, [[0.507997, -1.396991], [0.888994, 0.0], [0.0, 0.0]], atol=1e-5)
    # Stops {0.44, 0.2} (0.58 is the forced rollout's, left out): mean 0.32, std 0.12.
    np.testing.assert_allclose(a_s, [0.0, 0.999992, -0.999992], atol=1e-5)
    # Syntheses {0.6, 0.45, 0.2}: mean 0.416667, std 0.164992.
    np.testing.assert_allclose(a_f, [1.111161, 0.202029, -1.313190], atol=1e-5)
    # One question in the group, or all stops equal: advantage exactly 0, as in grpo_advantages.
    a_q, a_s, _ = loop_grpo.loop_advantages(
        [[0.3, 0.0]], [[True, False]], [0.1, 0.1], [True, True], [0.0, 1.0], 1e-6
    )
    assert np.asarray(a_q).tolist() == [[0.0, 0.0]] and np.asarray(a_s).tolist() == [0.0, 0.0]


def test_group_advantages_from_rewards_and_config_by_hand():
    loop = loop_grpo.loop_defaults()
    loop.lam, loop.max_questions = 0.5, 2
    asked, stopped = [[True, True], [True, False], [False, False]], [False, True, True]
    a_q, a_s, a_f = loop_grpo.group_advantages(
        [0.0, 0.0, 0.2],
        [0.5, 0.3, 0.2],
        [[0.25, 0.5], [0.0, 9.0], [9.0, 9.0]],
        [0.4, 0.3, 0.4],
        asked,
        stopped,
        loop,
    )
    # The same rollouts as above: c_q 0.02, c_s 0.01 and lambda 0.5 from the config.
    np.testing.assert_allclose(a_q, [[0.507997, -1.396991], [0.888994, 0.0], [0.0, 0.0]], atol=1e-5)
    np.testing.assert_allclose(a_s, [0.0, 0.999992, -0.999992], atol=1e-5)
    np.testing.assert_allclose(a_f, [1.111161, 0.202029, -1.313190], atol=1e-5)
    args = ([0.0] * 3, [0.5] * 3, [[0.0, 0.0]] * 3, [0.4] * 3)
    with pytest.raises(ValueError, match="finalised by force"):
        loop_grpo.group_advantages(*args, asked, [True, True, True], loop)
    with pytest.raises(ValueError, match="first T_g questions"):
        loop_grpo.group_advantages(
            *args, [[False, True], [True, False], [False, False]], stopped, loop
        )
    with pytest.raises(ValueError, match="K = loop.max_questions = 2"):
        loop_grpo.group_advantages(*args, [[True], [True], [False]], stopped, loop)


def test_span_layout_and_token_advantages():
    n, q, s, f = (
        loop_grpo.SPAN_NONE,
        loop_grpo.SPAN_QUESTION,
        loop_grpo.SPAN_STOP,
        loop_grpo.SPAN_FINAL,
    )
    # prompt+c_0, question 0, its answer, question 1, its answer, READY, scheduler, final caption.
    kind, index = loop_grpo.span_layout(
        [(n, 2), (q, 2), (n, 1), (q, 1), (n, 1), (s, 1), (n, 1), (f, 2)]
    )
    assert kind.tolist() == [0, 0, 1, 1, 0, 1, 0, 2, 0, 3, 3]
    assert index.tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    # Rollout 1 was forced to finalise at K: its layout has no READY; a stray stop token is masked.
    forced, forced_index = loop_grpo.span_layout(
        [(n, 2), (q, 1), (n, 2), (q, 2), (n, 1), (s, 1), (f, 2)]
    )
    adv, mask = loop_grpo.token_advantages(
        np.stack([kind, forced]),
        np.stack([index, forced_index]),
        adv_question=[[0.5, -1.5], [2.0, 3.0]],
        adv_stop=[0.7, 9.0],
        adv_final=[-0.25, 1.25],
        stopped=[True, False],
    )
    np.testing.assert_allclose(
        adv,
        [
            [0, 0, 0.5, 0.5, 0, -1.5, 0, 0.7, 0, -0.25, -0.25],
            [0, 0, 2.0, 0, 0, 3.0, 3.0, 0, 0, 1.25, 1.25],
        ],
    )
    np.testing.assert_array_equal(
        mask, [[0, 0, 1, 1, 0, 1, 0, 1, 0, 1, 1], [0, 0, 1, 0, 0, 1, 1, 0, 0, 1, 1]]
    )
    with pytest.raises(ValueError, match="bad span"):
        loop_grpo.span_layout([(7, 1)])


def test_loop_loss_by_hand():
    # Ratios 1, 1.5, 0.5 on three span tokens (the fourth is masked), advantages 1, 1, -1:
    # -min(rho A, clip(rho, 0.8, 1.2) A) = -1, -1.2, +0.8 -> token mean -1.4 / 3.
    old = np.log(np.array([[0.2, 0.2, 0.2, 0.2]], np.float32))
    logprobs = old + np.log(np.array([[1.0, 1.5, 0.5, 1.0]], np.float32))
    token_adv = np.array([[1.0, 1.0, -1.0, 5.0]], np.float32)
    mask = np.array([[1, 1, 1, 0]], np.float32)
    loss, metrics = loop_grpo.loop_loss(logprobs, old, token_adv, mask, clip_eps=0.2)
    assert float(loss) == pytest.approx(-1.4 / 3, abs=1e-6)
    # k3 KL with ref - logprob = [0, ln 2, 0, 9]: e^d - d - 1 = [0, 1 - ln 2, 0, (masked)], token mean / 3.
    ref = logprobs + np.array([[0.0, np.log(2.0), 0.0, 9.0]], np.float32)
    loss, metrics = loop_grpo.loop_loss(
        logprobs, old, token_adv, mask, clip_eps=0.2, kl_beta=0.5, ref_logprobs=ref
    )
    assert float(metrics["kl"]) == pytest.approx((1 - np.log(2.0)) / 3, abs=1e-6)
    assert float(loss) == pytest.approx(-1.4 / 3 + 0.5 * (1 - np.log(2.0)) / 3, abs=1e-6)
    assert float(metrics["clip_frac_high"]) == pytest.approx(
        1 / 3, abs=1e-6
    )  # token 1: A > 0, rho > 1.2


def test_loop_config_defaults_and_validation():
    loop = loop_grpo.loop_defaults()
    assert (loop.c_q, loop.c_s, loop.lam, loop.max_questions, loop.eps_norm) == (
        0.02,
        0.01,
        1.0,
        3,
        1e-6,
    )
    loop_grpo.validate(loop)
    for key, value in (
        ("c_q", -0.1),
        ("lam", float("nan")),
        ("eps_norm", 0.0),
        ("max_questions", 0),
    ):
        bad = loop_grpo.loop_defaults()
        bad[key] = value
        with pytest.raises(ValueError, match=f"config.loop.{key}="):
            loop_grpo.validate(bad)


def test_reward_switch_is_validated():
    rl = rl_config.rl_defaults(tiny=True)
    rl.reward = "mcq"
    with pytest.raises(ValueError, match=r"config.rl.reward='mcq'"):
        rl_config.validate(rl)


# ---------------------------------------------------------------------------- RL on the G2P reward


def test_g2p_rl_rewards_known_captions_by_hand(tmp_path, monkeypatch):
    """The Policy's samples are real, but each group's captions are replaced by [reference, "",
    reference, ""]: the oracle judge gives R_G = 1 (every item right) and -0.5 (every item Not
    Given), so the logged rewards and fractions are known by hand, and GRPO has signal."""
    from mocojax.train import g2p, rl, rl_evals, rollout as rollout_lib

    monkeypatch.syspath_prepend(REPO)
    config = importlib.import_module("configs.acecap_g2p").get_config("tiny")
    config.rl.num_steps = 2
    config.rl.lr, config.rl.warmup_ratio = 1e-2, 0.0  # both updates move the Policy
    scenes = {s.id: s for s in tw.make_scenes(config.data.seed, config.data.num_train_scenes)}
    policy_captions = rollout_lib.policy_captions

    def known_captions(cfg, params, processor, images, rl_cfg, rng):
        out = policy_captions(cfg, params, processor, images, rl_cfg, rng)
        ids = [e["id"] for e in current_group]
        refs = [tw.reference_captions(scenes[i], config.data.seed)[0] for i in ids]
        return (*out[:4], [[ref, "", ref, ""] for ref in refs])

    current_group = []
    collect = g2p.G2PSource.collect

    def recording_collect(self, *args, **kwargs):
        current_group[:] = args[5]  # the step's images: {id, image, references}
        return collect(self, *args, **kwargs)

    def no_gate(*args):
        raise AssertionError("the rubric Judge gate ran for the G2P reward")

    monkeypatch.setattr(rollout_lib, "policy_captions", known_captions)
    monkeypatch.setattr(g2p.G2PSource, "collect", recording_collect)
    monkeypatch.setattr(rl_evals, "judge_gate", no_gate)
    rl.run_rl(config, str(tmp_path))

    with open(tmp_path / "metrics.jsonl") as f:
        rows = [r for r in map(json.loads, f) if r["stage"] == "rl" and r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["reward_mean"] == pytest.approx(0.25)  # (1 - 0.5 + 1 - 0.5) / 4
        assert row["g2p/right_frac"] == pytest.approx(0.5) and row[
            "g2p/not_given_frac"
        ] == pytest.approx(0.5)
        assert row["g2p/wrong_frac"] == 0.0 and row["g2p/unreadable_frac"] == 0.0
        assert row["true/caption_f1"] == pytest.approx(0.5)  # references: F1 1; empty captions: 0
        assert (
            row["signal_frac"] == 1.0 and row["no_signal_skipped"] == 0 and row["update_norm"] > 0
        )
        assert "tracking_error" not in row and "rubric_items" not in row  # no role copy, no rubric
    with open(tmp_path / "rl_samples.jsonl") as f:
        samples = [json.loads(line) for line in f]
    assert len(samples) == 2 * config.rl.images_per_step
    for sample in samples:
        assert sample["rewards"] == [1.0, -0.5, 1.0, -0.5]
        assert all(item["answer"] in "ABCD" for item in sample["mcq"])
        assert sample["choices"][1] == ["E"] * len(sample["mcq"])


def _hand_score(choice, answer):
    return 1.0 if choice == answer else -0.5 if choice == "E" else -1.0


def test_g2p_tiny_config_runs_two_rl_steps_through_main_with_a_model_judge(tmp_path):
    """configs/acecap_g2p.py:tiny through python -m mocojax.main (SFT, then 2 RL steps) with the
    SFT model as a frozen text-only judge through the sampler: every logged reward is the mean of
    +1 / -0.5 / -1 over the logged letters (unreadable: -1)."""
    workdir = tmp_path / "run"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mocojax.main",
            "--config",
            "configs/acecap_g2p.py:tiny",
            "--workdir",
            str(workdir),
            "--config.stages=('sft', 'rl')",
            "--config.rl.num_steps=2",
            "--config.rl.judge=frozen",
            "--config.rl.judge_max_new_tokens=12",
        ],
        cwd=REPO,
        env=env,
        check=True,
        timeout=900,
    )
    with open(workdir / "metrics.jsonl") as f:
        rows = [r for r in map(json.loads, f) if r["stage"] == "rl" and r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert (
            0.0 <= row["g2p/unreadable_frac"] <= 1.0
            and 0.0 <= row["true/judge_choice_accuracy"] <= 1.0
        )
        fractions = row["g2p/right_frac"] + row["g2p/not_given_frac"] + row["g2p/wrong_frac"]
        assert fractions == pytest.approx(1.0)
        assert (
            "tracking_error_frozen" in row and "tracking_error" not in row
        )  # only the judge's frozen copy
    with open(workdir / "rl_samples.jsonl") as f:
        samples = [json.loads(line) for line in f]
    assert len(samples) == 2 * 2  # 2 steps x images_per_step 2
    for sample in samples:
        answers = [item["answer"] for item in sample["mcq"]]
        assert len(sample["judge_texts"]) == len(sample["captions"]) == 4
        for choices, reward in zip(sample["choices"], sample["rewards"]):
            assert reward == pytest.approx(
                np.mean([_hand_score(c, a) for c, a in zip(choices, answers)]), abs=1e-6
            )


def test_g2p_rl_on_image_records_uses_their_gold_mcq_items(tmp_path, monkeypatch):
    """Real-format image records (JPEG / PNG files, records.py JSONL) whose `mcq` field holds
    their Gold-MCQ items (what `python -m mocojax.gold_mcq` writes): RL on R_G from the shipped toy
    base with a frozen model judge, two real updates. The judge's replies are scripted from the
    items it is given (the gold letter for half the captions, E for the other half), so the
    rewards are known by hand: 1 and -0.5. No toy truth is logged for images without a scene;
    records without items, and the exact (toy-only) judge, are refused before any work."""
    from test_distill import write_images

    from mocojax.train import g2p, rl, rl_evals

    data = str(tmp_path / "data")
    path = write_images(data, 4, sizes=[(96, 96)])
    rows = [json.loads(line) for line in open(path)]
    for k, row in enumerate(rows):
        row["mcq"] = [
            {
                "question": "What flies over the beach?",
                "options": ["a bird", "a kite"],
                "answer": "B",
            },
            {
                "question": f"Which picture is this? ({k})",
                "options": ["1", "2", "3"],
                "answer": "C",
            },
        ]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    monkeypatch.syspath_prepend(REPO)
    config = importlib.import_module("configs.acecap_g2p").get_config("tiny")
    config.stages = ("rl",)
    config.data.source, config.data.train_path = "jsonl", path
    config.model.init_from = os.path.join(REPO, "mocojax", "assets", "toybase")
    config.rl.evals, config.rl.judge, config.rl.num_steps = "", "frozen", 2
    config.rl.lr, config.rl.warmup_ratio = 1e-2, 0.0

    records = rl.rl_records(config)
    assert records[0]["mcq"][0] == acecap.text_item(
        "What flies over the beach?", ["a bird", "a kite"], "B"
    )
    with pytest.raises(ValueError, match=r"record 'im0' \(and 0 more\) has no Gold-MCQ items"):
        g2p.G2PSource(config, [{k: v for k, v in records[0].items() if k != "mcq"}])
    config.rl.judge = "exact"
    with pytest.raises(ValueError, match=r"'im0' is not a toy-world scene; the exact judge"):
        g2p.G2PSource(config, records)
    config.rl.judge = "frozen"

    given = []

    def scripted_judge(cfg, params, processor, mcqs, captions, rl_cfg, rng):
        given.extend(mcqs)
        right = "\n".join(f"{j} | {item.answer}" for j, item in enumerate(mcqs[0], 1))
        blank = "\n".join(f"{j} | E" for j in range(1, len(mcqs[0]) + 1))
        return [[right if k % 2 == 0 else blank for k in range(len(c))] for c in captions]

    def no_gate(*args):
        raise AssertionError("the rubric Judge gate ran for the G2P reward")

    monkeypatch.setattr(g2p, "judge_mcq", scripted_judge)
    monkeypatch.setattr(rl_evals, "judge_gate", no_gate)
    rl.run_rl(config, str(tmp_path / "run"))

    by_id = {r["id"]: r["mcq"] for r in records}
    assert len(given) == 2 * config.rl.images_per_step
    assert all(items in by_id.values() for items in given)
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        metrics = [r for r in map(json.loads, f) if r["stage"] == "rl" and r["step"] > 0]
    assert [r["step"] for r in metrics] == [1, 2]
    for row in metrics:
        assert row["reward_mean"] == pytest.approx(0.25)  # (1 - 0.5 + 1 - 0.5) / 4
        assert row["g2p/right_frac"] == pytest.approx(0.5)
        assert row["g2p/not_given_frac"] == pytest.approx(0.5)
        assert row["signal_frac"] == 1.0 and row["update_norm"] > 0
        assert not any(k.startswith("true/") for k in row)  # no scene: no toy truth
    with open(tmp_path / "run" / "rl_samples.jsonl") as f:
        samples = [json.loads(line) for line in f]
    assert len(samples) == 2 * config.rl.images_per_step
    for sample in samples:
        assert sample["mcq"] == [acecap.item_dict(i) for i in by_id[sample["image_id"]]]
        assert sample["rewards"] == [1.0, -0.5, 1.0, -0.5] and "truth" not in sample
