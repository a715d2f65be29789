"""Toy-world records of ACE-Cap's evidence loop (mocojax/data/toyloop.py): exact Instruct
answers, teacher Composer transcripts, the loop tokens, and the records in the SFT data."""

import collections

import numpy as np
import pytest

from configs import toyworld as toyworld_config
from mocojax import acecap_loop, config_utils, main, processing, roles
from mocojax.data import records, toyloop, toyroles, toyworld as tw
from mocojax.data.toyworld import Obj, Scene
from mocojax.train import loop_train, sft

SCENES = tw.make_scenes(3, 60)


def _content(mentions):
    return collections.Counter((m.shape, m.colour, m.size, m.position) for m in mentions)


def test_instruct_answers_state_exactly_the_objects_of_the_asked_shape():
    rng = np.random.default_rng(0)
    for scene in SCENES:
        for shape in tw.SHAPES:
            answer = toyloop.instruct_answer(scene, toyloop.question_about(shape), rng)
            mentions, background = tw.parse_caption(answer)
            expected = [o for o in scene.objects if o.shape == shape]
            assert background is None and _content(mentions) == _content(expected), answer
            assert (answer == toyloop.ABSENT_ANSWER) == (not expected)
    with pytest.raises(ValueError, match="no single shape"):
        toyloop.instruct_answer(SCENES[0], "What is the background?", rng)
    with pytest.raises(ValueError, match="no single shape"):
        toyloop.instruct_answer(SCENES[0], "Is there a star or a circle?", rng)
    # the loop's exact Instruct answers those with a sentence that states nothing
    assert toyloop.exact_answer(SCENES[0], "What is the background?", rng) == toyloop.UNANSWERABLE
    assert tw.parse_caption(toyloop.UNANSWERABLE) == ([], None)


def test_teacher_asks_after_the_shapes_c0_leaves_out_and_writes_a_true_final_caption():
    scene = Scene(
        "s",
        "white",
        (Obj("circle", "red", "large", "center"), Obj("star", "blue", "small", "top left")),
    )
    rng = np.random.default_rng(1)
    caption = "There is a large red circle in the center."
    episode = toyloop.teacher_episode(scene, caption, [scene.objects[0]], 3, rng)
    # four shapes unnamed, budget 3: three questions, none about the circle, no READY
    assert len(episode["questions"]) == 3 and not episode["stopped"]
    assert "circle" not in " ".join(episode["questions"])
    found = "star" in " ".join(episode["questions"])
    final, _ = tw.parse_caption(episode["final"])
    assert _content(final) == _content(scene.objects if found else scene.objects[:1])
    # budget 4: every unnamed shape asked, then READY; the star is always found
    episode = toyloop.teacher_episode(scene, caption, [scene.objects[0]], 4, rng)
    assert episode["stopped"] and _content(tw.parse_caption(episode["final"])[0]) == _content(
        scene.objects
    )
    for scene in SCENES:
        caption, kept = toyloop.initial_caption(scene, rng)
        episode = toyloop.teacher_episode(scene, caption, kept, 3, rng)
        metrics = tw.caption_metrics(scene, episode["final"])
        assert not metrics["hallucinated"], episode
        assert metrics["recall"] >= tw.caption_metrics(scene, caption)["recall"]


def test_the_exact_reader_scores_the_evidence_at_least_as_high_as_c0():
    """Answers are in the language the Gold-MCQ's exact reader reads: ser(E) never scores below
    c_0 (an absent answer adds nothing), and above it whenever an answer found an object."""
    score = loop_train.toy_scorer(SCENES, seed=3)
    rng = np.random.default_rng(2)
    gains = []
    for b, scene in enumerate(SCENES):
        caption, kept = toyloop.initial_caption(scene, rng)
        episode = toyloop.teacher_episode(scene, caption, kept, 3, rng)
        evidence = acecap_loop.serialise_evidence(caption, episode["questions"], episode["answers"])
        r0, r_e = score(b, caption), score(b, evidence)
        found = any(a != toyloop.ABSENT_ANSWER for a in episode["answers"])
        assert r_e >= r0 and (r_e > r0) == found, (caption, episode)
        gains.append(r_e - r0)
    assert np.mean(gains) > 0.05


def test_loop_records_read_without_unk_with_the_loop_tokens_and_train_every_reply(tmp_path):
    vocab = toyroles.build_vocabulary(count_tokens=True, loop_tokens=True)
    assert len(vocab) == len(set(vocab)) == 642 + 6 + 36
    loop = processing.load_tokenizer(
        toyroles.build_tokenizer(tmp_path / "loop", count_tokens=True, loop_tokens=True)
    )
    plain = processing.load_tokenizer(toyroles.build_tokenizer(tmp_path / "plain"))
    recs = toyloop.sft_records(3, 20, (1, 1))
    texts = [
        part["text"] if isinstance(part, dict) else part
        for r in recs
        for m in records.conversation(r, None)
        for part in (m["content"] if isinstance(m["content"], list) else [m["content"]])
        if not isinstance(part, dict) or part.get("type") == "text"
    ]
    assert not any(loop.unk_token_id in loop(t)["input_ids"] for t in texts)
    assert any(plain.unk_token_id in plain(t)["input_ids"] for t in texts)
    processor = processing.Processor(loop, max_length=1024)
    composer = [r for r in recs if r["role"] == "judge"]
    batch = processor([records.conversation(r, None) for r in composer], mode="sft")
    for r, mask in zip(composer, np.asarray(batch["loss_mask"])):
        replies = sum(m["role"] == "assistant" for m in r["messages"])
        runs = np.count_nonzero(np.diff(np.concatenate([[0], mask, [0]])) == 1)
        assert runs == replies >= 2
    # the Instruct record is the message roles.instruct_messages builds for the loop
    instruct = next(r for r in recs if r["role"] == "policy")
    question = instruct["prompt"].split("Question: ")[1]
    assert records.conversation(instruct, "IMG")[:1] == roles.instruct_messages("IMG", question)
    with pytest.raises(ValueError, match="text only"):
        records.conversation(dict(composer[0], role="policy"), None)


def test_data_loop_mix_adds_the_records_and_the_tokens(tmp_path):
    config = toyworld_config.get_config("tiny")
    config.data.loop_mix = (1, 2)
    train, held_out = config_utils.sft_examples(config)
    for examples, n in (
        (train, config.data.num_train_scenes),
        (held_out, config.data.num_eval_scenes),
    ):
        ids = [e["id"] for e in examples]
        assert (
            sum("/instruct" in i for i in ids) == n and sum("/composer" in i for i in ids) == 2 * n
        )
    setup = config_utils.build_setup(config, str(tmp_path))
    tokenizer = setup.processor.tokenizer
    assert tokenizer.convert_tokens_to_ids(" READY") != tokenizer.unk_token_id
    config.data.loop_mix = (0, -1)
    with pytest.raises(ValueError, match="data.loop_mix"):
        config_utils.validate(config, main.STAGES)


def test_warmup_loop_mix_gives_the_warmup_composer_records_only(tmp_path):
    """warmup.loop_mix = (0, 2) with warmup.mix = (0, 0, 0): the warm-up trains the Composer's
    transcripts alone (2 per scene), the role SFT keeps its own records (no loop records), and both
    stages build the same tokenizer, with the loop words; a warm-up of no records is refused."""
    config = toyworld_config.get_config("tiny")
    config.stages = ("warmup", "sft")
    config.sft.init_stage = "warmup"
    config.warmup.mix, config.warmup.loop_mix = (0, 0, 0), (0, 2)
    config_utils.validate(config, main.STAGES)
    warm = sft.warmup_config(config)
    train, _ = config_utils.sft_examples(warm)
    assert len(train) == 2 * config.data.num_train_scenes
    assert all("/composer" in e["id"] for e in train)
    role_train, _ = config_utils.sft_examples(config)
    assert not any("/composer" in e["id"] or "/instruct" in e["id"] for e in role_train)
    vocab = [
        config_utils.build_setup(c, str(tmp_path / name)).processor.tokenizer.get_vocab()
        for c, name in ((warm, "warm"), (config, "role"))
    ]
    assert vocab[0] == vocab[1] and " READY" in vocab[0]
    config.warmup.loop_mix = (0, 0)
    with pytest.raises(ValueError, match="the warm-up has no records"):
        config_utils.validate(config, main.STAGES)
