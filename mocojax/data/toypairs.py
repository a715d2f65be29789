"""Minimal-pair training data for the per-item Judge on the toy world (`data.judge_pairs`).

Measured 2026-12-02 (docs/results.md, "The Judge on the Policy's own captions"): a per-item
Judge trained on the world's candidate captions, labels balanced within each item kind, reached
0.67 balanced accuracy within kinds on held-out records of the same kind, yet on the Policy's own sampled
captions it agreed with the exact Judge on 41% of items (always "1": 52%) and its reward did
not rank a group's captions at all (within-group r(reward, true F1) = 0.01). It had learned
cues of how the training captions were made, not the lookup "does the caption say this?".

A minimal pair removes every such cue. Each per-item Judge example (`records.judge_items`)
becomes two examples on the SAME rubric item: its caption rewritten from the caption's parsed
content, and the same rewrite with one edit that flips the item's exact label. Both captions
are written by `toyworld.write_caption` from one rng draw, so they share their sentence frame
and wording up to the edit. Every item is then seen with both answers, half "1" and half "0"
in every kind, and only the words the item asks about tell them apart. Labels and rationales
come from the exact Judge (`toyroles.judge_fact`) on each caption, and a pair is kept only
when the two labels really differ.

The edit is, 80% of the time (SWAP_SHARE), a *binding swap*: an attribute exchanged between the
item's object and another object of the caption ("a red triangle and a green square" -> "a
green triangle and a red square"), a distractor object added to both captions when there is
none, so both captions hold the same words (78% of presence pairs word for word) and only which
object a word belongs to decides. Otherwise the object is named or removed, the attribute's
value swapped in or out, the background changed. The swap came from a measurement: the base
continued on "Does it name a red triangle?" alone (0.93 on the world's captions) says "yes" to
all of 90 questions on the Policy's samples that name the colour and the shape on two different
objects -- it had learned "are both words there", since random unnamed pairs rarely have both.

Measured the same day, before the swaps: 500 minimal-pair steps taught the lookup on the
world's captions in part (0.64 within kinds on held-out pairs) but not on the Policy's longer
samples (agreement with the exact Judge 0.39, within-group r(reward, true F1) -0.06).
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


# Share of flips done as a swap between two objects of the caption (`pair_content`; a distractor
# object is added when there is none to exchange with); the rest remove, add or replace words.
SWAP_SHARE = 0.8


def _swap(mentions, k, j, attribute):
    """Returns the mentions with `attribute`'s values of mentions k and j exchanged."""
    mentions = list(mentions)
    a, b = getattr(mentions[k], attribute), getattr(mentions[j], attribute)
    mentions[k] = dataclasses.replace(mentions[k], **{attribute: b})
    mentions[j] = dataclasses.replace(mentions[j], **{attribute: a})
    return mentions


def _distractor(mentions, avoid, rng, **fixed):
    """Returns a new mention of a shape other than `avoid` (fields in `fixed` as given, colour
    always stated, size and position drawn or left out, a position no mention states)."""
    taken = {m.position for m in mentions}
    free = [p for p in tw.POSITIONS if p not in taken]
    drawn = {
        "shape": str(rng.choice([s for s in tw.SHAPES if s != avoid])),
        "colour": str(rng.choice(tuple(tw.COLOURS))),
        "size": str(rng.choice(tw.SIZES)) if rng.random() < 0.5 else None,
        "position": str(rng.choice(free)) if free and rng.random() < 0.5 else None,
    }
    drawn.update(fixed)
    return tw.Mention(**drawn)


def _insert(mentions, mention, rng):
    """Returns the mentions with `mention` at a random place, and its index."""
    at = int(rng.integers(len(mentions) + 1))
    return mentions[:at] + [mention] + mentions[at:], at


def _binding_swap(fact, mentions, rng):
    """Returns (base, flipped): mentions whose `fact` labels differ by one attribute exchanged
    between two objects (every word stays, only which object it belongs to changes), or None.

    `base` is the caption's content, with one distractor object added when the caption has no
    object to exchange with (never one the item is about, so the base keeps its label).
    """
    if fact.kind == "only":
        return _only_swap(fact, mentions, rng)
    if fact.kind not in ("present", "absent", "attribute"):
        return None
    named = _matching(mentions, fact.referent)
    shape = fact.referent.shape
    if fact.kind in ("present", "absent"):
        colour = fact.referent.colour
        if colour is None or len(named) > 1:
            return None
        if named:  # give the named object another object's colour (and that one its own)
            k = named[0]
            others = [
                j
                for j, m in enumerate(mentions)
                if m.shape != shape and m.colour not in (None, colour)
            ]
            if not others:
                other = str(rng.choice([c for c in tw.COLOURS if c != colour]))
                mentions, j = _insert(
                    mentions, _distractor(mentions, shape, rng, colour=other), rng
                )
                k, others = k + (j <= k), [j]
            return mentions, _swap(mentions, k, int(rng.choice(others)), "colour")
        # not named: bring the colour of another object onto an object of the item's shape
        same_shape = [k for k, m in enumerate(mentions) if m.shape == shape]
        if not same_shape:
            other = str(rng.choice([c for c in tw.COLOURS if c != colour]))
            added = _distractor(mentions, shape, rng, shape=shape, colour=other)
            mentions, _ = _insert(mentions, added, rng)
        if not any(m.colour == colour and m.shape != shape for m in mentions):
            mentions, _ = _insert(mentions, _distractor(mentions, shape, rng, colour=colour), rng)
        same_shape = [k for k, m in enumerate(mentions) if m.shape == shape]
        same_colour = [j for j, m in enumerate(mentions) if m.colour == colour and m.shape != shape]
        k, j = int(rng.choice(same_shape)), int(rng.choice(same_colour))
        return mentions, _swap(mentions, k, j, "colour")
    attribute, value = fact.attribute, fact.value
    holding = [k for k in named if getattr(mentions[k], attribute) == value]
    if len(holding) > 1 or not named:
        return None
    if holding:  # the value moves to an object the item is not about
        k = holding[0]
        others = [
            j
            for j, m in enumerate(mentions)
            if j not in named and getattr(m, attribute) not in (None, value)
        ]
        if not others:
            fixed = {attribute: _other(_attribute_values(attribute), value, rng)}
            mentions, j = _insert(mentions, _distractor(mentions, shape, rng, **fixed), rng)
            k, others = k + (j <= k), [j]
        return mentions, _swap(mentions, k, int(rng.choice(others)), attribute)
    donors = [
        j for j, m in enumerate(mentions) if j not in named and getattr(m, attribute) == value
    ]
    if not donors:
        mentions, _ = _insert(
            mentions, _distractor(mentions, shape, rng, **{attribute: value}), rng
        )
        named = _matching(mentions, fact.referent)
        donors = [
            j for j, m in enumerate(mentions) if j not in named and getattr(m, attribute) == value
        ]
    return mentions, _swap(mentions, int(rng.choice(named)), int(rng.choice(donors)), attribute)


def _only_swap(fact, mentions, rng):
    """An `only` item's binding swap: two named objects' colours exchanged, so that a caption
    naming only the allowed objects names a colour-shape pair the item does not allow."""
    if not all(toyroles.only_allows(fact, m) for m in mentions):
        return None
    options = [
        (k, j)
        for k in range(len(mentions))
        for j in range(k + 1, len(mentions))
        if not all(toyroles.only_allows(fact, m) for m in _swap(mentions, k, j, "colour"))
    ]
    if not options:
        return None
    k, j = options[int(rng.integers(len(options)))]
    return mentions, _swap(mentions, k, j, "colour")


def pair_content(fact, mentions, background, rng):
    """Returns (base, flipped), each (mentions, background), whose exact labels for `fact`
    differ, or None. `base` is the caption's own content unless a swap needs a distractor.

    With probability SWAP_SHARE the flip is a *binding swap*: one attribute exchanged between
    the object the item is about and another object of the caption (a distractor object added
    to both captions when the caption has none to exchange with) ("a red triangle and a green square" -> "a green triangle and a red square" for "mentions a
    red triangle"; sizes or positions alike for attribute items). Both captions then hold the
    same words, and only which object a word belongs to tells the labels apart -- exactly what
    the Policy's own captions demand (they bind colours to shapes that rubric items recombine).
    Otherwise: present / absent: every mention of the referent removed, or one added at a random
    place; attribute: the value replaced by another in every matching mention, or set on the
    first match (a mention of the referent with the value is added when none is named);
    background: changed to another colour, or set to the asked one; only: the objects it does
    not allow removed, or one added (its swap: two allowed objects exchange colours).
    """
    mentions = list(mentions)
    if rng.random() < SWAP_SHARE:
        swapped = _binding_swap(fact, mentions, rng)
        if swapped is not None:
            return (swapped[0], background), (swapped[1], background)
    flipped = _flipped_content(fact, mentions, background, rng)
    return None if flipped is None else ((mentions, background), flipped)


def _flipped_content(fact, mentions, background, rng):
    """The edit that is not a swap: (mentions, background) with `fact`'s label flipped, or None."""
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
    if fact.kind == "only":
        if any(not toyroles.only_allows(fact, m) for m in mentions):
            return [m for m in mentions if toyroles.only_allows(fact, m)], background
        pairs = [(s, c) for s in tw.SHAPES for c in tw.COLOURS]
        shape, colour = pairs[int(rng.integers(len(pairs)))]
        while toyroles.only_allows(fact, tw.Mention(shape, colour)):
            shape, colour = pairs[int(rng.integers(len(pairs)))]
        invented = _new_mention(tw.Mention(shape, colour), rng)
        mentions.insert(int(rng.integers(len(mentions) + 1)), invented)
        return mentions, background
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
        pair = pair_content(fact, mentions, background, rng)
        if pair is None:
            out.append(example)
            continue
        wording = int(rng.integers(2**31))
        captions = [tw.write_caption(m, b, np.random.default_rng(wording)) for m, b in pair]
        decisions = [toyroles.judge_fact(fact, *tw.parse_caption(caption)) for caption in captions]
        if decisions[0].value == decisions[1].value:
            out.append(example)
            continue
        out += [
            _example(example, suffix, caption, decision)
            for suffix, caption, decision in zip(("same", "flip"), captions, decisions)
        ]
    return out
