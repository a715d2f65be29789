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
    # the edits that are not swaps (toypairs._flipped_content)
    rng = np.random.default_rng(0)
    green_diamond = [tw.Mention("diamond", "green", "large", "center")]
    absent = toyroles.Fact("absent", tw.Mention("circle", "purple"))
    mentions, background = toypairs._flipped_content(absent, green_diamond, "white", rng)
    assert background == "white" and green_diamond[0] in mentions
    assert [(m.shape, m.colour) for m in mentions if m.shape == "circle"] == [("circle", "purple")]
    # the object named -> removed; the attribute stated -> swapped for another value
    present = toyroles.Fact("present", tw.Mention("diamond", "green"))
    assert toypairs._flipped_content(present, green_diamond, None, rng) == ([], None)
    colour = toyroles.Fact("attribute", tw.Mention("diamond"), "colour", "green")
    (swapped,), _ = toypairs._flipped_content(colour, green_diamond, None, rng)
    assert swapped.colour in tw.COLOURS and swapped.colour != "green"
    assert (swapped.shape, swapped.size, swapped.position) == ("diamond", "large", "center")
    colour_red = toyroles.Fact("attribute", tw.Mention("diamond"), "colour", "red")
    (set_red,), _ = toypairs._flipped_content(colour_red, green_diamond, None, rng)
    assert set_red.colour == "red"
    sky = toyroles.Fact("background", value="black")
    assert toypairs._flipped_content(sky, green_diamond, None, rng)[1] == "black"
    assert toypairs._flipped_content(sky, green_diamond, "black", rng)[1] in ("white", "gray")


def test_other_examples_pass_through(items):
    policy = {"id": "p", "role": "policy", "target": "A red circle."}
    whole = {"id": "w", "role": "judge", "rubric": [], "caption": "x", "target": ""}
    unknown = dict(items[0], id="u", item=["is well written", "style", 1.0])
    assert toypairs.judge_minimal_pairs([policy, whole, unknown], seed=1) == [
        policy,
        whole,
        unknown,
    ]


def _pairs(mentions):
    return {(m.colour, m.shape) for m in mentions}


def test_binding_swaps_exchange_an_attribute_between_two_objects():
    rng = np.random.default_rng(0)
    red_triangle = tw.Mention("triangle", "red", "large", "top left")
    green_square = tw.Mention("square", "green", "small", "bottom right")
    caption = [red_triangle, green_square]
    present = toyroles.Fact("present", tw.Mention("triangle", "red"))
    flips = {}
    base, flips[present] = toypairs._binding_swap(present, caption, rng)
    assert base == caption
    assert _pairs(flips[present]) == {("green", "triangle"), ("red", "square")}
    # sizes and positions stay with their objects
    assert [(m.size, m.position) for m in flips[present]] == [(m.size, m.position) for m in caption]
    # not named: the item's colour moves onto the item's shape
    absent = toyroles.Fact("absent", tw.Mention("square", "red"))
    base, flips[absent] = toypairs._binding_swap(absent, caption, rng)
    assert base == caption and _pairs(flips[absent]) == {("green", "triangle"), ("red", "square")}
    # an attribute item: the value moves to the other object
    large = toyroles.Fact("attribute", tw.Mention("triangle"), "size", "large")
    base, flips[large] = toypairs._binding_swap(large, caption, rng)
    assert base == caption
    assert [(m.shape, m.size) for m in flips[large]] == [("triangle", "small"), ("square", "large")]
    for fact, flipped in flips.items():
        labels = [toyroles.judge_fact(fact, m, None).value for m in (caption, flipped)]
        assert labels[0] != labels[1], fact


def test_a_swap_adds_a_distractor_the_item_is_not_about():
    rng = np.random.default_rng(3)
    caption = [tw.Mention("triangle", "red")]
    present = toyroles.Fact("present", tw.Mention("triangle", "red"))
    for _ in range(20):
        base, flipped = toypairs._binding_swap(present, caption, rng)
        assert len(base) == 2 and caption[0] in base
        (added,) = [m for m in base if m != caption[0]]
        assert added.shape != "triangle" and added.colour not in (None, "red")
        assert toyroles.judge_fact(present, base, None).value == 1
        assert toyroles.judge_fact(present, flipped, None).value == 0
        assert sorted(m.colour for m in base) == sorted(m.colour for m in flipped)


def test_most_presence_pairs_differ_only_in_which_object_a_word_belongs_to(items):
    pairs = toypairs.judge_minimal_pairs(items, seed=1)
    same_words = collections.Counter()
    for same, flip in zip(pairs[::2], pairs[1::2]):
        kind = toyroles.parse_criterion(same["item"][0]).kind
        if kind in ("present", "absent"):
            words = [sorted(e["caption"].replace(",", " ").split()) for e in (same, flip)]
            same_words[words[0] == words[1]] += 1
    assert same_words[True] / sum(same_words.values()) > 0.6
