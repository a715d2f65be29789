"""Minimal pairs for the per-item Judge (mocojax/data/toypairs.py, config data.judge_pairs)."""

import collections

import numpy as np
import pytest

from mocojax import roles
from mocojax.data import records, toypairs, toyroles, toyworld as tw


@pytest.fixture(scope="module")
def items():
    scenes = tw.make_scenes(1, 60, 500)
    return records.judge_items(
        [r for s in scenes for r in toyroles.scene_sft_records(s, 1, (0, 0, 1))]
    )


def _label(example):
    (decision,), problems = roles.parse_decisions(example["target"], 1)
    assert not problems
    return decision.value


def test_every_item_is_seen_with_both_labels_and_the_exact_judge_agrees(items):
    pairs = toypairs.judge_minimal_pairs(items, seed=1)
    assert len(pairs) == 2 * len(items)  # every toy item pairs (none falls back)
    by_kind = collections.Counter()
    for same, flip in zip(pairs[::2], pairs[1::2]):
        assert same["id"].endswith("/same") and flip["id"] == same["id"][:-5] + "/flip"
        assert same["item"] == flip["item"] and same["caption"] != flip["caption"]
        fact = toyroles.parse_criterion(same["item"][0])
        for example in (same, flip):
            exact = toyroles.judge_fact(fact, *tw.parse_caption(example["caption"]))
            assert _label(example) == exact.value
            assert example["target"] == roles.format_decisions([exact])
        assert _label(same) != _label(flip)
        by_kind[(fact.kind, _label(same))] += 1
        by_kind[(fact.kind, _label(flip))] += 1
    for kind in ("present", "absent", "attribute", "background"):
        assert by_kind[(kind, 0)] == by_kind[(kind, 1)] > 0, kind


def test_the_same_caption_keeps_the_original_label(items):
    # The rewrite of the caption's parsed content states the same content: the label the world
    # gave the original caption is the "same" example's label.
    pairs = toypairs.judge_minimal_pairs(items, seed=1)
    assert [_label(e) for e in items] == [_label(e) for e in pairs[::2]]


def test_pairs_are_deterministic_and_order_independent(items):
    forward = toypairs.judge_minimal_pairs(items, seed=1)
    backward = toypairs.judge_minimal_pairs(items[::-1], seed=1)
    key = {e["id"]: e for e in backward}
    assert all(key[e["id"]] == e for e in forward)
    other = toypairs.judge_minimal_pairs(items, seed=2)
    assert [e["caption"] for e in other] != [e["caption"] for e in forward]


def test_hand_made_pairs():
    rng = np.random.default_rng(0)
    green_diamond = [tw.Mention("diamond", "green", "large", "center")]
    absent = toyroles.Fact("absent", tw.Mention("circle", "purple"))
    mentions, background = toypairs.flipped_content(absent, green_diamond, "white", rng)
    assert background == "white" and green_diamond[0] in mentions
    assert [(m.shape, m.colour) for m in mentions if m.shape == "circle"] == [("circle", "purple")]
    # the object named -> removed; the attribute stated -> swapped for another value
    present = toyroles.Fact("present", tw.Mention("diamond", "green"))
    assert toypairs.flipped_content(present, green_diamond, None, rng) == ([], None)
    colour = toyroles.Fact("attribute", tw.Mention("diamond"), "colour", "green")
    (swapped,), _ = toypairs.flipped_content(colour, green_diamond, None, rng)
    assert swapped.colour in tw.COLOURS and swapped.colour != "green"
    assert (swapped.shape, swapped.size, swapped.position) == ("diamond", "large", "center")
    colour_red = toyroles.Fact("attribute", tw.Mention("diamond"), "colour", "red")
    (set_red,), _ = toypairs.flipped_content(colour_red, green_diamond, None, rng)
    assert set_red.colour == "red"
    sky = toyroles.Fact("background", value="black")
    assert toypairs.flipped_content(sky, green_diamond, None, rng)[1] == "black"
    assert toypairs.flipped_content(sky, green_diamond, "black", rng)[1] in ("white", "gray")


def test_other_examples_pass_through(items):
    policy = {"id": "p", "role": "policy", "target": "A red circle."}
    whole = {"id": "w", "role": "judge", "rubric": [], "caption": "x", "target": ""}
    unknown = dict(items[0], id="u", item=["is well written", "style", 1.0])
    assert toypairs.judge_minimal_pairs([policy, whole, unknown], seed=1) == [
        policy,
        whole,
        unknown,
    ]
