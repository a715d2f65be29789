"""EvoLM as the paper reproduces it (seed 000: "We select EvoLM as the alternating-training
baseline because the original method shares Policy and Generator parameters"): the Policy and
the Generator are ONE set of parameters theta and both are trained, in alternating updates
(config.rl.train_generator = True, configs/rl_evolm.py; docs/ablations.md).

  odd updates   the Policy update of the method, with the Generator played by the live shared
                params (rl.generator = "policy") and a frozen Judge (rl.judge = "frozen"):
                rollout.collect, GRPO on the captions;
  even updates  a Generator update on the same params: for each image, N rubrics sampled from
                the Generator prompt (image, references, M of the current Policy's captions) at
                the Policy's temperature; GRPO on the rubric tokens with the reward below.

The Generator's training signal (our choice: the seed text names no signal, and the only hint is
that EvoLM, unlike DynamicRubric, needs no "ranking annotations for anchor responses") is a
rubric's *discrimination* between the reference caption and the current Policy's captions:

    g(R) = s(c_ref; R) - mean_i s(y_i; R),   s(y; R) = sum_k w_k b_k(y) / sum_k w_k,

judged by the same frozen Judge, with g = -1 for a rubric that parses to no item. A rubric earns
reward when the reference meets its items and the Policy's captions do not: it names what the
Policy still gets wrong, which is what the method's rubrics are for. It uses only the
references that every Generator prompt already has.
"""

import dataclasses

import jax
import numpy as np

from mocojax import roles
from mocojax.data import records as records_lib
from mocojax.train import rl as rl_lib, rollout as rollout_lib

UNPARSED_REWARD = -1.0


def discrimination_reward(weights, reference_decisions, caption_decisions):
    """Returns g(R) = s(reference; R) - mean_i s(y_i; R) for one rubric (float in [-1, 1]).

    weights [K]; reference_decisions [K] 0/1; caption_decisions [N][K] 0/1. An empty rubric
    (K = 0) gets UNPARSED_REWARD.
    """
    if len(weights) == 0:
        return UNPARSED_REWARD
    reference = roles.rubric_reward(weights, reference_decisions)
    captions = [roles.rubric_reward(weights, d) for d in caption_decisions]
    return float(reference - np.mean(captions))


@dataclasses.dataclass
class GeneratorSamples(rollout_lib.PolicySamples):
    """A Generator update's rollouts: N sampled rubrics per image ("captions" holds their text),
    rewards g(R) [G, N]; what rl.train_batch needs, as for the Policy's captions."""

    rubrics: list  # [G][N] list[RubricItem]
    policy_captions: list  # [G][N] the current Policy's captions the rubrics were judged on


class AlternatingSource(rl_lib.RubricSource):
    """The method's rubric reward on odd updates, Generator updates on even ones (EvoLM)."""

    roles = ("generator", "judge")

    def __init__(self, config, records):
        rl = config.rl
        if rl.generator != "policy" or rl.judge not in ("frozen", "exact"):
            raise ValueError(
                "config.rl.train_generator=True (EvoLM): the Generator must share the Policy's "
                f"params (rl.generator='policy', got {rl.generator!r}) and the Judge be fixed "
                f"(rl.judge 'frozen' or 'exact', got {rl.judge!r})"
            )
        super().__init__(
            {r["id"]: r["scene"] for r in records if "scene" in r},
            records_lib.judge_item_form(config.data),
        )

    @staticmethod
    def is_generator_step(step):
        """Returns whether update `step` (1-based) trains the Generator (even steps)."""
        return step % 2 == 0

    def collect(
        self, cfg, policy_params, generator_params, judge_params, processor, group, rl, **kwargs
    ):
        """Returns (rollout, seconds): the method's rollout, or GeneratorSamples on even steps."""
        if not self.is_generator_step(kwargs["step"]):
            return rollout_lib.collect(
                cfg,
                policy_params,
                generator_params,
                judge_params,
                processor,
                group,
                rl,
                judge_per_item=self.judge_per_item,
                **kwargs,
            )
        return self.collect_generator(
            cfg, policy_params, judge_params, processor, group, rl, **kwargs
        )

    def collect_generator(
        self, cfg, params, judge_params, processor, group, rl, *, seed, step, rng, exact=None
    ):
        """Returns (GeneratorSamples, seconds) of one Generator update on the shared params.

        Long because it is one Generator update's rollout read top to bottom (Policy captions,
        rubrics on M-caption subsets, judging the reference and the N captions, discrimination
        rewards), the first three timed and each feeding the next, as `rollout.collect` is for the
        Policy.
        """
        seconds = {}
        n = rl.num_samples
        images = [e["image"] for e in group]
        with rollout_lib.timed(seconds, "policy_sampling"):
            captions = rollout_lib.policy_captions(cfg, params, processor, images, rl, rng)[-1]
        subsets = rollout_lib.choose_subsets(seed, step, len(group), n, rl.subset_size)
        conversations = [
            roles.generator_messages(
                e["image"], e["references"], [captions[g][i] for i in subsets[g]]
            )
            for g, e in enumerate(group)
        ]
        with rollout_lib.timed(seconds, "rubric_generation"):
            prompt, out = rollout_lib._generate(
                cfg,
                params,
                processor,
                conversations,
                num_samples=n,
                max_new_tokens=rl.generator_max_new_tokens,
                temperature=rl.temperature,
                top_p=rl.top_p,
                top_k=rl.top_k,
                rng=jax.random.fold_in(rng, 3),
            )
            texts = rollout_lib.decode_texts(
                processor.tokenizer, out.tokens, out.lengths, processor.eos_token_ids
            )
            finished = np.asarray(out.lengths) < rl.generator_max_new_tokens
            rubrics = [
                roles.parse_rubric(t + "\n" if done else t)[0] for t, done in zip(texts, finished)
            ]
        # Judge every rubric on the reference and the N Policy captions of its image.
        judged = [[e["references"][0], *captions[g]] for g, e in enumerate(group) for _ in range(n)]
        with rollout_lib.timed(seconds, "judging"):
            if rl.judge == "exact":
                decisions = [
                    [exact.decisions(r, c) if r else [] for c in caps]
                    for r, caps in zip(rubrics, judged)
                ]
            else:
                decisions, _ = rollout_lib.judge_captions(
                    cfg,
                    judge_params,
                    processor,
                    rubrics,
                    judged,
                    rl,
                    jax.random.fold_in(rng, 4),
                    per_item=self.judge_per_item,
                )
        rewards = [
            discrimination_reward([i.weight for i in r], d[0], d[1:]) if r else UNPARSED_REWARD
            for r, d in zip(rubrics, decisions)
        ]
        samples = GeneratorSamples(
            ids=[e["id"] for e in group],
            prompt=prompt,
            tokens=np.asarray(out.tokens),
            logprobs=np.asarray(out.logprobs, np.float32),
            lengths=np.asarray(out.lengths),
            captions=[texts[g * n : (g + 1) * n] for g in range(len(group))],
            rewards=np.asarray(rewards, np.float32).reshape(len(group), n),
            rubrics=[rubrics[g * n : (g + 1) * n] for g in range(len(group))],
            policy_captions=captions,
        )
        return samples, seconds

    def logs(self, rollout):
        """Returns (scalars, truths): the method's logs on Policy steps; on Generator steps the
        rubric rewards (prefixed "generator/") and the toy truth of the rubric items."""
        if not isinstance(rollout, GeneratorSamples):
            return super().logs(rollout)
        scalars = {f"generator/{k}": v for k, v in rl_lib.samples_metrics(rollout).items()}
        items = [i for group in rollout.rubrics for r in group for i in r]
        scalars["generator/rubric_items"] = len(items) / max(rollout.rewards.size, 1)
        if self.scenes:
            from mocojax.data import toyroles

            rates = [
                toyroles.rubric_truth_rate(self.scenes[image_id], r)[0]
                for image_id, group in zip(rollout.ids, rollout.rubrics)
                for r in group
                if r
            ]
            if rates:
                scalars["generator/true/rubric_item_truth"] = float(np.mean(rates))
        return scalars, []

    def sample_rows(self, step, rollout, truths):
        """Returns the step's rows for <workdir>/rl_samples.jsonl."""
        if not isinstance(rollout, GeneratorSamples):
            return super().sample_rows(step, rollout, truths)
        return [
            {
                "step": step,
                "image_id": image_id,
                "role": "generator",
                "rubric_texts": rollout.captions[g],
                "policy_captions": rollout.policy_captions[g],
                "rewards": rollout.rewards[g].tolist(),
            }
            for g, image_id in enumerate(rollout.ids)
        ]
