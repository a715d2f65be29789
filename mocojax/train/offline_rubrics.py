"""Offline (fixed) rubrics in Stage II: one rubric per image, written once, never rewritten.

config.rl.rubrics picks where the rubric of an image comes from (docs/ablations.md):
  "online"     the method: the Generator writes a new rubric every update from the current
               Policy's candidates (rollout.collect; not this module);
  "offline"    M3: the Generator (rl.generator's params, frozen in the ablation) writes the rubric
               once from the image, its references and M captions sampled from the SFT Policy
               theta_0, the student before RL;
  "committee"  RubiCap (seeds 001 / 003): the rubric is written once from a committee of
               rl.committee_size noisy teacher captions of the toy world (toycommittee: noise
               model, majority consensus, the SFT Policy's greedy caption diagnosed, one binary item
               per deficiency weighted 3 / 2 / 1); no Generator model runs.
Either way the Judge (rl.judge) scores all N captions of every update against the image's fixed
rubric, the reward is the same normalised weighted sum, and GRPO updates the Policy.

"Written once" is a cache filled the first time RL draws an image, from theta_0 (so it equals
writing every rubric before RL, for the images RL sees, without paying for the others). After a
resume the cache is refilled: committee rubrics come back identical (greedy student caption,
seeded teachers); "offline" rubrics are rewritten from new samples of theta_0.
"""

import jax
import ml_collections

from mocojax import roles
from mocojax.data import records as records_lib, toycommittee
from mocojax.train import rl as rl_lib, rollout as rollout_lib

MODES = ("offline", "committee")


def _with(rl, **changes):
    """Returns a copy of the rl config block with `changes` (the sampler reads only rl keys)."""
    out = ml_collections.ConfigDict(rl.to_dict())
    for key, value in changes.items():
        out[key] = value
    return out


def _image_key(seed, image_id):
    """Returns a jax key that depends only on the seed and the image id (stable over resumes,
    unlike Python's salted hash)."""
    value = seed % (1 << 31)
    for ch in image_id:
        value = (value * 131 + ord(ch)) % (1 << 31)
    return jax.random.key(value)


class OfflineRubricSource(rl_lib.RubricSource):
    """The rubric reward with one fixed rubric per image (config.rl.rubrics "offline" or
    "committee"); logs as RubricSource does."""

    def __init__(self, config, records, initial_policy):
        rl = config.rl
        if rl.rubrics not in MODES:
            raise ValueError(f"config.rl.rubrics={rl.rubrics!r}: offline sources are {MODES}")
        scenes = {r["id"]: r["scene"] for r in records if "scene" in r}
        if rl.rubrics == "committee" and len(scenes) != len(records):
            raise ValueError(
                "config.rl.rubrics='committee': the teacher committee is drawn from the toy "
                "world; every RL record needs its scene (data.source='toyworld')"
            )
        super().__init__(scenes, records_lib.judge_item_form(config.data))
        self.config = config
        self.mode = rl.rubrics
        # RubiCap writes no rubric with a model: only the Judge needs parameters.
        self.roles = ("generator", "judge") if self.mode == "offline" else ("judge",)
        self._initial_policy = initial_policy  # () -> theta_0, loaded on first use
        self._theta0 = None
        self.cache = {}  # image id -> (rubric text, list[RubricItem], parser problems)

    def theta0(self):
        """Returns theta_0 (the SFT Policy, the student the rubrics diagnose), loaded once."""
        if self._theta0 is None:
            self._theta0 = self._initial_policy()
        return self._theta0

    def _student_captions(self, cfg, processor, examples, rl, seed):
        """Returns [G][n] captions of theta_0: n = M samples ("offline"), 1 greedy ("committee")."""
        if self.mode == "committee":
            sub = _with(rl, num_samples=1, temperature=0.0)
        else:
            sub = _with(rl, num_samples=rl.subset_size)
        images = [e["image"] for e in examples]
        key = _image_key(seed, examples[0]["id"])
        return rollout_lib.policy_captions(cfg, self.theta0(), processor, images, sub, key)[-1]

    def write_missing(self, cfg, generator_params, processor, examples, rl, seed, exact=None):
        """Writes and caches the rubric of each example not cached yet."""
        examples = [e for e in examples if e["id"] not in self.cache]
        if not examples:
            return
        students = self._student_captions(cfg, processor, examples, rl, seed)
        if self.mode == "committee":
            data = self.config.data
            noise = dict(
                omit=rl.committee_omit, wrong=rl.committee_wrong, invent=rl.committee_invent
            )
            for e, student in zip(examples, students):
                committee = toycommittee.committee_captions(
                    self.scenes[e["id"]], data.seed, rl.committee_size, noise
                )
                items = toycommittee.rubicap_rubric(committee, student[0])
                self.cache[e["id"]] = (roles.format_rubric(items), items, [])
            return
        if rl.generator == "exact":
            for e, shown in zip(examples, students):
                items = exact.rubric(e["id"], shown)
                self.cache[e["id"]] = (roles.format_rubric(items), items, [])
            return
        texts, rubrics, problems = rollout_lib.write_rubrics(
            cfg,
            generator_params,
            processor,
            [e["image"] for e in examples],
            [e["references"] for e in examples],
            students,
            rl,
            jax.random.fold_in(_image_key(seed, examples[0]["id"]), 1),
        )
        for e, text, items, found in zip(examples, texts, rubrics, problems):
            self.cache[e["id"]] = (text, items, found)

    def collect(
        self, cfg, policy_params, generator_params, judge_params, processor, group, rl, **kwargs
    ):
        """Returns (Rollout, seconds per phase): rollout.collect with the image's fixed rubric in
        place of the Generator (written first if the image is new)."""

        def write(examples, shown):
            self.write_missing(
                cfg, generator_params, processor, examples, rl, kwargs["seed"], kwargs.get("exact")
            )
            cached = [self.cache[e["id"]] for e in examples]
            return [c[0] for c in cached], [c[1] for c in cached], [c[2] for c in cached]

        args = (cfg, policy_params, generator_params, judge_params, processor, group, rl)
        return rollout_lib.collect(*args, write=write, judge_per_item=self.judge_per_item, **kwargs)
