"""Role formats: round trips, parser tolerance, reward, message shapes."""

import numpy as np
import pytest
from PIL import Image

from mocojax import roles

ITEMS = [
    roles.RubricItem("mentions a red circle", "a red circle must be named", 3.0),
    roles.RubricItem("the circle is large", "it must be called large", 2.0),
    roles.RubricItem("the background is white", "it must be called white", 1.5),
]
DECISIONS = [
    roles.Decision(1, "it is named"),
    roles.Decision(0, "it is small"),
    roles.Decision(1, "it is called white"),
]


def test_round_trips():
    assert (
        roles.format_rubric(ITEMS).splitlines()[0]
        == "1 | 3 | mentions a red circle | a red circle must be named"
    )
    assert roles.parse_rubric(roles.format_rubric(ITEMS)) == (ITEMS, [])
    assert roles.parse_decisions(roles.format_decisions(DECISIONS), 3) == (DECISIONS, [])


def test_rubric_tolerates_fences_reasoning_and_trailing_text():
    text = (
        "Let me look at the candidates first.\nThey miss the circle.\n```\n"
        + roles.format_rubric(ITEMS)
        + "\n```\nThat is the rubric. Done | ok"
    )
    items, problems = roles.parse_rubric(text)
    assert items == ITEMS and problems == []


def test_rubric_weights():
    text = (
        "1 | high | mentions a red circle | named\n"  # non-numeric -> default
        "2 | mentions a blue square | named\n"  # missing -> default
        "3 | 0 | mentions a green star | named\n"  # non-positive -> dropped
        "4 | -2 | mentions a red star | named\n"
        "5 | 1e6 | mentions a red square | named\n"  # clipped
        "6 | nan | mentions a red diamond | named\n"
    )
    items, problems = roles.parse_rubric(text)
    assert [i.criterion for i in items] == [
        "mentions a red circle",
        "mentions a blue square",
        "mentions a red square",
        "mentions a red diamond",
    ]
    assert [i.weight for i in items] == [1.0, 1.0, roles.MAX_WEIGHT, 1.0]
    assert len(problems) == 6 and all(p.startswith("item ") for p in problems)


def test_merge_rubrics_by_hand():
    """The union of draws: first-seen order, a criterion repeated in another case or spacing is
    one item (the first draw's check and weight kept), at most max_items items; min_votes keeps
    the criteria that many draws name."""
    item = roles.RubricItem
    draws = [
        [item("mentions a red circle", "named", 3.0), item("the background is white", "b", 1.0)],
        [],  # a draw that parsed to nothing
        [item("The background  is WHITE", "again", 2.0), item("mentions a blue star", "s", 2.0)],
        [item("mentions a green square", "g", 1.0)],
    ]
    assert roles.merge_rubrics(draws) == [
        item("mentions a red circle", "named", 3.0),
        item("the background is white", "b", 1.0),
        item("mentions a blue star", "s", 2.0),
        item("mentions a green square", "g", 1.0),
    ]
    assert [i.criterion for i in roles.merge_rubrics(draws, max_items=2)] == [
        "mentions a red circle",
        "the background is white",
    ]
    assert roles.merge_rubrics([[], []]) == []
    # min_votes 2: only the criterion two draws name (the background), with its first form
    assert roles.merge_rubrics(draws, min_votes=2) == [item("the background is white", "b", 1.0)]
    assert roles.merge_rubrics(draws, min_votes=3) == []
    # a criterion a draw repeats is one vote of that draw
    twice = [[item("mentions a blue star", "s", 2.0), item("Mentions a blue star", "t", 1.0)]]
    assert roles.merge_rubrics(twice, min_votes=2) == []


def test_rubric_ids_duplicates_and_truncation():
    text = (
        "3 | 2 | the circle is large | called large\n"
        "3 | 2 | the circle is red | called red\n"
        "- [7]: 1 | The circle is  LARGE | again\n"  # duplicate criterion, decorated id
        "8 | 3 | mentions a red circle\n"  # complete but without a check
        "9 | 3 | mentions a gre"
    )  # truncated mid-item
    items, problems = roles.parse_rubric(text)
    assert [i.criterion for i in items] == [
        "the circle is large",
        "the circle is red",
        "mentions a red circle",
    ]
    assert items[2].check == ""
    assert any("duplicate id" in p for p in problems)
    assert any("duplicate criterion" in p for p in problems)
    assert any("truncated" in p for p in problems)
    assert any("missing check" in p for p in problems)


@pytest.mark.parametrize("text", ["", "no rubric here", None, 17, "```\n```", "|||\n| | |"])
def test_rubric_never_raises(text):
    items, problems = roles.parse_rubric(text)
    assert items == [] and problems


def test_decisions_tolerance():
    text = (
        "Checking each item.\n```text\n"
        "1 | yes | named\n"
        "1 | 0 | second answer ignored\n"
        "7 | 1 | out of range\n"
        "2 | maybe | unreadable\n"
        "Item 3: 1 | fine\n```\ntrailing words"
    )
    decisions, problems = roles.parse_decisions(text, 4)
    assert [d.value for d in decisions] == [1, 0, 1, 0]
    assert decisions[0].rationale == "named"
    joined = " ".join(problems)
    assert "duplicate" in joined and "out of range" in joined and "unreadable" in joined
    assert "missing decisions for items [2, 4]" in joined


def test_truncated_decisions_count_zero():
    decisions, problems = roles.parse_decisions("1 | 1 | ok\n2 | 1 | fi", 3)
    assert [d.value for d in decisions] == [1, 1, 0]
    assert problems == ["missing decisions for items [3], counted as 0"]
    decisions, problems = roles.parse_decisions(None, 2)
    assert [d.value for d in decisions] == [0, 0] and len(problems) == 2


def test_rubric_reward():
    assert roles.rubric_reward([3, 2, 1], [1, 0, 1]) == pytest.approx(4 / 6)
    assert roles.rubric_reward([i.weight for i in ITEMS], DECISIONS) == pytest.approx(4.5 / 6.5)
    batch = roles.rubric_reward([3, 1], np.array([[1, 1], [0, 1], [0, 0]]))
    np.testing.assert_allclose(batch, [1.0, 0.25, 0.0])
    assert roles.rubric_reward([], []) == 0.0
    assert roles.rubric_reward([0.0, 0.0], [1, 1]) == 0.0


def test_messages():
    image = Image.new("RGB", (8, 8))
    policy = roles.policy_messages(image)
    assert policy[0]["content"][0] == {"type": "image", "image": image}
    assert policy[0]["content"][1]["text"] == roles.POLICY_INSTRUCTION
    generator = roles.generator_messages(image, ["ref one", "ref two"], ["cand a"])
    text = generator[0]["content"][1]["text"]
    assert "References:\n1. ref one\n2. ref two\nCandidates:\n1. cand a" in text
    first = roles.judge_messages(ITEMS, "a red circle")[0]["content"][0]["text"]
    second = roles.judge_messages(ITEMS, "a blue square")[0]["content"][0]["text"]
    # Rubric first, caption last: everything before the caption is a shared prefix.
    prefix = first[: -len("a red circle")]
    assert second.startswith(prefix) and prefix.endswith("Caption:\n")
    assert "3 | the background is white | it must be called white" in prefix
    assert all(
        part["type"] == "text" for m in roles.judge_messages(ITEMS, "x") for part in m["content"]
    )


def test_judge_item_messages_put_the_caption_first_and_the_one_item_last():
    item = roles.RubricItem("mentions a red circle", "named", 3.0)
    (message,) = roles.judge_item_messages(item, "a small red circle at the top")
    assert message["role"] == "user"
    assert message["content"] == [
        {
            "type": "text",
            "text": f"{roles.JUDGE_INSTRUCTION}\nCaption:\na small red circle at the top\n"
            "Rubric:\n1 | mentions a red circle | named",
        }
    ]
    # The one-line reply reads back with parse_decisions(text, 1).
    decisions, problems = roles.parse_decisions("1 | 0 | it is not named", 1)
    assert decisions == [roles.Decision(0, "it is not named")] and problems == []
