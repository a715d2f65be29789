"""Toy world: hand-worked metrics, language round trips, records true by construction, tokenizer."""

import collections

import ml_collections
import numpy as np
import pytest

from mocojax import processing, roles
from mocojax.data import records, toyroles, toyworld as tw
from mocojax.data.toyworld import Mention, Obj, Scene

SCENE = Scene(
    "hand",
    "white",
    (Obj("circle", "red", "large", "top left"), Obj("square", "blue", "small", "center")),
)


def _f1(p, r):
    return 2 * p * r / (p + r)


@pytest.mark.parametrize(
    "caption",
    [
        "A big red circle in the upper left corner and a little blue square in the middle, "
        "on a white background.",
        "The background is white. A small blue square sits at the centre. "
        "A large red circle is at the top left.",
        "On a white background there is a small blue square in the center and a large red "
        "circle at the top left.",
    ],
)
def test_complete_paraphrases_score_one(caption):
    metrics = tw.caption_metrics(SCENE, caption)
    assert (metrics["precision"], metrics["recall"], metrics["f1"]) == (1.0, 1.0, 1.0)
    assert metrics["hallucinated"] == [] and metrics["missing_objects"] == 0


def test_partial_caption():
    metrics = tw.caption_metrics(SCENE, "A large red circle in the top left.")
    # 4 of 4 stated facts right; 4 of 9 scene facts (2 objects x 4 + background) covered.
    assert metrics["precision"] == 1.0
    assert metrics["recall"] == pytest.approx(4 / 9)
    assert metrics["f1"] == pytest.approx(_f1(1, 4 / 9))
    assert metrics["missing_objects"] == 1


def test_wrong_attributes_and_hallucination():
    caption = (
        "A large green circle in the top left, a small blue square in the center and "
        "a yellow star at the bottom, on a gray background."
    )
    metrics = tw.caption_metrics(SCENE, caption)
    # stated: circle 4 (3 right), square 4 (4 right), star 3 (0 right), background 1 (wrong).
    assert metrics["precision"] == pytest.approx(7 / 12)
    assert metrics["recall"] == pytest.approx(7 / 9)
    assert metrics["f1"] == pytest.approx(_f1(7 / 12, 7 / 9))
    assert metrics["hallucinated"] == [Mention("star", "yellow", None, "bottom")]


def test_same_shape_objects_are_matched_one_to_one():
    scene = Scene(
        "two",
        "black",
        (Obj("circle", "red", "small", "top left"), Obj("circle", "blue", "large", "bottom right")),
    )
    metrics = tw.caption_metrics(
        scene,
        "A small blue circle at the top left and a big red "
        "circle in the lower right. The background is black.",
    )
    # Each mention has its colour swapped: 3 of 4 facts right per mention.
    assert metrics["precision"] == pytest.approx(7 / 9)
    assert metrics["recall"] == pytest.approx(7 / 9)
    assert tw.caption_metrics(scene, "A red circle, a red circle and a red circle.")[
        "hallucinated"
    ] == [Mention("circle", "red")]


def test_references_parse_back_to_the_scene():
    for index in range(300):
        scene = tw.make_scene(3, index)
        truth = sorted((o.shape, o.colour, o.size, o.position) for o in scene.objects)
        for caption in tw.reference_captions(scene, seed=3):
            mentions, background = tw.parse_caption(caption)
            assert sorted((m.shape, m.colour, m.size, m.position) for m in mentions) == truth
            assert background == scene.background


def test_candidate_errors_show_in_metrics():
    seen = set()
    for scene in tw.make_scenes(5, 200):
        for candidate in tw.candidate_captions(scene, seed=5):
            seen.update(candidate["errors"])
            if not candidate["errors"]:
                assert tw.caption_metrics(scene, candidate["caption"])["f1"] == 1.0
    assert seen == set(tw.ERROR_TYPES)


def test_criteria_round_trip():
    for fact in [
        toyroles.Fact("present", Mention("circle", "red")),
        toyroles.Fact("absent", Mention("star", "green")),
        toyroles.Fact("attribute", Mention("circle", position="top left"), "colour", "red"),
        toyroles.Fact("attribute", Mention("square", "blue"), "position", "bottom"),
        toyroles.Fact("attribute", Mention("square"), "size", "small"),
        toyroles.Fact("attribute", Mention("square", "blue"), "size", "small"),
        toyroles.Fact("attribute", Mention("star", "red", position="left"), "size", "large"),
        toyroles.Fact("background", value="gray"),
    ]:
        assert toyroles.parse_criterion(toyroles.item_of(fact).criterion) == fact
    for criterion in [
        "the caption is detailed",
        "mentions a circle",
        "the circle is red and blue",
        "the red circle is red",
        "",
        "is",
    ]:
        assert toyroles.parse_criterion(criterion) is None


def test_attribute_items_are_phrases_of_the_pair_by_hand():
    """Attribute items name the object by its colour and shape and read as the phrase to look
    for; a colour error is charged as the pair's presence; each is judged by hand on captions
    that state the attribute, another value, the wrong colour or nothing."""
    two_circles = Scene(
        "two", "white", SCENE.objects + (Obj("circle", "green", "small", "bottom right"),)
    )
    size = toyroles.attribute_fact(SCENE, 0, "size")
    where = toyroles.attribute_fact(SCENE, 0, "position")
    assert toyroles.item_of(size) == roles.RubricItem("mentions a large red circle", "large", 2.0)
    assert toyroles.item_of(where).criterion == "mentions a red circle at the top left"
    assert toyroles.attribute_fact(SCENE, 0, "colour") == toyroles.Fact(
        "present", Mention("circle", "red")
    )
    assert toyroles.attribute_fact(two_circles, 0, "colour") == where
    for fact in (size, where):
        assert toyroles.parse_criterion(toyroles.item_of(fact).criterion) == fact
    for caption, (size_value, where_value) in [
        ("A big red circle in the upper left corner.", (1, 1)),
        ("A small red circle at the top left.", (0, 1)),
        ("A large red circle at the bottom.", (1, 0)),
        ("A large blue circle at the top left.", (0, 0)),
        ("A red circle and a large square at the top left.", (0, 0)),
        ("A blue square.", (0, 0)),
    ]:
        parsed = tw.parse_caption(caption)
        assert toyroles.judge_fact(size, *parsed).value == size_value, caption
        assert toyroles.judge_fact(where, *parsed).value == where_value, caption


def test_rubric_without_attribute_items_by_hand():
    """attribute_items=False: a candidate's wrong size and place get no item, its wrong colour
    the pair's presence item; everything else as with attribute items."""
    shown = ["A small blue circle at the bottom and a small blue square in the center."]
    with_attributes = toyroles.rubric_facts(SCENE, shown, min_items=0)
    assert {f.kind for f in with_attributes} == {"present", "attribute", "background"}
    facts = toyroles.rubric_facts(SCENE, shown, min_items=0, attribute_items=False)
    assert facts == [
        toyroles.Fact("present", Mention("circle", "red")),
        toyroles.Fact("background", value="white"),
    ]
    exact = toyroles.ExactRoles({SCENE.id: SCENE}, attribute_items=False)
    assert all(
        toyroles.parse_criterion(item.criterion).kind != "attribute"
        for item in exact.rubric(SCENE.id, shown)
    )


def test_only_item_by_hand():
    """The "mentions only ..." item: it reads back, a caption naming only the scene's objects
    (with or without their colour, any size or place) meets it, one invented or recoloured
    object fails it; malformed listings are not read."""
    fact = toyroles.Fact("only", allowed=(Mention("circle", "red"), Mention("square", "blue")))
    item = toyroles.item_of(fact)
    assert item == roles.RubricItem(
        "mentions only a red circle and a blue square", "nothing else", 3.0
    )
    assert toyroles.parse_criterion(item.criterion) == fact
    for caption, value in [
        ("A red circle and a blue square.", 1),
        ("A big red circle at the top left.", 1),
        ("A circle and a square on a white background.", 1),
        ("A red circle, a blue square and a green star.", 0),
        ("A blue circle.", 0),
    ]:
        assert toyroles.judge_fact(fact, *tw.parse_caption(caption)).value == value, caption
    for criterion in [
        "mentions only",
        "mentions only a circle",
        "mentions only a red circle on a white background",
    ]:
        assert toyroles.parse_criterion(criterion) is None


def test_only_item_charges_an_invention_no_shown_candidate_made():
    """With only_item the exact Generator's rubric starts with the scene's object list, true of
    the scene; a caption that adds an invented object to a complete one then loses that item's
    weight (3 of the rubric's total), where without it the rubric cannot see the invention."""
    shown = ["A large red circle at the top left on a white background."]  # misses the square
    complete = "A large red circle at the top left and a small blue square in the centre, on a white background."
    invented = complete.replace(" on a white", " a big green star at the bottom, on a white")
    assert len(tw.caption_metrics(SCENE, invented)["hallucinated"]) == 1
    rewards = {}
    for only in (False, True):
        exact = toyroles.ExactRoles({SCENE.id: SCENE}, only_item=only)
        rubric = exact.rubric(SCENE.id, shown)
        weights = [item.weight for item in rubric]
        assert (toyroles.parse_criterion(rubric[0].criterion).kind == "only") == only
        rewards[only] = [
            roles.rubric_reward(weights, exact.decisions(rubric, c)) for c in (complete, invented)
        ]
        assert (
            toyroles.fact_is_true(SCENE, toyroles.parse_criterion(rubric[0].criterion)) or not only
        )
    assert rewards[False][0] == rewards[False][1] == 1.0
    total = sum(
        item.weight
        for item in toyroles.ExactRoles({SCENE.id: SCENE}, only_item=True).rubric(SCENE.id, shown)
    )
    assert rewards[True] == [1.0, pytest.approx(1.0 - 3.0 / total)]
    records = toyroles.scene_sft_records(SCENE, 0, (0, 1, 1), only_item=True)
    assert all(
        r["target"].startswith("1 | 3 | mentions only") for r in records if r["role"] == "generator"
    )


def test_absent_shape_items_charge_every_invented_shape():
    """absent_shapes: one "does not mention a <shape>" item per shape the scene lacks (true of
    the scene, read back as a colourless absent fact); the shown candidate's invented green star
    gets no pair item of its own; each invented object of a missing shape then costs 3 of the
    rubric's 12, where without the option only the shown candidate's own invention costs."""
    shown = ["A large red circle at the top left and a green star on a white background."]
    facts = toyroles.rubric_facts(SCENE, shown, min_items=0, absent_shapes=True)
    assert facts == [
        toyroles.Fact("absent", Mention("triangle")),
        toyroles.Fact("absent", Mention("diamond")),
        toyroles.Fact("absent", Mention("star")),
        toyroles.Fact("present", Mention("square", "blue")),
    ]
    assert toyroles.item_of(facts[0]) == roles.RubricItem(
        "does not mention a triangle", "not named", 3.0
    )
    assert all(toyroles.fact_is_true(SCENE, f) for f in facts)
    items = [toyroles.item_of(f) for f in facts]
    # the Judge's counts keep the word lookups apart from the pair items; "1" to all four on a
    # caption naming a star: the star item is a false positive
    by_kind = toyroles.judge_confusion(items, "A red star.", [1, 1, 1, 1], by_kind=True)
    assert by_kind["absent_shape"] == {"tp": 2, "fn": 0, "tn": 0, "fp": 1, "unreadable": 0}
    assert by_kind["present"] == {"tp": 0, "fn": 0, "tn": 0, "fp": 1, "unreadable": 0}
    complete = "A large red circle at the top left and a small blue square in the center."
    star = complete[:-1] + " and a big green star."
    two = complete[:-1] + ", a purple diamond and a yellow triangle."
    rewards = {}
    for option in (False, True):
        exact = toyroles.ExactRoles({SCENE.id: SCENE}, absent_shapes=option)
        rubric = exact.rubric(SCENE.id, shown)
        for item in rubric:
            assert toyroles.parse_criterion(item.criterion) is not None, item
        weights = [item.weight for item in rubric]
        rewards[option] = [
            roles.rubric_reward(weights, exact.decisions(rubric, c)) for c in (complete, star, two)
        ]
    # without: the green star's absence and the square's presence, filled up to min_items = 3
    # with the red circle's presence and the background (weights 3, 3, 3, 1; no caption here
    # names the background)
    assert rewards[False] == pytest.approx([9 / 10, 6 / 10, 9 / 10])
    # with: the three missing shapes and the square (weights 3 each; no fill)
    assert rewards[True] == pytest.approx([12 / 12, 9 / 12, 6 / 12])


def test_count_items_by_hand():
    """count_items: "mentions at most <n> <shape>s" per shape the scene has, read back; a second
    mention of the circle or a circle of another colour fails it, a caption without a circle
    meets it; with absent_shapes too, every hallucinated mention of these captions fails an item
    (hand-computed rewards)."""
    fact = toyroles.Fact("at_most", Mention("circle"), value="one")
    item = toyroles.item_of(fact)
    assert item == roles.RubricItem("mentions at most one circle", "no more named", 3.0)
    assert toyroles.parse_criterion(item.criterion) == fact
    two = toyroles.item_of(toyroles.Fact("at_most", Mention("star"), value="two"))
    assert two.criterion == "mentions at most two stars"
    assert toyroles.parse_criterion(two.criterion).value == "two"
    for criterion in ["mentions at most five circles", "mentions at most one cross"]:
        assert toyroles.parse_criterion(criterion) is None
    for caption, value in [
        ("A large red circle at the top left.", 1),
        ("A blue square.", 1),
        ("A red circle and a big red circle at the bottom.", 0),
        ("A red circle and a green circle.", 0),
    ]:
        assert toyroles.judge_fact(fact, *tw.parse_caption(caption)).value == value, caption
    shown = ["A large red circle at the top left and a small blue square in the center."]
    facts = toyroles.rubric_facts(SCENE, shown, absent_shapes=True, count_items=True)
    assert [toyroles.item_of(f).criterion for f in facts] == [
        "does not mention a triangle",
        "does not mention a diamond",
        "does not mention a star",
        "mentions at most one circle",
        "mentions at most one square",
        "the background is white",
    ]
    assert all(toyroles.fact_is_true(SCENE, f) for f in facts)
    exact = toyroles.ExactRoles({SCENE.id: SCENE}, absent_shapes=True, count_items=True)
    rubric = exact.rubric(SCENE.id, shown)
    weights = [i.weight for i in rubric]
    complete = shown[0][:-1] + " on a white background."
    for caption, expected in [
        (complete, 16 / 16),
        (complete.replace(" on", " and a red circle at the bottom, on"), 13 / 16),  # twice
        (complete.replace(" on", " and a green square, on"), 13 / 16),  # another colour
        (complete.replace(" on", " and a red star and a green square, on"), 10 / 16),
    ]:
        assert len(tw.caption_metrics(SCENE, caption)["hallucinated"]) == round(
            (16 - 16 * expected) / 3
        )
        assert roles.rubric_reward(weights, exact.decisions(rubric, caption)) == pytest.approx(
            expected
        ), caption


def test_invention_weight_reweights_only_the_items_an_invented_mention_fails():
    # rl.invention_weight = 6: the three absent-shape and two at-most items weigh 6, the
    # background keeps its 1 (hand-computed: 5 * 6 + 1 = 31), so each invention costs 6 / 31.
    shown = ["A large red circle at the top left and a small blue square in the center."]
    plain = toyroles.ExactRoles({SCENE.id: SCENE}, absent_shapes=True, count_items=True)
    heavy = toyroles.ExactRoles(
        {SCENE.id: SCENE}, invention_weight=6, absent_shapes=True, count_items=True
    )
    rubric = heavy.rubric(SCENE.id, shown)
    assert [i.criterion for i in rubric] == [i.criterion for i in plain.rubric(SCENE.id, shown)]
    assert [i.weight for i in rubric] == [6, 6, 6, 6, 6, 1]
    weights = [i.weight for i in rubric]
    complete = shown[0][:-1] + " on a white background."
    for caption, expected in [
        (complete, 31 / 31),
        (complete.replace(" on", " and a red circle at the bottom, on"), 25 / 31),
        (complete.replace(" on", " and a red star and a green square, on"), 19 / 31),
        (complete.replace(" on a white", " on a black"), 30 / 31),
    ]:
        assert roles.rubric_reward(weights, heavy.decisions(rubric, caption)) == pytest.approx(
            expected
        ), caption
    # a missed object's presence item (a candidate left the blue square out) keeps its 3
    missed = heavy.rubric(SCENE.id, ["A large red circle at the top left on a white background."])
    assert {i.criterion: i.weight for i in missed}["mentions a blue square"] == 3
    with pytest.raises(ValueError, match="invention_weight"):
        toyroles.ExactRoles({SCENE.id: SCENE}, invention_weight=-1)


# A scene with two circles, and the shape items of its rubric (absent shapes, at most, at least).
TWO_CIRCLES = Scene(
    "two",
    "white",
    (Obj("circle", "red", "large", "top left"), Obj("circle", "blue", "small", "center")),
)
TWO_CIRCLE_SHAPE_ITEMS = [
    "does not mention a square",
    "does not mention a triangle",
    "does not mention a diamond",
    "does not mention a star",
    "mentions at most two circles",
    "mentions at least two circles",
]


def test_count_floor_items_by_hand():
    """count_floor: "mentions at least <n> <shape>s" per shape the scene has, read back; a
    caption that drops one of two circles fails it whatever the kept circle's colour (the case a
    Judge reading shape words alone passes as the dropped circle's presence item); with
    count_items the two pin the count (hand-computed rewards)."""
    fact = toyroles.Fact("at_least", Mention("circle"), value="two")
    item = toyroles.item_of(fact)
    assert item == roles.RubricItem("mentions at least two circles", "no fewer named", 3.0)
    assert toyroles.parse_criterion(item.criterion) == fact
    assert toyroles.parse_criterion("mentions at least one star") == toyroles.Fact(
        "at_least", Mention("star"), value="one"
    )
    assert toyroles.parse_criterion("mentions at least five circles") is None
    for caption, value in [
        ("A red circle and a big blue circle at the bottom.", 1),
        ("A red circle, a blue circle and a green circle.", 1),
        ("A blue circle.", 0),
        ("A red square and a blue square.", 0),
    ]:
        decision = toyroles.judge_fact(fact, *tw.parse_caption(caption))
        assert decision.value == value, caption
    assert toyroles.judge_fact(fact, *tw.parse_caption("A blue circle.")).rationale == (
        "it names 1 circle"
    )
    assert toyroles.report_kind(fact) == "at_least"
    two = TWO_CIRCLES
    shown = [
        "A large red circle at the top left and a small blue circle in the center, on a white "
        "background."
    ]
    facts = toyroles.rubric_facts(
        two, shown, absent_shapes=True, count_items=True, count_floor=True
    )
    assert [toyroles.item_of(f).criterion for f in facts] == TWO_CIRCLE_SHAPE_ITEMS
    assert all(toyroles.fact_is_true(two, f) for f in facts)
    exact = toyroles.ExactRoles(
        {two.id: two}, absent_shapes=True, count_items=True, count_floor=True
    )
    rubric = exact.rubric(two.id, shown)
    weights = [i.weight for i in rubric]
    for caption, expected in [
        (shown[0], 18 / 18),
        ("A large red circle at the top left.", 15 / 18),  # one circle dropped
        ("A large green circle at the top left.", 15 / 18),  # and the other recoloured
        ("A red circle, a blue circle and a red circle.", 15 / 18),  # one too many
        ("A red square.", 12 / 18),  # no circle (at least), a square invented (absent)
    ]:
        assert roles.rubric_reward(weights, exact.decisions(rubric, caption)) == pytest.approx(
            expected
        ), caption
    without = toyroles.ExactRoles({two.id: two}, absent_shapes=True, count_items=True)
    rubric = without.rubric(two.id, shown)
    dropped = without.decisions(rubric, "A large red circle at the top left.")
    assert roles.rubric_reward([i.weight for i in rubric], dropped) == 1.0  # free without it


def test_unbound_items_by_hand():
    """unbound_items: no item binds a colour to a shape. The rubric of a two-circle scene is its
    shape items, one colour item per colour of the world and the background (read back exactly);
    a recoloured circle fails the two colour items, and swapping the two circles' colours, which
    a Judge that does not bind passes, is free here too (hand-computed rewards, weights 31)."""
    assert toyroles.item_of(toyroles.Fact("colour", value="red")) == roles.RubricItem(
        "mentions the colour red", "named", 2.0
    )
    assert toyroles.parse_criterion("does not mention the colour green") == toyroles.Fact(
        "no_colour", value="green"
    )
    assert toyroles.parse_criterion("mentions the colour pink") is None
    green = toyroles.Fact("no_colour", value="green")
    for caption, value, rationale in [
        ("A green star.", 0, "it is mentioned"),
        ("A red circle on a green background.", 1, "it is not mentioned"),  # not an object's
        ("A red circle.", 1, "it is not mentioned"),
    ]:
        assert toyroles.judge_fact(green, *tw.parse_caption(caption)) == roles.Decision(
            value, rationale
        ), caption
    assert [
        toyroles.report_kind(toyroles.Fact(k, value="red")) for k in ("colour", "no_colour")
    ] == [
        "colour",
        "no_colour",
    ]
    two = TWO_CIRCLES
    shown = ["A large green circle at the top left and a red square, on a black background."]
    options = dict(absent_shapes=True, count_items=True, count_floor=True, unbound_items=True)
    facts = toyroles.rubric_facts(two, shown, attribute_items=False, **options)
    assert [toyroles.item_of(f).criterion for f in facts] == TWO_CIRCLE_SHAPE_ITEMS + [
        "mentions the colour red",
        "does not mention the colour green",
        "mentions the colour blue",
        "does not mention the colour yellow",
        "does not mention the colour purple",
        "does not mention the colour orange",
        "the background is white",
    ]  # the candidate's errors write no items of their own
    assert all(toyroles.fact_is_true(two, f) for f in facts)
    exact = toyroles.ExactRoles({two.id: two}, attribute_items=False, **options)
    rubric = exact.rubric(two.id, shown)
    weights = [i.weight for i in rubric]
    assert sum(weights) == 31
    full = "A large red circle at the top left and a small blue circle in the center, on a white background."
    for caption, expected in [
        (full, 31),
        ("A blue circle and a red circle on a white background.", 31),  # colours swapped: free
        (
            "A green circle and a blue circle on a white background.",
            27,
        ),  # red missed, green invented
        ("A large red circle at the top left.", 25),  # a circle (3), blue (2), background (1)
        ("A red square on a white background.", 23),  # square (3), two circles (3), blue (2)
    ]:
        assert roles.rubric_reward(weights, exact.decisions(rubric, caption)) == pytest.approx(
            expected / 31
        ), caption


def test_repeat_captions_name_a_shape_more_often_than_the_scene_has_it():
    lone = Scene("lone", "black", (Obj("star", "yellow", "large", "center"),))
    fact = toyroles.parse_criterion("mentions at most one star")
    unmet = []
    for salt in range(20):
        for c in tw.repeat_captions(lone, seed=3, count=2, salt=salt):
            mentions, background = tw.parse_caption(c["caption"])
            shapes = [m.shape for m in mentions]
            # the last error is always the repeat: some shape is named twice (the scene has
            # each of its shapes once; an invented object may be the one repeated)
            assert c["errors"][-1] == "repeated_object", c
            assert max(shapes.count(s) for s in shapes) >= 2, c
            unmet.append(toyroles.judge_fact(fact, mentions, background).value == 0)
    # without an invented object (half the captions or more) the star is the one repeated
    assert np.mean(unmet) >= 0.5


def test_fragment_captions_are_the_background_alone_or_a_caption_cut_short():
    scene = Scene(
        "two",
        "gray",
        (Obj("circle", "blue", "large", "center"), Obj("star", "red", "small", "top")),
    )
    present = toyroles.parse_criterion("mentions a blue circle")
    kinds = []
    for salt in range(15):
        for c in tw.fragment_captions(scene, seed=2, count=2, salt=salt):
            mentions, background = tw.parse_caption(c["caption"])
            kinds.append(c["errors"])
            if c["errors"] == ["background_only"]:
                assert mentions == [] and background == "gray", c
                assert toyroles.judge_fact(present, mentions, background).value == 0
            else:
                assert c["errors"] == ["truncated"] and c["caption"].endswith("."), c
                assert len(mentions) <= 2 and len(c["caption"].split()) >= 2, c
    assert 0.25 < kinds.count(["background_only"]) / len(kinds) < 0.75


def test_judge_repeats_gives_the_judge_unmet_count_items():
    """Seed 4, 300 scenes, balanced per-item Judge examples: count items are rare without it."""
    rubric = dict(absent_shapes=True, count_items=True, attribute_items=False)

    def count_examples(judge_repeats):
        recs = toyroles.sft_records(4, 300, (0, 0, 1), judge_repeats=judge_repeats, **rubric)
        items = toyroles.balance_judge_items(records.judge_items(recs), 4)
        return [e for e in items if "at most" in e["item"][0]]

    plain, repeats = count_examples(False), count_examples(True)
    assert len(repeats) > 1.6 * len(plain)
    # judge_fragments: captions that name no object, their presence items labelled "0"
    recs = toyroles.sft_records(4, 100, (0, 0, 1), judge_fragments=True, **rubric)
    empty = [
        e
        for e in records.judge_items(recs)
        if not tw.parse_caption(e["caption"])[0] and e["item"][0].startswith("mentions a ")
    ]
    assert len(empty) > 20
    assert all(roles.parse_decisions(e["target"], 1)[0][0].value == 0 for e in empty)
    # the default's records are unchanged by the option's existence
    assert toyroles.sft_records(4, 5, (2, 1, 1)) == toyroles.sft_records(
        4, 5, (2, 1, 1), judge_repeats=False
    )


def test_recolour_captions_name_an_object_in_a_colour_no_object_of_its_shape_has():
    """Every caption names all of the scene's shapes, 1-2 objects recoloured; the recoloured
    object's presence item is then unmet with its shape named (`toyroles.is_recoloured`)."""
    scene = Scene(
        "two",
        "gray",
        (Obj("circle", "blue", "large", "center"), Obj("circle", "red", "small", "top")),
    )
    items = [toyroles.parse_criterion(f"mentions a {c} circle") for c in ("blue", "red")]
    recoloured = []
    for salt in range(10):
        for c in tw.recolour_captions(scene, seed=2, count=2, salt=salt):
            mentions, background = tw.parse_caption(c["caption"])
            assert background == "gray" and [m.shape for m in mentions] == ["circle"] * 2, c
            assert {m.colour for m in mentions} - {"blue", "red"}, c  # a colour the scene lacks
            assert c["errors"] in (["wrong_colour"], ["wrong_colour"] * 2), c
            recoloured += [toyroles.is_recoloured(f, mentions) for f in items]
    assert 0.4 < np.mean(recoloured) < 1.0  # one or both recoloured (the same one twice happens)


def test_judge_recolours_makes_half_the_unmet_presence_items_name_the_shape():
    """Seed 1, 300 scenes: without it a third of the Judge's unmet presence items are on captions
    that name the item's shape in another colour, with it more than half; default unchanged."""
    rubric = dict(absent_shapes=True, count_items=True, attribute_items=False)

    def share(judge_recolours):
        recs = toyroles.sft_records(1, 300, (0, 0, 1), judge_recolours=judge_recolours, **rubric)
        flags = []
        for e in records.judge_items(recs):
            fact = toyroles.parse_criterion(e["item"][0])
            if fact is None or fact.kind != "present":
                continue
            if roles.parse_decisions(e["target"], 1)[0][0].value == 0:
                flags.append(toyroles.is_recoloured(fact, tw.parse_caption(e["caption"])[0]))
        return np.mean(flags)

    assert share(False) < 0.4 < 0.5 < share(True)
    assert toyroles.sft_records(4, 5, (2, 1, 1)) == toyroles.sft_records(
        4, 5, (2, 1, 1), judge_recolours=False
    )


def test_pair_absent_facts_by_hand_and_judge_pair_absent_makes_the_kind_common():
    """pair_absent_facts: pairs named on a shape of the scene in a colour none of its objects of
    that shape has; not the scene's pairs, not shapes it lacks (absent_shapes prices those), in
    first-named order. judge_pair_absent (seed 1, 300 scenes): the pair-absent kind's share of
    the Judge's per-item examples rises from under 6% to over 12%, with both labels; the
    Generator's records are the same; default unchanged."""
    scene = Scene(
        "s",
        "gray",
        (
            Obj("square", "red", "large", "top left"),
            Obj("square", "blue", "small", "center"),
            Obj("circle", "green", "small", "center"),
        ),
    )
    captions = [
        "A large red square and a small green square.",  # green square: invented pair
        "A blue square, a yellow circle and a red star.",  # yellow circle; star: no such shape
        "A green square and a blue square.",  # green square again, then a real pair
    ]
    assert toyroles.pair_absent_facts(scene, captions) == [
        toyroles.Fact("absent", Mention("square", "green")),
        toyroles.Fact("absent", Mention("circle", "yellow")),
    ]
    assert toyroles.pair_absent_facts(scene, ["A red square on a gray background."]) == []
    rubric = dict(absent_shapes=True, count_items=True, attribute_items=False)

    def kinds(**options):
        recs = toyroles.sft_records(1, 300, (0, 1, 1), **rubric, **options)
        counts = collections.Counter()
        for e in records.judge_items([r for r in recs if r["role"] == "judge"]):
            fact = toyroles.parse_criterion(e["item"][0])
            value = roles.parse_decisions(e["target"], 1)[0][0].value
            counts[(toyroles.report_kind(fact), value)] += 1
        return counts, [r for r in recs if r["role"] == "generator"]

    (before, gen_before), (after, gen_after) = kinds(), kinds(judge_pair_absent=True)
    share = lambda c: (c[("absent", 0)] + c[("absent", 1)]) / sum(c.values())
    assert share(before) < 0.06 and share(after) > 0.12
    assert after[("absent", 0)] > 2 * before[("absent", 0)] and after[("absent", 1)] > 0
    assert gen_before == gen_after
    assert toyroles.sft_records(4, 5, (2, 1, 1)) == toyroles.sft_records(
        4, 5, (2, 1, 1), judge_pair_absent=False
    )


def test_every_object_items_pay_each_named_object_in_every_sample():
    """every_object: one "mentions a <colour> <shape>" item per object of the scene after the shape
    items, in place of the deficiency item naming the same pair; dropping an object then costs
    its weight even when the shown candidates named it (hand-computed rewards: 19 / 22 where the
    rubric without the option pays 16 / 16)."""
    complete = "A large red circle at the top left and a small blue square in the center."
    expected = [
        "does not mention a triangle",
        "does not mention a diamond",
        "does not mention a star",
        "mentions at most one circle",
        "mentions at most one square",
        "mentions a red circle",
        "mentions a blue square",
        "the background is white",
    ]
    options = dict(absent_shapes=True, count_items=True, every_object=True)
    for shown in ([complete], ["A large red circle at the top left."]):
        facts = toyroles.rubric_facts(SCENE, shown, **options)
        assert [toyroles.item_of(f).criterion for f in facts] == expected, shown
        assert all(toyroles.fact_is_true(SCENE, f) for f in facts)
        assert [toyroles.parse_criterion(c) for c in expected] == facts
    # fewer than min_items facts: the fill does not repeat an object item
    lone = Scene("lone", "black", (Obj("star", "yellow", "large", "center"),))
    facts = toyroles.rubric_facts(
        lone, ["A large yellow star in the center on a black background."], every_object=True
    )
    assert [toyroles.item_of(f).criterion for f in facts] == [
        "mentions a yellow star",
        "the background is black",
    ]
    with_bg = complete[:-1] + " on a white background."
    no_square = "A large red circle at the top left on a white background."
    star = with_bg.replace(" on", " and a green star on")
    for every, want in [
        (False, {with_bg: 1.0, no_square: 1.0, star: 13 / 16}),
        (True, {with_bg: 1.0, no_square: 19 / 22, star: 19 / 22}),
    ]:
        exact = toyroles.ExactRoles(
            {SCENE.id: SCENE}, absent_shapes=True, count_items=True, every_object=every
        )
        rubric = exact.rubric(SCENE.id, [complete])
        weights = [item.weight for item in rubric]
        for caption, reward in want.items():
            got = roles.rubric_reward(weights, exact.decisions(rubric, caption))
            assert got == pytest.approx(reward), (every, caption)
    assert toyroles.rubric_options(ml_collections.ConfigDict({"every_object": True})) == {
        **toyroles.RUBRIC_DEFAULTS,
        "every_object": True,
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_records_parse_back_and_are_true(seed):
    examples = toyroles.sft_records(seed, 80, mix=(2, 1, 2))
    scenes = {s.id: s for s in tw.make_scenes(seed, 80)}
    assert [e["role"] for e in examples[:5]] == ["policy", "policy", "generator", "judge", "judge"]
    for example in examples:
        scene = scenes[example["scene_id"]]
        if example["role"] == "policy":
            assert tw.caption_metrics(scene, example["target"])["f1"] == 1.0
        elif example["role"] == "generator":
            items, problems = roles.parse_rubric(example["target"])
            assert problems == [] and 1 <= len(items) <= toyroles.MAX_RUBRIC_ITEMS
            assert {i.weight for i in items} <= {1.0, 2.0, 3.0}
            assert toyroles.rubric_truth_rate(scene, items) == (1.0, 0)
            # Complete references meet every item of a rubric that is true of the scene.
            for reference in example["references"]:
                facts = [toyroles.parse_criterion(i.criterion) for i in items]
                mentions, background = tw.parse_caption(reference)
                assert all(toyroles.judge_fact(f, mentions, background).value for f in facts)
        else:
            rubric = [roles.RubricItem(*item) for item in example["rubric"]]
            decisions, problems = roles.parse_decisions(example["target"], len(rubric))
            assert problems == []
            assert toyroles.judge_accuracy(rubric, example["caption"], decisions) == (1.0, 0)


def test_generator_rubric_metrics_by_hand():
    """The eval's (and benchmarks/role_curve.py's) reading of written rubrics: targets are
    true and exact; a rubric that repeats its first item twice has 2 of its n+2 items repeated;
    the next scene's target, read on a scene, is the other-scene baseline."""
    from mocojax.eval import toyworld_eval

    scenes = {s.id: s for s in tw.make_scenes(3, 4, start=100)}
    options = dict(absent_shapes=True, count_items=True, attribute_items=False)
    examples = [
        r for s in scenes.values() for r in toyroles.scene_sft_records(s, 3, (0, 1, 0), **options)
    ]
    targets = [e["target"] for e in examples]
    got = toyworld_eval.generator_rubric_metrics(scenes, examples, targets)
    assert got["generator/rubric_truth_rate"] == 1.0 and got["generator/exact_target_rate"] == 1.0
    assert got["generator/repeated_item_rate"] == 0.0 and got["generator/unreadable_items"] == 0
    other = [
        toyroles.rubric_truth_rate(
            scenes[e["scene_id"]], roles.parse_rubric(targets[(k + 1) % 4])[0]
        )[0]
        for k, e in enumerate(examples)
    ]
    assert got["generator/rubric_truth_other_scene"] == pytest.approx(np.mean(other))
    assert np.mean(other) < 1.0
    kinds = {k.split("/target_items_")[1] for k in got if "/target_items_" in k}
    assert {"present", "absent_shape", "at_most"} <= kinds  # the targets' kinds, each written
    for kind in kinds:
        assert got[f"generator/truth_{kind}"] == 1.0
        assert got[f"generator/items_{kind}"] == got[f"generator/target_items_{kind}"] > 0
    assert got["generator/present_false_swapped"] == 0.0  # no false presence item
    lines = targets[0].splitlines()
    first = lines[0].split(" | ", 1)[1]  # its weight, criterion and rationale, under new ids
    doubled = "\n".join(lines + [f"{len(lines) + 1} | {first}", f"{len(lines) + 2} | {first}"])
    got = toyworld_eval.generator_rubric_metrics(scenes, examples[:1], [doubled])
    assert got["generator/repeated_item_rate"] == pytest.approx(2 / (len(lines) + 2))
    assert got["generator/exact_target_rate"] == 0.0 and got["generator/rubric_truth_rate"] == 1.0
    assert got["generator/items_per_rubric"] == len(lines)  # the repeats are dropped, as in RL


def test_rubric_truth_by_kind_by_hand():
    """Per kind, the items true of SCENE (a large red circle, a small blue square); of the false
    presence items, a red square (a colour and a shape of the scene, on different objects) is a
    swap, a green square and a red star are not."""
    facts = [
        toyroles.Fact("present", Mention("square", "blue")),  # true
        toyroles.Fact("present", Mention("square", "red")),  # false: swapped
        toyroles.Fact("present", Mention("square", "green")),  # false: no green object
        toyroles.Fact("present", Mention("star", "red")),  # false: no star
        toyroles.Fact("absent", Mention("star")),  # true (absent_shape)
        toyroles.Fact("absent", Mention("circle")),  # false (absent_shape)
        toyroles.Fact("absent", Mention("circle", "blue")),  # true (a pair absent item)
        toyroles.Fact("background", value="white"),  # true
    ]
    items = [toyroles.item_of(f) for f in facts] + [roles.RubricItem("is pretty", "-", 1.0)]
    by_kind, swapped = toyroles.rubric_truth_by_kind(SCENE, items)
    assert by_kind == {
        "present": [1, 4],
        "absent_shape": [1, 2],
        "absent": [1, 1],
        "background": [1, 1],
        "unreadable": [0, 1],
    }
    assert swapped == 1
    assert toyroles.rubric_truth_rate(SCENE, items) == (4 / 9, 1)  # the pooled reading agrees


def test_generator_reference_order_follows_the_reference_by_hand():
    """generator_reference_order: the scene's objects in the order its reference names them (any
    unnamed after); the Generator's count items then follow the reference's first mention of each
    shape, the items themselves do not change, and the Judge's records are the same."""
    reference = "A small blue square in the center and a large red circle at the top left."
    ordered = toyroles.reference_ordered(SCENE, reference)
    assert ordered.objects == SCENE.objects[::-1] and ordered.background == SCENE.background
    assert toyroles.reference_ordered(SCENE, "A small blue square.").objects == SCENE.objects[::-1]
    assert toyroles.reference_ordered(SCENE, "A white background.").objects == SCENE.objects
    shown = ["A white background."]
    options = dict(absent_shapes=True, count_items=True, attribute_items=False)
    criteria = [
        toyroles.item_of(f).criterion for f in toyroles.rubric_facts(ordered, shown, **options)
    ]
    assert criteria[3:] == [
        "mentions at most one square",
        "mentions at most one circle",
        "mentions a blue square",
        "mentions a red circle",
    ]
    kinds = dict(judge_repeats=True, policy_drop=0.4, **options)
    changed = 0
    for scene in tw.make_scenes(5, 40):
        plain, ordered_records = (
            toyroles.scene_sft_records(scene, 5, (1, 2, 2), generator_reference_order=o, **kinds)
            for o in (False, True)
        )
        for a, b in zip(plain, ordered_records):
            if a["role"] != "generator":
                assert a == b
                continue
            items = roles.parse_rubric(b["target"])[0]
            assert set(items) == set(roles.parse_rubric(a["target"])[0])
            changed += a["target"] != b["target"]
            named = [m.shape for m in tw.parse_caption(b["references"][0])[0]]
            counted = [
                toyroles.parse_criterion(i.criterion).referent.shape
                for i in items
                if i.criterion.startswith("mentions at most")
            ]
            assert counted == list(dict.fromkeys(named)), (b["references"][0], b["target"])
    assert changed > 10  # the draw order and the reference's differ in most scenes


def test_generator_other_image_swaps_only_generator_images():
    """generator_other_image: that share of Generator records shows another scene of the range
    (named by image_scene_id); its references, candidates and target stay its own scene's, every
    other record is unchanged, and 0 gives the records as before."""
    options = dict(absent_shapes=True, count_items=True, attribute_items=False)
    plain = toyroles.sft_records(4, 30, (1, 2, 1), **options)
    assert toyroles.sft_records(4, 30, (1, 2, 1), generator_other_image=0.0, **options) == plain
    scenes = {s.id: s for s in tw.make_scenes(4, 30)}
    for share, low, high in ((1.0, 60, 60), (0.5, 18, 42)):
        swapped = toyroles.sft_records(4, 30, (1, 2, 1), generator_other_image=share, **options)
        assert swapped == toyroles.sft_records(
            4, 30, (1, 2, 1), generator_other_image=share, **options
        )  # deterministic
        moved = 0
        for a, b in zip(plain, swapped):
            if a["role"] != "generator" or "image_scene_id" not in b:
                assert a == b
                continue
            moved += 1
            assert (
                b["image_scene_id"] != b["scene_id"] and b["scene"] == scenes[b["image_scene_id"]]
            )
            assert a["scene"] == scenes[a["scene_id"]]
            assert {**b, "scene": a["scene"], "image_scene_id": None} == {
                **a,
                "image_scene_id": None,
            }
        assert low <= moved <= high, moved
    with pytest.raises(ValueError, match="at least 2 scenes"):
        toyroles.sft_records(4, 1, (1, 1, 1), generator_other_image=0.5)


def test_weak_swap_colours_by_hand():
    """A wrong colour at swap_colours=1 is the other object's (SCENE: a red circle, a blue
    square); at 0 it may be any colour the shape lacks. Over Generator candidates of 30 scenes,
    weak_swap_colours=1 makes nearly every wrong colour a swap (0: about a quarter), changes
    nothing else of the records' form, and 0 gives the records as before."""
    import numpy as np

    mentions = [tw.Mention(o.shape, o.colour, o.size, o.position) for o in SCENE.objects]
    for k in range(20):
        rng = np.random.default_rng(k)
        (circle, square), _ = tw._apply_error(SCENE, mentions, "white", "wrong_colour", rng, 1.0)
        assert (circle.colour, square.colour) in {("blue", "blue"), ("red", "red")}
    seen = {
        tw._apply_error(SCENE, mentions, "white", "wrong_colour", np.random.default_rng(k))[0][
            0
        ].colour
        for k in range(40)
    }
    assert len(seen) > 2  # any colour the circle lacks

    def swap_share(swap_colours):  # over the captions written from the scene itself
        wrong = swapped = 0
        for scene in tw.make_scenes(4, 100):
            colours, shapes = {o.colour for o in scene.objects}, {o.shape for o in scene.objects}
            pairs = {(o.shape, o.colour) for o in scene.objects}
            for c in tw.weak_captions(scene, 4, 4, swap_colours=swap_colours):
                if c["kind"] == "blind" or len(colours) < 2:  # another scene's / no swap exists
                    continue
                for m in tw.parse_caption(c["caption"])[0]:
                    if m.colour and m.shape in shapes and (m.shape, m.colour) not in pairs:
                        wrong, swapped = wrong + 1, swapped + (m.colour in colours)
        return swapped / wrong

    assert swap_share(0.0) < 0.4 and swap_share(1.0) > 0.9
    options = dict(absent_shapes=True, count_items=True, attribute_items=False)
    plain = toyroles.sft_records(4, 30, (1, 2, 1), **options)
    assert toyroles.sft_records(4, 30, (1, 2, 1), weak_swap_colours=0.0, **options) == plain
    swaps = toyroles.sft_records(4, 30, (1, 2, 1), weak_swap_colours=1.0, **options)
    assert [(r["id"], r["role"]) for r in swaps] == [(r["id"], r["role"]) for r in plain]
    changed = [a["id"] for a, b in zip(plain, swaps) if a != b]
    assert changed and all(a == b for a, b in zip(plain, swaps) if a["role"] == "policy")


def test_uncut_rubric_catches_every_flawed_candidate():
    for scene in tw.make_scenes(9, 150):
        candidates = [c["caption"] for c in tw.candidate_captions(scene, seed=9)]
        facts = toyroles.rubric_facts(scene, candidates, max_items=100)
        weights = [toyroles.WEIGHTS[f.kind] for f in facts]
        for caption in candidates:
            mentions, background = tw.parse_caption(caption)
            values = [toyroles.judge_fact(f, mentions, background).value for f in facts]
            flawed = tw.caption_metrics(scene, caption)["f1"] < 1.0
            assert (roles.rubric_reward(weights, values) < 1.0) == flawed


def test_wrong_judge_decisions_lower_accuracy():
    example = next(e for e in toyroles.sft_records(4, 5) if e["role"] == "judge")
    rubric = [roles.RubricItem(*item) for item in example["rubric"]]
    decisions, _ = roles.parse_decisions(example["target"], len(rubric))
    flipped = [1 - decisions[0].value] + [d.value for d in decisions[1:]]
    accuracy, unreadable = toyroles.judge_accuracy(rubric, example["caption"], flipped)
    assert accuracy == pytest.approx(1 - 1 / len(rubric)) and unreadable == 0


def test_determinism():
    assert tw.make_scenes(11, 20) == tw.make_scenes(11, 20)
    assert tw.make_scenes(11, 20) != tw.make_scenes(12, 20)
    assert tw.make_scenes(11, 5, start=15) == tw.make_scenes(11, 20)[15:]
    assert toyroles.sft_records(11, 10) == toyroles.sft_records(11, 10)
    scene = tw.make_scene(11, 3)
    assert np.array_equal(np.asarray(tw.render(scene)), np.asarray(tw.render(scene)))
    assert Scene.from_dict(scene.to_dict()) == scene


def test_render_and_contact_sheet():
    scene = Scene("r", "black", (Obj("star", "yellow", "large", "center"),))
    pixels = np.asarray(tw.render(scene, 96))
    assert pixels.shape == (96, 96, 3)
    assert tuple(pixels[48, 48]) == tw.COLOURS["yellow"]
    assert tuple(pixels[2, 2]) == tw.BACKGROUNDS["black"]
    assert tw.contact_sheet(0, count=6, columns=3, size=32, gap=2).size == (3 * 34 + 2, 2 * 34 + 2)


def test_tokenizer_covers_every_record(tmp_path):
    path = toyroles.build_tokenizer(str(tmp_path / "tok"))
    tokenizer = processing.load_tokenizer(path)
    vocab_size = len(tokenizer)
    assert vocab_size < 1000
    for token in toyroles.SPECIAL_TOKENS:
        assert tokenizer.convert_ids_to_tokens(tokenizer.convert_tokens_to_ids(token)) == token
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    unk = tokenizer.unk_token_id
    texts = []
    for example in toyroles.sft_records(77, 150, mix=(3, 1, 3)):
        for message in records.conversation(example, None):
            content = message["content"]
            texts += (
                [content]
                if isinstance(content, str)
                else [part["text"] for part in content if part["type"] == "text"]
            )
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert unk not in ids, text
        assert tokenizer.decode(ids) == text
    specials = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>"
    ids = tokenizer(specials, add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids[:2]) == ["<|im_start|>", "user"]
    assert len(ids) == 8


def test_terse_captions_skip_objects_but_state_only_true_facts():
    """policy_drop: Policy targets leave objects out (recall < 1) but never state a wrong fact;
    at least one object stays; 0 gives the references unchanged; validation refuses 1."""
    scenes = tw.make_scenes(3, 200)
    metrics = [tw.caption_metrics(s, tw.terse_caption(s, 3, 0, 0.5)) for s in scenes]
    assert all(m["precision"] == 1.0 for m in metrics)
    assert all(len(tw.parse_caption(tw.terse_caption(s, 3, 0, 0.99))[0]) == 1 for s in scenes)
    multi = [m for s, m in zip(scenes, metrics) if len(s.objects) > 1]
    assert 0.5 < np.mean([m["recall"] for m in multi]) < 0.9
    assert tw.terse_caption(scenes[5], 3, 1, 0.5) == tw.terse_caption(scenes[5], 3, 1, 0.5)
    terse = toyroles.sft_records(3, 20, (2, 1, 1), policy_drop=0.5)
    full = toyroles.sft_records(3, 20, (2, 1, 1))
    assert [r["target"] for r in terse if r["role"] != "policy"] == [
        r["target"] for r in full if r["role"] != "policy"
    ]
    assert [r["target"] for r in terse if r["role"] == "policy"] != [
        r["target"] for r in full if r["role"] == "policy"
    ]
    assert toyroles.sft_records(3, 5, (2, 1, 1), policy_drop=0.0) == toyroles.sft_records(
        3, 5, (2, 1, 1)
    )


def test_policy_drop_validated():
    import importlib.util
    import os

    from mocojax import config_utils, main

    spec = importlib.util.spec_from_file_location(
        "toyworld_config",
        os.path.join(os.path.dirname(__file__), os.pardir, "configs", "toyworld.py"),
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("tiny")
    config.data.policy_drop = 1.0
    with pytest.raises(ValueError, match="data.policy_drop"):
        config_utils.validate(config, main.STAGES)
    config.data.policy_drop = 0.4
    with config.ignore_type():
        config.data.attribute_items = "no"
    with pytest.raises(ValueError, match="data.attribute_items"):
        config_utils.validate(config, main.STAGES)
    with config.ignore_type():
        config.data.attribute_items = True
    for key in ("generator_other_image", "weak_swap_colours"):  # shares in [0, 1]
        for bad in (1.5, -0.1, "half"):
            with config.ignore_type():
                config.data[key] = bad
            with pytest.raises(ValueError, match=f"data.{key}"):
                config_utils.validate(config, main.STAGES)
        with config.ignore_type():
            config.data[key] = 0.5
        config_utils.validate(config, main.STAGES)


def test_per_item_judge_outputs_score_like_the_same_whole_rubric_outputs():
    """The eval scores a per-item Judge (one reply per item) exactly as the whole-rubric Judge
    giving the same decisions: same confusion counts, overall and per item kind."""
    from mocojax.eval import toyworld_eval

    whole = [e for e in toyroles.sft_records(1, 6, (0, 0, 1)) if e["role"] == "judge"]
    rng = np.random.default_rng(0)
    said = [list(rng.integers(0, 2, len(e["rubric"]))) for e in whole]
    whole_out = [roles.format_decisions([roles.Decision(int(v), "") for v in s]) for s in said]
    split = records.judge_items(whole)
    split_out = [roles.format_decisions([roles.Decision(int(v), "")]) for s in said for v in s]
    confusion, _, _, by_kind, recoloured = toyworld_eval._judge_scores(whole, whole_out)
    item_confusion, _, _, item_by_kind, item_recoloured = toyworld_eval._judge_scores(
        split, split_out
    )
    assert item_confusion == confusion and item_by_kind == by_kind
    assert item_recoloured == recoloured
    assert sum(confusion[k] for k in ("tp", "fn", "tn", "fp")) == len(split)


def test_judge_on_policy_examples_carry_the_exact_decisions_on_the_policy_captions():
    """The eval's second Judge block asks the Judge about the Policy's own captions, each read
    against its scene's Generator rubric; the targets are the exact Judge's decisions."""
    from mocojax.eval import toyworld_eval

    examples = toyroles.sft_records(1, 40, toyworld_eval.EVAL_MIX, start=300)
    generator = [e for e in examples if e["role"] == "generator"]
    policy = [e for e in examples if e["role"] == "policy"]
    scenes = {s.id: s for s in tw.make_scenes(1, 40, 300)}
    # Stand-in Policy outputs: another scene's reference (wrong content) for every other scene.
    order = list(scenes)
    captions = [
        tw.reference_captions(scenes[order[(k + k % 2) % len(order)]], 1)[0]
        for k, e in enumerate(policy)
    ]
    judged = toyworld_eval.policy_judge_examples(generator, policy, captions)
    assert 0 < len(judged) <= len(policy)
    by_id = {e["id"]: (e, c) for e, c in zip(policy, captions)}
    for example in judged:
        source, caption = by_id[example["id"].removesuffix("/judged")]
        assert example["caption"] == caption and example["scene_id"] == source["scene_id"]
        rubric = [roles.RubricItem(*item) for item in example["rubric"]]
        decisions, problems = roles.parse_decisions(example["target"], len(rubric))
        assert not problems
        mentions, background = tw.parse_caption(caption)
        for item, decision in zip(rubric, decisions):
            fact = toyroles.parse_criterion(item.criterion)
            assert decision.value == toyroles.judge_fact(fact, mentions, background).value
    # The exact Judge scores 1 on them, always-"1" less, and both labels occur in some kind.
    exact = [e["target"] for e in judged]
    ones = [roles.format_decisions([roles.Decision(1, "")] * len(e["rubric"])) for e in judged]
    confusion, accuracy, always_1, by_kind, recoloured = toyworld_eval._judge_scores(judged, exact)
    assert np.mean(accuracy) == 1.0 and confusion["fp"] == confusion["fn"] == 0
    assert toyworld_eval.within_kind_balanced_accuracy(by_kind) == 1.0
    assert 0.2 < np.mean(always_1) < 0.9
    _, accuracy_1, _, by_kind_1, recoloured_1 = toyworld_eval._judge_scores(judged, ones)
    assert accuracy_1 == always_1 and toyworld_eval.within_kind_balanced_accuracy(by_kind_1) == 0.5
    # Recoloured presence items: the exact Judge passes none, always "1" all of them.
    assert recoloured[0] == 0 and recoloured_1 == [recoloured[1]] * 2
    assert toyworld_eval.recoloured_metrics("judge/", recoloured_1) == {
        "judge/recoloured_items": recoloured[1],
        **({"judge/recoloured_pass_rate": 1.0} if recoloured[1] else {}),
    }


def test_caption_breakdown_by_hand():
    """Objects found and attributes stated / right, pooled over captions, counted by hand."""
    captions = [
        # circle: all three attributes right; square: size only, wrong; a star invented
        "A large red circle at the top left, a big blue square and a green star.",
        # circle with a wrong colour and a wrong place; the square missed
        "A blue circle in the center on a white background.",
    ]
    out = tw.caption_breakdown([tw.caption_metrics(SCENE, c) for c in captions])
    # 4 objects in the two captions' scenes, 3 of them found; 4 mentions, 3 matched
    assert out["object_recall"] == pytest.approx(3 / 4)
    assert out["object_precision"] == pytest.approx(3 / 4)
    # colour stated by all 3 matched mentions (2 right); size by 2 (1 right); position by 2 (1)
    assert out["colour_stated"] == pytest.approx(1.0) and out["colour_accuracy"] == pytest.approx(
        2 / 3
    )
    assert out["size_stated"] == pytest.approx(2 / 3) and out["size_accuracy"] == pytest.approx(0.5)
    assert out["position_stated"] == pytest.approx(2 / 3)
    assert out["position_accuracy"] == pytest.approx(0.5)
    assert tw.caption_breakdown([tw.caption_metrics(SCENE, "")])["object_precision"] == 0.0


def test_judge_gate_reports_each_kind_exact_and_always_yes(monkeypatch):
    """RL's gate (and benchmarks/judge_curve.py) per item kind: the exact Judge's replies score
    1.0 in every kind and pass no recoloured presence item; the same replies with every verdict
    "yes" score 0.5 in every kind (both labels occur in each) and pass all of them."""
    from mocojax.eval import toyworld_eval

    asked = []

    def replies(verdict):
        def generate(cfg, params, processor, examples, *args, **kwargs):
            asked.extend(examples)
            if verdict is None:  # the exact Judge: the targets
                return [e["target"] for e in examples]
            return [e["target"].rsplit("|", 1)[0] + f"| {verdict}" for e in examples]

        return generate

    rubric = dict(absent_shapes=True, count_items=True, attribute_items=False, count_floor=True)
    kwargs = dict(seed=2, start=500, num_scenes=12, batch_size=8, max_new_tokens=24)
    monkeypatch.setattr(toyworld_eval, "generate_texts", replies(None))
    exact = toyworld_eval.judge_gate(None, None, None, judge_per_item="reason", **kwargs, **rubric)
    assert all(e["item_form"] == "reason" and "item" in e for e in asked)
    kinds = {k for k in exact if k.startswith("balanced_accuracy_") and "kind" not in k}
    # present, pair absent, absent shape, at most, at least, background: all with both labels here
    assert {"balanced_accuracy_present", "balanced_accuracy_at_least"} <= kinds and len(kinds) >= 5
    assert all(exact[k] == 1.0 for k in kinds) and exact["balanced_accuracy_worst_kind"] == 1.0
    assert exact["recoloured_items"] > 0 and exact["recoloured_pass_rate"] == 0.0
    # what each kind's score rests on: every decided item counted once, under its kind
    counts = {k: v for k, v in exact.items() if k.startswith("items_")}
    assert sum(counts.values()) == exact["num_items"] and {
        f"items_{k[len('balanced_accuracy_') :]}" for k in kinds
    } <= set(counts)
    assert all(
        0 < exact[f"unmet_{k}"] < n
        for k, n in counts.items()
        if f"balanced_accuracy_{k[6:]}" in kinds
    )
    monkeypatch.setattr(toyworld_eval, "generate_texts", replies("yes"))
    yes = toyworld_eval.judge_gate(None, None, None, judge_per_item="reason", **kwargs, **rubric)
    assert {k for k in yes if k in kinds} == kinds and all(yes[k] == 0.5 for k in kinds)
    assert yes["accuracy"] == yes["accuracy_always_1"] and yes["recoloured_pass_rate"] == 1.0
