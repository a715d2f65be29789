"""The toy world's headline result: the default command on several data seeds, one table.

Runs `python -m mocojax.main --config configs/toyworld.py` once per seed (each in its own
workdir, so a rerun resumes or skips finished seeds), then prints the markdown table of
docs/results.md: SFT and RL held-out quality next to their trivial baselines, the RL-time
signal numbers, and the wall time of each run.

  python benchmarks/toyworld_results.py --seeds 0,1,2 --root runs/results
  python benchmarks/toyworld_results.py --seeds 0 --root runs/results --table-only
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = (
    "policy/f1",
    "policy/f1_image_blind",
    "policy/hallucinated_per_caption",
    "policy/caption_words",
    "policy/distinct_captions",
    "judge/balanced_accuracy",
    "judge/accuracy",
    "judge/accuracy_always_1",
    "generator/rubric_truth_rate",
    "generator/rubric_truth_other_scene",
    "num_scenes",
)


def _latest(workdir, stage):
    files = glob.glob(os.path.join(workdir, f"eval_{stage}_*.json"))
    if not files:
        return None
    with open(max(files, key=lambda p: int(p.rsplit("_", 1)[1][:-5]))) as f:
        return json.load(f)


def rl_signal(workdir):
    """Returns RL-time means from metrics.jsonl: zero-variance share, within-group r, skipped updates, gate."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    rl = [r for r in rows if r.get("stage") == "rl" and r["step"] > 0]
    gate = next((r for r in rows if r.get("stage") == "rl" and r["step"] == 0), {})
    within = [r["true/reward_f1_corr_within"] for r in rl if "true/reward_f1_corr_within" in r]
    return {
        "zero_variance_frac": float(np.mean([r["zero_variance_frac"] for r in rl]))
        if rl
        else float("nan"),
        "reward_f1_corr_within": float(np.mean(within)) if within else float("nan"),
        "true_judge_accuracy": float(
            np.mean([r["true/judge_accuracy"] for r in rl if "true/judge_accuracy" in r])
        )
        if rl
        else float("nan"),
        "skipped": int(rl[-1]["no_signal_skipped_total"]) if rl else -1,
        "updates": len(rl),
        "gate": gate.get("gate/judge_balanced_accuracy", float("nan")),
    }


def run_seed(seed, root, extra):
    """Runs the default command for one data seed (skipped when its RL eval exists); returns wall seconds."""
    workdir = os.path.join(root, f"seed{seed}")
    timing = os.path.join(workdir, "wall_seconds.json")
    if _latest(workdir, "rl") is not None and os.path.isfile(timing):
        with open(timing) as f:
            return json.load(f)["seconds"]
    command = [
        sys.executable,
        "-m",
        "mocojax.main",
        "--config",
        "configs/toyworld.py",
        "--workdir",
        workdir,
        f"--config.data.seed={seed}",
        *extra,
    ]
    print("+", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True)
    seconds = time.perf_counter() - start
    with open(timing, "w") as f:
        json.dump({"seconds": seconds, "command": command}, f)
    return seconds


def table(seeds, root):
    """Returns the markdown table of the seeds' results (one row per seed and stage)."""
    head = [
        "seed",
        "stage",
        "F1",
        "blind F1",
        "halluc./cap",
        "words",
        "distinct",
        "Judge bal. acc",
        "Judge acc",
        "always-1 acc",
        "rubric truth",
        "other-scene rubric",
        "scenes",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for seed in seeds:
        workdir = os.path.join(root, f"seed{seed}")
        for stage in ("sft", "rl"):
            result = _latest(workdir, stage)
            if result is None:
                continue
            cells = [str(seed), f"{stage} {result['step']}"] + [
                f"{result[k]:.3f}" if isinstance(result[k], float) else str(result[k])
                for k in COLUMNS
            ]
            lines.append("| " + " | ".join(cells) + " |")
        sft, rl = _latest(workdir, "sft"), _latest(workdir, "rl")
        if sft and rl:
            signal = rl_signal(workdir)
            timing = os.path.join(workdir, "wall_seconds.json")
            minutes = (
                json.load(open(timing))["seconds"] / 60 if os.path.isfile(timing) else float("nan")
            )
            notes.append(
                f"- seed {seed}: RL - SFT F1 **{rl['policy/f1'] - sft['policy/f1']:+.3f}**, "
                f"hallucinations {sft['policy/hallucinated_per_caption']:.3f} -> "
                f"{rl['policy/hallucinated_per_caption']:.3f}, words {sft['policy/caption_words']:.1f} -> "
                f"{rl['policy/caption_words']:.1f}; during RL ({signal['updates']} updates): zero-variance groups "
                f"{signal['zero_variance_frac']:.1%}, within-group r(reward, true F1) "
                f"{signal['reward_f1_corr_within']:.3f}, Judge accuracy on RL captions "
                f"{signal['true_judge_accuracy']:.3f}, skipped updates {signal['skipped']}, "
                f"gate (Judge balanced accuracy before RL) {signal['gate']:.3f}; wall {minutes:.1f} min"
            )
    return "\n".join(lines + [""] + notes)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated data seeds")
    parser.add_argument(
        "--root", default="runs/results", help="one workdir per seed under this folder"
    )
    parser.add_argument(
        "--table-only", action="store_true", help="print the table of finished runs only"
    )
    parser.add_argument("overrides", nargs="*", help="extra --config.KEY=VALUE flags for every run")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if not args.table_only:
        for seed in seeds:
            run_seed(seed, args.root, args.overrides)
    print(table(seeds, args.root))


if __name__ == "__main__":
    main()
