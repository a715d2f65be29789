"""The learned Generator on the validation range: its rubrics' truth for runs' kept checkpoints.

  python benchmarks/generator_curve.py runs/genonly_s2 --stage sft          # from the repository root
  python benchmarks/generator_curve.py runs/gen_s2 --stage sft --steps 800 --scenes 100

For each run and each kept checkpoint of the stage (or the --steps given), the model in the
Generator role writes one rubric per validation scene (the scenes after the eval stage's held-out
scenes, `rl_evals.validation_range`), from the prompts its SFT records have (the scene, the
references, four weak candidates), greedily. Each rubric is read against the scene's exact truth:
`toyworld_eval.generator_rubric_metrics`, as the eval stage reads it: the share of items true of
the scene next to a rubric written for another scene, items per rubric, the share of items that
repeat an earlier one (true, but checking nothing new), unreadable items, rubrics equal to their
target. Each run's config.json gives the model, tokenizer, data seed and rubric options. Prints
one markdown row per (run, step) and writes each run's rows to <workdir>/generator_curve_<stage>.json.
"""

import argparse
import json
import os
import sys
import time

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mocojax import checkpoint, config_utils  # noqa: E402
from mocojax.data import toyroles, toyworld as tw  # noqa: E402
from mocojax.eval import toyworld_eval  # noqa: E402
from mocojax.train import rl_evals  # noqa: E402

COLUMNS = (  # toyworld_eval.generator_rubric_metrics' keys, without "generator/"
    ("rubric_truth_rate", "truth"),
    ("rubric_truth_other_scene", "another scene's rubric"),
    ("items_per_rubric", "items / rubric"),
    ("repeated_item_rate", "repeated items"),
    ("unreadable_items", "unreadable items"),
    ("exact_target_rate", "rubric = target"),
)


def curve(workdir, stage, steps, num_scenes):
    """Returns [{"run", "step", "seconds", <COLUMNS' keys>, "num_scenes", "example"}] for each
    step's checkpoint of workdir (every kept one when steps is empty)."""
    with open(os.path.join(workdir, "config.json")) as f:  # written by mocojax.main
        config = ml_collections.ConfigDict(json.load(f))
    config.rl.val_scenes = num_scenes
    setup = config_utils.build_setup(config, workdir)
    start, _ = rl_evals.validation_range(config)
    seed = config.data.seed
    scenes = {s.id: s for s in tw.make_scenes(seed, num_scenes, start)}
    options = toyroles.rubric_options(config.data)
    examples = [
        r
        for s in scenes.values()
        for r in toyroles.scene_sft_records(s, seed, (0, 1, 0), **options)
    ]
    rows = []
    for step in steps or checkpoint.kept_steps(workdir, stage):
        params, step = checkpoint.restore_params(workdir, stage, setup.model_config, step=step)
        began = time.time()
        rubrics = toyworld_eval.generate_texts(
            setup.model_config,
            params,
            setup.processor,
            examples,
            config.eval.batch_size,
            config.eval.max_new_tokens,
            config.data.image_size,
        )
        rows.append(
            {
                "run": workdir,
                "step": step,
                "seconds": round(time.time() - began, 1),
                **{
                    k.removeprefix("generator/"): v
                    for k, v in toyworld_eval.generator_rubric_metrics(
                        scenes, examples, rubrics
                    ).items()
                },
                "num_scenes": num_scenes,
                "example": {"written": rubrics[0], "target": examples[0]["target"]},
            }
        )
    return rows


def markdown(rows, header=True):
    """Returns the rows as markdown table lines (the header first when header)."""
    lines = []
    if header:
        lines.append("| run | step | " + " | ".join(name for _, name in COLUMNS) + " | scenes |")
        lines.append("|---" * (len(COLUMNS) + 3) + "|")
    for row in rows:
        cells = [
            str(row[key]) if isinstance(row[key], int) else f"{row[key]:.3f}" for key, _ in COLUMNS
        ]
        lines.append(
            f"| {os.path.basename(os.path.normpath(row['run']))} | {row['step']} | "
            + " | ".join(cells)
            + f" | {row['num_scenes']} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdirs", nargs="+")
    parser.add_argument("--stage", default="sft", help="checkpoints/<stage> (warmup, sft, rl)")
    parser.add_argument(
        "--steps", default="", help="comma-separated steps (default: every kept one)"
    )
    parser.add_argument("--scenes", type=int, default=100, help="validation scenes")
    args = parser.parse_args(argv)
    if args.scenes < 2:
        parser.error(f"--scenes must be >= 2 (the other-scene baseline), got {args.scenes}")
    steps = [int(s) for s in args.steps.split(",")] if args.steps else []
    header = True
    for workdir in args.workdirs:
        rows = curve(workdir, args.stage, steps, args.scenes)
        print(markdown(rows, header=header), flush=True)
        header = False
        out = os.path.join(workdir, f"generator_curve_{args.stage}.json")
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
