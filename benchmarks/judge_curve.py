"""The Judge's skill against training steps: the RL gate of every kept checkpoint of a run.

  python benchmarks/judge_curve.py runs/judgelong_s2 --stage warmup        # from the repository root
  python benchmarks/judge_curve.py runs/judge_s2 --stage sft --steps 700,800 --scenes 100

For each kept checkpoint of the stage (or the --steps given), the Judge of those weights is
scored as RL's gate scores it (`rl_evals.gate_scores`: per-item Judge records on RL-like
captions, greedy, against the world's exact truth), per item kind and on recoloured presence
items ("mentions a red square" on a caption naming a square in another colour: a Judge of the
shape word alone passes all of them, the exact Judge none). The scenes are a validation range
after the held-out eval's (`--offset`, default eval.num_scenes: scenes
data.num_train_scenes + offset ...), so reading the curve to choose a budget does not look at
the scenes the eval reports. The run's config.json gives the model, tokenizer and rubric.
Prints one markdown row per step and writes the rows to <workdir>/judge_curve_<stage>.json.
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
    ("balanced_accuracy_within_kind", "within kinds"),
    ("balanced_accuracy_worst_kind", "worst kind"),
    ("balanced_accuracy_present", "present"),
    ("balanced_accuracy_absent", "pair absent"),
    ("balanced_accuracy_absent_shape", "absent shape"),
    ("balanced_accuracy_at_most", "at most"),
    ("balanced_accuracy_at_least", "at least"),
    ("balanced_accuracy_background", "background"),
    ("recoloured_pass_rate", "passes recoloured"),
    ("accuracy", "accuracy"),
    ("accuracy_always_1", "always-1 acc."),
)


def curve(workdir, stage, steps, num_scenes, offset):
    """Returns [{"step", "seconds", <judge_gate's keys>}] for each step's checkpoint."""
    with open(os.path.join(workdir, "config.json")) as f:  # written by mocojax.main
        config = ml_collections.ConfigDict(json.load(f))
    setup = config_utils.build_setup(config, workdir)
    config.rl.val_scenes = num_scenes  # (a run's config.json may predate the key)
    start = (
        rl_evals.validation_range(config)[0]
        if offset is None
        else config.data.num_train_scenes + offset
    )
    rows = []
    for step in steps:
        params, step = checkpoint.restore_params(workdir, stage, setup.model_config, step=step)
        began = time.time()
        gate = rl_evals.gate_scores(
            config, setup.processor, params, setup.model_config, start, num_scenes
        )
        rows.append({"step": step, "seconds": round(time.time() - began, 1), **gate})
        print(markdown([rows[-1]], header=len(rows) == 1), flush=True)
    return rows


def markdown(rows, header=True):
    """Returns the rows as markdown table lines (the header first when header)."""
    lines = []
    if header:
        lines.append(
            "| step | "
            + " | ".join(name for _, name in COLUMNS)
            + " | items | pair-absent items (unmet) |"
        )
        lines.append("|---" * (len(COLUMNS) + 3) + "|")
    for row in rows:
        cells = [f"{row[key]:.3f}" if key in row else "--" for key, _ in COLUMNS]
        pair = (
            f"{row['items_absent']} ({row['unmet_items_absent']})"
            if "items_absent" in row
            else "--"
        )
        lines.append(
            f"| {row['step']} | " + " | ".join(cells) + f" | {row['num_items']} | {pair} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir")
    parser.add_argument("--stage", default="warmup", help="checkpoints/<stage> (warmup, sft, rl)")
    parser.add_argument(
        "--steps", default="", help="comma-separated steps (default: every kept one)"
    )
    parser.add_argument("--scenes", type=int, default=100, help="validation scenes (RL's gate: 50)")
    parser.add_argument(
        "--offset",
        type=int,
        default=None,
        help="first validation scene after the training scenes (default: eval.num_scenes, past the eval's)",
    )
    args = parser.parse_args(argv)
    steps = (
        [int(s) for s in args.steps.split(",")]
        if args.steps
        else checkpoint.kept_steps(args.workdir, args.stage)
    )
    rows = curve(args.workdir, args.stage, steps, args.scenes, args.offset)
    out = os.path.join(args.workdir, f"judge_curve_{args.stage}.json")
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
