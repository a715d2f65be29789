"""The toy base model's tasks, the RL-like role data, and the honest-metric helpers."""

import collections
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from configs import toyworld as toyworld_config
from mocojax import config_utils, main, processing, roles
from mocojax.data import toybase, toyroles, toyworld as tw
from mocojax.data.toyworld import Mention, Obj, Scene
from mocojax.train import rl_evals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENE = Scene(
    "toy0-000001",
    "gray",
    (
        Obj("circle", "red", "large", "top left"),
        Obj("star", "blue", "small", "center"),
        Obj("circle", "green", "small", "bottom right"),
    ),
)


def test_grid_listing_and_read_listing_by_hand():
    assert toybase.grid_listing(SCENE) == (
        "top left: large red circle. center: small blue star. "
        "bottom right: small green circle. background: gray."
    )
    mentions, background = tw.parse_caption("A red circle at the top left and a big star.")
    assert toybase.read_listing(mentions, background) == (
        "red circle at the top left. large star. background: not given."
    )
    assert toybase.read_listing([], None) == "no objects. background: not given."


@pytest.mark.parametrize("seed", [0, 3])
def test_base_targets_are_true_of_their_scene(seed):
    scenes = {s.id: s for s in tw.make_scenes(seed, 120)}
    counts = collections.Counter()
    for record in toybase.base_records(seed, 120):
        scene, task, target = scenes[record["scene_id"]], record["task"], record["target"]
        counts[task, target] = counts[task, target] + 1
        cells = {o.position: o for o in scene.objects}
        if task == "grid":
            assert target == toybase.grid_listing(scene)
        elif task == "cell":
            cell = record["prompt"][len("What is at the ") : -1]
            obj = cells.get(cell)
            assert target == (f"a {obj.size} {obj.colour} {obj.shape}" if obj else "nothing")
        elif task == "find":
            colour, shape = record["prompt"][len("Where is the ") : -1].split()
            obj = next((o for o in scene.objects if (o.shape, o.colour) == (shape, colour)), None)
            assert target == (f"at the {obj.position}" if obj else f"there is no {colour} {shape}")
        elif task == "caption":
            assert tw.caption_metrics(scene, target)["f1"] == 1.0
        elif task == "read":
            caption = record["caption"]
            assert record["prompt"] == f"Caption: {caption}\n{toybase.READ_PROMPT}"
            assert target == toybase.read_listing(*tw.parse_caption(caption))
        elif task == "names":
            mentions, _ = tw.parse_caption(record["caption"])
            colour, shape = record["prompt"].rsplit("name a ", 1)[1][:-1].split()
            assert (target == "yes") == any(
                (m.colour, m.shape) == (colour, shape) for m in mentions
            )
        assert "scene" in record if task in toybase.IMAGE_TASKS else "caption" in record
    # Both answers of the yes/no and "nothing" questions occur: no task is answerable by a prior alone.
    assert counts["names", "yes"] and counts["names", "no"]
    assert (
        sum(v for (t, a), v in counts.items() if t == "cell" and a != "nothing")
        > counts["cell", "nothing"] / 2
    )


def test_base_records_deterministic_and_validated():
    assert toybase.base_records(5, 6) == toybase.base_records(5, 6)
    assert (
        toybase.base_records(5, 2, start=4)
        == toybase.base_records(5, 6)[-len(toybase.base_records(5, 2, 4)) :]
    )
    with pytest.raises(ValueError, match="unknown base tasks"):
        toybase.scene_base_records(SCENE, 0, {"grid": 1, "riddle": 1})


def test_task_mix_parsed_and_refused():
    assert toybase.parse_task_mix("") == toybase.DEFAULT_TASK_MIX
    assert toybase.parse_task_mix("names=3, attr=2") == {"names": 3, "attr": 2}
    records = toybase.scene_base_records(SCENE, 0, toybase.parse_task_mix("names=3,attr=2"))
    assert [r["task"] for r in records] == ["names"] * 3 + ["attr"] * 2
    for bad in ("names", "names=x", "riddle=2", "names=0"):
        with pytest.raises(ValueError, match="task mix"):
            toybase.parse_task_mix(bad)


def test_continued_base_manifest_keeps_the_parent_scenes(tmp_path):
    """A base continued from another (model.init_from) records the parent's scenes and its own."""
    import importlib.util
    import json

    import ml_collections

    from mocojax import config_utils

    spec = importlib.util.spec_from_file_location(
        "toybase_config", os.path.join(ROOT, "configs", "toybase.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / config_utils.BASE_MANIFEST).write_text(
        json.dumps({"scenes_seen": [{"seed": 0, "start": 0, "count": 100}], "built_by": "first"})
    )
    config = module.get_config("tiny")
    config.model.init_from = str(parent)
    config.sft.init_stage = ""
    config.data.seed = 11
    config.data.task_mix = "names=2"
    out = tmp_path / "out"
    out.mkdir()
    config_utils.write_base_manifest(config, str(out), 7)
    manifest = json.loads((out / config_utils.BASE_MANIFEST).read_text())
    assert manifest["scenes_seen"] == [
        {"seed": 0, "start": 0, "count": 100},
        {"seed": 11, "start": 0, "count": 10},
    ]
    assert manifest["built_by"].startswith("first then ") and "names=2" in manifest["built_by"]
    assert isinstance(config, ml_collections.ConfigDict)


def test_check_base_manifest_names_the_shipped_base_then_its_own_scenes(tmp_path):
    """configs/toybase_check.py's export records the shipped base's scenes, then its data seed's,
    and its own command; a recipe run on that seed from it is refused, seed 1 is not."""
    import json
    import sys

    from mocojax import config_utils, main

    sys.path.insert(0, ROOT)
    from configs import toybase_check, toyworld_judge

    config = toybase_check.get_config()
    seed = config.data.seed
    assert seed not in (0, 1, 2, 3, 7)  # the toy base's seeds and the eval seeds
    with open(os.path.join(config.model.init_from, config_utils.BASE_MANIFEST)) as f:
        parent = json.load(f)
    out = tmp_path / "check"
    out.mkdir()
    config_utils.write_base_manifest(config, str(out), 3000)
    (out / "config.json").write_text("{}")
    manifest = json.loads((out / config_utils.BASE_MANIFEST).read_text())
    assert manifest["scenes_seen"] == parent["scenes_seen"] + [
        {"seed": seed, "start": 0, "count": 4000 + 24}
    ]
    assert manifest["built_by"] == (
        parent["built_by"] + " then python -m mocojax.main --config configs/toybase_check.py"
    )
    run = toyworld_judge.get_config()
    run.model.init_from = str(out)
    run.data.seed = seed
    with pytest.raises(ValueError, match=f"config.data.seed={seed}"):
        config_utils.validate(run, main.STAGES)
    run.data.seed = 1
    config_utils.validate(run, main.STAGES)
    # configs/toyworld_judge.py:check starts role SFT from the shipped check base, whose manifest
    # is the one this command writes (its seed refused there too)
    check = toyworld_judge.get_config("check")
    assert check.stages == ("sft", "rl", "eval") and not check.sft.init_stage
    with open(os.path.join(check.model.init_from, config_utils.BASE_MANIFEST)) as f:
        assert json.load(f)["scenes_seen"] == manifest["scenes_seen"]
    config_utils.validate(check, main.STAGES)
    check.data.seed = seed
    with pytest.raises(ValueError, match=f"config.data.seed={seed}"):
        config_utils.validate(check, main.STAGES)
    with pytest.raises(ValueError, match="unknown arg 'fast'"):
        toyworld_judge.get_config("fast")


def test_default_config_is_the_check_recipe_with_its_export():
    """configs/toyworld.py's default is configs/toyworld_judge.py:check plus the HF export (it
    validates: a learned EMA Judge, the exact Generator, from the check base); "paper" and "tiny"
    are paper_config's; an unknown arg is refused."""
    import sys

    from mocojax import config_utils, main

    sys.path.insert(0, ROOT)
    from configs import toyworld, toyworld_judge

    default = toyworld.get_config()
    assert default.stages == ("sft", "rl", "eval", "export")
    assert os.path.basename(default.model.init_from) == "toybase_check"
    assert (default.rl.generator, default.rl.judge) == ("exact", "ema")
    check = toyworld_judge.get_config("check")
    check.stages = default.stages
    assert default.to_dict() == check.to_dict()
    config_utils.validate(default, main.STAGES)
    for arg, paper_arg in (("paper", ""), ("tiny", "tiny")):
        assert toyworld.get_config(arg).to_dict() == toyworld.paper_config(paper_arg).to_dict()
    assert toyworld.paper_config().data.mix == (2, 1, 1)
    with pytest.raises(ValueError, match="known: '', long, paper, tiny"):
        toyworld.get_config("fast")


def test_base_score_by_hand():
    record = {"task": "cell", "target": "a large red circle"}
    assert toybase.score(record, "a large red circle") == 1.0
    assert toybase.score(record, " A large  red circle ") == 1.0
    assert toybase.score(record, "a large red square") == 0.0
    caption = {"task": "caption", "scene": SCENE}
    # 2 of the scene's 13 facts stated, both right: P = 1, R = 2/13, F1 = 4/15.
    assert toybase.score(caption, "a red circle") == pytest.approx(4 / 15)
    check = {"task": "check", "target": "1 | yes\n2 | no\n3 | no\n4 | yes"}
    assert toybase.score(check, "1 | yes\n2 | no\n3 | no\n4 | yes") == 1.0
    # Item 3 wrong, item 4 missing, a stray line and a repeated id ignored: 2 of 4 right.
    assert toybase.score(check, "1 | yes\n2 | no\n2 | yes\n3 | yes\nfoo") == 0.5
    assert toybase.check_answers("1 | Yes\n 2 |no\n3 | maybe\nx | yes") == {1: "yes", 2: "no"}


def test_check_task_answers_colour_and_shape_together():
    """Multi-item names questions: 3-6 distinct items, each answer exact for its caption, about
    half "yes", most "no" items a named shape in another colour; adding the task to a mix
    leaves every other task's records as they were (it is drawn last)."""
    records = toybase.base_records(5, 300, task_mix={"check": 1})
    answers, hard = [], 0
    for record in records:
        mentions, _ = tw.parse_caption(record["caption"])
        named = {(m.colour, m.shape) for m in mentions}
        head, items_text = record["prompt"].split(toybase.CHECK_PROMPT + "\n")
        assert head == f"Caption: {record['caption']}\n"
        items = [line.split(" | a ")[1].split() for line in items_text.splitlines()]
        assert 3 <= len(items) <= 6 and len({tuple(i) for i in items}) == len(items)
        truth = toybase.check_answers(record["target"])
        assert list(truth) == list(range(1, len(items) + 1))
        for j, (colour, shape) in enumerate(items, 1):
            assert truth[j] == ("yes" if (colour, shape) in named else "no")
            answers.append(truth[j])
            hard += truth[j] == "no" and any(m.shape == shape for m in mentions)
    assert 0.35 <= answers.count("yes") / len(answers) <= 0.6
    assert hard / answers.count("no") > 0.4
    plain = toybase.base_records(5, 20)
    mixed = toybase.base_records(5, 20, task_mix=dict(toybase.DEFAULT_TASK_MIX, check=1))
    assert [r for r in mixed if r["task"] != "check"] == plain
    assert sum(r["task"] == "check" for r in mixed) == 20


def test_bind_task_asks_crossed_pairs():
    """Binding names questions: answers exact for their caption, about half "yes", and most
    "no" answers a colour and a shape the caption does name, on different objects; adding
    the task leaves every other task's records as they were."""
    records = toybase.base_records(5, 300, task_mix={"bind": 1})
    answers, crossed = [], 0
    for record in records:
        mentions, _ = tw.parse_caption(record["caption"])
        head, question = record["prompt"].split("\n")
        assert head == f"Caption: {record['caption']}"
        colour, shape = question.removeprefix("Does it name a ").removesuffix("?").split()
        named = any(m.colour == colour and m.shape == shape for m in mentions)
        assert record["target"] == ("yes" if named else "no")
        answers.append(record["target"])
        crossed += (
            not named
            and any(m.colour == colour for m in mentions)
            and any(m.shape == shape for m in mentions)
        )
    assert 0.4 <= answers.count("yes") / len(answers) <= 0.6
    assert crossed / answers.count("no") > 0.5
    plain = toybase.base_records(5, 20)
    mixed = toybase.base_records(5, 20, task_mix=dict(toybase.DEFAULT_TASK_MIX, bind=1))
    assert [r for r in mixed if r["task"] != "bind"] == plain


def test_truth_task_states_rubric_criteria_about_half_true_per_kind():
    """Rubric-criterion questions: the criterion is one the Generator writes (it parses back to
    a fact), the answer is the exact Judge's on the question's caption, every item kind is
    asked with about half "yes", most presence "no" answers name both words of the pair on
    different objects (a binding swap), and adding the task leaves the other tasks' records."""
    records = toybase.base_records(4, 600, task_mix={"truth": 1})
    by_kind, crossed = collections.defaultdict(list), 0
    for record in records:
        head, question = record["prompt"].split("\n")
        assert head == f"Caption: {record['caption']}"
        criterion = question.removeprefix(f"{toybase.TRUTH_PROMPT} ")
        fact = toyroles.parse_criterion(criterion)
        assert fact is not None and fact.kind == record["kind"]
        assert toyroles.item_of(fact).criterion == criterion
        mentions, background = tw.parse_caption(record["caption"])
        decision = toyroles.judge_fact(fact, mentions, background)
        assert record["target"] == ("yes" if decision.value else "no")
        by_kind[fact.kind].append(record["target"])
        if fact.kind == "present" and not decision.value:
            ref = fact.referent
            crossed += any(m.colour == ref.colour for m in mentions) and any(
                m.shape == ref.shape for m in mentions
            )
    assert set(by_kind) == {"present", "absent", "attribute", "background", "only"}
    for kind, answers in by_kind.items():
        assert len(answers) > 60, kind
        assert 0.35 <= answers.count("yes") / len(answers) <= 0.65, kind
    assert crossed / by_kind["present"].count("no") > 0.5
    attribute = toybase.base_records(4, 200, task_mix={"truthattr": 1})
    assert {(r["task"], r["kind"]) for r in attribute} == {("truthattr", "attribute")}
    assert 0.35 <= np.mean([r["target"] == "yes" for r in attribute]) <= 0.65
    plain = toybase.base_records(4, 20)
    mixed = toybase.base_records(4, 20, task_mix=dict(toybase.DEFAULT_TASK_MIX, truth=1))
    assert [r for r in mixed if r["task"] != "truth"] == plain


def test_pair_tokens_add_one_token_per_colour_shape_and_move_no_word(tmp_path):
    """The pair-token tokenizer keeps every word's id, appends one token per " <colour>
    <shape>", reads a named pair as that token (not a plural, not across a line), and still
    decodes every record's text back exactly, without <unk>."""
    plain = processing.load_tokenizer(toyroles.build_tokenizer(str(tmp_path / "plain")))
    pairs = processing.load_tokenizer(
        toyroles.build_tokenizer(str(tmp_path / "pairs"), pair_tokens=True)
    )
    plain_vocab, pair_vocab = plain.get_vocab(), pairs.get_vocab()
    assert len(pairs) == len(plain) + len(tw.COLOURS) * len(tw.SHAPES)
    assert all(pair_vocab[token] == i for token, i in plain_vocab.items())
    assert sorted(pair_vocab[t] for t in toyroles.PAIR_TOKENS) == list(
        range(len(plain), len(pairs))
    )
    text = "A red circle and a big blue star.\nred square, green\ncircle"
    pieces = [pairs.decode([i]) for i in pairs.encode(text)]
    assert pieces == [
        "A", " red circle", " and", " a", " big", " blue star", ".", "\n",
        "red", " square", ",", " green", "\n", "circle",
    ]  # fmt: skip
    assert pairs.decode(pairs.encode(" red circles")) == " red<unk>"  # no plural in the world
    records = toybase.base_records(6, 40, task_mix={"truth": 1, "bind": 1, "caption": 1})
    for record in records:
        text = record["prompt"] + "\n" + record["target"]
        ids = pairs.encode(text)
        assert pairs.unk_token_id not in ids and pairs.decode(ids) == text
        assert len(ids) < len(plain.encode(text)) or record["task"] == "truth"


def test_pair_tokens_build_the_tokenizer_over_the_base_own(tmp_path):
    """data.pair_tokens with model.init_from: the tokenizer is built into the workdir (the
    shipped base's 704 embedding rows hold its 672 tokens); without it the base's own is used;
    a source other than the toy world is refused."""
    config = toyworld_config.paper_config()
    config.data.pair_tokens = True
    setup = config_utils.build_setup(config, str(tmp_path))
    assert setup.tokenizer_path == str(tmp_path / "tokenizer")
    assert len(processing.load_tokenizer(setup.tokenizer_path)) == 672
    config.data.pair_tokens = False
    assert config_utils.build_setup(config, str(tmp_path)).tokenizer_path == config.model.init_from
    config.data.pair_tokens = True
    config.data.source = "jsonl"
    config.data.train_path = str(tmp_path / "train.jsonl")
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(ValueError, match="pair_tokens"):
        config_utils.validate(config, main.STAGES)


def test_toy_tokenizer_rebuilds_the_shipped_bases(tmp_path):
    """A base rebuilt from scratch (configs/toybase.py builds its tokenizer) gets the shipped
    base's token ids: the vocabulary corpus still holds every word the shipped one did."""
    toyroles.build_tokenizer(str(tmp_path))
    with open(tmp_path / "tokenizer.json") as f:
        built = json.load(f)
    with open(os.path.join(ROOT, "mocojax", "assets", "toybase", "tokenizer.json")) as f:
        shipped = json.load(f)
    assert built["model"]["vocab"] == shipped["model"]["vocab"]
    assert built == shipped


def test_weak_captions_are_weak_and_varied():
    kinds, f1 = collections.Counter(), collections.defaultdict(list)
    for scene in tw.make_scenes(0, 300):
        for caption in tw.weak_captions(scene, 0):
            kinds[caption["kind"]] += 1
            f1[caption["kind"]].append(tw.caption_metrics(scene, caption["caption"])["f1"])
    assert set(kinds) == set(tw.WEAK_KINDS)
    assert np.mean(f1["complete"]) == 1.0
    assert np.mean(f1["blind"]) < 0.3 < np.mean(f1["partial"]) < np.mean(f1["errors"]) < 0.9
    assert 0.5 < np.mean([v for vs in f1.values() for v in vs]) < 0.7
    assert tw.weak_captions(SCENE, 0) == tw.weak_captions(SCENE, 0)
    assert tw.weak_captions(SCENE, 0, salt=1) != tw.weak_captions(SCENE, 0)


def test_role_records_look_like_rl():
    """Judge targets near half "1", few judged references, an absent item per invented object."""
    ones, references, judge = [], 0, 0
    for scene in tw.make_scenes(2, 300):
        records = toyroles.scene_sft_records(scene, 2, mix=(2, 1, 2))
        generator = next(r for r in records if r["role"] == "generator")
        items, _ = roles.parse_rubric(generator["target"])
        facts = [toyroles.parse_criterion(i.criterion) for i in items]
        invented = set()
        for caption in generator["candidates"]:
            mentions, _ = tw.parse_caption(caption)
            for m, k in zip(mentions, tw.match_mentions(scene, mentions)):
                if (
                    k is None
                    and m.colour
                    and not any((o.shape, o.colour) == (m.shape, m.colour) for o in scene.objects)
                ):
                    invented.add((m.shape, m.colour))
        absent = {(f.referent.shape, f.referent.colour) for f in facts if f.kind == "absent"}
        assert absent == invented or len(items) == toyroles.MAX_RUBRIC_ITEMS
        for r in records:
            if r["role"] == "judge":
                decisions, _ = roles.parse_decisions(r["target"], len(r["rubric"]))
                ones += [d.value for d in decisions]
                references += "/ref" in r["caption_id"]
                judge += 1
    assert 0.4 <= np.mean(ones) <= 0.6
    assert references / judge <= 0.1


def test_judge_confusion_and_balanced_accuracy_by_hand():
    rubric = [
        toyroles.item_of(toyroles.Fact("present", Mention("circle", "red"))),
        toyroles.item_of(toyroles.Fact("absent", Mention("star", "green"))),
        toyroles.item_of(toyroles.Fact("background", value="white")),
        roles.RubricItem("the caption is vivid", "", 1.0),
    ]
    caption = "A red circle and a green star on a black background."  # truth: 1, 0, 0, unreadable
    always_1 = toyroles.judge_confusion(rubric, caption, [1, 1, 1, 1])
    assert always_1 == dict(tp=1, fn=0, tn=0, fp=2, unreadable=1)
    assert toyroles.balanced_accuracy(always_1) == 0.5
    mixed = toyroles.judge_confusion(rubric, caption, [0, 0, 1, 0])
    assert mixed == dict(tp=0, fn=1, tn=1, fp=1, unreadable=1)
    assert toyroles.balanced_accuracy(mixed) == 0.25
    zero = dict(tp=0, fn=0, tn=0, fp=0, unreadable=0)
    assert toyroles.judge_confusion(rubric, caption, [0, 0, 1, 0], by_kind=True) == {
        "present": dict(zero, fn=1),
        "absent": dict(zero, tn=1),
        "background": dict(zero, fp=1),
        "unreadable": dict(zero, unreadable=1),
    }


def test_gaming_watch_warns_once_when_the_reward_ranks_against_the_truth(caplog):
    watch = rl_evals.GamingWatch(3)
    key = "true/reward_f1_corr_within"
    assert watch.update(1, {key: 0.5}) == {}
    assert watch.update(2, {}) == {}  # no value this update: not counted
    assert watch.update(3, {key: -0.4}) == {}  # window not full yet
    with caplog.at_level("WARNING"):
        out = watch.update(4, {key: -0.5})  # mean (0.5 - 0.4 - 0.5) / 3 < 0
    assert out["true/reward_f1_corr_within_window"] == pytest.approx(-0.4 / 3)
    assert watch.warned_at == 4 and "REWARD GAMED at step 4" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        out = watch.update(5, {key: -0.9})  # (-0.4 - 0.5 - 0.9) / 3: still below, warned already
    assert out["true/reward_f1_corr_within_window"] == pytest.approx(-0.6)
    assert "REWARD GAMED" not in caplog.text
    # A reward that ranks as the truth does never warns; window 0 is off.
    healthy = rl_evals.GamingWatch(2)
    for step in range(10):
        healthy.update(step, {key: 0.3})
    assert healthy.warned_at is None
    assert rl_evals.GamingWatch(0).update(1, {key: -1.0}) == {}


def test_within_group_corr_by_hand():
    rewards = [[0.0, 0.5, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.5]]
    f1 = [[0.1, 0.2, 0.3], [0.1, 0.5, 0.9], [0.2, 0.4, 0.6]]
    # Group 0: r = 1; group 1: constant reward (left out); group 2: r = -0.5.
    assert rl_evals.within_group_corr(rewards, f1) == pytest.approx(0.25)
    assert rl_evals.within_group_corr([[1.0, 1.0]], [[0.1, 0.2]]) is None


def test_short_base_build_is_deterministic(tmp_path):
    """Two short builds of the base (configs/toybase.py:tiny) export byte-identical weights."""
    exported = []
    for name in ("a", "b"):
        workdir = tmp_path / name
        subprocess.run(
            [
                sys.executable,
                "-m",
                "mocojax.main",
                "--config",
                "configs/toybase.py:tiny",
                "--workdir",
                str(workdir),
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=600,
        )
        with open(workdir / "hf" / "model.safetensors", "rb") as f:
            exported.append(f.read())
        assert (workdir / "hf" / "tokenizer.json").is_file()
        (result_file,) = workdir.glob("eval_sft_*.json")
        with open(result_file) as f:
            result = json.load(f)
        # Every item is right under all-"yes" or all-"no", so the better of the two is >= 0.5.
        assert (
            0.0 <= result["base/check"] <= 1.0 and 0.5 <= result["base/check_fixed_answer"] <= 1.0
        )
    assert exported[0] == exported[1]


def test_cell_labels_follow_the_merged_token_order():
    from mocojax.train import toyvision

    labels = toyvision.cell_labels(SCENE)
    heads = toyvision.HEADS
    assert [heads["colour"][i] for i in labels["colour"]] == [
        "red",
        "empty",
        "empty",
        "empty",
        "blue",
        "empty",
        "empty",
        "empty",
        "green",
    ]
    assert [heads["shape"][i] for i in labels["shape"]][::4] == ["circle", "star", "circle"]
    assert [heads["size"][i] for i in labels["size"]][::4] == ["large", "small", "small"]
    assert set(labels["background"].tolist()) == {heads["background"].index("gray")}
    assert [heads["cell"][i] for i in labels["cell"]] == list(tw.POSITIONS)


def test_vision_stage_learns_to_label_cells(tmp_path):
    """80 steps of the vision stage (the base's tower) take the probe from chance to reading
    backgrounds, colours and sizes (the cell head needs ~200 steps: docs/toyworld.md)."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location(
        "toybase_config", os.path.join(ROOT, "configs", "toybase.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, ROOT)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(ROOT)
    config = module.get_config("tiny")
    config.model.tiny = dict(module.toyworld.BASE_MODEL)
    config.vision.num_steps, config.vision.batch_size = 80, 16
    from mocojax.train import toyvision

    toyvision.run_vision(config, str(tmp_path))
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    first, last = rows[0], rows[-1]
    assert first["acc_background"] < 0.6 and last["acc_background"] > 0.95
    assert last["acc_colour"] > max(first["acc_colour"], 0.8)
    assert last["acc_size"] > max(first["acc_size"], 0.8)
    assert (tmp_path / "checkpoints" / "vision").is_dir()


def test_validation_refuses_eval_scenes_the_base_trained_on(tmp_path):
    """The shipped base records the scenes it saw (toybase.json); a toy run whose held-out scenes
    are among them fails validation naming config.data.seed."""
    import importlib.util
    import json

    from mocojax import config_utils, main

    spec = importlib.util.spec_from_file_location(
        "toyworld_config", os.path.join(ROOT, "configs", "toyworld.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / config_utils.BASE_MANIFEST).write_text(
        json.dumps(
            {
                "scenes_seen": [
                    {"seed": 0, "start": 0, "count": 20064},
                    {"seed": 7, "start": 0, "count": 38400},
                ]
            }
        )
    )
    config = module.get_config("tiny")
    config.model.init_from = str(base)
    config.data.seed = 0
    with pytest.raises(
        ValueError, match=r"config.data.seed=0: the base model .* trained on scenes 0..20063"
    ):
        config_utils.validate(config, main.STAGES)
    config.data.seed = 1
    config_utils.validate(config, main.STAGES)


def test_shipped_base_is_what_the_default_config_loads():
    """mocojax/assets/toybase (configs/toyworld.py:paper's start) and mocojax/assets/toybase_check
    (the default's) are loadable HF directories of the default architecture, whose tokenizer
    writes every role record and base task without <unk>."""
    import importlib.util

    from mocojax import model, processing
    from mocojax.data import records

    spec = importlib.util.spec_from_file_location(
        "toyworld_config", os.path.join(ROOT, "configs", "toyworld.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bases = [module.get_config().model.init_from, module.paper_config().model.init_from]
    assert [os.path.basename(b) for b in bases] == ["toybase_check", "toybase"]
    texts = [
        m["content"] if isinstance(m["content"], str) else part["text"]
        for r in toyroles.sft_records(3, 30) + toybase.base_records(3, 30)
        for m in records.conversation(r, None)
        for part in (m["content"] if isinstance(m["content"], list) else [m])
        if isinstance(m["content"], str) or part.get("type") == "text"
    ]
    for base in bases:
        assert os.path.isfile(os.path.join(base, "model.safetensors"))
        assert os.path.isfile(os.path.join(base, "toybase.json"))
        cfg = model.ModelConfig.from_pretrained(base)
        dims = module.BASE_MODEL
        assert (
            cfg.text.hidden_size,
            cfg.text.num_hidden_layers,
            cfg.vision.depth,
            cfg.vision.hidden_size,
        ) == (dims["hidden_size"], dims["num_layers"], dims["vision_depth"], dims["vision_hidden"])
        tokenizer = processing.load_tokenizer(base)
        for text in texts:
            assert (
                tokenizer.unk_token_id not in tokenizer(text, add_special_tokens=False)["input_ids"]
            ), text


def test_rl_truth_logs_how_often_the_judge_passes_a_recoloured_object_by_hand():
    """ "mentions a red circle" on a caption naming only a blue circle is unmet with the shape
    named (counted); on one naming no circle it is unmet without it (not counted)."""
    scene = Scene(
        "s", "black", (Obj("circle", "red", "large", "center"), Obj("star", "red", "small", "top"))
    )
    rubric = [
        roles.RubricItem("mentions a red circle", "named", 3.0),
        roles.RubricItem("mentions a red star", "named", 3.0),
    ]
    captions = [
        "A large blue circle is in the centre.",  # circle recoloured; no star
        "A large blue circle and a small green star.",  # both recoloured
        "A large red circle and a small red star.",  # both met
    ]
    rollout = types.SimpleNamespace(
        captions=[captions], rubrics=[rubric], decisions=[[[1, 0], [0, 1], [1, 1]]]
    )
    truth = rl_evals.toy_truth(scene, rollout, 0)
    assert truth["judge_recoloured"] == [2, 3]  # passed 2 of the 3 recoloured items
    out = rl_evals.truth_metrics([truth], [[0.5, 0.5, 1.0]])
    assert out["true/judge_pass_rate_recoloured"] == pytest.approx(2 / 3)
    mentions, _ = tw.parse_caption(captions[0])
    facts = [toyroles.parse_criterion(item.criterion) for item in rubric]
    assert [toyroles.is_recoloured(f, mentions) for f in facts] == [True, False]
    assert not toyroles.is_recoloured(
        toyroles.parse_criterion("mentions at most one circle"), mentions
    )


def test_rl_truth_logs_the_judges_balanced_accuracy_per_kind_by_hand():
    """On RL's own samples: per item kind, and a kind with only met items left out."""
    scene = Scene("s", "black", (Obj("circle", "red", "large", "center"),))
    rubric = [
        roles.RubricItem("mentions a red circle", "named", 3.0),  # present: met by both
        roles.RubricItem("does not mention a star", "not named", 3.0),  # absent_shape
        roles.RubricItem("mentions at most one circle", "no more named", 3.0),  # at_most
    ]
    captions = [
        "A large red circle is in the centre. The background is black.",  # meets all three
        "A large red circle is in the centre, a small blue circle is at the top and "
        "a small yellow star is at the bottom.",  # names a star and two circles
    ]
    # The Judge is right on the star both times and passes the unmet count item.
    rollout = types.SimpleNamespace(
        captions=[captions], rubrics=[rubric], decisions=[[[1, 1, 1], [1, 0, 1]]]
    )
    truth = rl_evals.toy_truth(scene, rollout, 0)
    assert truth["judge_by_kind"]["at_most"] == dict(tp=1, fn=0, tn=0, fp=1, unreadable=0)
    out = rl_evals.truth_metrics([truth, truth], [[1.0, 2 / 3], [1.0, 2 / 3]])
    assert out["true/judge_accuracy"] == pytest.approx(5 / 6)
    assert "true/judge_balanced_accuracy_present" not in out  # no unmet presence item
    assert out["true/judge_balanced_accuracy_absent_shape"] == 1.0
    assert out["true/judge_balanced_accuracy_at_most"] == 0.5  # (1 + 0) / 2
    assert out["true/judge_balanced_accuracy_within_kind"] == pytest.approx(0.75)
    assert out["true/judge_balanced_accuracy_worst_kind"] == 0.5
    assert "true/judge_pass_rate_recoloured" not in out  # no presence item is recoloured
    # A reward without rubrics (G2P) logs none of these.
    assert not any(
        "balanced" in k
        for k in rl_evals.truth_metrics([{"f1": [0.5], "hallucinated": [0]}], [[1.0]])
    )


def test_zero_variance_groups_split_into_rubric_limited_and_judge_caused_by_hand():
    """A group whose rewards are equal is rubric-limited when the exact Judge would also score its
    captions equally on that rubric, Judge-caused when it would not."""
    scene = Scene("s", "black", (Obj("circle", "red", "large", "center"),))
    rubric = [
        roles.RubricItem("mentions a red circle", "named", 3.0),
        roles.RubricItem("does not mention a star", "not named", 2.0),
        roles.RubricItem("mentions at most one circle", "no more named", 1.0),
    ]
    good = "A large red circle is in the centre. The background is black."
    bad = "A large red circle, a small blue circle and a small yellow star."  # fails items 2, 3
    rollouts = [  # (captions, the learned Judge's decisions)
        ([good, good], [[1, 1, 1], [1, 1, 1]]),  # equal, and exactly equal: rubric-limited
        ([good, bad], [[1, 1, 1], [1, 1, 1]]),  # equal, but exactly 1 vs 3/6: Judge-caused
        ([good, bad], [[1, 1, 1], [1, 0, 0]]),  # rewards differ: not zero-variance
    ]
    truths = [
        rl_evals.toy_truth(
            scene,
            types.SimpleNamespace(captions=[c], rubrics=[rubric], decisions=[d]),
            0,
        )
        for c, d in rollouts
    ]
    assert truths[1]["exact_rewards"] == [1.0, pytest.approx(3 / 6)]
    rewards = [[1.0, 1.0], [1.0, 1.0], [1.0, 0.5]]
    out = rl_evals.truth_metrics(truths, rewards)
    assert out["true/zero_variance_rubric_frac"] == pytest.approx(1 / 3)
    assert out["true/zero_variance_judge_frac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="equal"):
        rl_evals.zero_variance_causes([[1.0, 1.0]], [[1.0, 1.0, 1.0]])


def test_within_kind_balanced_accuracy_by_hand():
    from mocojax.eval import toyworld_eval

    zero = dict(tp=0, fn=0, tn=0, fp=0, unreadable=0)
    by_kind = {
        "present": dict(zero, tp=3, fn=1, tn=2, fp=2),  # (0.75 + 0.5) / 2 = 0.625
        "absent": dict(zero, tp=4),  # all met: no rate to balance, left out
        "attribute": dict(zero, fn=2, tn=4),  # (0 + 1) / 2 = 0.5
        "unreadable": dict(zero, unreadable=3),
    }
    assert toyworld_eval.within_kind_balanced_accuracy(by_kind) == pytest.approx(0.5625)
    assert toyworld_eval.worst_kind_balanced_accuracy(by_kind) == 0.5  # attribute
    del by_kind["attribute"]
    assert toyworld_eval.worst_kind_balanced_accuracy(by_kind) == pytest.approx(0.625)
    # A Judge that says "1" to absent items and "0" to attribute items: pooled it looks good,
    # within each kind it is chance.
    prior = {"absent": dict(zero, tp=8, fp=2), "attribute": dict(zero, tn=8, fn=2)}
    pooled = {k: prior["absent"][k] + prior["attribute"][k] for k in zero}
    assert toyroles.balanced_accuracy(pooled) == pytest.approx(0.8)
    assert toyworld_eval.within_kind_balanced_accuracy(prior) == 0.5
    assert (
        toyworld_eval.within_kind_balanced_accuracy({"unreadable": dict(zero, unreadable=1)}) == 0.5
    )
