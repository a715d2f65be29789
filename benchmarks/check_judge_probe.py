"""A model asked the per-item `check` question as RL's Judge, on RL's own logged samples.

Reads the groups an RL run logged (`<workdir>/rl_samples.jsonl`: each group's sampled captions
and its rubric), asks the model ``Caption: <caption>\\nCheck: <criterion>`` for every readable
rubric item of every caption (`roles.check_question`, the toy base's `truth` task and the Judge's
`data.judge_item_form="check"` form), and compares its yes / no with the exact Judge: agreement
and balanced accuracy per item kind next to always "1", and the mean within-group r(rubric
reward, true caption F1) of its reward next to the exact Judge's and a coin's (GRPO uses only
the ranking within a group). Measured numbers: docs/results.md, session 8.

  PYTHONPATH=. python benchmarks/check_judge_probe.py --model runs/base5/hf \\
      --samples runs/terse_plain3/rl_samples.jsonl --groups 40 --max-step 100
"""

import argparse
import collections
import json

import numpy as np

from configs import toyworld as toyworld_config
from mocojax import config_utils, roles
from mocojax.data import toyroles, toyworld as tw
from mocojax.eval import toyworld_eval
from mocojax.train import rl_evals


def scene_of(image_id):
    """Returns the toy scene of an RL image id ("toy<seed>-<index>")."""
    seed, index = image_id.removeprefix("toy").split("-")
    scene = tw.make_scenes(int(seed), 1, int(index))[0]
    if scene.id != image_id:
        raise ValueError(f"{image_id!r} is not a toy-world image id")
    return scene


def questions_of(groups):
    """Returns (check questions, [(group, caption, weight, kind, exact 0/1)]) of the groups."""
    questions, meta = [], []
    for g, group in enumerate(groups):
        for c, caption in enumerate(group["captions"]):
            mentions, background = tw.parse_caption(caption)
            for item in group["rubric"]:
                fact = toyroles.parse_criterion(item["criterion"])
                if fact is None:
                    continue
                questions.append(
                    {
                        "id": f"{g}/{c}/{len(questions)}",
                        "role": "judge",
                        "prompt": roles.check_question(caption, item["criterion"]),
                        "caption": caption,
                    }
                )
                exact = toyroles.judge_fact(fact, mentions, background).value
                meta.append((g, c, item["weight"], fact.kind, exact))
    return questions, meta


def within_group_r(groups, meta, said, seed=0):
    """Returns {name: (mean within-group r(reward, true F1), zero-variance share)} for the
    model's decisions, the exact Judge's and a coin's."""
    rng = np.random.default_rng(seed)
    coin = rng.random(len(meta)) < 0.5
    sums = collections.defaultdict(lambda: np.zeros(4))  # model, exact, coin, weight
    for (g, c, weight, _, exact), s, flip in zip(meta, said, coin):
        sums[(g, c)] += weight * np.array([s, exact, flip, 1.0])
    f1 = [
        [tw.caption_metrics(scene_of(group["image_id"]), c)["f1"] for c in group["captions"]]
        for group in groups
    ]
    out = {}
    for col, name in enumerate(("model", "exact", "coin")):
        rewards = [
            [
                sums[(g, c)][col] / sums[(g, c)][3] if sums[(g, c)][3] else 0.0
                for c in range(len(group["captions"]))
            ]
            for g, group in enumerate(groups)
        ]
        zero = float(np.mean([np.std(r) == 0 for r in rewards]))
        out[name] = (rl_evals.within_group_corr(rewards, f1) or 0.0, zero)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="HF directory (its tokenizer is used)")
    parser.add_argument("--samples", required=True, help="an RL run's rl_samples.jsonl")
    parser.add_argument("--groups", type=int, default=40)
    parser.add_argument("--max-step", type=int, default=10**9)
    parser.add_argument("--workdir", default="/tmp/check_judge_probe")
    args = parser.parse_args()
    with open(args.samples) as f:
        groups = [g for g in map(json.loads, f) if g["step"] <= args.max_step][: args.groups]
    config = toyworld_config.paper_config()
    config.model.init_from = args.model
    setup = config_utils.build_setup(config, args.workdir)
    questions, meta = questions_of(groups)
    outputs = toyworld_eval.generate_texts(
        setup.model_config, setup.load_params(), setup.processor, questions, 100, 4, 0
    )
    parsed = [roles.parse_item_reply(o, "check") for o in outputs]
    said = [decisions[0].value for decisions, _ in parsed]
    print(
        f"{len(meta)} questions on {len(groups)} groups; unreadable replies "
        f"{sum(bool(p) for _, p in parsed)}; exact '1' rate {np.mean([m[4] for m in meta]):.3f}, "
        f"said '1' {np.mean(said):.3f}; agreement "
        f"{np.mean([s == m[4] for s, m in zip(said, meta)]):.3f}"
    )
    counts = collections.defaultdict(collections.Counter)  # kind -> tp / fn / tn / fp
    for (_, _, _, kind, exact), s in zip(meta, said):
        counts[kind][("t" if s == exact else "f") + ("p" if s else "n")] += 1
    for kind, c in sorted(counts.items()):
        n = sum(c.values())
        print(
            f"  {kind:10s} n={n:5d} accuracy {(c['tp'] + c['tn']) / n:.3f} "
            f"balanced {toyroles.balanced_accuracy(c):.3f} always-1 {(c['tp'] + c['fn']) / n:.3f}"
        )
    for name, (r, zero) in within_group_r(groups, meta, said).items():
        print(
            f"within-group r(reward, true F1), {name:5s}: {r:.3f} (zero-variance groups {zero:.3f})"
        )


if __name__ == "__main__":
    main()
