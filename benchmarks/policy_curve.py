"""The Policy on the validation range: greedy caption metrics of runs' kept checkpoints.

  python benchmarks/policy_curve.py runs/lk2 runs/lk2_kl10 --stage rl          # from the repository root
  python benchmarks/policy_curve.py runs/ship_s2 --stage sft --steps 800 --scenes 100

For each run and each kept checkpoint of the stage (or the --steps given), the Policy of those
weights captions the validation range -- the scenes after the eval stage's held-out scenes
(data.num_train_scenes + eval.num_scenes ..., `rl_evals.validation_range`), the range RL's
`rl.eval_every` readout and benchmarks/judge_curve.py read -- greedily, scored against the
world's exact truth: F1, object precision and recall, invented objects and words per caption,
next to the image-blind caption's F1. Choices between runs (a KL weight, a number of RL
updates) are made on these rows, not on the eval stage's scenes that docs/results.md reports.
Each run's config.json gives the model, tokenizer and data seed. Prints one markdown row per
(run, step) and writes each run's rows to <workdir>/policy_curve_<stage>.json.
"""

import argparse
import json
import os
import sys
import time

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mocojax import checkpoint, config_utils  # noqa: E402
from mocojax.train import rl_evals  # noqa: E402

COLUMNS = (
    ("val/policy/f1", "F1"),
    ("val/policy/precision", "precision"),
    ("val/policy/recall", "recall"),
    ("val/policy/hallucinated_per_caption", "invented / caption"),
    ("val/policy/caption_words", "words"),
    ("val/policy/f1_image_blind", "image-blind F1"),
)


def curve(workdir, stage, steps, num_scenes, samples=0):
    """Returns [{"run", "step", "seconds", "val/...": ...}] for each step's checkpoint of workdir
    (every kept one when steps is empty); samples > 0 adds "val/policy_sampled/*" (T 1)."""
    with open(os.path.join(workdir, "config.json")) as f:  # written by mocojax.main
        config = ml_collections.ConfigDict(json.load(f))
    config.rl.val_scenes = num_scenes
    config.eval.policy_samples, config.eval.policy_temperature = samples, 1.0
    setup = config_utils.build_setup(config, workdir)
    rows = []
    for step in steps or checkpoint.kept_steps(workdir, stage):
        params, step = checkpoint.restore_params(workdir, stage, setup.model_config, step=step)
        began = time.time()
        scores = rl_evals.validation(config, setup.processor, params, setup.model_config)
        rows.append(
            {"run": workdir, "step": step, "seconds": round(time.time() - began, 1), **scores}
        )
    return rows


def markdown(rows, header=True):
    """Returns the rows as markdown table lines (the header first when header)."""
    lines = []
    if header:
        lines.append("| run | step | " + " | ".join(name for _, name in COLUMNS) + " | scenes |")
        lines.append("|---" * (len(COLUMNS) + 3) + "|")
    for row in rows:
        cells = [f"{row[key]:.3f}" for key, _ in COLUMNS]
        lines.append(
            f"| {os.path.basename(os.path.normpath(row['run']))} | {row['step']} | "
            + " | ".join(cells)
            + f" | {row['val/num_scenes']} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdirs", nargs="+")
    parser.add_argument("--stage", default="rl", help="checkpoints/<stage> (sft, rl)")
    parser.add_argument(
        "--steps", default="", help="comma-separated steps (default: every kept one)"
    )
    parser.add_argument("--scenes", type=int, default=100, help="validation scenes")
    parser.add_argument(
        "--samples", type=int, default=0, help="also this many sampled captions per scene (T 1)"
    )
    args = parser.parse_args(argv)
    if args.scenes < 1 or args.samples < 0:
        parser.error(f"--scenes must be >= 1 and --samples >= 0, got {args.scenes}, {args.samples}")
    steps = [int(s) for s in args.steps.split(",")] if args.steps else []
    header = True
    for workdir in args.workdirs:
        rows = curve(workdir, args.stage, steps, args.scenes, args.samples)
        print(markdown(rows, header=header), flush=True)
        header = False
        out = os.path.join(workdir, f"policy_curve_{args.stage}.json")
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
