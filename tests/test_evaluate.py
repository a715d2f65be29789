"""Evaluation protocols (mocojax.eval.{winrate,rank,vqa,judges,suite}, python -m mocojax.evaluate):
hand-computed scores with the toy world's exact oracle, tolerant parsers, a checkpoint against
itself at 50%, and bad input as a clear error or a counted skip."""

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from configs import toyworld
from mocojax import checkpoint, config_utils
from mocojax.data import toyroles, toyworld as tw
from mocojax.eval import judges, rank, suite, vqa, winrate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORACLE = judges.OracleJudge()


def _records(n, start=0):
    return toyroles.image_records(1, n, start=start)


def _reference(record):
    return tw.reference_captions(record["scene"], 1)[0]


class _FixedJudge:
    """Answers every request with the same text (a position-biased or broken judge)."""

    name = "fixed"

    def __init__(self, text):
        self.text = text

    def compare(self, records, pairs):
        return [self.text] * len(pairs)

    def rank(self, records, caption_lists):
        return [self.text] * len(caption_lists)

    def read(self, records, captions, questions):
        return [self.text] * len(captions)


# ---- pairwise win rate ----


@pytest.mark.parametrize(
    "text, verdict",
    [
        ("Caption 1 is better", 1),
        ("caption 2 is the better one.", 2),
        ("Tie", 0),
        ("It's a tie.", 0),
        ("Caption 1 is better on colours, but overall Caption 2 is better", 2),
        ("CAPTION #1 IS BETTER", 1),
        ("Both are fine", None),
        ("", None),
        (None, None),
        ("Caption 3 is better", None),
        ("tiebreak: none", None),
    ],
)
def test_parse_verdict(text, verdict):
    assert winrate.parse_verdict(text) == verdict


def test_parse_verdict_is_linear_on_adversarial_text():
    start = time.perf_counter()
    assert winrate.parse_verdict("caption " + " " * 200_000 + "x" + "caption 1 " * 20_000) is None
    assert time.perf_counter() - start < 1.0


def test_win_rate_hand_computed_with_the_oracle():
    """Pairs: perfect vs empty (win), perfect vs perfect (tie), empty vs perfect (loss), perfect
    vs one-object caption (win): 2 wins, 1 tie, 1 loss -> (1 + 0.5 + 0 + 1) / 4 = 0.625."""
    records = _records(4)
    ref = [_reference(r) for r in records]
    one = tw.write_caption([tw.Mention("star", "red")], None, np.random.default_rng(0))
    model = [ref[0], ref[1], "", ref[3]]
    baseline = ["", ref[1], ref[2], one]
    out = winrate.win_rate(records, model, baseline, ORACLE, seed=3)
    assert (out["wins"], out["ties"], out["losses"], out["unparseable"]) == (2, 1, 1, 0)
    assert out["win_rate"] == pytest.approx(0.625)
    assert out["ci95_low"] <= 0.625 <= out["ci95_high"] and out["ci95_low"] < out["ci95_high"]
    assert out["empty_captions"] == 2
    assert out["mean_words_model"] == pytest.approx(np.mean([len(c.split()) for c in model]))
    assert out["mean_words_baseline"] == pytest.approx(np.mean([len(c.split()) for c in baseline]))


def test_position_bias_cancels_against_itself():
    """A judge that always prefers position 1, on a model against itself: the seeded position
    shuffle puts the model first about half the time, so the rate lands near 50% inside its
    interval (without the shuffle it would be 100% or 0%)."""
    records = _records(200)
    captions = [_reference(r) for r in records]
    out = winrate.win_rate(records, captions, captions, _FixedJudge("Caption 1 is better"), seed=0)
    assert out["first_position_pick_rate"] == 1.0
    assert out["ties"] == 0 and out["wins"] + out["losses"] == 200
    assert 0.4 < out["win_rate"] < 0.6
    assert out["ci95_low"] <= 0.5 <= out["ci95_high"]
    again = winrate.win_rate(
        records, captions, captions, _FixedJudge("Caption 1 is better"), seed=0
    )
    assert again["win_rate"] == out["win_rate"]  # seeded


def test_unparseable_verdicts_and_missing_baseline_are_counted_not_fatal():
    records = _records(3)
    captions = [_reference(r) for r in records]
    out = winrate.win_rate(records, captions, [captions[0], None, None], _FixedJudge("no idea"))
    assert out["unparseable"] == 1 and out["pairs"] == 1 and out["skipped_no_baseline"] == 2
    assert np.isnan(out["win_rate"]) and np.isnan(out["ci95_low"])
    with pytest.raises(ValueError, match="align"):
        winrate.win_rate(records, captions, captions[:2], ORACLE)


# ---- blind ranking ----


def test_parse_ranking():
    ranks, flagged, problems = rank.parse_ranking(
        "I compared them.\nRanking: 2 > 1 = 3\nHallucinated: 2", 3
    )
    assert ranks == [2.5, 1.0, 2.5] and flagged == {1} and not problems
    ranks, _, problems = rank.parse_ranking("Ranking: 3, 3, 9 > 1", 3)
    assert (
        ranks == [2.0, 3.0, 1.0] and len(problems) == 3
    )  # repeat, out of range, caption 2 missing
    assert rank.parse_ranking("no numbers here", 3)[0] is None
    assert rank.parse_ranking(None, 3)[0] is None


def test_blind_rank_hand_computed_with_the_oracle():
    """Per image: the reference (F1 1) beats the reference plus an invented object (0 < F1 < 1,
    flagged), which beats the empty caption (F1 0). The third image has no caption from
    "empty": skipped and counted."""
    records = _records(3)
    ref = [_reference(r) for r in records]
    invented = []
    for r in records:
        used = {(o.shape, o.colour) for o in r["scene"].objects}
        shape, colour = next((s, c) for s in tw.SHAPES for c in tw.COLOURS if (s, c) not in used)
        invented.append(f"{_reference(r)} There is also a {colour} {shape}.")
    out = rank.blind_rank(
        records, {"ref": ref, "invented": invented, "empty": ["", "", None]}, ORACLE, seed=1
    )
    assert out["images"] == 2 and out["skipped_missing_caption"] == 1 and out["unparseable"] == 0
    m = out["methods"]
    assert (m["ref"]["mean_rank"], m["invented"]["mean_rank"], m["empty"]["mean_rank"]) == (
        1.0,
        2.0,
        3.0,
    )
    assert (m["ref"]["first_place_share"], m["invented"]["first_place_share"]) == (1.0, 0.0)
    assert (
        m["ref"]["hallucination_penalty"],
        m["invented"]["hallucination_penalty"],
        m["empty"]["hallucination_penalty"],
    ) == (0.0, 1.0, 0.0)


def test_blind_rank_ties_share_places_and_first_place():
    records = _records(2)
    ref = [_reference(r) for r in records]
    out = rank.blind_rank(records, {"a": ref, "b": list(ref)}, ORACLE)
    assert out["methods"]["a"] == {
        "mean_rank": 1.5,
        "first_place_share": 0.5,
        "hallucination_penalty": 0.0,
    }


# ---- caption-only VQA ----

SCENE = tw.Scene(
    "toy9-000001",
    "white",
    (tw.Obj("circle", "red", "small", "top left"), tw.Obj("square", "blue", "large", "center")),
)


def test_scene_questions_have_exact_answers():
    qs = vqa.scene_questions(SCENE)
    assert len(qs) == 1 + 3 * 2 + 2
    assert qs[0] == {"kind": "count", "question": "How many objects are there?", "answer": "2"}
    assert {
        "kind": "colour",
        "question": "What colour is the circle at the top left?",
        "answer": "red",
        "object": {"shape": "circle", "colour": "red", "position": "top left"},
    } in qs
    assert [q["question"] for q in qs if q["kind"] == "place"] == [
        "Where is the red circle?",
        "Where is the blue square?",
    ]
    presence = [q for q in qs if q["kind"] == "presence"]
    assert [q["answer"] for q in presence] == ["yes", "no"]
    absent = presence[1]["object"]
    assert (absent["shape"], absent["colour"]) not in {("circle", "red"), ("square", "blue")}


@pytest.mark.parametrize(
    "text, kind, want",
    [
        ("Big.", "size", "large"),
        ("upper left corner", "place", "top left"),
        ("in the middle", "place", "center"),
        ("two", "count", "2"),
        ("3 objects", "count", "3"),
        ("It is not given.", "colour", vqa.NOT_GIVEN),
        ("Not Given", "presence", vqa.NOT_GIVEN),
        ("purple", "colour", "purple"),
        ("Yes, there is", "presence", "yes"),
        ("maybe", "presence", None),
        ("", "colour", None),
        (None, "size", None),
    ],
)
def test_normalise_answer(text, kind, want):
    assert vqa.normalise_answer(text, kind) == want


def test_parse_answers_tolerant():
    assert vqa.parse_answers("1 | red\n2) large\nsome prose\n1 | blue\n9 | x", 3) == [
        "red",
        "large",
        None,
    ]
    assert vqa.parse_answers("yes", 1) == ["yes"]
    assert vqa.parse_answers(None, 2) == [None, None]


def test_oracle_reader_hand_computed():
    """Caption names only the small red circle at the top left: count "1" is wrong, the circle's
    colour / size / place are right, the square's three are Not Given, "is there a red circle"
    is yes (right) or "is there a blue square" is no (wrong), the absent object is no (right)."""
    record = {"id": SCENE.id, "scene": SCENE}
    caption = "There is a small red circle in the top left."
    out = vqa.caption_vqa([record], [caption], ORACLE)
    present = next(q for q in vqa.scene_questions(SCENE) if q["kind"] == "presence")["object"][
        "shape"
    ]
    right = 3 + 1 + (present == "circle")
    assert (out["right"], out["not_given"], out["wrong"] + out["unreadable"]) == (
        right,
        3,
        9 - 3 - right,
    )
    assert out["accuracy"] == pytest.approx(right / 9)
    assert out["g2p"] == pytest.approx((right - 0.5 * 3 - (6 - right)) / 9)
    perfect = vqa.caption_vqa(
        [record],
        [
            "A small red circle in the top left and a large blue square in the "
            "center, on a white background."
        ],
        ORACLE,
    )
    assert perfect["accuracy"] == 1.0 and perfect["g2p"] == 1.0
    empty = vqa.caption_vqa([record, record], ["", None], ORACLE)
    assert empty["not_given"] == 9 and empty["g2p"] == -0.5 and empty["skipped_no_caption"] == 1


def test_g2p_counts_unreadable_as_wrong():
    """A reader that answers "1 | 2" to every question list: the count question of a 2-object
    scene is right, every other answer is unreadable (-1): (1 - 8) / 9."""
    out = vqa.caption_vqa([{"id": SCENE.id, "scene": SCENE}], ["anything"], _FixedJudge("1 | 2"))
    assert (out["right"], out["unreadable"]) == (1, 8)
    assert out["g2p"] == pytest.approx(-7 / 9)


def test_toy_reference_against_image_blind_captions(tmp_path):
    """No model: the reference caption (exact F1 1) beats the next scene's reference on every image
    under the oracle, ranks first, answers every VQA question right; the blind caption does not."""
    out = suite.run(
        toyworld.get_config("tiny"),
        str(tmp_path),
        model_spec="toy:reference",
        against_spec="toy:blind",
        num_images=6,
    )
    p = out["protocols"]
    assert (p["winrate"]["win_rate"], p["winrate"]["wins"], p["winrate"]["ci95_low"]) == (
        1.0,
        6,
        1.0,
    )
    assert p["rank"]["methods"]["toy_reference"] == {
        "mean_rank": 1.0,
        "first_place_share": 1.0,
        "hallucination_penalty": 0.0,
    }
    assert p["vqa"]["oracle"]["toy_reference"]["accuracy"] == 1.0
    assert p["vqa"]["oracle"]["toy_blind"]["accuracy"] < 0.6
    assert p["exact"]["toy_reference"]["f1"] == 1.0 and p["exact"]["toy_blind"]["f1"] < 0.6


# ---- the command and the suite, with a tiny random checkpoint ----


@pytest.fixture(scope="module")
def tiny_workdir(tmp_path_factory):
    """A workdir with a random tiny-config SFT checkpoint (step 2)."""
    workdir = str(tmp_path_factory.mktemp("tiny_eval"))
    config = toyworld.get_config("tiny")
    params = config_utils.build_setup(config, workdir).load_params()
    manager = checkpoint.Manager(workdir, "sft", keep=1)
    manager.save(2, {"params": params, "step": np.int32(2), "rng": jax.random.key(0)}, {})
    manager.close()
    return workdir


def test_checkpoint_against_itself_is_50_percent_inside_its_interval(tiny_workdir, tmp_path):
    config = toyworld.get_config("tiny")
    out = suite.run(
        config,
        str(tmp_path),
        model_spec=tiny_workdir,
        against_spec=tiny_workdir + "@sft",
        protocols=("winrate", "rank", "exact"),
        num_images=4,
    )
    w = out["protocols"]["winrate"]
    assert w["win_rate"] == 0.5 and w["ci95_low"] <= 0.5 <= w["ci95_high"]
    assert w["pairs"] == 4 and w["mean_words_model"] == w["mean_words_baseline"]
    labels = list(out["protocols"]["exact"])
    assert len(labels) == 2 and labels[1] == labels[0] + "_2"
    assert out["protocols"]["rank"]["methods"][labels[0]]["mean_rank"] == 1.5
    with open(tmp_path / "evaluation.json") as f:
        assert json.load(f)["protocols"]["winrate"]["pairs"] == 4
    captions = [json.loads(line) for line in open(tmp_path / f"captions_{labels[0]}.jsonl")]
    assert [c["id"] for c in captions] == [tw.scene_id(1, k) for k in range(8, 12)]
    assert "== evaluate:" in suite.format_table(out)


def test_model_judge_and_reader_count_what_they_cannot_parse(tiny_workdir, tmp_path):
    """The random tiny model as judge and reader ("self"): its text is garbage, so verdicts and
    answers are counted unparseable / unreadable and every count adds up; nothing raises."""
    config = toyworld.get_config("tiny")
    out = suite.run(
        config,
        str(tmp_path),
        model_spec=tiny_workdir,
        against_spec=tiny_workdir,
        protocols=("winrate", "vqa"),
        judge_spec="self",
        reader_specs=("self", "oracle"),
        num_images=2,
    )
    w = out["protocols"]["winrate"]
    assert w["wins"] + w["ties"] + w["losses"] + w["unparseable"] == w["pairs"] == 2
    for reader in ("self", "oracle"):
        for m in out["protocols"]["vqa"][reader].values():
            assert m["right"] + m["not_given"] + m["wrong"] + m["unreadable"] == m["questions"] > 0


def test_baseline_captions_file_with_fewer_images_is_a_counted_skip(tiny_workdir, tmp_path):
    config = toyworld.get_config("tiny")
    records = _records(4, start=config.data.num_train_scenes)
    path = tmp_path / "baseline.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps({"id": records[0]["id"], "caption": _reference(records[0])}) + "\n")
        f.write(json.dumps({"id": records[2]["id"], "caption": ""}) + "\n")
        f.write("{not json\n")
    out = suite.run(
        config,
        str(tmp_path / "out"),
        model_spec=str(path),
        against_spec=str(path),
        protocols=("winrate", "vqa", "exact"),
        num_images=4,
    )
    assert out["protocols"]["winrate"]["skipped_no_baseline"] == 2
    assert (
        out["protocols"]["winrate"]["ties"] == 2
        and out["protocols"]["winrate"]["empty_captions"] == 2
    )
    assert out["sources"]["baseline"]["bad_rows"] == 1
    exact = out["protocols"]["exact"]["baseline"]
    assert exact["skipped_no_caption"] == 2 and exact["empty_captions"] == 1
    assert exact["f1"] == pytest.approx(0.5)  # the reference (1.0) and the empty caption (0.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"model_spec": "/nonexistent/run"}, "no such directory"),
        ({"model_spec": "{tiny}@rl"}, "no finished rl checkpoint"),
        (
            {
                "model_spec": "{tiny}",
                "against_spec": "{tiny}",
                "judge_spec": "openai:localhost:1/v1#m",
            },
            "want openai:http",
        ),
        (
            {
                "model_spec": "{tiny}",
                "against_spec": "{tiny}",
                "judge_spec": "openai:http://localhost:1/v1",
            },
            "want openai:http",
        ),
        ({"model_spec": "{tiny}", "protocols": ("winrate",)}, "pass --against"),
        ({"model_spec": "{empty}"}, "neither a workdir"),
        (
            {"model_spec": "{tiny}", "against_spec": "{tiny}", "judge_spec": "{empty}/none.jsonl"},
            "no such captions file",
        ),
        (
            {"model_spec": "{tiny}", "against_spec": "{tiny}", "judge_spec": "toy:blind"},
            "captions cannot judge",
        ),
    ],
)
def test_bad_specs_fail_before_any_work(tiny_workdir, tmp_path, kwargs, message):
    (tmp_path / "empty").mkdir()
    kwargs = {
        k: v.format(tiny=tiny_workdir, empty=tmp_path / "empty") if isinstance(v, str) else v
        for k, v in kwargs.items()
    }
    with pytest.raises(suite.SpecError, match=message):
        suite.run(toyworld.get_config("tiny"), str(tmp_path / "out"), **kwargs)
    assert not (tmp_path / "out").exists()


def test_command_prints_one_clear_line_and_exits_2(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mocojax.evaluate",
            "--config",
            "configs/toyworld.py:tiny",
            "--workdir",
            str(tmp_path / "out"),
            "--model",
            str(tmp_path / "missing"),
            "--protocols",
            "exact,bleu",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "mocojax.evaluate: unknown protocols ['bleu']; choose from ('winrate', 'rank', 'vqa', 'exact')"
    ]
