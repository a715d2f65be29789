"""Stage II defaults: the `rl` block of an experiment config, and its validation.

Wire it into a config with `config.rl = rl_config.rl_defaults(tiny=arg == "tiny")`. The paper's
values are in comments; the toy-world defaults are sized for SFT + RL + eval on 2 CPU cores.
"""

import math

import ml_collections

from mocojax.losses import AGGREGATIONS
from mocojax.momentum import ROLE_SOURCES as PARAM_SOURCES

# The parameter copies a role may use (momentum.RoleMomentum), or "exact" (toy world only): the
# world's exact rubric writer and judge instead of a model, the ceiling of what the rubric reward
# can give the Policy (toyroles.ExactRoles).
ROLE_SOURCES = PARAM_SOURCES + ("exact",)
MOMENTUM_SCHEDULES = ("constant", "byol_cosine")
# What scores the Policy's captions: "rubric" (online rubrics, the method) or "g2p" (ACE-Cap's
# Gold-MCQ reward from a text-only MCQ judge; mocojax.train.g2p, docs/acecap.md).
# "true_f1" (toy world, with the exact roles): each caption's exact fact-level F1 against its
# scene, the ceiling of any caption reward -- what GRPO does when the reward is the metric itself.
REWARDS = ("rubric", "g2p", "true_f1")
# The RL loop's eval hooks (mocojax.train.rl_evals.EVALS): "" none; "toyworld" the Judge gate and
# held-out evals against the toy world's exact truth (needs data.source="toyworld").
EVALS = ("", "toyworld")
# Where the rubric reward's rubrics come from (mocojax.train.offline_rubrics).
RUBRICS = ("online", "offline", "committee")
# rl.rubric_check: "" the rubrics as written (the paper); "references": the Judge first reads each
# image's reference captions against its rubric and drops the items fewer than half of them meet
# (rollout.check_rubrics; docs/rl.md).
RUBRIC_CHECKS = ("", "references")
# rl.rubric_source: "own" each image is judged with the rubric written for it (the method);
# "next_image" the trivial baseline of any rubric reward: each image of an update is judged with
# the rubric written for the next image of the update (cyclically; its image, references and
# candidates), after which the check and the Judge run as usual (rollout.collect).
RUBRIC_SOURCES = ("own", "next_image")


def rl_defaults(tiny: bool = False) -> ml_collections.ConfigDict:
    """Returns the `rl` config block: the method (shared init, m = 0.99, H = 1) on the toy world.

    Long because it is data: one assignment per `rl` key, most commented (many with the paper's
    value), then the tiny run's overrides; a list of settings reads best in one place.
    """
    rl = ml_collections.ConfigDict()
    rl.num_steps = 100  # paper: 600
    rl.images_per_step = 4  # groups per Policy update (paper: per-device batch 8)
    rl.grad_accum_steps = 2  # paper: 2; each micro-batch holds images_per_step / 2 whole groups
    rl.num_samples = 8  # N captions per image (paper: 16)
    rl.subset_size = 4  # M captions shown to the Generator (paper: 4)
    rl.num_scenes = 0  # toy world: RL images are training scenes 0..num_scenes-1 (0: all of them)
    # The update's caption axis: the batch's longest caption rounded up to a multiple of this
    # (at most max_new_tokens), so the gradient step pays for caption tokens, not the sampler's
    # room; each width compiles once (up to max_new_tokens / multiple shapes). 0: always
    # max_new_tokens (as with the aggregation "seq_mean_token_sum_norm", whose normaliser is that
    # length). Off here: on the toy job (64-token room, ~20-token captions, 600 updates) the
    # extra compiles (~23 s each on 2 cores) cost more than the cut saves (docs/performance.md).
    rl.update_length_multiple = 0

    # The Policy's optimiser: AdamW settings come from config.optimizer, these override its
    # schedule (paper: lr 1e-6, cosine, 5% warmup).
    # the toy SFT lr / 5 (paper: SFT lr / 10); the toy run has 100 updates, the paper 600
    rl.lr = 2e-4
    rl.warmup_ratio = 0.05
    rl.end_lr_ratio = 0.1

    # GRPO surrogate (losses.grpo_loss).
    rl.clip_eps = 0.2
    rl.clip_eps_high = 0.2  # DAPO's clip-higher sets it larger, e.g. 0.28
    rl.kl_beta = 0.0  # > 0 adds k3 KL to the initial Policy (keeps a frozen copy)
    rl.aggregation = "seq_mean_token_mean"
    rl.adv_eps = 1e-6

    # Momentum transfer: phi <- m phi + (1 - m) theta after every `sync_every` Policy updates.
    rl.momentum = 0.99  # m; 1: frozen roles, 0: copy (H = 1) or periodic copy (H > 1)
    rl.sync_every = 1  # H
    rl.momentum_schedule = "constant"  # or "byol_cosine": m -> 1 by a half cosine over the run
    # or "g2p": Gold-MCQ judged by rl.judge ("exact": the toy oracle); no Generator
    rl.reward = "rubric"
    # rl.reward = "true_f1" only: subtracted from a caption's F1 per hallucinated object
    rl.hallucination_charge = 0.0
    # > 0 (rl.generator = "exact", online rubrics): the weight of the exact rubric's items that an
    # invented mention fails ("does not mention a star", "mentions at most one circle";
    # toyroles.INVENTION_KINDS) instead of their 3, so an invented mention costs more than a found
    # object's presence item pays; 0: the rubric's own weights (docs/rl.md; docs/results.md,
    # session 40: it trades the RL gain for fewer inventions, no weight keeping both).
    rl.invention_weight = 0.0
    # which params play the Generator: "ema" | "frozen" | "policy" | "exact" (toy)
    rl.generator = "ema"
    rl.judge = "ema"
    # Where each image's rubric comes from: "online" (the method: the Generator writes one every
    # update from the current candidates), "offline" (M3: written once per image from theta_0's
    # captions, then fixed) or "committee" (RubiCap: written once from a committee of noisy
    # teacher captions, toy world; mocojax.train.offline_rubrics, docs/ablations.md).
    rl.rubrics = "online"
    # "references": before the Policy's captions are judged, the Judge reads the image's reference
    # captions against the rubric and an item fewer than half of them meet is dropped (a criterion
    # the gold captions fail is a false one: a learned Generator's misperception written as a
    # requirement); "": the rubric as written, as the paper (RUBRIC_CHECKS, rollout.check_rubrics).
    rl.rubric_check = ""
    # K > 1: the Generator writes K rubrics per image, sampled at generator_temperature (> 0),
    # and the image's rubric is their union (roles.merge_rubrics): more of the image's checkable
    # facts than one greedy draw names, its false items left to rubric_check = "references".
    rl.rubric_samples = 1
    rl.rubric_votes = 1  # of the K draws, how many must name an item for the union to keep it
    # "next_image": the trivial baseline -- every image judged with another image's rubric
    # (RUBRIC_SOURCES); "own" the method.
    rl.rubric_source = "own"
    rl.committee_size = 5  # K teachers; a fact is kept when >= ceil(K/2) state it
    rl.committee_omit = (
        0.1  # teacher noise (toycommittee.teacher_caption): object / background left out
    )
    rl.committee_wrong = 0.1  # an attribute or the background misstated
    rl.committee_invent = 0.2  # one object that is not there added
    # EvoLM (mocojax.train.evolm): even updates train the Generator (shared with the Policy:
    # rl.generator = "policy") on its rubrics' discrimination reward; odd updates the Policy.
    rl.train_generator = False
    rl.roles_init = ""  # empty: roles start from the Policy's init (shared); else a workdir
    #                     whose latest SFT checkpoint initialises the roles (separate init)

    # Decoding. The Policy samples; the roles decode greedily so one rubric version is scored.
    rl.temperature = 1.0
    rl.top_p = 1.0
    rl.top_k = 0
    rl.max_new_tokens = 64  # caption tokens (toy references: at most 52)
    rl.generator_temperature = 0.0
    rl.generator_max_new_tokens = 160  # toy rubrics: at most 138 tokens
    rl.judge_temperature = 0.0
    rl.judge_max_new_tokens = 112  # toy decisions: at most 96 tokens

    # Before the first update (toy world): the Judge's balanced accuracy on its worst item kind
    # on held-out RL-like captions; below judge_gate RL warns loudly, or refuses when
    # judge_gate_refuse is set.
    rl.judge_gate = 0.85
    rl.judge_gate_refuse = False
    rl.judge_gate_scenes = 50

    rl.evals = ""  # eval hooks (EVALS): "" none; configs/toyworld.py sets "toyworld"
    # Toy world: warn loudly once the mean within-group r(reward, true F1) over the last this
    # many updates that have one is below 0 (the reward ranks captions against the truth: a
    # gamed Judge); 0: off. Measured: a collapsed run went below 0 at update 294 of 600.
    rl.gaming_window = 50
    # True: RL also stops there, its checkpoint of that step kept (and a rerun does not resume
    # it), so the eval stage scores the Policy before the gamed reward lowers it further.
    rl.gaming_stop = False
    rl.log_samples_every = 5  # K: one step's groups go to <workdir>/rl_samples.jsonl
    # > 0 (toy world): the Policy's greedy F1, hallucinations and words on the validation range
    # (the val_scenes scenes after the eval stage's; "val/*") at the start and every n steps, to
    # choose settings on; 0: none (the eval stage scores the checkpoints on the eval scenes).
    rl.eval_every = 0
    rl.val_scenes = 100
    rl.checkpoint_every = 20
    rl.keep_checkpoints = 2
    rl.max_skipped_steps = 10  # stop the run after this many updates in a row skipped as non-finite

    if tiny:
        rl.num_steps = 3
        rl.images_per_step = 2
        rl.grad_accum_steps = 2
        rl.num_samples = 4
        rl.subset_size = 2
        rl.max_new_tokens = 8
        rl.generator_max_new_tokens = 12
        rl.judge_max_new_tokens = 8
        rl.log_samples_every = 1
        rl.checkpoint_every = 2
        rl.judge_gate_scenes = 2
    return rl


def _fail(key, value, reason):
    raise ValueError(f"config.rl.{key}={value!r}: {reason}")


def _real(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# Float keys: (low, high, low inclusive, high inclusive); None: unbounded on that side.
RANGES = {
    "lr": (0.0, None, False, True),
    "warmup_ratio": (0.0, 1.0, True, False),
    "end_lr_ratio": (0.0, 1.0, True, True),
    "clip_eps": (0.0, 1.0, True, False),
    "clip_eps_high": (0.0, None, True, True),
    "kl_beta": (0.0, None, True, True),
    "hallucination_charge": (0.0, None, True, True),
    "invention_weight": (0.0, None, True, True),
    "adv_eps": (0.0, None, False, True),
    "momentum": (0.0, 1.0, True, True),
    "judge_gate": (0.0, 1.0, True, True),
    "temperature": (0.0, None, True, True),
    "generator_temperature": (0.0, None, True, True),
    "judge_temperature": (0.0, None, True, True),
    "top_p": (0.0, 1.0, False, True),
    "committee_omit": (0.0, 1.0, True, True),
    "committee_wrong": (0.0, 1.0, True, True),
    "committee_invent": (0.0, 1.0, True, True),
}


def describe_range(low, high, low_in, high_in):
    """Returns e.g. 'a finite number in [0, 1)' or 'a finite number > 0'."""
    if high is None:
        return f"a finite number {'>=' if low_in else '>'} {low:g}"
    return f"a finite number in {'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"


def in_range(value, low, high, low_in, high_in):
    """Returns whether value is a finite real number (not a bool) inside the range."""
    if not _real(value):
        return False
    above = value >= low if low_in else value > low
    below = high is None or (value <= high if high_in else value < high)
    return above and below


def validate(rl) -> None:
    """Raises ValueError naming the first bad `rl` key; runs before anything is compiled.

    Long because it is a flat list of checks (ranges, positive ints, non-negative ints, then choices
    and cross-key rules such as subset_size <= num_samples) in the order a bad key is reported;
    splitting it would scatter that order.
    """
    positive = (
        "num_steps",
        "images_per_step",
        "grad_accum_steps",
        "num_samples",
        "subset_size",
        "sync_every",
        "max_new_tokens",
        "generator_max_new_tokens",
        "judge_max_new_tokens",
        "log_samples_every",
        "checkpoint_every",
        "keep_checkpoints",
        "val_scenes",
        "judge_gate_scenes",
        "max_skipped_steps",
        "committee_size",
    )
    for key, bounds in RANGES.items():
        if not in_range(rl[key], *bounds):
            _fail(key, rl[key], "must be " + describe_range(*bounds))
    for key in positive:
        value = rl[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            _fail(key, value, "must be a positive int")
    for key in ("num_scenes", "eval_every", "top_k", "gaming_window", "update_length_multiple"):
        if not isinstance(rl[key], int) or rl[key] < 0:
            _fail(key, rl[key], "must be an int >= 0")
    if rl.subset_size > rl.num_samples:
        _fail("subset_size", rl.subset_size, f"must be <= num_samples = {rl.num_samples}")
    if rl.images_per_step % rl.grad_accum_steps:
        _fail(
            "grad_accum_steps",
            rl.grad_accum_steps,
            f"must divide images_per_step = {rl.images_per_step} (micro-batches hold whole groups)",
        )
    if rl.momentum_schedule not in MOMENTUM_SCHEDULES:
        _fail("momentum_schedule", rl.momentum_schedule, f"must be one of {MOMENTUM_SCHEDULES}")
    for key in ("generator", "judge"):
        if rl[key] not in ROLE_SOURCES:
            _fail(key, rl[key], f"must be one of {ROLE_SOURCES}")
    if rl.evals not in EVALS:
        _fail("evals", rl.evals, f"must be one of {EVALS}")
    if rl.reward not in REWARDS:
        _fail("reward", rl.reward, f"must be one of {REWARDS}")
    if rl.rubrics not in RUBRICS:
        _fail("rubrics", rl.rubrics, f"must be one of {RUBRICS}")
    if rl.reward == "true_f1" and (rl.generator, rl.judge) != ("exact", "exact"):
        _fail(
            "reward",
            rl.reward,
            "the true-F1 ceiling runs with the exact roles (rl.generator = rl.judge = 'exact'), "
            f"got {rl.generator!r} / {rl.judge!r}",
        )
    if rl.hallucination_charge and rl.reward != "true_f1":
        _fail(
            "hallucination_charge",
            rl.hallucination_charge,
            f"applies to rl.reward='true_f1' only, not {rl.reward!r}",
        )
    if rl.invention_weight and (rl.generator, rl.rubrics, rl.reward) != (
        "exact",
        "online",
        "rubric",
    ):
        _fail(
            "invention_weight",
            rl.invention_weight,
            "reweights the exact Generator's online rubric only (rl.generator='exact', "
            f"rl.rubrics='online', rl.reward='rubric'), got {rl.generator!r} / {rl.rubrics!r} / "
            f"{rl.reward!r}",
        )
    if rl.get("rubric_check", "") not in RUBRIC_CHECKS:
        _fail("rubric_check", rl.rubric_check, f"must be one of {RUBRIC_CHECKS}")
    if rl.get("rubric_check", "") and rl.reward != "rubric":
        _fail(
            "rubric_check",
            rl.rubric_check,
            f"checks rubrics: rl.reward='rubric', not {rl.reward!r}",
        )
    samples = rl.get("rubric_samples", 1)
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        _fail("rubric_samples", samples, "must be a positive int")
    votes = rl.get("rubric_votes", 1)
    if not isinstance(votes, int) or isinstance(votes, bool) or not 1 <= votes <= samples:
        _fail("rubric_votes", votes, f"must be an int in [1, rl.rubric_samples = {samples}]")
    if samples > 1 and not rl.generator_temperature:
        _fail(
            "rubric_samples",
            samples,
            "draws several rubrics per image: set rl.generator_temperature > 0 (greedy draws are "
            "all the same)",
        )
    if samples > 1 and (rl.generator == "exact" or rl.rubrics == "committee" or rl.train_generator):
        _fail(
            "rubric_samples",
            samples,
            "draws from the model Generator's rubric writer: not with rl.generator='exact', "
            "rl.rubrics='committee' or rl.train_generator (EvoLM writes its own)",
        )
    source = rl.get("rubric_source", "own")
    if source not in RUBRIC_SOURCES:
        _fail("rubric_source", source, f"must be one of {RUBRIC_SOURCES}")
    if source != "own" and (rl.reward != "rubric" or rl.train_generator):
        _fail(
            "rubric_source",
            source,
            "swaps rubrics between images: needs rl.reward='rubric' and not rl.train_generator "
            "(EvoLM rewards the Generator for its own image's rubric)",
        )
    if source != "own" and rl.images_per_step < 2:
        _fail(
            "rubric_source",
            source,
            f"takes another image's rubric: needs rl.images_per_step >= 2, got {rl.images_per_step}",
        )
    if rl.rubrics != "online" and rl.reward != "rubric":
        _fail("rubrics", rl.rubrics, f"fixed rubrics need rl.reward='rubric', not {rl.reward!r}")
    if rl.aggregation not in AGGREGATIONS:
        _fail("aggregation", rl.aggregation, f"must be one of {AGGREGATIONS}")
    if not isinstance(rl.train_generator, bool):
        _fail("train_generator", rl.train_generator, "must be True or False")
    if rl.train_generator and (rl.reward != "rubric" or rl.rubrics != "online"):
        _fail(
            "train_generator",
            rl.train_generator,
            "EvoLM trains the online Generator: needs rl.reward='rubric' and rl.rubrics='online'",
        )
    for key in ("judge_gate_refuse", "gaming_stop"):
        if not isinstance(rl.get(key, False), bool):
            _fail(key, rl[key], "must be True or False")
