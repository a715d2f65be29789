"""The toy world in the RL loop: the Judge gate, held-out evals, and the exact truth of rollouts.

`run_rl` has no toy-world branches: it calls the hooks that config.rl.evals names (`make`):
"toyworld" gates RL on the starting Judge and evaluates the Policy on held-out scenes, "" (any
other data) returns nothing; the reward sources score each step's captions, rubric items
and Judge decisions against the scenes' exact truth with `toy_truth` / `truth_metrics`.
"""

import collections
import logging

import numpy as np

from mocojax import roles
from mocojax.data import records as records_lib, toyroles, toyworld as tw
from mocojax.eval import toyworld_eval


class ToyWorldEvals:
    """Hooks of a toy-world RL run (config.rl.evals == "toyworld")."""

    def __init__(self, config, processor, cfg):
        self.config, self.processor, self.cfg = config, processor, cfg

    def start(self, params, judge_params):
        """Returns the step-0 metrics of a fresh run: the Judge gate (rubric reward with a model
        Judge) and, with rl.eval_every, the validation readout of the starting Policy; else {}."""
        rl = self.config.rl
        gate = (
            judge_gate(self.config, self.processor, judge_params, self.cfg)
            if rl.judge != "exact" and rl.reward == "rubric"
            else {}
        )
        return {
            **gate,
            **(validation(self.config, self.processor, params, self.cfg) if rl.eval_every else {}),
        }

    def after_update(self, step, params):
        """Returns the validation readout of the Policy every rl.eval_every updates and after
        the last ({} otherwise)."""
        rl = self.config.rl
        if rl.eval_every and (step % rl.eval_every == 0 or step == rl.num_steps):
            return validation(self.config, self.processor, params, self.cfg)
        return {}


class NoEvals:
    """Hooks of a run on user data: nothing to gate on or evaluate against."""

    def start(self, params, judge_params):
        return {}

    def after_update(self, step, params):
        return {}


EVALS = {"": lambda config, processor, cfg: NoEvals(), "toyworld": ToyWorldEvals}


def make(config, processor, cfg):
    """Returns the RL loop's eval hooks named by config.rl.evals (big_vision's pattern: the
    config names the evals, the loop only calls them)."""
    return EVALS[config.rl.evals](config, processor, cfg)


def validation_range(config):
    """Returns (start, num_scenes) of the toy world's validation range: the rl.val_scenes scenes
    after the eval stage's eval.num_scenes held-out scenes (the range benchmarks/judge_curve.py
    reads by default), so choices made on RL's readout are not made on the scenes reported."""
    return config.data.num_train_scenes + config.eval.num_scenes, config.rl.val_scenes


def validation(config, processor, params, cfg):
    """Returns the Policy-only toy-world metrics of params on the validation range, prefixed
    "val/" (greedy captions; with eval.policy_samples also the sampled ones)."""
    start, num_scenes = validation_range(config)
    ev = config.eval
    result = toyworld_eval.evaluate_policy(
        cfg,
        params,
        processor,
        seed=config.data.seed,
        start=start,
        num_scenes=num_scenes,
        batch_size=ev.batch_size,
        max_new_tokens=ev.max_new_tokens,
        image_size=config.data.image_size,
        policy_samples=ev.get("policy_samples", 0),
        policy_temperature=ev.get("policy_temperature", 1.0),
    )
    return {f"val/{k}": v for k, v in result.items()}


def gate_scores(config, processor, judge_params, cfg, start=None, num_scenes=None):
    """Returns `toyworld_eval.judge_gate`'s scores of the Judge params, asked as the config's
    Judge is asked, on scenes start.. (default: the first rl.judge_gate_scenes held-out scenes);
    benchmarks/judge_curve.py scores a run's checkpoints with it on a range past the eval's."""
    return toyworld_eval.judge_gate(
        cfg,
        judge_params,
        processor,
        seed=config.data.seed,
        start=config.data.num_train_scenes if start is None else start,
        num_scenes=config.rl.judge_gate_scenes if num_scenes is None else num_scenes,
        batch_size=config.eval.batch_size,
        max_new_tokens=config.rl.judge_max_new_tokens,
        judge_per_item=records_lib.judge_item_form(config.data),
        **toyroles.rubric_options(config.data),
    )


def judge_gate(config, processor, judge_params, cfg):
    """Scores the Judge that RL starts with on held-out RL-like toy captions; returns
    {"gate/judge_balanced_accuracy_worst_kind", ...}. Below config.rl.judge_gate (on the worst item
    kind, which RL exploits) it warns loudly, or
    raises when config.rl.judge_gate_refuse is set: a Judge that cannot tell a caption that
    meets an item from one that does not gives rewards without signal about quality."""
    rl = config.rl
    gate = gate_scores(config, processor, judge_params, cfg)
    # Within each item kind (a Judge that only learned each kind's usual answer scores 0.5), and
    # the worst kind: RL finds the Judge's weakest kind and writes captions that pass it.
    score = gate["balanced_accuracy_worst_kind"]
    message = (
        f"the Judge's balanced accuracy on its worst item kind on held-out RL-like captions is "
        f"{score:.3f} (mean over kinds {gate['balanced_accuracy_within_kind']:.3f}, pooled "
        f"{gate['balanced_accuracy']:.3f}, accuracy {gate['accuracy']:.3f}; "
        f"an always-1 Judge: accuracy {gate['accuracy_always_1']:.3f}, balanced 0.5), "
        f"threshold config.rl.judge_gate={rl.judge_gate}"
    )
    if score < rl.judge_gate:
        if rl.judge_gate_refuse:
            raise RuntimeError(
                f"RL refused: {message}. Train the roles longer (config.sft.num_steps) "
                "or set config.rl.judge_gate_refuse=False to run anyway."
            )
        logging.warning("!" * 80)
        logging.warning(
            "JUDGE GATE FAILED: %s. Rewards will carry little signal about caption quality.",
            message,
        )
        logging.warning("!" * 80)
    else:
        logging.info("judge gate passed: %s", message)
    return {f"gate/judge_{k}": v for k, v in gate.items()}


def toy_truth(scene, rollout, g):
    """Returns the exact toy-world truth of group g: per-caption F1 and hallucinations, per-item
    rubric truth (None: not in the world's language), per-caption, per-item Judge correctness, and
    per caption the reward the exact Judge would give on the same rubric ("exact_rewards"; an item
    outside the world's language keeps the Judge's decision)."""
    metrics = [tw.caption_metrics(scene, caption) for caption in rollout.captions[g]]
    facts = [toyroles.parse_criterion(item.criterion) for item in rollout.rubrics[g]]
    weights = [item.weight for item in rollout.rubrics[g]]
    item_true = [None if f is None else toyroles.fact_is_true(scene, f) for f in facts]
    decision_right, by_kind = [], {}  # by_kind: the Judge's confusion counts per item kind
    exact_rewards = []
    recoloured = [0, 0]  # unmet presence items whose shape the caption names: [passed, total]
    for caption, values in zip(rollout.captions[g], rollout.decisions[g]):
        mentions, background = tw.parse_caption(caption)
        exact = [
            int(v) if f is None else toyroles.judge_fact(f, mentions, background).value
            for f, v in zip(facts, values)
        ]
        row = [None if f is None else int(e == v) for f, e, v in zip(facts, exact, values)]
        for f, v, right in zip(facts, values, row):
            toyroles.count_decision(by_kind, f, int(v), bool(right))
            toyroles.count_recoloured(recoloured, f, mentions, int(v))
        decision_right.append(row)
        exact_rewards.append(float(roles.rubric_reward(weights, exact)) if facts else 0.0)
    checked_out = getattr(rollout, "checked_out", None)
    out_facts = (
        [toyroles.parse_criterion(i.criterion) for i in checked_out[g]] if checked_out else []
    )
    return {
        # rl.rubric_check: the truth of the items the references checked out (None: unreadable)
        **(
            {
                "checked_out_true": [
                    None if f is None else toyroles.fact_is_true(scene, f) for f in out_facts
                ]
            }
            if checked_out is not None
            else {}
        ),
        "f1": [m["f1"] for m in metrics],
        "hallucinated": [len(m["hallucinated"]) for m in metrics],
        "words": [len(caption.split()) for caption in rollout.captions[g]],
        "breakdown": tw.caption_breakdown(metrics),
        "item_true": item_true,
        "decision_right": decision_right,
        "judge_by_kind": by_kind,
        "judge_recoloured": recoloured,
        "exact_rewards": exact_rewards,
    }


def zero_variance_causes(rewards, exact_rewards):
    """Returns (rubric-limited, Judge-caused): the shares of the groups whose rewards are all
    equal (GRPO learns nothing from them) and whose exact-Judge rewards on the same rubric are
    also all equal (the rubric has no item that tells the captions apart: e.g. every caption
    meets every item), or are not (the Judge's errors erased a difference the rubric makes).
    rewards, exact_rewards: [G, N]. The two shares add up to the zero-variance fraction."""
    rewards = np.asarray(rewards, np.float64)
    exact = np.asarray(exact_rewards, np.float64)
    if rewards.shape != exact.shape or rewards.ndim != 2 or not rewards.size:
        raise ValueError(f"need two equal [G, N] shapes, got {rewards.shape}, {exact.shape}")
    flat = rewards.max(axis=1) == rewards.min(axis=1)
    exact_flat = np.isclose(exact.max(axis=1), exact.min(axis=1), rtol=0.0, atol=1e-6)
    return float(np.mean(flat & exact_flat)), float(np.mean(flat & ~exact_flat))


def truth_metrics(truths, rewards):
    """Returns the step's toy-world truth scalars from toy_truth dicts of its groups; rewards [G, N].
    Only "f1" and "hallucinated" are needed ("words" and "breakdown" are logged when every group
    has them): a reward without rubrics (G2P) gives no "item_true"
    or "decision_right"."""
    f1 = [v for t in truths for v in t["f1"]]
    items = [v for t in truths for v in t.get("item_true", [])]
    decisions = [
        v for t in truths for row in t.get("decision_right", []) for v in row if v is not None
    ]
    out = {
        "true/caption_f1": float(np.mean(f1)),
        "true/hallucinated_per_caption": float(
            np.mean([v for t in truths for v in t["hallucinated"]])
        ),
    }
    if all("words" in t for t in truths):
        out["true/caption_words"] = float(np.mean([v for t in truths for v in t["words"]]))
    if all("breakdown" in t for t in truths):  # means over groups of each group's shares
        for key in truths[0]["breakdown"]:
            out[f"true/{key}"] = float(np.mean([t["breakdown"][key] for t in truths]))
    if items:
        out["true/rubric_item_truth"] = float(np.mean([bool(v) for v in items]))
        out["true/rubric_item_unreadable"] = float(np.mean([v is None for v in items]))
    if decisions:
        out["true/judge_accuracy"] = float(np.mean(decisions))
    checked_out = [v for t in truths for v in t.get("checked_out_true", []) if v is not None]
    if checked_out:  # rl.rubric_check: how many of the dropped items were true of the scene
        out["true/checked_out_item_truth"] = float(np.mean([bool(v) for v in checked_out]))
    if truths and all("exact_rewards" in t for t in truths):
        rubric_limited, judge_caused = zero_variance_causes(
            rewards, [t["exact_rewards"] for t in truths]
        )
        out["true/zero_variance_rubric_frac"] = rubric_limited
        out["true/zero_variance_judge_frac"] = judge_caused
    out.update(_judge_kind_metrics(truths))
    passed, total = (sum(t.get("judge_recoloured", (0, 0))[i] for t in truths) for i in (0, 1))
    if total:  # a Judge of the shape word alone: 1.0; the exact Judge: 0.0
        out["true/judge_pass_rate_recoloured"] = passed / total
    # Does the rubric reward rank captions as the truth does? Pearson r over this step's captions,
    # and (what GRPO uses: ranks within a group) the mean r within groups where both vary.
    if np.std(f1) > 0 and np.std(rewards) > 0:
        out["true/reward_f1_corr"] = float(np.corrcoef(np.ravel(rewards), f1)[0, 1])
    within = within_group_corr(rewards, [t["f1"] for t in truths])
    if within is not None:
        out["true/reward_f1_corr_within"] = within
    return out


def _judge_kind_metrics(truths):
    """Returns the Judge's balanced accuracy on this step's samples, per item kind and averaged
    over kinds ("true/judge_balanced_accuracy_<kind>", "..._within_kind", "..._worst_kind"), for
    the kinds with both met and unmet items among them (none: nothing).

    Its accuracy alone hides the kind RL exploits: measured (docs/results.md, session 15) a Judge
    right on 90% of RL's decisions said "1" to 96% of the unmet count items ("mentions at most
    one square" on a caption naming two), which an always-"1" Judge also does."""
    by_kind = {}
    for t in truths:
        toyroles.add_confusion(by_kind, t.get("judge_by_kind", {}))
    scores = toyworld_eval.kind_balanced_accuracies(by_kind)
    if not scores:
        return {}
    out = {f"true/judge_balanced_accuracy_{kind}": float(v) for kind, v in scores.items()}
    out["true/judge_balanced_accuracy_within_kind"] = float(np.mean(list(scores.values())))
    out["true/judge_balanced_accuracy_worst_kind"] = float(min(scores.values()))
    return out


class GamingWatch:
    """Warns once when the reward stops ranking captions as the truth does (toy world).

    Keeps the last `window` values of "true/reward_f1_corr_within" (updates without one, where
    every group's reward or F1 was constant, are not counted); once the window is full, logs
    their mean as "true/reward_f1_corr_within_window" and warns the first time it is below 0.
    Measured (docs/results.md, session 15): a learned Judge passed presence items on captions
    that name no object, the reward rose 0.69 -> 0.83 while F1 fell to the image-blind level,
    and this mean was negative from update 294 of 600 on (healthy runs: never below 0.3).
    window 0: off. The window restarts when a run resumes.
    """

    def __init__(self, window):
        self.window = window
        self.values = collections.deque(maxlen=max(window, 1))
        self.warned_at = None

    def update(self, step, metrics):
        """Returns {"true/reward_f1_corr_within_window": mean} once the window is full, else {}."""
        value = metrics.get("true/reward_f1_corr_within")
        if not self.window or value is None:
            return {}
        self.values.append(value)
        if len(self.values) < self.window:
            return {}
        mean = float(np.mean(self.values))
        if mean < 0 and self.warned_at is None:
            self.warned_at = step
            logging.warning("!" * 80)
            logging.warning(
                "REWARD GAMED at step %d: the mean within-group r(reward, true F1) over the last "
                "%d updates is %.3f < 0, so raising the reward lowers caption quality (e.g. a "
                "Judge that passes what it should fail). Look at rl_samples.jsonl and the "
                "true/judge_balanced_accuracy_* metrics; config.rl.gaming_stop=True stops RL "
                "here, config.rl.gaming_window=0 silences this.",
                step,
                self.window,
                mean,
            )
            logging.warning("!" * 80)
        return {"true/reward_f1_corr_within_window": mean}


def within_group_corr(rewards, f1):
    """Returns the mean over groups of Pearson r(reward, true F1) within the group, or None.

    rewards, f1 [G, N]. Groups where either side is constant carry no ranking and are left out.
    """
    rs = [
        np.corrcoef(r, f)[0, 1]
        for r, f in zip(np.asarray(rewards, np.float64), np.asarray(f1, np.float64))
        if np.std(r) > 0 and np.std(f) > 0
    ]
    return float(np.mean(rs)) if rs else None
