"""A toy base (or any toy-world model) asked the `truth` task's rubric-criterion questions on
held-out scenes: accuracy per item kind and, for attribute items, per attribute (size / place),
each next to its fixed answer (the share of the commoner answer), plus a sample of wrong answers.

The base eval (`base/truth_<kind>`) scores ~20 questions per kind on 100 scenes; this asks as many
as `--scenes` gives (about a fifth of them per kind) so that a kind's number can be read.
Measured numbers: docs/results.md, session 9.

  PYTHONPATH=. python benchmarks/truth_probe.py --model runs/base7/hf --scenes 600 --mix truthattr=1
"""

import argparse
import collections

import numpy as np

from configs import toyworld as toyworld_config
from mocojax import config_utils
from mocojax.data import toybase, toyroles
from mocojax.eval import toyworld_eval


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="HF directory of a pair-token toy model")
    parser.add_argument("--scenes", type=int, default=600)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--start", type=int, default=100000, help="first scene (held out)")
    parser.add_argument("--mix", default="truth=1", help="task mix: truth and / or truthattr")
    parser.add_argument("--show-wrong", type=int, default=8)
    parser.add_argument("--workdir", default="/tmp/truth_probe")
    args = parser.parse_args()
    mix = toybase.parse_task_mix(args.mix)
    if set(k for k, v in mix.items() if v) - {"truth", "truthattr"}:
        raise SystemExit(f"--mix {args.mix!r}: only truth and truthattr are asked here")
    records = toybase.base_records(args.seed, args.scenes, start=args.start, task_mix=mix)
    config = toyworld_config.paper_config()
    config.model.init_from = args.model
    config.data.pair_tokens = True
    setup = config_utils.build_setup(config, args.workdir)
    outputs = toyworld_eval.generate_texts(
        setup.model_config, setup.load_params(), setup.processor, records, 100, 4, 0
    )
    groups = collections.defaultdict(list)  # (kind, attribute) -> [(right, answer is yes)]
    wrong = []
    for record, output in zip(records, outputs):
        criterion = record["prompt"].rsplit(f"{toybase.TRUTH_PROMPT} ", 1)[-1]
        fact = toyroles.parse_criterion(criterion)
        right = bool(toybase.score(record, output))
        key = (record["kind"], fact.attribute if fact.kind == "attribute" else "")
        groups[key].append((right, record["target"] == "yes"))
        if not right:
            wrong.append((record["target"], output.strip(), record["prompt"].replace("\n", " || ")))
    print(f"{len(records)} questions on {args.scenes} scenes of seed {args.seed}")
    for (kind, attribute), rows in sorted(groups.items()):
        rows = np.array(rows)
        yes = rows[:, 1].mean()
        print(
            f"  {kind:10s} {attribute:9s} n={len(rows):4d} accuracy {rows[:, 0].mean():.3f} "
            f"fixed answer {max(yes, 1 - yes):.3f}"
        )
    rng = np.random.default_rng(0)
    for k in rng.permutation(len(wrong))[: args.show_wrong]:
        target, said, prompt = wrong[k]
        print(f"  want {target}, said {said!r}: {prompt}")


if __name__ == "__main__":
    main()
