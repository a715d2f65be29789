"""Stage II rollouts on the host: Policy samples, online rubrics, Judge decisions, rewards.

One call of `collect` per Policy update, for G images (groups):
  1. the Policy samples N captions per image (each prompt and image prefilled once);
  2. a seeded random subset of M captions per image goes to the Generator, which writes the
     rubric from the image, the references and the subset (greedy by default);
  3. the Judge scores EVERY one of the N captions against its group's rubric, without the
     image; the instruction + rubric prefix is the same for the N captions of a group;
  4. reward r = sum_k w_k b_k / sum_k w_k; a group whose rubric did not parse gets no reward
     and, like a group whose N rewards are all equal, no gradient.
Text work (decoding, parsing, rewards) is numpy/python; model work goes through `sampling`.
On several processes every process runs `collect` on the same group with the same keys: the
sampler's programs run once over the whole mesh, their outputs are gathered to every process,
and the host-side text work, identical everywhere, keeps the processes in step.
"""

import contextlib
import dataclasses
import functools
import time

import jax
import numpy as np

from mocojax import distributed, roles, sampling


@dataclasses.dataclass
class PolicySamples:
    """The Policy's captions of one update and their rewards (host arrays), whatever scored them:
    G groups of N captions, T new tokens. `rl.train_batch` needs only these fields and properties."""

    ids: list  # [G] image ids
    prompt: dict  # Processor output of the G Policy prompts (left padded to one length)
    tokens: np.ndarray  # [G*N, T] sampled caption tokens, group-major
    logprobs: np.ndarray  # [G*N, T] behaviour log-probabilities (unscaled softmax)
    lengths: np.ndarray  # [G*N] generated tokens per row, EOS included
    captions: list  # [G][N] caption text
    rewards: np.ndarray  # [G, N] float32

    @property
    def zero_variance(self) -> np.ndarray:
        """Returns bool [G]: groups whose N rewards are all equal (no learning signal)."""
        return self.rewards.max(-1) == self.rewards.min(-1)

    @property
    def has_signal(self) -> np.ndarray:
        """Returns bool [G]: groups that give a gradient (rewards not all equal)."""
        return ~self.zero_variance

    @property
    def completion_mask(self) -> np.ndarray:
        """Returns int32 [G*N, T]: 1 on generated tokens (EOS included), 0 on padding."""
        return (np.arange(self.tokens.shape[1])[None, :] < self.lengths[:, None]).astype(np.int32)


@dataclasses.dataclass
class Rollout(PolicySamples):
    """The rubric reward's rollouts of one Policy update; rewards in [0, 1]."""

    subsets: np.ndarray  # [G, M] indices of the captions shown to the Generator
    rubric_texts: list  # [G] raw Generator output
    rubrics: list  # [G] list[RubricItem] (empty when nothing parsed)
    generator_problems: list  # [G] list of parser problems
    decisions: list  # [G][N] list[int] (one 0/1 per rubric item; [] when no rubric)
    judge_problems: np.ndarray  # [G, N] number of parser problems per judged caption
    rubric_ok: np.ndarray  # [G] bool: the rubric has at least one item
    # rl.rubric_check = "references": [G] list[RubricItem], the items the references failed,
    # dropped before judging; None when the check is off
    checked_out: list = None

    @property
    def has_signal(self) -> np.ndarray:
        """Returns bool [G]: groups that give a gradient (rubric parsed, rewards not all equal)."""
        return self.rubric_ok & ~self.zero_variance


def decode_texts(tokenizer, tokens, lengths, eos_token_ids):
    """Returns the text of each row of tokens [R, T] up to its length, EOS tokens dropped."""
    eos = set(int(t) for t in eos_token_ids)
    return [
        tokenizer.decode(
            [int(t) for t in row[:n] if int(t) not in eos], skip_special_tokens=True
        ).strip()
        for row, n in zip(np.asarray(tokens), np.asarray(lengths))
    ]


def _generate(
    cfg,
    params,
    processor,
    conversations,
    *,
    num_samples,
    max_new_tokens,
    temperature,
    top_p=1.0,
    top_k=0,
    rng=None,
):
    """Returns (Processor batch, sampler output) for prompts built from conversations."""
    batch = processor(conversations, mode="generate")
    out = sampling.generate(
        cfg,
        params,
        batch["input_ids"],
        batch["attention_mask"],
        batch["pixel_values"],
        batch["image_grid_thw"],
        max_new_tokens=max_new_tokens,
        num_samples=num_samples,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        eos_token_ids=processor.eos_token_ids,
        pad_id=processor.pad_token_id,
        rng=rng,
    )
    return batch, distributed.fetch(out)


def sample_policy(cfg, params, processor, images, rl, rng):
    """Returns (prompt batch, tokens [G*N, T], logprobs [G*N, T], lengths [G*N]) of the Policy."""
    conversations = [roles.policy_messages(image) for image in images]
    batch, out = _generate(
        cfg,
        params,
        processor,
        conversations,
        num_samples=rl.num_samples,
        max_new_tokens=rl.max_new_tokens,
        temperature=rl.temperature,
        top_p=rl.top_p,
        top_k=rl.top_k,
        rng=rng,
    )
    return (
        batch,
        np.asarray(out.tokens),
        np.asarray(out.logprobs, np.float32),
        np.asarray(out.lengths),
    )


def policy_captions(cfg, params, processor, images, rl, rng):
    """Returns (prompt batch, tokens [G*N, T], logprobs [G*N, T], lengths [G*N], captions [G][N])."""
    prompt, tokens, logprobs, lengths = sample_policy(cfg, params, processor, images, rl, rng)
    texts = decode_texts(processor.tokenizer, tokens, lengths, processor.eos_token_ids)
    n = rl.num_samples
    return (
        prompt,
        tokens,
        logprobs,
        lengths,
        [texts[g * n : (g + 1) * n] for g in range(len(images))],
    )


def write_rubrics(cfg, params, processor, images, references, subsets_text, rl, rng):
    """Returns (rubric texts [G], rubric items [G], parser problems [G]) from the Generator.

    With rl.rubric_samples = K > 1 the Generator writes K rubrics per image (sampled at
    rl.generator_temperature) and the image's rubric is their union (`roles.merge_rubrics`); its
    text is then the merged rubric, its problems each draw's, prefixed "draw k:".
    """
    k = rl.get("rubric_samples", 1)
    conversations = [
        roles.generator_messages(image, refs, subset)
        for image, refs, subset in zip(images, references, subsets_text)
    ]
    _, out = _generate(
        cfg,
        params,
        processor,
        conversations,
        num_samples=k,
        max_new_tokens=rl.generator_max_new_tokens,
        temperature=rl.generator_temperature,
        rng=rng,
    )
    texts = decode_texts(processor.tokenizer, out.tokens, out.lengths, processor.eos_token_ids)
    # parse_rubric reads an unterminated last line as truncated; a decoded reply that stopped
    # at EOS is complete, so it gets its line end back.
    finished = np.asarray(out.lengths) < rl.generator_max_new_tokens
    parsed = [
        roles.parse_rubric(text + "\n" if done else text) for text, done in zip(texts, finished)
    ]
    if k == 1:
        return texts, [items for items, _ in parsed], [problems for _, problems in parsed]
    rubrics = roles.merge_draws(
        [items for items, _ in parsed], k, min_votes=rl.get("rubric_votes", 1)
    )
    problems = [
        [
            f"draw {j}: {p}"
            for j, (_, found) in enumerate(parsed[g * k : (g + 1) * k])
            for p in found
        ]
        for g in range(len(images))
    ]
    return [roles.format_rubric(r) for r in rubrics], rubrics, problems


def split_shared_prefix(input_ids, attention_mask, group_size):
    """Returns (prefix ids [G, P], prefix mask [G, P], continuations [G*n, C], their mask).

    input_ids / attention_mask [G*n, L] are left-padded prompts, n per group. Each group's
    prefix is the longest run of tokens all its n prompts start with (kept short of the
    shortest prompt so every continuation has a token); prefix + continuation is exactly the
    original prompt, whatever the tokenizer does at the boundary. Prefixes come back left
    padded, continuations right padded.
    """
    return split_prefixes(input_ids, attention_mask, [group_size] * (len(input_ids) // group_size))


def split_prefixes(input_ids, attention_mask, group_sizes):
    """split_shared_prefix for groups of uneven sizes: rows [sum(group_sizes), L] in consecutive
    groups; returns (prefix ids [len(group_sizes), P], prefix mask, continuations [rows, C], mask)."""
    rows = [ids[mask > 0] for ids, mask in zip(np.asarray(input_ids), np.asarray(attention_mask))]
    if sum(group_sizes) != len(rows) or min(group_sizes, default=1) < 1:
        raise ValueError(f"group sizes {group_sizes} must be >= 1 and sum to {len(rows)} rows")
    prefixes, continuations = [], []
    start = 0
    for size in group_sizes:
        group = rows[start : start + size]
        start += size
        shared = min(len(r) for r in group) - 1
        for r in group[1:]:
            differs = np.nonzero(r[:shared] != group[0][:shared])[0]
            shared = int(differs[0]) if differs.size else shared
        prefixes.append(group[0][:shared])
        continuations += [r[shared:] for r in group]

    def pad(seqs, left):
        width = max(len(s) for s in seqs)
        ids = np.zeros((len(seqs), width), np.int32)
        mask = np.zeros((len(seqs), width), np.int32)
        for k, seq in enumerate(seqs):
            span = slice(width - len(seq), width) if left else slice(0, len(seq))
            ids[k, span], mask[k, span] = seq, 1
        return ids, mask

    return (*pad(prefixes, left=True), *pad(continuations, left=False))


def judge_texts(cfg, params, processor, conversations, n, rl, rng):
    """Returns the text-only Judge's replies to conversations [G*n], n per group in a row.

    The n prompts of a group share their leading tokens (instruction + rubric or questions; the
    caption comes last), which are encoded once and their KV cache shared by the n captions.
    """
    batch = processor(conversations, mode="generate")
    prefix_ids, prefix_mask, tails, tail_mask = split_shared_prefix(
        batch["input_ids"], batch["attention_mask"], n
    )
    out = sampling.generate_with_shared_prefix(
        cfg,
        params,
        prefix_ids,
        prefix_mask,
        continuations=tails,
        continuation_mask=tail_mask,
        max_new_tokens=rl.judge_max_new_tokens,
        num_samples=n,
        temperature=rl.judge_temperature,
        eos_token_ids=processor.eos_token_ids,
        pad_id=processor.pad_token_id,
        rng=rng,
    )
    out = distributed.fetch(out)
    return decode_texts(processor.tokenizer, out.tokens, out.lengths, processor.eos_token_ids)


def sample_texts(
    cfg,
    params,
    processor,
    conversations,
    *,
    max_new_tokens,
    temperature,
    rng,
    num_samples=1,
    min_rows=8,
):
    """Returns the decoded replies [len(conversations) * num_samples] of ONE sampler call, sample j
    of conversation i at i * num_samples + j.

    The conversations are padded to a power-of-two count of at least min_rows
    (`sampling.bucket`; filler rows repeat the first and are dropped), so the sampler compiles
    once per bucket, not once per batch size.
    """
    rows = len(conversations)
    padded = conversations + [conversations[0]] * (sampling.bucket(rows, minimum=min_rows) - rows)
    _, out = _generate(
        cfg,
        params,
        processor,
        padded,
        num_samples=num_samples,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        rng=rng,
    )
    return decode_texts(processor.tokenizer, out.tokens, out.lengths, processor.eos_token_ids)[
        : rows * num_samples
    ]


def judge_items_texts(cfg, params, processor, conversations, rl, rng, group_sizes=None):
    """Returns the per-item Judge's replies to one-item conversations, in order.

    group_sizes: the conversations come in consecutive groups that share their opening (the
    questions about one caption: the caption first, the item last); each group's common prefix
    is encoded once and its KV cache copied to the group's rows
    (`sampling.generate_with_prefix_index`). Prefixes and rows are padded to power-of-two counts
    (filler rows repeat the first and are dropped), so the sampler compiles once per bucket.
    Without group_sizes every conversation is encoded whole (`sample_texts`, at least 8 rows).
    """
    if group_sizes is None:
        return sample_texts(
            cfg,
            params,
            processor,
            conversations,
            max_new_tokens=rl.judge_max_new_tokens,
            temperature=rl.judge_temperature,
            rng=rng,
        )
    batch = processor(conversations, mode="generate")
    prefix_ids, prefix_mask, tails, tail_mask = split_prefixes(
        batch["input_ids"], batch["attention_mask"], list(group_sizes)
    )
    index = np.repeat(np.arange(len(group_sizes)), group_sizes)
    rows = len(conversations)
    # filler prefixes and rows repeat the first, up to a power-of-two count
    padded = lambda x: np.concatenate([x, np.repeat(x[:1], sampling.bucket(len(x), 8) - len(x), 0)])
    out = sampling.generate_with_prefix_index(
        cfg,
        params,
        padded(prefix_ids),
        padded(prefix_mask),
        prefix_index=padded(index),
        continuations=padded(tails),
        continuation_mask=padded(tail_mask),
        max_new_tokens=rl.judge_max_new_tokens,
        temperature=rl.judge_temperature,
        eos_token_ids=processor.eos_token_ids,
        pad_id=processor.pad_token_id,
        rng=rng,
    )
    out = distributed.fetch(out)
    return decode_texts(processor.tokenizer, out.tokens, out.lengths, processor.eos_token_ids)[
        :rows
    ]


def judge_captions(cfg, params, processor, rubrics, captions, rl, rng, per_item=False):
    """Returns (decisions [G][N] lists of 0/1, problem counts [G, N]) of the Judge.

    Only groups with a rubric are judged. The N prompts of a group share the instruction +
    rubric prefix, which is encoded once and its KV cache shared by the N captions.
    per_item (config `data.judge_per_item`): the Judge is asked once per (caption, item), all of
    a step's questions in one batch, in the form per_item names ("check", "echo", "reason":
    `roles.judge_check_messages`; True or "rubric": `roles.judge_item_messages`).
    """
    num_groups, n = len(captions), len(captions[0])
    decisions = [[[] for _ in range(n)] for _ in range(num_groups)]
    problems = np.zeros((num_groups, n), np.int32)
    judged = [g for g in range(num_groups) if rubrics[g]]
    if not judged:
        return decisions, problems
    if per_item:
        form = per_item if isinstance(per_item, str) else "rubric"
        rows = [(g, i, item) for g in judged for i in range(n) for item in rubrics[g]]
        texts = judge_items_texts(
            cfg,
            params,
            processor,
            [roles.judge_item_prompt(item, captions[g][i], form) for g, i, item in rows],
            rl,
            rng,
            # the rows of one caption are consecutive and share its prompt up to the item
            group_sizes=[len(rubrics[g]) for g in judged for _ in range(n)],
        )
        for (g, i, item), text in zip(rows, texts):
            values, found = roles.parse_item_reply(text, form, item.criterion)
            decisions[g][i].append(values[0].value)
            problems[g, i] += len(found)
        return decisions, problems
    texts = judge_texts(
        cfg,
        params,
        processor,
        [roles.judge_messages(rubrics[g], caption) for g in judged for caption in captions[g]],
        n,
        rl,
        rng,
    )
    for row, text in enumerate(texts):
        g, i = judged[row // n], row % n
        values, found = roles.parse_decisions(text, len(rubrics[g]))
        decisions[g][i] = [d.value for d in values]
        problems[g, i] = len(found)
    return decisions, problems


def kept_by_references(passes, num_references):
    """Returns bool [K]: the rubric items at least half of an image's references meet.

    passes: [R][K] 0/1 decisions of the Judge on each of the R >= num_references captions judged
    (only the first num_references count: the rest pad a group to the step's largest R)."""
    passes = np.asarray(passes, np.int64)[:num_references]
    if num_references < 1 or passes.ndim != 2:
        raise ValueError(f"need [R >= 1][K] decisions, got {passes.shape} for R={num_references}")
    return 2 * passes.sum(axis=0) >= num_references


def check_rubrics(cfg, params, processor, rubrics, references, rl, rng, per_item=False, exact=None):
    """Returns (kept rubrics [G], checked-out items [G]): rl.rubric_check = "references".

    The Judge (params, or the exact toy Judge when rl.judge is "exact") reads each image's
    reference captions against its rubric, as it reads the Policy's captions; an item fewer than
    half of the references meet (`kept_by_references`) is dropped before the Policy's captions
    are judged: a criterion the gold captions do not satisfy is a false one (the Generator's own
    misperception, written as a requirement). Groups are padded to the step's largest number of
    references with their last one (the padding's decisions are not counted)."""
    width = max(len(r) for r in references)
    padded = [list(r) + [r[-1]] * (width - len(r)) for r in references]
    if rl.judge == "exact":
        decisions = [
            [exact.decisions(rubric, ref) if rubric else [] for ref in refs]
            for rubric, refs in zip(rubrics, padded)
        ]
    else:
        decisions, _ = judge_captions(
            cfg, params, processor, rubrics, padded, rl, rng, per_item=per_item
        )
    kept, dropped = [], []
    for rubric, passes, refs in zip(rubrics, decisions, references):
        keep = kept_by_references(passes, len(refs)) if rubric else []
        kept.append([item for item, k in zip(rubric, keep) if k])
        dropped.append([item for item, k in zip(rubric, keep) if not k])
    return kept, dropped


def choose_subsets(seed, step, num_groups, num_samples, subset_size):
    """Returns int [G, M]: a seeded random subset of M of the N captions per group."""
    rng = np.random.default_rng([seed, step])
    return np.stack(
        [np.sort(rng.choice(num_samples, subset_size, replace=False)) for _ in range(num_groups)]
    )


def group_rewards(rubrics, decisions):
    """Returns float32 [G, N] rewards sum(w b) / sum(w); 0 for groups without a rubric."""
    return np.asarray(
        [
            [
                roles.rubric_reward([item.weight for item in rubric], values) if rubric else 0.0
                for values in group
            ]
            for rubric, group in zip(rubrics, decisions)
        ],
        np.float32,
    )


def collect(
    cfg,
    policy_params,
    generator_params,
    judge_params,
    processor,
    group,
    rl,
    *,
    seed,
    step,
    rng,
    exact=None,
    write=None,
    judge_per_item=False,
):
    """Returns (Rollout, seconds per phase) for a group list of {id, image, references}.

    rng is a jax key for the Policy's sampling (the roles decode greedily unless their
    temperature says otherwise, from keys folded out of the same rng). `exact` (toy world,
    `toyroles.ExactRoles`) plays the role whose `rl.generator` / `rl.judge` is "exact".
    `write(group, shown)` -> (rubric texts, rubrics, problems), when given, replaces the
    Generator (offline rubrics, mocojax.train.offline_rubrics). judge_per_item: the Judge is
    asked once per rubric item (config `data.judge_per_item`, `judge_captions`).

    Long because it is the rollout's phases in order (Policy sampling, rubric generation and
    judging, each timed, then the rewards), with each phase's alternatives side by side (offline
    `write`, the exact toy roles, the model roles); the Rollout is filled from all of them.
    """
    images = [example["image"] for example in group]
    seconds = {}
    timer = functools.partial(timed, seconds)
    with timer("policy_sampling"):
        prompt, tokens, logprobs, lengths, captions = policy_captions(
            cfg, policy_params, processor, images, rl, rng
        )
    n = rl.num_samples
    subsets = choose_subsets(seed, step, len(group), n, rl.subset_size)
    shown = [[captions[g][i] for i in subsets[g]] for g in range(len(group))]
    with timer("rubric_generation"):
        if write is not None:
            rubric_texts, rubrics, generator_problems = write(group, shown)
        elif rl.generator == "exact":
            rubrics = [exact.rubric(e["id"], s) for e, s in zip(group, shown)]
            rubric_texts, generator_problems = (
                [roles.format_rubric(r) for r in rubrics],
                [[] for _ in group],
            )
        else:
            rubric_texts, rubrics, generator_problems = write_rubrics(
                cfg,
                generator_params,
                processor,
                images,
                [e["references"] for e in group],
                shown,
                rl,
                jax.random.fold_in(rng, 1),
            )
    if rl.get("rubric_source", "own") == "next_image":
        rubric_texts, rubrics, generator_problems = (
            next_image(rubric_texts, len(group)),
            next_image(rubrics, len(group)),
            next_image(generator_problems, len(group)),
        )
    checked_out = None
    if rl.get("rubric_check", ""):
        with timer("rubric_check"):
            rubrics, checked_out = check_rubrics(
                cfg,
                judge_params,
                processor,
                rubrics,
                [e["references"] for e in group],
                rl,
                jax.random.fold_in(rng, 3),
                per_item=judge_per_item,
                exact=exact,
            )
    with timer("judging"):
        if rl.judge == "exact":
            decisions = [
                [exact.decisions(rubric, c) if rubric else [] for c in caps]
                for rubric, caps in zip(rubrics, captions)
            ]
            judge_problems = np.zeros((len(group), n), np.int32)
        else:
            decisions, judge_problems = judge_captions(
                cfg,
                judge_params,
                processor,
                rubrics,
                captions,
                rl,
                jax.random.fold_in(rng, 2),
                per_item=judge_per_item,
            )
    rollout = Rollout(
        ids=[e["id"] for e in group],
        prompt=prompt,
        tokens=tokens,
        logprobs=logprobs,
        lengths=lengths,
        captions=captions,
        subsets=subsets,
        rubric_texts=rubric_texts,
        rubrics=rubrics,
        generator_problems=generator_problems,
        decisions=decisions,
        judge_problems=judge_problems,
        rewards=group_rewards(rubrics, decisions),
        rubric_ok=np.asarray([bool(r) for r in rubrics]),
        checked_out=checked_out,
    )
    return rollout, seconds


def next_image(per_image, count):
    """Returns per_image (one entry per image of an update) shifted so image g gets image g+1's
    entry, cyclically: `rl.rubric_source="next_image"`, the rubric reward's trivial baseline."""
    per_image = list(per_image)
    if count < 2 or len(per_image) != count:
        raise ValueError(
            f'rl.rubric_source="next_image" needs >= 2 images per update on each process, one '
            f"rubric each: got {len(per_image)} rubrics for {count} images"
        )
    return per_image[1:] + per_image[:1]


@contextlib.contextmanager
def timed(seconds, name):
    """Adds the wall seconds of the with-block to seconds[name]."""
    start = time.perf_counter()
    yield
    seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
