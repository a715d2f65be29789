"""ACE-Cap's active evidence acquisition: the Composer's action parser, the evidence serialisation
and its leave-one-out texts (by hand), the span layout of a READY and a forced rollout, and one
batched rollout on a tiny random model (shapes, the K cut, one sampler call per round)."""

import importlib
import os

import jax
import numpy as np
import pytest
from acecap_helpers import transcript

from mocojax import acecap, acecap_loop, config_utils, loop_grpo, roles, sampling
from mocojax.data import toyworld as tw
from mocojax.train import rollout as rollout_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASK, READY = acecap_loop.ASK, acecap_loop.READY
ONE_CIRCLE = tw.Scene("hand-1", "white", (tw.Obj("circle", "red", "large", "top left"),))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """configs/toyworld.py:tiny (one layer) and its Setup: the toy tokenizer's processor and a
    random tiny model."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.syspath_prepend(REPO)
        config = importlib.import_module("configs.toyworld").get_config("tiny")
    # One layer instead of two: the batched rollout compiles six sampler programs, each smaller.
    config.model.tiny = dict(config.model.tiny, num_layers=1)
    return config, config_utils.build_setup(config, str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def processor(tiny):
    return tiny[1].processor


# ---------------------------------------------------------------------------- pure functions


@pytest.mark.parametrize(
    "text, action",
    [
        ("ASK: How many objects are there?", (ASK, "How many objects are there?")),
        ("ask:what colour\n is  the circle?", (ASK, "what colour is the circle?")),
        ("  Ask : Is it large? ", (ASK, "Is it large?")),
        ("READY", (READY, "")),
        (" ready. ", (READY, "")),
        ("Ready!", (READY, "")),
        ("ASK:", (None, "")),  # no question
        ("ASK", (None, "")),
        ("READY now", (None, "")),
        ("Is there a circle?", (None, "")),  # a question without ASK
        ("", (None, "")),
        (None, (None, "")),
    ],
)
def test_parse_action(text, action):
    assert tuple(acecap_loop.parse_action(text)) == action


def test_serialise_evidence_by_hand():
    text = acecap_loop.serialise_evidence(
        "A red circle.", ["How many objects?", "What size\n is it?"], ["2", "It is  large."]
    )
    assert text == (
        "A red circle.\n"
        "Q (asked, not a fact): How many objects?\nA: 2\n"
        "Q (asked, not a fact): What size is it?\nA: It is large."
    )
    # An empty evidence state is c_0 itself, so any judge scores it as c_0.
    c0 = "A small red circle."
    assert acecap_loop.serialise_evidence(c0, [], []) == c0
    items = acecap.toy_mcq(ONE_CIRCLE)
    gold = [item.answer for item in items]

    def score(t):
        return acecap.g2p_reward([acecap.oracle_choice(t, item) for item in items], gold)

    assert score(acecap_loop.serialise_evidence(c0, [], [])) == score(c0) == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="2 questions for 1 answers"):
        acecap_loop.serialise_evidence(c0, ["a?", "b?"], ["x"])


def test_leave_one_out_texts_by_hand():
    c0, q, a = "A red circle.", ["How many?", "Where?"], ["2", "top left"]
    assert acecap_loop.leave_one_out_texts(c0, q, a) == [
        "A red circle.\nQ (asked, not a fact): Where?\nA: top left",
        "A red circle.\nQ (asked, not a fact): How many?\nA: 2",
    ]
    assert acecap_loop.leave_one_out_texts(c0, q[:1], a[:1]) == [c0]  # r^E_{-t} = r^0
    assert acecap_loop.leave_one_out_texts(c0, [], []) == []


def test_span_layout_of_a_ready_and_a_forced_rollout(processor):
    c0 = "A red circle."
    # Rollout 0 asks one question, then says READY; rollout 1 asks K = 2 and is finalised by force.
    ready = transcript(c0, ["ASK: How many objects?", "READY"], ["2"], "Two circles.")
    forced = transcript(
        c0, ["ASK: Where is it?", "ASK: Is it large?"], ["top left", "yes"], "A large circle."
    )
    rollouts = acecap_loop.EvidenceRollouts(
        initial_captions=[c0],
        num_rollouts=2,
        composer_texts=[
            ["ASK: How many objects?", "READY"],
            ["ASK: Where is it?", "ASK: Is it large?"],
        ],
        questions=[["How many objects?"], ["Where is it?", "Is it large?"]],
        answers=[["2"], ["top left", "yes"]],
        final_captions=["Two circles.", "A large circle."],
        asked=np.array([[True, False], [True, True]]),
        stopped=np.array([True, False]),
        unparseable=np.array([False, False]),
        transcripts=[ready, forced],
    )
    q, s, f = loop_grpo.SPAN_QUESTION, loop_grpo.SPAN_STOP, loop_grpo.SPAN_FINAL
    assert rollouts.span_kinds(0) == [q, s, f] and rollouts.span_kinds(1) == [q, q, f]
    layout = acecap_loop.composer_layout(processor, rollouts)
    ids, kind, index = layout["input_ids"], layout["span_kind"], layout["span_index"]
    im_end = processor.im_end_token_id

    def tokens(text):
        return processor.tokenizer(text, add_special_tokens=False)["input_ids"] + [im_end]

    def span(r, k, t=0):
        return ids[r][(kind[r] == k) & (index[r] == t)].tolist()

    # Each span is exactly its reply's tokens and <|im_end|>; nothing else is labelled.
    assert span(0, q) == tokens("ASK: How many objects?")
    assert span(0, s) == tokens("READY")
    assert span(0, f) == tokens("Two circles.")
    assert span(1, q, 0) == tokens("ASK: Where is it?")
    assert span(1, q, 1) == tokens("ASK: Is it large?")
    assert span(1, s) == [] and span(1, f) == tokens("A large circle.")
    labelled = (kind != loop_grpo.SPAN_NONE).sum(-1)
    assert labelled.tolist() == [
        len(tokens("ASK: How many objects?") + tokens("READY") + tokens("Two circles.")),
        len(tokens("ASK: Where is it?") + tokens("ASK: Is it large?") + tokens("A large circle.")),
    ]
    # The answers are observations: the token_advantages mask is 0 on them.
    _, mask = loop_grpo.token_advantages(
        kind, index, [[1.0, 0.0], [2.0, 3.0]], [0.5, 0.0], [1.0, 1.0], rollouts.stopped
    )
    np.testing.assert_array_equal(mask, (kind != loop_grpo.SPAN_NONE).astype(np.float32))
    answer = processor.tokenizer(" top left", add_special_tokens=False)["input_ids"]
    row = ids[1].tolist()
    at = next(i for i in range(len(row)) if row[i : i + len(answer)] == answer)
    assert mask[1, at : at + len(answer)].tolist() == [0.0] * len(answer)
    assert rollouts.evidence_texts()[0] == (
        "A red circle.\nQ (asked, not a fact): How many objects?\nA: 2"
    )
    assert rollouts.leave_one_out() == [
        [c0],
        [
            "A red circle.\nQ (asked, not a fact): Is it large?\nA: yes",
            "A red circle.\nQ (asked, not a fact): Where is it?\nA: top left",
        ],
    ]


# ---------------------------------------------------------------------------- batched rollout

# The Composer's replies per rollout j of an image (G = 4), round by round: j = 0 keeps asking
# (cut at K = 2), j = 1 asks once then stops, j = 2 stops at once, j = 3 replies nonsense.
SCRIPT = {
    0: ["ASK: How many objects?", "ASK: Where is it?", "ASK: never read"],
    1: ["ASK: What colour is it?", "READY"],
    2: ["READY"],
    3: ["the circle circle"],
}


def test_batched_rollout_cuts_at_k_and_calls_the_sampler_once_per_round(tiny, monkeypatch):
    """A tiny random model plays every role through the real sampler; the Composer's replies are
    replaced by SCRIPT (the toy tokenizer has no ASK / READY tokens), so the rounds are known.
    2 images x G = 4 rollouts, K = 2: sampler calls are c_0, (Composer, Instruct) x 2 rounds and
    the final captions = 6, each with the round's rows, never one per sample."""
    config, setup = tiny
    cfg, processor, params = setup.model_config, setup.processor, setup.load_params()
    images = [tw.render(s, config.data.image_size) for s in tw.make_scenes(0, 2)]
    g, k = 4, 2

    calls, generate = [], sampling.generate

    def counting_generate(cfg, params, input_ids, *args, num_samples=1, **kwargs):
        calls.append((np.shape(input_ids)[0], num_samples, args[1] is not None))
        return generate(cfg, params, input_ids, *args, num_samples=num_samples, **kwargs)

    composer_rows, active, sample_texts = [], list(range(2 * g)), rollout_lib.sample_texts

    def scripted_texts(cfg, params, processor, conversations, **kwargs):
        texts = sample_texts(cfg, params, processor, conversations, **kwargs)
        first, last = conversations[0][0], conversations[0][-1]
        is_composer = first["content"][-1]["text"].startswith(roles.COMPOSER_INSTRUCTION)
        if not is_composer or last["content"][-1]["text"].startswith(roles.FINAL_INSTRUCTION):
            return texts
        assert len(texts) == len(active), "one reply per active rollout"
        round_ = len(composer_rows)
        composer_rows.append(len(texts))
        replies = [SCRIPT[r % g][round_] for r in active]
        active[:] = [r for r, reply in zip(active, replies) if reply.startswith("ASK")]
        return replies

    monkeypatch.setattr(sampling, "generate", counting_generate)
    monkeypatch.setattr(rollout_lib, "sample_texts", scripted_texts)
    out = acecap_loop.acquire_evidence(
        cfg,
        params,
        processor,
        images,
        num_rollouts=g,
        max_questions=k,
        rng=jax.random.PRNGKey(7),
        caption_max_new_tokens=6,
        action_max_new_tokens=4,
        answer_max_new_tokens=4,
        final_max_new_tokens=6,
        temperature=0.0,
    )
    # Sampler calls (padded rows, samples per row, has images): c_0 of the 2 images; round 1's
    # Composer (2 prompts x 4 samples) and Instruct (rollouts 0, 1 of each image: 4 rows);
    # round 2's Composer and Instruct (2 rows, rollout 0 of each image); the 8 final captions.
    assert calls == [
        (2, 1, True),
        (2, 4, False),
        (4, 1, True),
        (4, 1, False),
        (2, 1, True),
        (8, 1, False),
    ]
    assert composer_rows == [8, 4]
    assert len(out.initial_captions) == 2 and len(out.final_captions) == 8
    assert all(isinstance(c, str) for c in out.initial_captions + out.final_captions)
    assert out.asked.shape == (8, k) and out.asked.tolist() == [[1, 1], [1, 0], [0, 0], [0, 0]] * 2
    assert out.num_questions.tolist() == [2, 1, 0, 0] * 2  # rollout 0 cut at K: never a third
    assert out.stopped.tolist() == [False, True, True, False] * 2
    assert out.unparseable.tolist() == [False, False, False, True] * 2 and out.forced_ready == 2
    assert out.questions[0] == ["How many objects?", "Where is it?"] and out.questions[2] == []
    assert [len(a) for a in out.answers] == [2, 1, 0, 0] * 2
    assert out.composer_texts[3] == ["the circle circle"] and len(out.composer_texts[0]) == 2
    # The answers reached the Composer as observations and the final prompt as evidence.
    assert out.transcripts[0][2] == roles.observation_message(out.answers[0][0])
    final_prompt = out.transcripts[0][-2]["content"][0]["text"]
    assert final_prompt.endswith(out.evidence_texts()[0])
    assert out.transcripts[3][-2] == roles.final_message(out.initial_captions[0])  # empty evidence
    layout = acecap_loop.composer_layout(processor, out)
    spans = [
        [(kind == s).any() for s in (loop_grpo.SPAN_QUESTION, loop_grpo.SPAN_STOP)]
        for kind in layout["span_kind"]
    ]
    assert spans == [[True, False], [True, True], [False, True], [False, False]] * 2
    # What group_advantages checks holds: asked is a prefix per row, no stop after K questions.
    loop = loop_grpo.loop_defaults()
    loop.max_questions = k
    a_q, a_s, a_f = loop_grpo.group_advantages(
        [0.0] * 4,
        [0.5] * 4,
        np.zeros((4, k)),
        [0.2, 0.4, 0.1, 0.3],
        out.asked[:4],
        out.stopped[:4],
        loop,
    )
    assert np.shape(a_q) == (4, k) and np.shape(a_s) == (4,) and np.shape(a_f) == (4,)
