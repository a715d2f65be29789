"""Role wrappers for RL tests: the random-weight tiny model writes no parseable rubric, so the
Generator and Judge still run (real sampler, real prompts) but their parsed output is replaced
by a fixed two-item rubric and decisions patterned so that rewards vary within every group."""

import numpy as np

from mocojax import roles
from mocojax.train import rollout as rollout_lib

RUBRIC = (
    roles.RubricItem("mentions a red circle", "a red circle must be named", 3.0),
    roles.RubricItem("the background is white", "it must be called white", 1.0),
)


def fixed_rubric(items=RUBRIC):
    """Returns a stand-in for rollout.write_rubrics: the real Generator writes (real sampler, real
    prompts), and each group's parsed rubric is replaced by `items`."""
    write_rubrics = rollout_lib.write_rubrics

    def write(*args):
        texts, _, problems = write_rubrics(*args)
        return texts, [list(items) for _ in texts], problems

    return write


def patterned_roles(setattr_=setattr):
    """Replaces rollout.write_rubrics / judge_captions with the wrappers; setattr_ is
    pytest's monkeypatch.setattr in tests, plain setattr in worker processes."""
    judge_captions = rollout_lib.judge_captions

    def patterned_decisions(cfg, params, processor, rubrics, captions, rl_cfg, rng, per_item=False):
        _, problems = judge_captions(
            cfg, params, processor, rubrics, captions, rl_cfg, rng, per_item=per_item
        )
        decisions = [[[i % 2, (i // 2) % 2] for i in range(len(group))] for group in captions]
        return decisions, problems

    setattr_(rollout_lib, "write_rubrics", fixed_rubric())
    setattr_(rollout_lib, "judge_captions", patterned_decisions)


def toy_rollout(config, setup, tokens, logprobs, lengths, rewards):
    """Returns a Rollout of config.rl.images_per_step toy images (the Policy's real prompts) with
    the given caption tokens / logprobs / lengths [G*N, ...] and rewards [G, N], no rubric text:
    what the GRPO update reads."""
    from mocojax.data import records as records_lib, toyroles

    group = toyroles.image_records(config.data.seed, config.rl.images_per_step)
    images = [
        records_lib.example_image({"role": "policy", **r}, config.data.image_size) for r in group
    ]
    prompt = setup.processor([roles.policy_messages(image) for image in images], mode="generate")
    return hand_rollout([r["id"] for r in group], prompt, tokens, logprobs, lengths, rewards)


def hand_rollout(ids, prompt, tokens, logprobs, lengths, rewards):
    """Returns a Rollout of the given prompts, caption tokens / logprobs / lengths [G*N, ...] and
    rewards [G, N], its rubric fields empty: what the GRPO update reads."""
    g, n = np.shape(rewards)
    return rollout_lib.Rollout(
        ids=ids,
        prompt=prompt,
        tokens=tokens,
        logprobs=logprobs,
        lengths=lengths,
        captions=[[""] * n] * g,
        subsets=np.zeros((g, 1), int),
        rubric_texts=[""] * g,
        rubrics=[[]] * g,
        generator_problems=[[]] * g,
        decisions=[[]] * g,
        judge_problems=np.zeros((g, n)),
        rewards=rewards,
        rubric_ok=np.ones(g, bool),
    )
