"""One RL rollout of the default toy job with shared prompt prefixes, against re-prefilling.

  python benchmarks/bench_rollout.py --repeats 2        # configs/toyworld.py:paper, the shipped base
  python benchmarks/bench_rollout.py --tiny             # seconds: the script's check (tests)
  python benchmarks/bench_rollout.py --recipe --repeats 2   # configs/toyworld_judge.py

--recipe: the learned-Judge recipe (configs/toyworld_judge.py), whose Generator is the world's
exact one and whose Judge is asked once per (caption, rubric item) in the `reason` form: there
**shared** encodes the opening of a caption's questions (the caption; the item ends each question)
once for all its items (`sampling.generate_with_prefix_index`) and **re-prefill** encodes every
question whole.

A rollout is what one RL update samples and scores before its gradient step: the Policy's N
captions per image, one Generator rubric per image, and the Judge's decisions on every caption.
**shared** is what RL runs (`mocojax.train.rollout`): each image's Policy prompt is encoded once
for its N samples (`sampling.generate(num_samples=N)`), and the N Judge prompts of a group encode
their common prefix (instruction + rubric; the caption comes last) once
(`sampling.generate_with_shared_prefix`). **re-prefill** encodes every prompt whole: each Policy
prompt repeated N times with one sample each, each Judge prompt on its own row. The Generator has
one prompt per image either way (its time is in both totals). The Judge of both variants scores
the same captions and rubrics (the shared variant's), greedily, so its decode work is the same;
the Policy samples at the RL temperature in both (its decode lengths are printed). Times are the
best of --repeats after one call that compiles every shape; one process, side by side.
"""

import argparse
import functools
import os
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The repository root, for `configs` (and this checkout's mocojax) when run as a script.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs import toyworld, toyworld_judge  # noqa: E402
from mocojax import config_utils, roles  # noqa: E402
from mocojax.data import pipeline, records as records_lib  # noqa: E402
from mocojax.train import rl as rl_lib, rollout  # noqa: E402


def setup_rollout(tiny, recipe=False):
    """Returns (config, model config, params, processor, one RL group, {image id: scene}) of the
    toy job (recipe: configs/toyworld_judge.py's)."""
    config = (toyworld_judge.get_config if recipe else toyworld.paper_config)(
        "tiny" if tiny else ""
    )
    setup = config_utils.build_setup(config, tempfile.mkdtemp())
    records = rl_lib.rl_records(config)
    group = next(
        iter(
            pipeline.rl_dataset(
                records,
                global_batch_size=config.rl.images_per_step,
                seed=config.data.seed + 1,
                image_size=config.data.image_size,
            )
        )
    )
    scenes = {r["id"]: r["scene"] for r in records}
    return config, setup.model_config, setup.load_params(), setup.processor, group, scenes


def policy_shared(cfg, params, processor, images, rl, rng):
    """Returns the Policy's decoded lengths [G*N]: one encoded prompt per image, N samples."""
    _, _, _, lengths = rollout.sample_policy(cfg, params, processor, images, rl, rng)
    return lengths


def whole_prompts(cfg, params, processor, conversations, **decode):
    """Returns the sampler output of conversations, each encoded whole on its own row."""
    return rollout._generate(cfg, params, processor, conversations, num_samples=1, **decode)[1]


def policy_reprefill(cfg, params, processor, images, rl, rng):
    """Returns the Policy's decoded lengths [G*N]: each prompt encoded N times, one sample each."""
    conversations = [
        roles.policy_messages(image) for image in images for _ in range(rl.num_samples)
    ]
    out = whole_prompts(
        cfg,
        params,
        processor,
        conversations,
        max_new_tokens=rl.max_new_tokens,
        temperature=rl.temperature,
        top_p=rl.top_p,
        top_k=rl.top_k,
        rng=rng,
    )
    return np.asarray(out.lengths)


def judge_shared(cfg, params, processor, conversations, rl, rng):
    """Returns the Judge's replies: each group's instruction + rubric prefix encoded once."""
    return rollout.judge_texts(cfg, params, processor, conversations, rl.num_samples, rl, rng)


def judge_reprefill(cfg, params, processor, conversations, rl, rng):
    """Returns the Judge's replies: every prompt encoded whole, one row each."""
    out = whole_prompts(
        cfg,
        params,
        processor,
        conversations,
        max_new_tokens=rl.judge_max_new_tokens,
        temperature=rl.judge_temperature,
        rng=rng,
    )
    return rollout.decode_texts(
        processor.tokenizer, out.tokens, out.lengths, processor.eos_token_ids
    )


def best(fn, repeats):
    """Returns (best seconds over repeats, the last result); the first call (compiles) untimed."""
    result = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()  # host values: every variant fetches its output
        times.append(time.perf_counter() - t0)
    return min(times), result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="configs/toyworld.py:tiny (a check)")
    parser.add_argument(
        "--recipe", action="store_true", help="configs/toyworld_judge.py (per-item Judge)"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    config, cfg, params, processor, group, scenes = setup_rollout(args.tiny, args.recipe)
    rl = config.rl
    images = [e["image"] for e in group]
    rng = jax.random.key(0)
    # The shared variant's captions and rubrics, which both Judges then score.
    _, _, _, _, captions = rollout.policy_captions(cfg, params, processor, images, rl, rng)
    n = rl.num_samples
    subsets = rollout.choose_subsets(config.seed, 1, len(group), n, rl.subset_size)
    shown = [[captions[g][i] for i in subsets[g]] for g in range(len(group))]
    if args.recipe:  # the world's exact Generator (no model work)
        exact = rl_lib.exact_roles(config, scenes)
        write = lambda: (None, [exact.rubric(e["id"], s) for e, s in zip(group, shown)], None)
    else:
        write = functools.partial(
            rollout.write_rubrics,
            cfg,
            params,
            processor,
            images,
            [e["references"] for e in group],
            shown,
            rl,
            jax.random.fold_in(rng, 1),
        )
    generator_s, (_, rubrics, _) = best(write, args.repeats)
    # A group whose rubric did not parse is given a one-item rubric, so every group is judged
    # (the benchmark times the Judge's prompts, not the Generator's quality).
    fallback = [roles.RubricItem("mentions a red circle", "named", 1.0)]
    rubrics = [r or fallback for r in rubrics]
    form = records_lib.judge_item_form(config.data) if args.recipe else False
    if form:
        conversations = [
            roles.judge_item_prompt(item, caption, form)
            for g in range(len(group))
            for caption in captions[g]
            for item in rubrics[g]
        ]
        sizes = [len(rubrics[g]) for g in range(len(group)) for _ in captions[g]]
        # shared: each caption's common opening encoded once; re-prefill: every question whole
        judges = (
            functools.partial(rollout.judge_items_texts, group_sizes=sizes),
            rollout.judge_items_texts,
        )
    else:
        conversations = [
            roles.judge_messages(rubrics[g], caption)
            for g in range(len(group))
            for caption in captions[g]
        ]
        judges = (judge_shared, judge_reprefill)
    print(
        f"{len(group)} images x N = {n} captions, Policy max {rl.max_new_tokens} new tokens at "
        f"temperature {rl.temperature}; Generator "
        f"{'exact' if args.recipe else rl.generator_max_new_tokens}; Judge "
        f"{rl.judge_max_new_tokens} (greedy, {form or 'whole-rubric'} form, "
        f"{len(conversations)} prompts); best of {args.repeats}"
    )
    rows = {}
    for name, policy, judge in (
        ("shared", policy_shared, judges[0]),
        ("re-prefill", policy_reprefill, judges[1]),
    ):
        policy_s, lengths = best(
            lambda policy=policy: policy(cfg, params, processor, images, rl, rng), args.repeats
        )
        judge_s, replies = best(
            lambda judge=judge: judge(
                cfg, params, processor, conversations, rl, jax.random.fold_in(rng, 2)
            ),
            args.repeats,
        )
        rows[name] = (policy_s, generator_s, judge_s, int(np.sum(lengths)), replies)
    if rows["shared"][4] != rows["re-prefill"][4]:
        changed = sum(a != b for a, b in zip(rows["shared"][4], rows["re-prefill"][4]))
        print(f"note: {changed} of {len(conversations)} Judge replies differ between the variants")
    print(
        "\n| rollout | Policy s (tokens) | Generator s | Judge s | total s | "
        "vs re-prefill (total) |"
    )
    print("|---|---|---|---|---|---|")
    base = sum(rows["re-prefill"][:3])
    for name, (policy_s, generator_s_, judge_s, tokens, _) in rows.items():
        total = policy_s + generator_s_ + judge_s
        print(
            f"| {name} | {policy_s:.2f} ({tokens}) | {generator_s_:.2f} | {judge_s:.2f} | "
            f"{total:.2f} | {total / base:.2f}x |"
        )
    return rows


if __name__ == "__main__":
    main()
