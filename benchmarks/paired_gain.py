"""Two checkpoints' Policies on the same toy scenes, scene by scene: the gain and its uncertainty.

  python benchmarks/paired_gain.py runs/toyworld_judge                     # sft (last) vs rl (last), eval scenes
  python benchmarks/paired_gain.py runs/one_s1 --a sft:800 --b rl:600 --range validation

A held-out gain such as "RL over SFT: +0.013 F1 on 200 scenes" is one draw of scenes. Both
checkpoints caption the same scenes greedily, so the gain is a mean of per-scene differences, and
its uncertainty over scenes is that of a paired mean: this prints the two means, the mean
difference with a paired bootstrap 95% interval (resampling scenes) and the normal one
(mean +- 1.96 standard errors), the share of bootstrap resamples whose gain reaches --target
(the issue's +0.05), and scenes won / lost / tied -- for F1, invented objects per caption and
words per caption (the RL target's three columns). It says how far a seed's gain is from the
target *given these scenes*; it says nothing of another seed's training, which only more seeds
measure.

--range eval reads the eval stage's held-out scenes (data.num_train_scenes ...,
eval.num_scenes of them: the scenes docs/results.md reports); --range validation reads the
scenes after them (`rl_evals.validation_range`), where choices are made. Writes
<workdir>/paired_<a>_<b>_<range>.json (stage:step with "_" for ":") and prints a markdown table.
"""

import argparse
import json
import os
import sys
import time

import ml_collections
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mocojax import checkpoint, config_utils  # noqa: E402
from mocojax.data import toyworld as tw  # noqa: E402
from mocojax.eval import toyworld_eval  # noqa: E402
from mocojax.train import rl_evals  # noqa: E402

# rl.val_scenes' default (mocojax/train/rl_config.py), for runs whose config.json predates it.
VALIDATION_SCENES = 100
# The per-scene values compared: F1, invented objects and words of each scene's caption.
COLUMNS = ("f1", "hallucinated", "words")


def paired_summary(a, b, target=0.05, num_resamples=10000, seed=0):
    """Returns the paired comparison of per-scene values a and b (same scenes, same order):
    "mean_a", "mean_b", "gain" (mean of b - a), "ci95" (paired bootstrap percentile interval of
    the gain, resampling scenes with replacement), "normal_ci95" (gain +- 1.96 standard errors,
    sample standard deviation), "share_reaching_target" (share of resamples whose gain >= target),
    "b_higher" / "b_lower" / "tied" (scenes), "num_scenes"."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(
            f"need two equal 1-D per-scene arrays of >= 2 scenes, got {a.shape}, {b.shape}"
        )
    diff = b - a
    rng = np.random.default_rng(seed)
    resampled = diff[rng.integers(len(diff), size=(num_resamples, len(diff)))].mean(axis=1)
    se = diff.std(ddof=1) / np.sqrt(len(diff))
    gain = float(diff.mean())
    return {
        "mean_a": float(a.mean()),
        "mean_b": float(b.mean()),
        "gain": gain,
        "ci95": [float(q) for q in np.percentile(resampled, [2.5, 97.5])],
        "normal_ci95": [gain - 1.96 * float(se), gain + 1.96 * float(se)],
        "share_reaching_target": float(np.mean(resampled >= target)),
        "target": target,
        "b_higher": int(np.sum(diff > 0)),
        "b_lower": int(np.sum(diff < 0)),
        "tied": int(np.sum(diff == 0)),
        "num_scenes": len(diff),
    }


def per_scene(config, setup, params, start, num_scenes):
    """Returns {"f1", "hallucinated", "words"}: per-scene lists of the Policy's greedy captions
    on scenes start..start+num_scenes-1, as the eval stage scores them (`toyworld_eval`)."""
    scenes, examples, captions = toyworld_eval.policy_captions(
        setup.model_config,
        params,
        setup.processor,
        config.data.seed,
        start,
        num_scenes,
        config.eval.batch_size,
        config.eval.max_new_tokens,
        config.data.image_size,
    )
    metrics = [tw.caption_metrics(scenes[e["scene_id"]], t) for e, t in zip(examples, captions)]
    return {
        "f1": [m["f1"] for m in metrics],
        "hallucinated": [len(m["hallucinated"]) for m in metrics],
        "words": [len(t.split()) for t in captions],
    }


def _checkpoint(workdir, spec):
    stage, _, step = spec.partition(":")
    if not stage:
        raise ValueError(f"a checkpoint is stage[:step] (e.g. sft:800, rl), got {spec!r}")
    kept = checkpoint.kept_steps(workdir, stage)
    if not kept:
        raise ValueError(f"{workdir} keeps no {stage} checkpoint")
    step = int(step) if step else max(kept)
    if step not in kept:
        raise ValueError(f"{workdir} keeps {stage} steps {kept}, not {step}")
    return stage, step


def compare(workdir, a="sft", b="rl", where="eval", num_scenes=0, target=0.05, resamples=10000):
    """Returns the comparison of workdir's checkpoints a and b (stage[:step], default step: the
    last kept) on the range `where` ("eval" or "validation"; num_scenes 0: the range's own size)."""
    with open(os.path.join(workdir, "config.json")) as f:  # written by mocojax.main
        config = ml_collections.ConfigDict(json.load(f))
    if where == "eval":
        start, size = config.data.num_train_scenes, config.eval.num_scenes
    elif where == "validation":
        if "val_scenes" not in config.rl:  # a run from before rl.val_scenes: its default
            config.rl.val_scenes = VALIDATION_SCENES
        start, size = rl_evals.validation_range(config)
    else:
        raise ValueError(f"range must be 'eval' or 'validation', got {where!r}")
    num_scenes = num_scenes or size
    if num_scenes < 2:
        raise ValueError(f"need >= 2 scenes, got {num_scenes}")
    setup = config_utils.build_setup(config, workdir)
    specs = [_checkpoint(workdir, spec) for spec in (a, b)]
    began = time.time()
    values = []
    for stage, step in specs:
        params, _ = checkpoint.restore_params(workdir, stage, setup.model_config, step=step)
        values.append(per_scene(config, setup, params, start, num_scenes))
    return {
        "run": workdir,
        "a": f"{specs[0][0]}:{specs[0][1]}",
        "b": f"{specs[1][0]}:{specs[1][1]}",
        "range": where,
        "start": start,
        "seconds": round(time.time() - began, 1),
        **{
            key: paired_summary(
                values[0][key], values[1][key], target if key == "f1" else 0.0, resamples
            )
            for key in COLUMNS
        },
        "per_scene": {"a": values[0], "b": values[1]},
    }


def markdown(results, header=True):
    """Returns markdown rows: per run, each column's a -> b, gain [bootstrap 95%], and for F1
    the share of resamples reaching the target and the scenes b wins / loses."""
    lines = []
    if header:
        lines.append(
            "| run | a -> b | range | F1 a -> b | F1 gain [95%] | P(gain >= target) | scenes +/-/= "
            "| invented a -> b [95% of change] | words a -> b [95% of change] |"
        )
        lines.append("|---" * 9 + "|")
    for r in results:
        f1, inv, words = r["f1"], r["hallucinated"], r["words"]

        def ci(s):
            return f"[{s['ci95'][0]:+.3f}, {s['ci95'][1]:+.3f}]"

        lines.append(
            f"| {os.path.basename(os.path.normpath(r['run']))} | {r['a']} -> {r['b']} | "
            f"{r['range']} ({f1['num_scenes']}) | {f1['mean_a']:.3f} -> {f1['mean_b']:.3f} | "
            f"{f1['gain']:+.3f} {ci(f1)} | {f1['share_reaching_target']:.3f} (>= {f1['target']}) | "
            f"{f1['b_higher']}/{f1['b_lower']}/{f1['tied']} | "
            f"{inv['mean_a']:.2f} -> {inv['mean_b']:.2f} {ci(inv)} | "
            f"{words['mean_a']:.1f} -> {words['mean_b']:.1f} {ci(words)} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdirs", nargs="+")
    parser.add_argument("--a", default="sft", help="stage[:step] (default step: the last kept)")
    parser.add_argument("--b", default="rl", help="stage[:step]")
    parser.add_argument("--range", default="eval", choices=("eval", "validation"))
    parser.add_argument("--scenes", type=int, default=0, help="0: the range's own size")
    parser.add_argument("--target", type=float, default=0.05, help="the F1 gain to reach")
    parser.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples")
    args = parser.parse_args(argv)
    if args.resamples < 1:
        parser.error(f"--resamples must be >= 1, got {args.resamples}")
    header = True
    for workdir in args.workdirs:
        try:
            result = compare(
                workdir, args.a, args.b, args.range, args.scenes, args.target, args.resamples
            )
        except ValueError as err:
            parser.error(str(err))
        print(markdown([result], header=header), flush=True)
        header = False
        name = f"paired_{result['a']}_{result['b']}_{args.range}.json".replace(":", "_")
        out = os.path.join(workdir, name)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
