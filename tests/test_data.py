"""Records, sources (PixMo-Cap, DenseFusion shapes), bad records, and the grain pipelines."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from configs import toyworld as toyworld_config
from mocojax import config_utils, main, processing, roles
from mocojax.data import pipeline, records, sources, toybase, toyroles


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(row if isinstance(row, str) else json.dumps(row))
            f.write("\n")
    return str(path)


def _image(path, colour=(200, 30, 30)):
    Image.new("RGB", (40, 30), colour).save(path)
    return str(path)


@pytest.fixture
def image_dir(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    _image(folder / "a.png")
    _image(folder / "b.jpg", (10, 10, 200))
    (folder / "broken.jpg").write_bytes(b"not an image at all")
    return folder


USER_ROW = {
    "id": "img1",
    "image": "a.png",
    "references": ["A red box.", "A red square."],
    "candidates": [{"id": "c0", "caption": "A blue box."}],
    "rubric": [{"criterion": "says the box is red", "check": "red", "weight": 2}],
    "decisions": {"c0": [{"value": 0, "rationale": "it says blue"}]},
}


def test_user_jsonl_to_role_examples(image_dir, tmp_path):
    path = _write_jsonl(tmp_path / "data.jsonl", [USER_ROW])
    loaded, report = records.load_jsonl(path, image_root=str(image_dir), strict=True)
    assert report.kept == 1 and loaded[0]["image"] == str(image_dir / "a.png")
    examples = records.sft_examples(loaded)
    assert [e["role"] for e in examples] == ["policy", "policy", "generator", "judge"]
    items, problems = roles.parse_rubric(examples[2]["target"])
    assert problems == [] and items == [roles.RubricItem("says the box is red", "red", 2.0)]
    decisions, problems = roles.parse_decisions(examples[3]["target"], 1)
    assert problems == [] and decisions == [roles.Decision(0, "it says blue")]
    judge = records.conversation(examples[3], None)
    assert judge[-1] == {"role": "assistant", "content": "1 | 0 | it says blue"}


BAD_ROWS = {
    "missing_image": {"id": "m1", "image": "nope.png", "references": ["x"]},
    "unreadable_image": {"id": "u1", "image": "broken.jpg", "references": ["x"]},
    "empty_caption": {"id": "e1", "image": "a.png", "references": ["  "]},
    "missing_field": {"id": "f1", "image": "a.png"},
}


@pytest.mark.parametrize("reason", sorted(BAD_ROWS))
def test_bad_records_strict_names_the_record(reason, image_dir, tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [USER_ROW, BAD_ROWS[reason]])
    with pytest.raises(records.BadRecord, match=f"record {BAD_ROWS[reason]['id']}:"):
        records.load_jsonl(path, image_root=str(image_dir), strict=True)


def test_bad_records_lenient_skips_and_counts(image_dir, tmp_path):
    rows = [USER_ROW, *BAD_ROWS.values(), "{not json", {"image": "a.png", "references": ["x"]}]
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    loaded, report = records.load_jsonl(path, image_root=str(image_dir))
    assert [r["id"] for r in loaded] == ["img1"]
    assert report.read == 7 and report.kept == 1
    assert report.skipped == {
        "missing_image": 1,
        "unreadable_image": 1,
        "empty_caption": 1,
        "missing_field": 2,
        "bad_json": 1,
    }


def test_pixmo_cap_fixture(image_dir, tmp_path):
    by_digest = "https://images.example.org/x/photo.png"
    (image_dir / f"{sources.url_digest(by_digest)}.png").write_bytes(
        (image_dir / "a.png").read_bytes()
    )
    rows = [
        {"image_url": by_digest, "caption": "A red photo.", "transcripts": ["um a red", "red"]},
        {
            "image_url": "https://cdn.example.org/q/b.jpg?size=2",
            "caption": "Blue.",
            "transcripts": [],
        },
        {"image_url": "https://cdn.example.org/missing.jpg", "caption": "Gone.", "transcripts": []},
        {"image_url": "https://cdn.example.org/q/b.jpg", "caption": "", "transcripts": []},
    ]
    path = _write_jsonl(tmp_path / "pixmo.jsonl", rows)
    loaded, report = sources.load_pixmo_cap(path, str(image_dir), transcripts_as_references=True)
    assert [r["references"] for r in loaded] == [["A red photo.", "um a red", "red"], ["Blue."]]
    assert loaded[0]["id"] == sources.url_digest(by_digest)[:16]
    assert loaded[1]["image"].endswith("b.jpg")
    assert report.skipped == {"missing_image": 1, "empty_caption": 1}
    missing_id = sources.url_digest(rows[2]["image_url"])[:16]
    with pytest.raises(records.BadRecord, match=f"record {missing_id}: no image"):
        sources.load_pixmo_cap(path, str(image_dir), strict=True)


def test_densefusion_fixture(image_dir, tmp_path):
    rows = [
        {"image_id": "df_1", "image_path": "a.png", "caption": "Dense red."},
        {"image_id": "df_2", "image_path": "b.jpg", "caption": "Dense blue."},
        {"image_id": "df_3", "caption": "No path."},
        {"image_id": "df_4", "image_path": "broken.jpg", "caption": "Broken."},
    ]
    path = tmp_path / "densefusion.json"
    path.write_text(json.dumps(rows))
    loaded, report = sources.load_densefusion(str(path), str(image_dir))
    assert [(r["id"], r["references"]) for r in loaded] == [
        ("df_1", ["Dense red."]),
        ("df_2", ["Dense blue."]),
    ]
    assert report.skipped == {"missing_field": 1, "unreadable_image": 1}
    with pytest.raises(records.BadRecord, match="record df_3: field 'image_path'"):
        sources.load_densefusion(str(path), str(image_dir), strict=True)


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    path = toyroles.build_tokenizer(str(tmp_path_factory.mktemp("tok")))
    # 128x128 toy images stay 128x128: 8x8 patches, 16 image tokens.
    return processing.Processor(
        processing.load_tokenizer(path), min_pixels=128 * 128, max_pixels=128 * 128
    )


@pytest.fixture(scope="module")
def examples():
    return toyroles.sft_records(seed=0, num_scenes=12)


def _take(iterator, count):
    return [next(iterator) for _ in range(count)]


def _same(batches_a, batches_b):
    return all(
        np.array_equal(a["input_ids"], b["input_ids"]) and np.array_equal(a["role"], b["role"])
        for a, b in zip(batches_a, batches_b)
    )


def test_pipeline_deterministic_and_resumable(processor, examples):
    def dataset(seed):
        return pipeline.sft_dataset(examples, processor, global_batch_size=4, seed=seed)

    uninterrupted = _take(iter(dataset(0)), 6)
    assert _same(uninterrupted, _take(iter(dataset(0)), 6))
    assert not _same(uninterrupted, _take(iter(dataset(1)), 6))
    first = iter(dataset(0))
    _take(first, 3)
    state = json.loads(json.dumps(first.get_state()))  # survives a checkpoint file
    resumed = iter(dataset(0))
    resumed.set_state(state)
    assert _same(uninterrupted[3:], _take(resumed, 3))
    # 12 scenes x 4 examples = 48: batches 12..13 are the second, reshuffled epoch.
    assert len(_take(iter(dataset(0)), 14)) == 14


def test_pipeline_batches(processor, examples):
    batch = next(iter(pipeline.sft_dataset(examples, processor, global_batch_size=8, seed=3)))
    assert batch["input_ids"].shape[1] in pipeline.DEFAULT_BUCKETS
    assert batch["input_ids"].shape == batch["loss_mask"].shape == (8, batch["input_ids"].shape[1])
    images = sum(records.ROLES[r] != "judge" for r in batch["role"])
    assert batch["image_grid_thw"].shape == (images, 3)
    assert batch["pixel_values"].shape == (images * 64, 1536)
    tokenizer = processor.tokenizer
    # The loss covers exactly the assistant reply and its <|im_end|>.
    ordered = sorted(examples, key=lambda e: e["target"])
    for row in range(8):
        reply = tokenizer.decode(batch["input_ids"][row][batch["loss_mask"][row] == 1])
        assert reply.endswith("<|im_end|>")
        target = reply[: -len("<|im_end|>")]
        match = [e for e in ordered if e["target"] == target]
        assert match and records.ROLES.index(match[0]["role"]) == batch["role"][row]


def test_hosts_split_the_global_batch(processor, examples):
    def rows(index, count):
        it = iter(
            pipeline.sft_dataset(
                examples,
                processor,
                global_batch_size=4,
                seed=5,
                process_index=index,
                process_count=count,
            )
        )
        return [list(map(tuple, b["input_ids"][:, :40])) for b in _take(it, 2)]

    single = rows(0, 1)
    halves = [rows(0, 2), rows(1, 2)]
    for step in range(2):
        assert single[step] == halves[0][step] + halves[1][step]
    with pytest.raises(ValueError, match="does not split"):
        pipeline.host_slice([1, 2, 3], 0, 2)


def test_bucket_length():
    assert pipeline.bucket_length(129, (128, 256)) == 256
    with pytest.raises(ValueError, match="largest length bucket 256"):
        pipeline.bucket_length(300, (128, 256))


def test_rl_dataset():
    image_records = toyroles.image_records(seed=2, num_scenes=6)
    group = next(iter(pipeline.rl_dataset(image_records, global_batch_size=2, seed=0)))
    assert len(group) == 2 and group[0]["image"].size == (128, 128)
    assert len(group[0]["references"]) == toyroles.GENERATOR_REFERENCES
    assert os.path.basename(group[0]["id"]).startswith("toy2-")


def test_role_grouped_batches(processor, examples):
    """group_by_role: one role per batch, roles keep their 2:1:1 share, determinism and resume hold."""
    batches = pipeline.role_batches(examples, 4, seed=0)
    roles_of = [{e["role"] for e in b} for b in batches]
    assert all(len(r) == 1 for r in roles_of)
    counts = {role: sum(r == {role} for r in roles_of) for role in records.ROLES}
    # 12 scenes x (2 Policy, 1 Generator, 1 Judge) = 24 / 12 / 12 examples -> 6 / 3 / 3 batches of 4.
    assert counts == {"policy": 6, "generator": 3, "judge": 3}
    assert sorted(e["id"] for b in batches for e in b) == sorted(e["id"] for e in examples)

    def dataset(seed):
        return pipeline.sft_dataset(
            examples, processor, global_batch_size=4, seed=seed, group_by_role=True
        )

    first = _take(iter(dataset(0)), 12)
    assert all(len(set(b["role"].tolist())) == 1 for b in first)
    policy = [b for b in first if b["role"][0] == records.ROLES.index("policy")]
    generator = [b for b in first if b["role"][0] == records.ROLES.index("generator")]
    # Short Policy rows pad to a smaller bucket than the Generator's long prompts.
    assert max(b["input_ids"].shape[1] for b in policy) < min(
        b["input_ids"].shape[1] for b in generator
    )
    it = iter(dataset(0))
    _take(it, 5)
    resumed = iter(dataset(0))
    resumed.set_state(json.loads(json.dumps(it.get_state())))
    assert _same(first[5:8], _take(resumed, 3))
    with pytest.raises(ValueError, match="no role has 100 examples"):
        pipeline.role_batches(examples[:10], 100, seed=0)


# A whole-rubric Judge example and a Policy example for the per-item split tests.
JUDGE_EXAMPLE = {
    "id": "s/judge0",
    "role": "judge",
    "rubric": [
        ["mentions a red circle", "named", 3.0],
        ["the background is white", "white", 1.0],
    ],
    "caption": "a red circle on a black background",
    "target": "1 | 1 | it is named\n2 | 0 | it is called black",
}
POLICY_EXAMPLE = {"id": "s/policy0", "role": "policy", "target": "a red circle"}


def test_judge_items_split_each_rubric_into_one_example_per_item():
    judge, policy = dict(JUDGE_EXAMPLE), dict(POLICY_EXAMPLE)
    split = records.judge_items([policy, judge])
    assert split[0] is policy
    assert [e["id"] for e in split[1:]] == ["s/judge0/item1", "s/judge0/item2"]
    assert [e["item"] for e in split[1:]] == judge["rubric"]
    assert [e["target"] for e in split[1:]] == ["1 | 1 | it is named", "1 | 0 | it is called black"]
    assert all("rubric" not in e and e["caption"] == judge["caption"] for e in split[1:])
    # The conversation asks about the one item, caption first (roles.judge_item_messages).
    messages = records.conversation(split[2], None)
    assert messages[0]["content"][0]["text"].endswith(
        "Caption:\na red circle on a black background\nRubric:\n1 | the background is white | white"
    )
    assert messages[-1] == {"role": "assistant", "content": "1 | 0 | it is called black"}
    # Already split examples pass through; a target without a decision for an item is refused.
    assert records.judge_items(split) == split
    with pytest.raises(ValueError, match="s/judge0: missing decisions for items \\[2\\]"):
        records.judge_items([dict(judge, target="1 | 1 | it is named")])


def test_check_form_asks_the_base_truth_question_and_answers_yes_or_no():
    """data.judge_item_form="check": each per-item example keeps its item and caption, its
    target becomes yes / no for the decision it held, and its conversation is exactly the toy
    base's `truth` question for that caption and criterion; replies parse back, an unreadable
    one counts 0 and is reported; the form needs the per-item Judge."""
    judge, policy = dict(JUDGE_EXAMPLE), dict(POLICY_EXAMPLE)
    checked = records.check_form(records.judge_items([policy, judge]))
    assert checked[0] is policy
    assert [e["target"] for e in checked[1:]] == ["yes", "no"]
    assert [e["item"] for e in checked[1:]] == judge["rubric"]
    messages = records.conversation(checked[2], None)
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "Caption: a red circle on a black background\nCheck: the background is white"}]},
        {"role": "assistant", "content": "no"},
    ]  # fmt: skip
    base = toybase.base_records(3, 5, task_mix={"truth": 1})[0]
    caption, criterion = base["caption"], base["prompt"].split("\nCheck: ")[1]
    item = roles.RubricItem(criterion, "named", 3.0)
    assert (
        roles.judge_item_prompt(item, caption, "check")[0]["content"][0]["text"] == base["prompt"]
    )
    assert roles.parse_item_reply(" Yes", "check") == ([roles.Decision(1, "")], [])
    assert roles.parse_item_reply("no.", "check") == ([roles.Decision(0, "")], [])
    decisions, problems = roles.parse_item_reply("1 | 1 | it is named", "check")
    assert decisions == [roles.Decision(1, "")] and not problems  # first word "1"
    decisions, problems = roles.parse_item_reply("perhaps", "check")
    assert decisions == [roles.Decision(0, "")] and "unreadable" in problems[0]
    with pytest.raises(ValueError, match="unknown per-item Judge form"):
        roles.judge_item_prompt(item, caption, "lines")
    assert records.judge_item_form({"judge_per_item": True, "judge_item_form": "check"}) == "check"
    assert records.judge_item_form({"judge_per_item": False, "judge_item_form": "check"}) is False
    config = toyworld_config.paper_config()
    config.data.judge_item_form = "check"
    with pytest.raises(ValueError, match="judge_item_form"):
        config_utils.validate(config, main.STAGES)


def test_echo_and_reason_forms_restate_the_criterion_before_yes_or_no():
    """data.judge_item_form="echo": the check question, the target the criterion then yes / no
    ("reason": the criterion, the rationale, then yes / no);
    the reply's last word is the decision, a reply restating another item keeps its decision and
    is reported, an unreadable last word counts 0; the form needs the per-item Judge."""
    judge = dict(JUDGE_EXAMPLE)
    echoed = records.check_form(records.judge_items([judge]), "echo")
    assert [e["target"] for e in echoed] == [
        "mentions a red circle yes",
        "the background is white no",
    ]
    assert all(e["item_form"] == "echo" for e in echoed)
    messages = records.conversation(echoed[1], None)
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "Caption: a red circle on a black background\nCheck: the background is white"}]},
        {"role": "assistant", "content": "the background is white no"},
    ]  # fmt: skip
    criterion = "mentions a red circle"
    assert roles.parse_item_reply("mentions a red circle yes", "echo", criterion) == (
        [roles.Decision(1, "")],
        [],
    )
    decisions, problems = roles.parse_item_reply("mentions a blue star no", "echo", criterion)
    assert decisions == [roles.Decision(0, "")] and "restates 'mentions a blue star'" in problems[0]
    decisions, problems = roles.parse_item_reply("mentions a red circle", "echo", criterion)
    assert decisions == [roles.Decision(0, "")] and "unreadable" in problems[0]
    with pytest.raises(ValueError, match="form must be one of"):
        records.check_form([judge], "lines")
    # reason: the criterion, the rubric line's rationale, then the decision
    reasoned = records.check_form(records.judge_items([judge]), "reason")
    assert [e["target"] for e in reasoned] == [
        "mentions a red circle | it is named | yes",
        "the background is white | it is called black | no",
    ]
    assert roles.parse_item_reply(reasoned[1]["target"], "reason", "the background is white") == (
        [roles.Decision(0, "it is called black")],
        [],
    )
    decisions, problems = roles.parse_item_reply("mentions a red circle | yes", "reason")
    assert decisions == [roles.Decision(0, "")] and "unreadable" in problems[0]
    with pytest.raises(ValueError, match="unknown per-item Judge form 'lines'"):
        roles.parse_item_reply("yes", "lines")
    config = toyworld_config.paper_config()
    config.data.judge_item_form = "echo"
    with pytest.raises(ValueError, match="judge_item_form"):
        config_utils.validate(config, main.STAGES)
    config.data.judge_per_item = True
    config_utils.validate(config, main.STAGES)


def test_mention_rationales_copy_the_captions_mentions_of_the_items_shape(tmp_path):
    """data.judge_rationale="mentions": a presence, absence or count item's rationale lists the
    caption's mentions of its shape in caption order (hand-written); the decision and other
    kinds' rationales are kept; every word is in the toy tokenizer; the config validates."""
    caption = (
        "A big blue circle is at the top. A small red circle is at the left. "
        "A large green star is in the middle. The background is white."
    )
    items = [
        ["mentions at most one circle", "", 3],
        ["mentions a red circle", "", 3],
        ["does not mention a square", "", 3],
        ["does not mention a green star", "", 3],
        ["the background is white", "", 3],
    ]
    judge = {
        "id": "j",
        "role": "judge",
        "caption": caption,
        "rubric": items,
        "target": roles.format_decisions(
            [
                roles.Decision(0, "it names 2 circles"),
                roles.Decision(1, "it is named"),
                roles.Decision(1, "it is not mentioned"),
                roles.Decision(0, "it is mentioned"),
                roles.Decision(1, "it is called white"),
            ]
        ),
    }
    (whole,) = toyroles.with_mention_rationales([judge])
    assert whole["target"].splitlines() == [
        "1 | 0 | it names blue circle, red circle",
        "2 | 1 | it names blue circle, red circle",
        "3 | 1 | it names no square",
        "4 | 0 | it names green star",
        "5 | 1 | it is called white",
    ]
    per_item = toyroles.with_mention_rationales(records.judge_items([judge]))
    reasoned = records.check_form(per_item, "reason")
    assert reasoned[0]["target"] == (
        "mentions at most one circle | it names blue circle, red circle | no"
    )
    assert [e["target"] for e in per_item] == [
        "1 | " + line.split(" | ", 1)[1] for line in whole["target"].splitlines()
    ]
    # the world's exact decision is kept on every toy Judge example
    examples = [e for e in toyroles.sft_records(seed=1, num_scenes=20) if e["role"] == "judge"]
    for e in toyroles.with_mention_rationales(records.judge_items(examples)):
        (decision,), _ = roles.parse_decisions(e["target"], 1)
        assert (
            toyroles.judge_accuracy([roles.RubricItem(*e["item"])], e["caption"], [decision])[0]
            == 1.0
        )
    tokenizer = processing.load_tokenizer(toyroles.build_tokenizer(str(tmp_path / "tok")))
    for line in whole["target"].splitlines():
        assert tokenizer.unk_token_id not in tokenizer(line)["input_ids"], line
    config = toyworld_config.get_config("tiny")
    config.data.update(judge_rationale="mentions", judge_per_item=True, judge_item_form="reason")
    config_utils.validate(config, main.STAGES)
    train, _ = config_utils.sft_examples(config)
    targets = [e["target"] for e in train if e["role"] == "judge"]
    assert any(" | it names no " in t for t in targets)
    assert not any("it is named" in t or "it is not mentioned" in t for t in targets)
    config.data.judge_rationale = "listing"
    with pytest.raises(ValueError, match="data.judge_rationale"):
        config_utils.validate(config, main.STAGES)


def test_toy_judge_per_item_examples_keep_the_toy_labels():
    examples = [e for e in toyroles.sft_records(seed=1, num_scenes=20) if e["role"] == "judge"]
    split = records.judge_items(examples)
    assert len(split) == sum(len(e["rubric"]) for e in examples)
    for e in split:
        item = roles.RubricItem(*e["item"])
        (decision,), _ = roles.parse_decisions(e["target"], 1)
        # each label is the world's exact decision for that item on that caption
        assert toyroles.judge_accuracy([item], e["caption"], [decision])[0] == 1.0


def test_toy_judge_items_are_balanced_within_each_item_kind():
    examples = records.judge_items(toyroles.sft_records(seed=1, num_scenes=150, mix=(1, 0, 1)))

    def shares(chosen):
        counts = {}
        for e in chosen:
            if "item" in e:
                kind = toyroles.parse_criterion(e["item"][0]).kind
                value = roles.parse_decisions(e["target"], 1)[0][0].value
                counts.setdefault(kind, []).append(value)
        return {kind: (np.mean(values), len(values)) for kind, values in counts.items()}

    before = shares(examples)
    # the skew that makes each kind's usual answer a shortcut
    assert before["absent"][0] > 0.65 and before["present"][0] < 0.4
    balanced = toyroles.balance_judge_items(examples, seed=1)
    after = shares(balanced)
    for kind, (share, count) in after.items():
        assert 0.4 <= share <= 0.6, (kind, share, count)
    # Policy examples pass through; the selection does not depend on the examples' order.
    assert [e for e in balanced if e["role"] == "policy"] == [
        e for e in examples if e["role"] == "policy"
    ]
    reordered = toyroles.balance_judge_items(examples[::-1], seed=1)
    assert sorted(e["id"] for e in reordered) == sorted(e["id"] for e in balanced)
