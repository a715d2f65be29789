"""Minimal-pair training data for the per-item Judge on the toy world (`data.judge_pairs`).

Measured 2026-12-02 (docs/results.md, "The Judge on the Policy's own captions"): a per-item
Judge trained on the world's candidate captions, labels balanced within each item kind, reached
0.67 balanced accuracy within kinds on held-out records of the same kind, yet on the Policy's own sampled
captions it agreed with the exact Judge on 41% of items (always "1": 52%) and its reward did
not rank a group's captions at all (within-group r(reward, true F1) = 0.01). It had learned
cues of how the training captions were made, not the lookup "does the caption say this?".

A minimal pair removes every such cue. Each per-item Judge example (`records.judge_items`)
becomes two examples on the SAME rubric item: its caption rewritten from the caption's parsed
content, and the same rewrite with one edit that flips the item's exact label (the object
named or removed, the attribute's value swapped in or out, the background changed). Both
captions are written by `toyworld.write_caption` from one rng draw, so they share their
sentence frame and wording up to the edit. Every item is then seen with both answers, half
"1" and half "0" in every kind, and only the words the item asks about tell them apart.
Labels and rationales come from the exact Judge (`toyroles.judge_fact`) on each caption, and a
pair is kept only when the two labels really differ.

Measured the same day: 500 minimal-pair steps teach the lookup on the world's captions in part
(0.64 within kinds on held-out pairs) but not on the Policy's longer samples (agreement with
the exact Judge 0.39, within-group r(reward, true F1) -0.06), so the switch stays off.
"""

import dataclasses
import zlib

import numpy as np

from mocojax import roles
from mocojax.data import toyroles, toyworld as tw


def _matching(mentions, referent):
    return [k for k, m in enumerate(mentions) if toyroles._matches(m, referent)]


def _other(values, value, rng):
    return str(rng.choice([v for v in values if v != value]))


def _attribute_values(attribute):
    return {
        "colour": tuple(tw.COLOURS),
        "size": tw.SIZES,
        "position": tw.POSITIONS,
    }[attribute]


def _new_mention(referent, rng):
    """Returns a mention of `referent` (its stated attributes kept, the rest drawn or left out)."""
    drawn = {
        "colour": referent.colour or str(rng.choice(tuple(tw.COLOURS))),
        "size": referent.size or (str(rng.choice(tw.SIZES)) if rng.random() < 0.5 else None),
        "position": referent.position
        or (str(rng.choice(tw.POSITIONS)) if rng.random() < 0.5 else None),
    }
    return tw.Mention(referent.shape, **drawn)


def flipped_content(fact, mentions, background, rng):
    """Returns (mentions, background) edited so that `fact`'s exact label flips, or None.

    present / absent: every mention of the referent removed, or one added at a random place;
    attribute: the value replaced by another in every matching mention, or set on the first
    match (a mention of the referent with the value is added when none is named);
    background: changed to another colour, or set to the asked one.
    """
    mentions = list(mentions)
    if fact.kind in ("present", "absent"):
        named = _matching(mentions, fact.referent)
        if named:
            return [m for k, m in enumerate(mentions) if k not in named], background
        mentions.insert(int(rng.integers(len(mentions) + 1)), _new_mention(fact.referent, rng))
        return mentions, background
    if fact.kind == "background":
        if background == fact.value:
            return mentions, _other(tuple(tw.BACKGROUNDS), fact.value, rng)
        return mentions, fact.value
    if fact.kind != "attribute":
        return None
    named = _matching(mentions, fact.referent)
    attribute, value = fact.attribute, fact.value
    if any(getattr(mentions[k], attribute) == value for k in named):
        other = _other(_attribute_values(attribute), value, rng)
        for k in named:
            if getattr(mentions[k], attribute) == value:
                mentions[k] = dataclasses.replace(mentions[k], **{attribute: other})
        return mentions, background
    if named:
        mentions[named[0]] = dataclasses.replace(mentions[named[0]], **{attribute: value})
        return mentions, background
    added = dataclasses.replace(_new_mention(fact.referent, rng), **{attribute: value})
    mentions.insert(int(rng.integers(len(mentions) + 1)), added)
    return mentions, background


def _example(example, suffix, caption, decision):
    return dict(
        example,
        id=f"{example['id']}/{suffix}",
        caption=caption,
        target=roles.format_decisions([decision]),
    )


def judge_minimal_pairs(examples, seed):
    """Returns the examples with each toy per-item Judge example replaced by its minimal pair.

    The pair's ids are `<id>/same` and `<id>/flip`; an example whose item states no fact of
    this world, or whose edit does not flip the label (e.g. a caption the parser reads
    differently once rewritten), is kept as it was. Other examples pass through. Deterministic
    in (seed, example id).
    """
    out = []
    for example in examples:
        fact = (
            toyroles.parse_criterion(example["item"][0])
            if example["role"] == "judge" and "item" in example
            else None
        )
        if fact is None:
            out.append(example)
            continue
        rng = np.random.default_rng([seed, 29, zlib.crc32(example["id"].encode())])
        mentions, background = tw.parse_caption(example["caption"])
        flipped = flipped_content(fact, mentions, background, rng)
        if flipped is None:
            out.append(example)
            continue
        wording = int(rng.integers(2**31))
        captions = [
            tw.write_caption(m, b, np.random.default_rng(wording))
            for m, b in ((mentions, background), flipped)
        ]
        decisions = [toyroles.judge_fact(fact, *tw.parse_caption(caption)) for caption in captions]
        if decisions[0].value == decisions[1].value:
            out.append(example)
            continue
        out += [
            _example(example, suffix, caption, decision)
            for suffix, caption, decision in zip(("same", "flip"), captions, decisions)
        ]
    return out
