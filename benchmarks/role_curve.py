"""The Policy or the Generator on the validation range, for runs' kept checkpoints.

  python benchmarks/role_curve.py runs/lk2 runs/one_s2 --stage rl --steps 600      # from the repository root
  python benchmarks/role_curve.py runs/gen_s2 --role generator --stage sft
  python benchmarks/role_curve.py runs/gen_s2 --role generator --stage sft --shown other-image

For each run and each kept checkpoint of the stage (or the --steps given), the model of those
weights is asked in one role on the validation range -- the scenes after the eval stage's held-out
scenes (data.num_train_scenes + eval.num_scenes ..., `rl_evals.validation_range`), the range RL's
`rl.eval_every` readout and benchmarks/judge_curve.py read -- greedily, and scored against the
world's exact truth:

- `--role policy` (default): its captions (`rl_evals.validation`): F1, object precision and
  recall, invented objects and words per caption, next to the image-blind caption's F1
  (`--samples k` adds k captions per scene drawn at T 1, "val/policy_sampled/*");
- `--role generator`: one rubric per scene from the prompts its SFT records have (the scene, the
  references, four weak candidates), read as the eval stage reads them
  (`toyworld_eval.generator_rubric_metrics`): the share of items true of the scene next to a
  rubric written for another scene, readable items per rubric, the share of written items that
  repeat an earlier one (dropped, as RL drops them), unreadable items, rubrics equal to their
  target, and the presence items ("mentions a <colour> <shape>"): the share true, the share of
  the false ones that put a colour of the scene on another of its shapes, how many are written
  against how many the targets hold; `--shown other-image` / `other-references` show each prompt
  the next scene's image / references (is an item kind read from the image or copied from the
  text?), written to <role>_curve_<stage>_<shown>.json; `--check-references model|exact` also
  reads each rubric after `rl.rubric_check="references"`'s check (rollout.check_rubrics: the same
  checkpoint as the Judge, in its trained per-item form, or the world's exact Judge, reads the
  prompt's references against the rubric and an item they fail is dropped): "checked" columns,
  beside the same check's trivial baseline (a rubric written for another scene, checked against
  this scene's references: the check alone keeps some of its items true by chance) and the
  useful items per rubric (true of the scene and failed by at least one shown candidate, exactly
  judged: what can tell RL's captions apart) of the written, checked, other-scene and exact rubrics,
  written to <role>_curve_<stage>_checked-<judge>.json; `--rubric-samples K --rubric-temperature
  T [--rubric-votes v]` reads the union of K rubrics drawn at T per prompt (of the items v of
  them name; RL's rl.rubric_samples / rubric_votes), written to
  <role>_curve_<stage>[...]_draws<K>-t<T>[-v<v>].json.

Choices between runs (a KL weight, a warm-up schedule, a number of steps) are made on these rows,
not on the eval stage's scenes that docs/results.md reports. Each run's config.json gives the
model, tokenizer, data seed and rubric options. Prints one markdown row per (run, step) and
writes each run's rows to <workdir>/<role>_curve_<stage>.json.
"""

import argparse
import json
import os
import sys
import time

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from mocojax import checkpoint, config_utils, roles  # noqa: E402
from mocojax.data import records as records_lib, toyroles, toyworld as tw  # noqa: E402
from mocojax.eval import toyworld_eval  # noqa: E402
from mocojax.train import rl_evals, rollout as rollout_lib  # noqa: E402

COLUMNS = {
    "policy": (
        ("val/policy/f1", "F1"),
        ("val/policy/precision", "precision"),
        ("val/policy/recall", "recall"),
        ("val/policy/hallucinated_per_caption", "invented / caption"),
        ("val/policy/caption_words", "words"),
        ("val/policy/f1_image_blind", "image-blind F1"),
    ),
    "generator": (
        ("val/generator/rubric_truth_rate", "truth"),
        ("val/generator/rubric_truth_other_scene", "another scene's rubric"),
        ("val/generator/items_per_rubric", "items / rubric"),
        ("val/generator/repeated_item_rate", "repeated items"),
        ("val/generator/unreadable_items", "unreadable items"),
        ("val/generator/exact_target_rate", "rubric = target"),
        ("val/generator/truth_present", "presence items true"),
        ("val/generator/present_false_swapped", "false ones swapped"),
        ("val/generator/items_present", "presence items written"),
        ("val/generator/target_items_present", "in the targets"),
    ),
}
# --check-references: the rubrics after the references' check, and what it dropped
CHECKED_COLUMNS = (
    ("val/checked/generator/rubric_truth_rate", "truth after the check"),
    ("val/checked/generator/items_per_rubric", "items / rubric after"),
    ("val/checked/generator/truth_present", "presence items true after"),
    ("val/checked/dropped_per_rubric", "dropped / rubric"),
    ("val/checked/dropped_true", "dropped items true"),
    ("val/checked/other_scene_truth", "another scene's rubric after the check"),
    ("val/checked/other_scene_items", "its items / rubric after"),
    ("val/checked/useful_written", "useful items, written"),
    ("val/checked/useful", "useful items after the check"),
    ("val/checked/useful_other_scene", "useful, another scene's after"),
    ("val/checked/useful_target", "useful, the exact rubric"),
)
CHECK_CHUNK = 16  # scenes whose rubrics are checked in one sampler call


# --shown: what each Generator prompt shows besides its candidates; truth is always its own scene's
SHOWN = ("own", "other-image", "other-references")


def shown_examples(examples, shown):
    """Returns the Generator examples as `shown` asks: "own" unchanged; "other-image" /
    "other-references": example k shows example k+1's (cyclically) image / reference captions,
    everything else (its scene_id, candidates, target) its own."""
    key = {"other-image": "scene", "other-references": "references"}.get(shown)
    if key is None:
        return examples
    return [{**e, key: n[key]} for e, n in zip(examples, examples[1:] + examples[:1])]


def checked_metrics(config, setup, params, scenes, examples, texts, judge):
    """Returns "val/checked/*": the Generator's rubrics (texts) after rollout.check_rubrics with
    each example's references, the Judge being params ("model") or the world's exact one."""
    rl = config.rl.copy_and_resolve_references()
    rl.judge = "exact" if judge == "exact" else "ema"
    exact = toyroles.ExactRoles(scenes, **toyroles.rubric_options(config.data))
    per_item = records_lib.judge_item_form(config.data)

    def check(rubrics):
        kept, dropped = [], []
        for start in range(0, len(rubrics), CHECK_CHUNK):
            k, d = rollout_lib.check_rubrics(
                setup.model_config,
                params,
                setup.processor,
                rubrics[start : start + CHECK_CHUNK],
                [e["references"] for e in examples[start : start + CHECK_CHUNK]],
                rl,
                jax.random.PRNGKey(start),
                per_item=per_item,
                exact=exact,
            )
            kept += k
            dropped += d
        return kept, dropped

    kept, dropped = check([roles.parse_rubric(t)[0] for t in texts])
    metrics = toyworld_eval.generator_rubric_metrics(
        scenes, examples, [roles.format_rubric(r) for r in kept]
    )
    # the trivial baseline under the same check: the next example's target rubric (written for
    # another scene), checked against this example's references and read on this scene
    targets = [roles.parse_rubric(e["target"])[0] for e in examples]
    other, _ = check(targets[1:] + targets[:1])
    other_truth = [
        toyroles.rubric_truth_rate(scenes[e["scene_id"]], items)[0]
        for e, items in zip(examples, other)
        if items
    ]
    truth = [
        toyroles.fact_is_true(scenes[e["scene_id"]], f)
        for e, items in zip(examples, dropped)
        for f in (toyroles.parse_criterion(i.criterion) for i in items)
        if f is not None
    ]

    def useful(rubrics):
        """Mean items per rubric that are true of the scene and that at least one of the prompt's
        candidates fails (exactly judged): the items that can tell captions apart in RL."""
        counts = []
        for e, items in zip(examples, rubrics):
            scene, n = scenes[e["scene_id"]], 0
            for item in items:
                fact = toyroles.parse_criterion(item.criterion)
                if fact is not None and toyroles.fact_is_true(scene, fact):
                    n += any(exact.decisions([item], c) == [0] for c in e["candidates"])
            counts.append(n)
        return float(np.mean(counts))

    return {
        **{f"val/checked/{k}": v for k, v in metrics.items()},
        "val/checked/useful_written": useful([roles.parse_rubric(t)[0] for t in texts]),
        "val/checked/useful": useful(kept),
        "val/checked/useful_other_scene": useful(other),
        "val/checked/useful_target": useful(targets),
        "val/checked/dropped_per_rubric": float(np.mean([len(d) for d in dropped])),
        "val/checked/other_scene_truth": float(np.mean(other_truth)) if other_truth else None,
        "val/checked/other_scene_items": float(np.mean([len(r) for r in other])),
        "val/checked/dropped_true": float(np.mean(truth)) if truth else None,
    }


def generator_scorer(config, setup, shown="own", check="", draws=(1, 0.0, 1)):
    """Returns params -> "val/generator/*" of the Generator's rubrics on the validation range.

    draws (K, T, v): with K > 1 each prompt's rubric is the union of K rubrics sampled at T, of
    the items at least v of them name (`roles.merge_rubrics`, as RL's rl.rubric_samples /
    rubric_votes); (1, T > 0, 1) one sampled rubric.

    shown "other-image" / "other-references": each prompt shows the next scene's image /
    reference captions instead of its own (the rest its own), and its items are still read
    against its own scene: a Generator that writes an item kind from the image loses that kind's
    truth with another image, one that copies it from the references with other references."""
    start, num_scenes = rl_evals.validation_range(config)
    seed = config.data.seed
    scenes = {s.id: s for s in tw.make_scenes(seed, num_scenes, start)}
    options = toyroles.rubric_options(config.data)
    options["generator_reference_order"] = config.data.get("generator_reference_order", False)
    examples = [
        r
        for s in scenes.values()
        for r in toyroles.scene_sft_records(s, seed, (0, 1, 0), **options)
    ]
    examples = shown_examples(examples, shown)

    def score(params):
        rubrics = toyworld_eval.generate_texts(
            setup.model_config,
            params,
            setup.processor,
            examples,
            config.eval.batch_size,
            config.eval.max_new_tokens,
            config.data.image_size,
            num_samples=draws[0],
            temperature=draws[1],
        )
        if draws[0] > 1:
            parsed = [roles.parse_rubric(t)[0] for t in rubrics]
            merged = roles.merge_draws(parsed, draws[0], min_votes=draws[2])
            rubrics = [roles.format_rubric(r) for r in merged]
        metrics = toyworld_eval.generator_rubric_metrics(scenes, examples, rubrics)
        if check:
            metrics.update(checked_metrics(config, setup, params, scenes, examples, rubrics, check))
        return {
            **{f"val/{k}" if not k.startswith("val/") else k: v for k, v in metrics.items()},
            "val/num_scenes": num_scenes,
            "example": {"written": rubrics[0], "target": examples[0]["target"]},
        }

    return score


def curve(
    workdir,
    stage,
    steps,
    num_scenes,
    role="policy",
    samples=0,
    shown="own",
    check="",
    draws=(1, 0.0, 1),
):
    """Returns [{"run", "step", "seconds", "val/...": ...}] for each step's checkpoint of workdir
    (every kept one when steps is empty), the role's metrics (module docstring; `shown`, `draws`:
    `generator_scorer`'s)."""
    with open(os.path.join(workdir, "config.json")) as f:  # written by mocojax.main
        config = ml_collections.ConfigDict(json.load(f))
    config.rl.val_scenes = num_scenes
    config.eval.policy_samples, config.eval.policy_temperature = samples, 1.0
    setup = config_utils.build_setup(config, workdir)
    if role == "generator":
        score = generator_scorer(config, setup, shown, check, draws)
    else:
        score = lambda params: rl_evals.validation(  # noqa: E731
            config, setup.processor, params, setup.model_config
        )
    rows = []
    for step in steps or checkpoint.kept_steps(workdir, stage):
        params, step = checkpoint.restore_params(workdir, stage, setup.model_config, step=step)
        began = time.time()
        scores = score(params)
        rows.append(
            {"run": workdir, "step": step, "seconds": round(time.time() - began, 1), **scores}
        )
    return rows


def markdown(rows, role="policy", header=True, check=""):
    """Returns the rows as markdown table lines (the header first when header)."""
    columns = COLUMNS[role] + (CHECKED_COLUMNS if check else ())
    lines = []
    if header:
        lines.append("| run | step | " + " | ".join(name for _, name in columns) + " | scenes |")
        lines.append("|---" * (len(columns) + 3) + "|")
    for row in rows:
        values = [row.get(key) for key, _ in columns]  # a kind never written has no reading
        cells = [
            "--" if v is None else str(v) if isinstance(v, int) else f"{v:.3f}" for v in values
        ]
        lines.append(
            f"| {os.path.basename(os.path.normpath(row['run']))} | {row['step']} | "
            + " | ".join(cells)
            + f" | {row['val/num_scenes']} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdirs", nargs="+")
    parser.add_argument("--role", default="policy", choices=sorted(COLUMNS))
    parser.add_argument("--stage", default="rl", help="checkpoints/<stage> (warmup, sft, rl)")
    parser.add_argument(
        "--steps", default="", help="comma-separated steps (default: every kept one)"
    )
    parser.add_argument("--scenes", type=int, default=100, help="validation scenes")
    parser.add_argument(
        "--samples",
        type=int,
        default=0,
        help="policy: also this many sampled captions per scene (T 1)",
    )
    parser.add_argument(
        "--shown",
        default="own",
        choices=SHOWN,
        help="generator: show each prompt the next scene's image or references (probe)",
    )
    parser.add_argument(
        "--check-references",
        default="",
        choices=("", "model", "exact"),
        help="generator: also read the rubrics after rl.rubric_check='references' (the "
        "checkpoint's Judge or the exact one)",
    )
    parser.add_argument(
        "--rubric-samples",
        type=int,
        default=1,
        help="generator: each rubric the union of this many drawn at --rubric-temperature "
        "(rl.rubric_samples)",
    )
    parser.add_argument(
        "--rubric-temperature", type=float, default=0.0, help="generator: its sampling temperature"
    )
    parser.add_argument(
        "--rubric-votes",
        type=int,
        default=1,
        help="generator: keep the items at least this many draws name (rl.rubric_votes)",
    )
    args = parser.parse_args(argv)
    draws = (args.rubric_samples, args.rubric_temperature, args.rubric_votes)
    if draws != (1, 0.0, 1) and args.role != "generator":
        parser.error(
            "--rubric-samples / -temperature / -votes probe the Generator: add --role generator"
        )
    if (
        args.rubric_temperature < 0
        or not 1 <= args.rubric_votes <= args.rubric_samples
        or (args.rubric_samples > 1 and not args.rubric_temperature)
    ):
        parser.error(
            "--rubric-samples must be >= --rubric-votes >= 1 and --rubric-temperature >= 0, > 0 "
            f"with several samples (greedy draws are all the same), got {draws}"
        )
    if args.check_references and args.role != "generator":
        parser.error("--check-references checks the Generator's rubrics: add --role generator")
    if args.shown != "own" and args.role != "generator":
        parser.error(f"--shown {args.shown} probes the Generator: add --role generator")
    if args.scenes < 2 or args.samples < 0:
        parser.error(
            f"--scenes must be >= 2 (the other-scene baselines) and --samples >= 0, "
            f"got {args.scenes}, {args.samples}"
        )
    steps = [int(s) for s in args.steps.split(",")] if args.steps else []
    header = True
    for workdir in args.workdirs:
        rows = curve(
            workdir,
            args.stage,
            steps,
            args.scenes,
            args.role,
            args.samples,
            args.shown,
            args.check_references,
            draws,
        )
        print(markdown(rows, args.role, header=header, check=args.check_references), flush=True)
        header = False
        probe = "" if args.shown == "own" else f"_{args.shown}"
        if args.check_references:
            probe += f"_checked-{args.check_references}"
        if draws != (1, 0.0, 1):
            probe += f"_draws{draws[0]}-t{draws[1]:g}" + (f"-v{draws[2]}" if draws[2] > 1 else "")
        out = os.path.join(workdir, f"{args.role}_curve_{args.stage}{probe}.json")
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
