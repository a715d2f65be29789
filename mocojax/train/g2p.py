"""ACE-Cap's G2P reward in Stage II: config.rl.reward = "g2p" (docs/acecap.md).

Per Policy update, for G images: the Policy samples N captions per image (as for the rubric
reward); a text-only judge answers the image's Gold-MCQ items (mocojax.acecap) from each caption
alone; R_G = mean_j s_j is the caption's reward; GRPO as for the rubric reward (rl.train_batch).
No Generator runs and no rubric is written.

The judge is config.rl.judge:
  "exact"   the toy world's oracle reader (acecap.oracle_choice), a fixed judge that reads the
            world's language without error;
  "frozen"  the model that RL starts from, kept frozen (the paper's frozen judge; rl.roles_init
            points it at another run's SFT checkpoint); "ema" / "policy" as for the rubric Judge.
A model judge gets one prompt per caption with all of the image's items, the caption last, so
the N captions of an image share the instruction + questions prefix and its KV cache
(rollout.judge_texts); it decodes rl.judge_max_new_tokens tokens at rl.judge_temperature.
Gold-MCQs come from the scene on the toy world (acecap.toy_mcq) and from an image record's `mcq`
field elsewhere (records.py; `python -m mocojax.gold_mcq` writes them from the references through
a teacher), which needs a model judge; the toy truth metrics are logged on the toy world only.
"""

import dataclasses
import functools

import jax
import numpy as np

from mocojax import acecap, roles
from mocojax.data import toyworld as tw
from mocojax.train import rl as rl_lib, rl_evals, rollout as rollout_lib


@dataclasses.dataclass
class G2PRollout(rollout_lib.PolicySamples):
    """The G2P reward's rollouts of one Policy update; rewards R_G in [-1, 1]."""

    mcqs: list  # [G] list[acecap.MCQItem]
    judge_texts: list  # [G][N] raw judge replies ("" from the exact judge)
    choices: list  # [G][N] list of letters per item (None: unreadable)
    unreadable: np.ndarray  # [G, N] int: items whose answer named no offered letter
    judge: str  # rl.judge: "exact" (the oracle) or the params that played the judge


def judge_mcq(cfg, params, processor, mcqs, captions, rl, rng):
    """Returns the model judge's replies [G][N]: image g's items answered from each caption."""
    n = len(captions[0])
    conversations = [
        roles.prompt_messages(acecap.mcq_prompt(items, caption))
        for items, group in zip(mcqs, captions)
        for caption in group
    ]
    texts = rollout_lib.judge_texts(cfg, params, processor, conversations, n, rl, rng)
    return [texts[g * n : (g + 1) * n] for g in range(len(captions))]


class G2PSource:
    """Collects, scores and logs one step's captions with the G2P reward (rl.reward_source)."""

    roles = ("judge",)

    def __init__(self, config, records):
        # Toy-world records build their items from the scene (acecap.toy_mcq); any other record
        # carries them in its `mcq` field (records.py; `python -m mocojax.gold_mcq` writes them).
        missing = [r.get("id") for r in records if "scene" not in r and not r.get("mcq")]
        if missing:
            raise ValueError(
                f"config.rl.reward='g2p': record {missing[0]!r} (and {len(missing) - 1} more) has "
                "no Gold-MCQ items: give image records an 'mcq' field (python -m mocojax.gold_mcq "
                "writes it from their references) or use toy-world scenes"
            )
        real = [r["id"] for r in records if "scene" not in r]
        if real and config.rl.judge == "exact":
            raise ValueError(
                f"config.rl.reward='g2p': record {real[0]!r} is not a toy-world scene; the exact "
                "judge reads toy captions only: set config.rl.judge to 'frozen', 'ema' or 'policy'"
            )
        self.scenes = {r["id"]: r["scene"] for r in records if "scene" in r}
        self.items = {r["id"]: list(r["mcq"]) for r in records if "scene" not in r}
        self.seed = config.data.seed

    def mcq(self, image_id):
        """Returns the Gold-MCQ items of an image: list[acecap.MCQItem]."""
        if image_id in self.scenes:
            return acecap.toy_mcq(self.scenes[image_id], self.seed)
        return self.items[image_id]

    def collect(
        self,
        cfg,
        policy_params,
        generator_params,
        judge_params,
        processor,
        group,
        rl,
        *,
        seed,
        step,
        rng,
        exact=None,
    ):
        """Returns (G2PRollout, seconds per phase); the signature of rollout.collect (the Generator's
        params, seed, step and exact are unused: no rubric is written, the oracle needs only scenes)."""
        del generator_params, seed, step, exact
        seconds = {}
        timer = functools.partial(rollout_lib.timed, seconds)
        with timer("policy_sampling"):
            prompt, tokens, logprobs, lengths, captions = rollout_lib.policy_captions(
                cfg, policy_params, processor, [e["image"] for e in group], rl, rng
            )
        mcqs = [self.mcq(e["id"]) for e in group]
        with timer("judging"):
            if rl.judge == "exact":
                texts = [["" for _ in caps] for caps in captions]
                parsed = [
                    [([acecap.oracle_choice(c, item) for item in items], 0) for c in caps]
                    for items, caps in zip(mcqs, captions)
                ]
            else:
                texts = judge_mcq(
                    cfg, judge_params, processor, mcqs, captions, rl, jax.random.fold_in(rng, 2)
                )
                parsed = [
                    [acecap.parse_choices(t, items) for t in group_texts]
                    for items, group_texts in zip(mcqs, texts)
                ]
        choices = [[c for c, _ in group] for group in parsed]
        rewards = [
            [acecap.g2p_reward(c, [item.answer for item in items]) for c in group]
            for items, group in zip(mcqs, choices)
        ]
        rollout = G2PRollout(
            ids=[e["id"] for e in group],
            prompt=prompt,
            tokens=tokens,
            logprobs=logprobs,
            lengths=lengths,
            captions=captions,
            rewards=np.asarray(rewards, np.float32),
            mcqs=mcqs,
            judge_texts=texts,
            choices=choices,
            unreadable=np.asarray([[u for _, u in group] for group in parsed], np.int32),
            judge=rl.judge,
        )
        return rollout, seconds

    def logs(self, rollout):
        """Returns (the step's scalars, per-group toy truths): answer outcome fractions, the
        captions' exact F1, and how often a model judge picks what the oracle picks."""
        outcomes = {"right": 0, "not_given": 0, "wrong": 0}
        for items, group in zip(rollout.mcqs, rollout.choices):
            for choice in group:
                for c, item in zip(choice, items):
                    outcome = (
                        "right"
                        if c == item.answer
                        else "not_given"
                        if c == acecap.NOT_GIVEN_LETTER
                        else "wrong"
                    )
                    outcomes[outcome] += 1
        answered = max(sum(outcomes.values()), 1)
        scalars = {
            **rl_lib.samples_metrics(rollout),
            **{f"g2p/{k}_frac": v / answered for k, v in outcomes.items()},
            "g2p/unreadable_frac": float(rollout.unreadable.sum()) / answered,
            "g2p/questions_per_image": float(np.mean([len(items) for items in rollout.mcqs])),
        }
        truths = [
            self._truth(g, image_id, rollout)
            for g, image_id in enumerate(rollout.ids)
            if image_id in self.scenes
        ]
        if truths and len(truths) == len(rollout.ids):  # the toy world's truth: every group
            scalars.update(rl_evals.truth_metrics(truths, rollout.rewards))
        else:
            truths = []
        agree = [v for t in truths for v in t["judge_agrees"]]
        if agree:
            scalars["true/judge_choice_accuracy"] = float(np.mean(agree))
        return scalars, truths

    def _truth(self, g, image_id, rollout):
        scene, items = self.scenes[image_id], rollout.mcqs[g]
        metrics = [tw.caption_metrics(scene, caption) for caption in rollout.captions[g]]
        # A model judge against the oracle, answer by answer (the exact judge agrees by definition).
        agrees = (
            []
            if rollout.judge == "exact"
            else [
                int(c == acecap.oracle_choice(caption, item))
                for caption, choice in zip(rollout.captions[g], rollout.choices[g])
                for c, item in zip(choice, items)
            ]
        )
        return {
            "f1": [m["f1"] for m in metrics],
            "hallucinated": [len(m["hallucinated"]) for m in metrics],
            "judge_agrees": agrees,
        }

    def sample_rows(self, step, rollout, truths):
        """Returns the step's rows for <workdir>/rl_samples.jsonl: captions, items, choices, rewards."""
        return [
            {
                "step": step,
                "image_id": image_id,
                "captions": rollout.captions[g],
                "mcq": [
                    {"question": i.question, "options": list(i.options), "answer": i.answer}
                    for i in rollout.mcqs[g]
                ],
                "judge_texts": rollout.judge_texts[g],
                "choices": rollout.choices[g],
                "rewards": rollout.rewards[g].tolist(),
                "has_signal": bool(rollout.has_signal[g]),
                **(
                    {"truth": {k: v for k, v in truths[g].items() if k != "judge_agrees"}}
                    if truths
                    else {}
                ),
            }
            for g, image_id in enumerate(rollout.ids)
        ]
