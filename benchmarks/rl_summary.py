"""Summarises finished toy-world runs: held-out SFT -> RL numbers and RL's first/last updates.

  python benchmarks/rl_summary.py runs/judge_s1 [runs/judge_s2 ...]   # from the repository root

Per workdir, one markdown row of the held-out evals (eval_sft_*.json, eval_rl_*.json: F1 with
its image-blind baseline, the sampled captions' F1 where the eval drew them, hallucinations, words, the Judge within kinds and on recoloured
presence items, the gain), then the means over RL's first and last 20 updates of the logged
truth metrics (metrics.jsonl: sample F1, hallucinations, words, within-group r, zero-variance
groups, the Judge's accuracy and its pass rate on recoloured presence items), the last 100
updates' zero-variance groups split into rubric-limited and Judge-caused (rl_samples.jsonl's
logged groups; with `--rubric KEY=VALUE` also the share the exact roles would leave without
variance under other rubric options, e.g. `--rubric attribute_items=True`), then, where RL
logged the validation readout (`rl.eval_every > 0`: `val/*`, the scenes after the eval
stage's), its F1, hallucinations and words at each logged update with the gain over update 0
(the role-SFT Policy), and the learned Judge's errors on RL's own samples per item kind with
the within-group r between its reward error and caption length. This is how the tables of
docs/results.md are read off a run; it reads files only.
"""

import argparse
import ast
import glob
import json
import os
import sys

import numpy as np

EVAL_KEYS = (
    ("policy/f1", "F1"),
    ("policy/f1_image_blind", "blind F1"),
    ("policy_sampled/f1", "sampled F1"),  # eval.policy_samples > 0 only
    ("policy/hallucinated_per_caption", "halluc."),
    ("policy/caption_words", "words"),
    ("judge/balanced_accuracy_within_kind", "Judge within kinds"),
    ("judge/recoloured_pass_rate", "Judge passes recoloured"),
    ("judge/accuracy_always_1", "always-1 acc."),
)
RL_KEYS = (
    ("true/caption_f1", "sample F1"),
    ("true/hallucinated_per_caption", "halluc."),
    ("true/caption_words", "words"),
    ("true/reward_f1_corr_within", "within-group r"),
    ("zero_variance_frac", "zero-var. groups"),
    ("true/zero_variance_rubric_frac", "of which rubric-limited"),
    ("true/judge_accuracy", "Judge right"),
    ("true/judge_pass_rate_recoloured", "Judge passes recoloured"),
)


def latest_eval(workdir, stage):
    """Returns the eval JSON of the stage's latest scored step, or None."""
    files = glob.glob(os.path.join(workdir, f"eval_{stage}_*.json"))
    if not files:
        return None
    path = max(files, key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
    with open(path) as f:
        return json.load(f)


def rl_rows(workdir):
    """Returns the RL stage's rows of metrics.jsonl, update 0 (the gate and the starting Policy's
    readout) included: one per update, as metrics.MetricWriter drops a resumed run's replayed rows."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if r.get("stage") == "rl"]


VAL_KEYS = ("val/policy/f1", "val/policy/hallucinated_per_caption", "val/policy/caption_words")


def validation_curve(rows):
    """Returns [(update, f1, hallucinated per caption, words)] of the validation readouts among
    the RL rows (update 0: the Policy RL started from)."""
    return [
        (r.get("step", 0), *(r.get(key) for key in VAL_KEYS))
        for r in rows
        if r.get(VAL_KEYS[0]) is not None
    ]


def first_last(rows, key, n=20):
    """Returns (mean of the first n, mean of the last n) values of key, or None without any."""
    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        return None
    return float(np.mean(values[:n])), float(np.mean(values[-n:]))


def sample_rows(workdir):
    """Returns the rows of <workdir>/rl_samples.jsonl ([] without the file)."""
    path = os.path.join(workdir, "rl_samples.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def recoloured_from_samples(workdir, window=100):
    """Returns (pass rate over the first `window` updates, over the last) of the Judge on
    recoloured presence items, read from rl_samples.jsonl (runs older than the logged metric),
    or None without samples or items."""
    from mocojax import roles
    from mocojax.data import toyroles, toyworld as tw

    rows = sample_rows(workdir)
    if not rows:
        return None
    last_step = max(r["step"] for r in rows)
    tallies = {"first": [0, 0], "last": [0, 0]}
    for row in rows:
        which = (
            "first"
            if row["step"] <= window
            else "last"
            if row["step"] > last_step - window
            else None
        )
        if which is None or not row.get("decisions"):
            continue
        facts = [toyroles.parse_criterion(roles.RubricItem(**i).criterion) for i in row["rubric"]]
        for caption, decisions in zip(row["captions"], row["decisions"]):
            mentions, _ = tw.parse_caption(caption)
            for fact, said in zip(facts, decisions):
                if said is not None:
                    toyroles.count_recoloured(tallies[which], fact, mentions, int(said))
    if not tallies["first"][1] or not tallies["last"][1]:
        return None
    return tuple(p / t for p, t in (tallies["first"], tallies["last"]))


def judge_errors_from_samples(workdir, window=100):
    """Returns the learned Judge's errors on RL's own logged groups of the last `window` updates
    (rl_samples.jsonl, against the world's exact decisions: `truth.decision_right`), or None
    without them: ({item kind: (true items, share failed, false items, share passed)}, mean over
    groups of the within-group r between the reward error (the Judge's reward minus the exact
    Judge's, both the weighted share of items passed) and the caption's words, groups counted).

    A negative r means the Judge's errors cost long captions more than short ones within a group,
    which GRPO turns into shorter captions (docs/results.md, session 33).
    """
    from mocojax import roles
    from mocojax.data import toyroles

    rows = [r for r in sample_rows(workdir) if r.get("decisions")]
    rows = [r for r in rows if "decision_right" in r.get("truth", {})]
    if not rows:
        return None
    last_step = max(r["step"] for r in rows)
    tallies = {}  # kind -> [true & passed, true & failed, false & passed, false & failed]
    correlations = []
    for row in rows:
        if row["step"] <= last_step - window:
            continue
        weights = np.array([item["weight"] for item in row["rubric"]], float)
        facts = [
            toyroles.parse_criterion(roles.RubricItem(**item).criterion) for item in row["rubric"]
        ]
        kinds = [toyroles.report_kind(f) if f else "unreadable" for f in facts]
        kinds = ["absent shape" if k == "absent_shape" else k for k in kinds]
        logged = "exact_rewards" in row["truth"]
        # the Judge's reward minus the exact Judge's, per caption (rebuilt where not logged)
        errors = (
            np.array(row["rewards"]) - np.array(row["truth"]["exact_rewards"]) if logged else []
        )
        for said, right in zip(row["decisions"], row["truth"]["decision_right"]):
            said = np.array([np.nan if d is None else d for d in said], float)
            exact = np.where(np.array(right) == 1, said, 1 - said)
            for kind, s, e in zip(kinds, said, exact):
                if not np.isnan(s):
                    tally = tallies.setdefault(kind, [0, 0, 0, 0])
                    tally[(0 if e else 2) + (0 if s else 1)] += 1
            if not logged:
                known = ~np.isnan(said)
                total = weights[known].sum()
                errors.append(
                    (weights[known] @ (said[known] - exact[known])) / total if total else 0.0
                )
        if "words" not in row["truth"]:  # a run older than the logged words: no r
            continue
        errors, words = np.array(errors, float), np.array(row["truth"]["words"], float)
        if errors.std() > 0 and words.std() > 0:
            correlations.append(np.corrcoef(errors, words)[0, 1])
    table = {
        kind: (
            tp + fn,
            fn / (tp + fn) if tp + fn else None,
            fp + tn,
            fp / (fp + tn) if fp + tn else None,
        )
        for kind, (tp, fn, fp, tn) in sorted(tallies.items())
    }
    return table, (float(np.mean(correlations)) if correlations else None), len(correlations)


def zero_variance_from_samples(workdir, window=100):
    """Returns (groups, zero-variance share, rubric-limited share, Judge-caused share) over the
    groups rl_samples.jsonl logged in the last `window` updates (rl_evals.zero_variance_causes),
    or None without logged groups that carry the Judge's decisions and their truth. A run older
    than the logged split has no "exact_rewards": the exact Judge's decision is rebuilt from the
    Judge's and whether it was right (an item outside the world's language keeps the Judge's)."""
    from mocojax import roles
    from mocojax.train import rl_evals

    rows = [
        r
        for r in sample_rows(workdir)
        if r.get("decisions") and r.get("truth", {}).get("decision_right")
    ]
    if not rows:
        return None
    last_step = max(r["step"] for r in rows)
    rewards, exact = [], []
    for row in rows:
        if row["step"] <= last_step - window:
            continue
        rewards.append(row["rewards"])
        if "exact_rewards" in row["truth"]:
            exact.append(row["truth"]["exact_rewards"])
            continue
        weights = [item["weight"] for item in row["rubric"]]
        exact.append(
            [
                float(
                    roles.rubric_reward(
                        weights,
                        [v if ok is None else (v if ok else 1 - v) for v, ok in zip(said, right)],
                    )
                )
                for said, right in zip(row["decisions"], row["truth"]["decision_right"])
            ]
        )
    rubric_limited, judge_caused = rl_evals.zero_variance_causes(rewards, exact)
    return len(rewards), rubric_limited + judge_caused, rubric_limited, judge_caused


def exact_zero_variance(workdir, rubric_overrides, window=100):
    """Returns (groups, zero-variance share, zero-variance share with the overrides) of the
    groups rl_samples.jsonl logged in the last `window` updates, re-scored by the world's exact
    Generator (from each group's shown captions) and exact Judge: first with the run's own rubric
    options (config.json's data block), then with `rubric_overrides` (e.g. {"attribute_items":
    True}: would size and place items tell the captions apart?). None without logged groups."""
    import ml_collections

    from mocojax import roles
    from mocojax.data import toyroles

    rows = [r for r in sample_rows(workdir) if r.get("subset") is not None]
    if not rows:
        return None
    with open(os.path.join(workdir, "config.json")) as f:
        config = json.load(f)
    data = ml_collections.ConfigDict(config["data"])
    records = toyroles.image_records(
        data.seed, config["rl"].get("num_scenes") or data.num_train_scenes
    )
    scenes = {r["id"]: r["scene"] for r in records}
    last_step = max(r["step"] for r in rows)
    rows = [r for r in rows if r["step"] > last_step - window]
    shares = []
    for overrides in ({}, rubric_overrides):
        exact = toyroles.ExactRoles(
            scenes,
            invention_weight=config["rl"].get("invention_weight", 0.0),  # the run's own weights
            **{**toyroles.rubric_options(data), **overrides},
        )
        flat = []
        for row in rows:
            rubric = exact.rubric(row["image_id"], [row["captions"][i] for i in row["subset"]])
            weights = [item.weight for item in rubric]
            rewards = [
                float(roles.rubric_reward(weights, exact.decisions(rubric, c)))
                for c in row["captions"]
            ]
            flat.append(np.isclose(max(rewards), min(rewards), rtol=0.0, atol=1e-6))
        shares.append(float(np.mean(flat)))
    return len(rows), shares[0], shares[1]


def _fmt(value):
    return "—" if value is None else f"{value:.3f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdirs", nargs="+")
    parser.add_argument(
        "--rubric",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also re-score the last 100 updates' logged groups with the exact roles, with the "
        "run's rubric options and with these overrides (data.<KEY>, e.g. attribute_items=True)",
    )
    args = parser.parse_args(argv)
    overrides = {}
    for pair in args.rubric:
        key, sep, value = pair.partition("=")
        if not sep:
            parser.error(f"--rubric {pair!r}: expected KEY=VALUE")
        from mocojax.data import toyroles

        if key not in toyroles.RUBRIC_DEFAULTS:
            parser.error(
                f"--rubric {key}: not a rubric option; known: {list(toyroles.RUBRIC_DEFAULTS)}"
            )
        try:
            overrides[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parser.error(f"--rubric {pair!r}: VALUE must be a Python literal (True, 3, 'x')")
    print("| run | stage | " + " | ".join(label for _, label in EVAL_KEYS) + " |")
    print("|---|---|" + "---|" * len(EVAL_KEYS))
    for workdir in args.workdirs:
        evals = {stage: latest_eval(workdir, stage) for stage in ("sft", "rl")}
        for stage, result in evals.items():
            if result is not None:
                cells = [_fmt(result.get(key)) for key, _ in EVAL_KEYS]
                print(f"| {workdir} | {stage} | " + " | ".join(cells) + " |")
        if evals["sft"] and evals["rl"]:
            gain = evals["rl"]["policy/f1"] - evals["sft"]["policy/f1"]
            words = evals["rl"]["policy/caption_words"] / evals["sft"]["policy/caption_words"] - 1
            line = f"F1 {gain:+.3f}, words {words:+.0%}"
            if "policy_sampled/f1" in evals["sft"] and "policy_sampled/f1" in evals["rl"]:
                sampled = evals["rl"]["policy_sampled/f1"] - evals["sft"]["policy_sampled/f1"]
                line += f", sampled F1 {sampled:+.3f}"
            print(f"| {workdir} | RL - SFT | {line} |")
    print()
    curves = {}  # workdir -> its validation curve
    print("| run | RL updates | " + " | ".join(label for _, label in RL_KEYS) + " |")
    print("|---|---|" + "---|" * len(RL_KEYS))
    for workdir in args.workdirs:
        if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
            print(f"{workdir}: no metrics.jsonl", file=sys.stderr)
            continue
        rows = rl_rows(workdir)
        curves[workdir] = validation_curve(rows)
        rows = [r for r in rows if r.get("step", 0) > 0]  # the updates
        cells = []
        for key, _ in RL_KEYS:
            pair = first_last(rows, key)
            cells.append("—" if pair is None else f"{pair[0]:.2f} -> {pair[1]:.2f}")
        print(f"| {workdir} | {len(rows)} | " + " | ".join(cells) + " |")
        samples = recoloured_from_samples(workdir)
        if samples is not None:
            print(
                f"| {workdir} | rl_samples.jsonl | Judge passes recoloured presence items, "
                f"first / last 100 updates: {samples[0]:.2f} -> {samples[1]:.2f} |"
            )
        split = zero_variance_from_samples(workdir)
        if split is not None:
            print(
                f"| {workdir} | rl_samples.jsonl | zero-variance groups, last 100 updates: "
                f"{split[1]:.0%} of {split[0]} logged groups = {split[2]:.0%} rubric-limited "
                f"(the exact Judge also scores them equal) + {split[3]:.0%} Judge-caused |"
            )
        if overrides:
            exact = exact_zero_variance(workdir, overrides)
            if exact is not None:
                changed = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
                print(
                    f"| {workdir} | rl_samples.jsonl | exact roles, {exact[0]} logged groups of "
                    f"the last 100 updates: zero-variance {exact[1]:.0%} with the run's rubric, "
                    f"{exact[2]:.0%} with {changed} |"
                )
    errors = {w: judge_errors_from_samples(w) for w in args.workdirs}
    if any(errors.values()):
        print()
        print(
            "| run | item kind (Judge errors on RL's samples, last 100 updates) | true items "
            "| failed | false items | passed | r(reward error, words) within groups |"
        )
        print("|---|---|---|---|---|---|---|")
        for workdir, found in errors.items():
            if found is None:
                continue
            table, r, groups = found
            for kind, (true, failed, false, passed) in table.items():
                print(
                    f"| {workdir} | {kind} | {true} | {_fmt(failed)} | {false} | {_fmt(passed)} | "
                    f"{_fmt(r)} over {groups} groups |"
                )
    if any(curves.values()):
        print()
        print("| run | update | val F1 | val F1 - update 0 | val halluc. | val words |")
        print("|---|---|---|---|---|---|")
        for workdir, curve in curves.items():
            for step, f1, halluc, words in curve:
                gain = f"{f1 - curve[0][1]:+.3f}" if curve[0][0] == 0 else "—"
                print(
                    f"| {workdir} | {step} | {f1:.3f} | {gain} | {_fmt(halluc)} | "
                    + ("—" if words is None else f"{words:.1f}")
                    + " |"
                )


if __name__ == "__main__":
    main()
