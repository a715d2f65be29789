"""The toy world's rubrics, Judge truth, SFT records for all three roles, and its tokenizer.

Rubric criteria are written in nine templates that `parse_criterion` reads back, so any
rubric (written by us or by a model) can be checked against the scene, and any Judge
decision against the caption:

  mentions a red circle                      (present; weight 3 when a candidate missed it)
  does not mention a green star              (absent; weight 3 against an invented object)
  does not mention a star                    (absent, a shape the scene lacks: `absent_shapes`)
  mentions at most one circle                (at_most, a shape's count: `count_items`; weight 3)
  mentions at least two circles              (at_least, a shape's count: `count_floor`; weight 3)
  mentions the colour red                    (colour, any shape: `unbound_items`; weight 2)
  does not mention the colour green          (no_colour, a colour the scene lacks; weight 2)
  mentions a small red circle                (attribute: size, or "... at the top left":
                                             position; weight 2 when one was wrong/missing)
  the background is white                    (detail; weight 1)
  mentions only a red circle and a blue star (only, with `data.only_item`; weight 3)

A colour error is charged as the presence of the right pair ("mentions a red circle"). The
first waves' predicate form of attribute items ("the circle at the top left is red", "the
circle is small") is still read, never written (`toyroles_facts._phrase_form` says why).
"""

import collections
import dataclasses
import json
import os
import re
import tempfile
import zlib

import numpy as np

from mocojax import roles
from mocojax.data import records as records_lib, toybase, toyworld as tw

# Split out (move only, #14); re-exported so `toyroles.<name>` keeps working.
from mocojax.data.toyroles_facts import (  # noqa: F401
    COUNT_WORDS,
    RATIONALES,
    WEIGHTS,
    Fact,
    _matches,
    _no_decisions,
    _referent_phrase,
    _scene_content,
    _value_phrase,
    add_confusion,
    balanced_accuracy,
    count_decision,
    count_recoloured,
    fact_is_true,
    is_recoloured,
    item_of,
    judge_accuracy,
    judge_confusion,
    judge_fact,
    mentions_rationale,
    only_allows,
    parse_criterion,
    pooled_confusion,
    report_kind,
    rubric_truth_by_kind,
    rubric_truth_rate,
    truth_rate_of_kinds,
)

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<think>",
    "</think>",
)
UNK_TOKEN = "<unk>"


def attribute_fact(scene, k, attribute):
    """Returns the Fact that object k has its `attribute`, anchored on the object's colour and
    shape so the criterion reads as the phrase to look for: size and position as attribute
    items ("mentions a small red circle", "mentions a red circle at the top left"), colour as
    a presence item ("mentions a red circle") or, when the scene has another object of that
    shape, as the pair at its place. Each holds of a caption that names the object with that
    attribute and its colour (the first waves' predicate, "the circle is small", ignored the
    colour: a wrong colour is now charged by each of the object's items)."""
    obj = scene.objects[k]
    pair = tw.Mention(obj.shape, obj.colour)
    if attribute != "colour":
        return Fact("attribute", pair, attribute, getattr(obj, attribute))
    if sum(o.shape == obj.shape for o in scene.objects) == 1:
        return Fact("present", pair)
    return Fact("attribute", pair, "position", obj.position)


def rubric_facts(
    scene,
    candidate_captions,
    max_items=8,
    min_items=3,
    only_item=False,
    attribute_items=True,
    absent_shapes=False,
    count_items=False,
    every_object=False,
    count_floor=False,
    unbound_items=False,
):
    """Returns the Facts of the target rubric: what the candidates missed, got wrong or invented.

    Ordered by weight (RubiCap's severity scheme; items against invented objects first, so
    every invented object keeps its item under the cap), then by first occurrence. When the
    candidates leave fewer than `min_items` deficiencies, presence items for the scene's
    objects and the background fill the rubric so it still separates good captions from bad.
    only_item: the rubric starts with one "mentions only <the scene's objects>" item, which any
    invented object fails, whether or not a shown candidate invented it (without it an invented
    object costs only when a shown candidate invented the same one: docs/results.md measured
    hallucinations doubling under RL with exact roles).
    attribute_items=False: no size or place items; a wrong colour is still charged, as the
    pair's presence item (`data.attribute_items`: a Judge that cannot check the attribute items
    is exploited through them; docs/results.md, sessions 8-9).
    absent_shapes: one "does not mention a <shape>" item for every shape the scene lacks, written
    from the image alone, so each invented object of a missing shape costs its item's weight in
    every sampled caption, not only when a shown candidate invented it (an invented pair of a
    missing shape then gets no pair item of its own: it would be charged twice).
    count_items: one "mentions at most <n> <shape>s" item for every shape the scene has (n its
    count), which a second mention of an object or a wrong colour of that shape fails, in every
    sample. With absent_shapes every invented mention fails an item. Both kinds go after the
    `only` item and before the deficiency items, and do not count against max_items (at most
    5 more items: one per shape of the world).
    count_floor: one "mentions at least <n> <shape>s" item for every shape the scene has (n its
    count), which a caption that drops an object of that shape fails, whatever the colours of
    the rest: with count_items the two pin each shape's count, a check of shape words alone (a
    Judge that does not bind colour to shape passes a presence item when the shape is named in
    another colour, so without it one square pays every square's item; docs/results.md,
    session 17). After the at_most items; not counted against max_items.
    every_object: one "mentions a <colour> <shape>" item for every object of the scene, written
    from the image alone, so each object a caption names pays in every sample, not only when a
    shown candidate missed it (with absent_shapes and count_items an invented mention costs in
    every sample; without this, dropping an object costs only when a shown candidate dropped it
    too). They go after the shape items, replace the deficiency items that name the same pair,
    and do not count against max_items.
    unbound_items: no item binds a colour to a shape (with absent_shapes, count_items and
    count_floor, which config validation requires): the shape items, then one "mentions the
    colour <c>" item per colour the scene has and one "does not mention the colour <c>" per
    colour it lacks (every colour of the world, weight 2 each), then the background item; the
    candidates' present, pair-absent and attribute items are not written. Every item is then a
    check of single words, which a toy Judge that does not bind colour to shape gets right
    (docs/results.md, session 18); what the rubric no longer prices is which shape a colour is on.
    """
    pairs = {(o.shape, o.colour) for o in scene.objects}
    missing = [s for s in tw.SHAPES if s not in {o.shape for o in scene.objects}]
    facts = []
    for caption in candidate_captions:
        mentions, background = tw.parse_caption(caption)
        assignment = tw.match_mentions(scene, mentions)
        for k, obj in enumerate(scene.objects):
            if k not in assignment:
                facts.append(Fact("present", tw.Mention(obj.shape, obj.colour)))
                continue
            mention = mentions[assignment.index(k)]
            wrong = [a for a in tw.ATTRIBUTES if getattr(mention, a) != getattr(obj, a)]
            if attribute_items:
                facts += [attribute_fact(scene, k, a) for a in wrong]
            elif "colour" in wrong:
                facts.append(Fact("present", tw.Mention(obj.shape, obj.colour)))
        facts += [
            Fact("absent", tw.Mention(m.shape, m.colour))
            for m, k in zip(mentions, assignment)
            if k is None
            and m.colour is not None
            and (m.shape, m.colour) not in pairs
            and not (absent_shapes and m.shape in missing)
        ]
        if background != scene.background:
            facts.append(Fact("background", value=scene.background))
    facts = list(dict.fromkeys(facts))
    counts = collections.Counter(o.shape for o in scene.objects)
    shape_facts = [Fact("absent", tw.Mention(shape)) for shape in missing if absent_shapes] + [
        Fact(kind, tw.Mention(shape), value=COUNT_WORDS[n - 1])
        for kind, on in (("at_most", count_items), ("at_least", count_floor))
        if on
        for shape, n in counts.items()
    ]
    object_facts = list(
        dict.fromkeys(Fact("present", tw.Mention(o.shape, o.colour)) for o in scene.objects)
    )
    if every_object:
        facts = [f for f in facts if f not in object_facts]
        shape_facts += object_facts
    if unbound_items:
        colours = {o.colour for o in scene.objects}
        colour_facts = [
            Fact("colour" if colour in colours else "no_colour", value=colour)
            for colour in tw.COLOURS
        ]
        return shape_facts + colour_facts + [Fact("background", value=scene.background)]
    if len(facts) + len(shape_facts) < min_items:
        fill = object_facts + [Fact("background", value=scene.background)]
        facts += [f for f in fill if f not in facts and f not in shape_facts]
    order = {kind: rank for rank, kind in enumerate(("absent", "present", "attribute"))}
    facts.sort(key=lambda f: order.get(f.kind, 3))
    if only_item and scene.objects:
        facts = [only_fact(scene)] + facts
    facts = facts[:max_items]
    k = int(bool(only_item and scene.objects))  # the shape items go after the `only` item
    return facts[:k] + shape_facts + facts[k:]


def pair_absent_facts(scene, captions):
    """Returns the distinct "absent" facts of the (shape, colour) pairs that the captions name on a
    shape of the scene in a colour that no object of that shape has ("does not mention a blue
    square" where the squares are red), in the order the captions first name them."""
    pairs = {(o.shape, o.colour) for o in scene.objects}
    shapes = {o.shape for o in scene.objects}
    facts = []
    for caption in captions:
        for m in tw.parse_caption(caption)[0]:
            if m.colour is not None and m.shape in shapes and (m.shape, m.colour) not in pairs:
                facts.append(Fact("absent", tw.Mention(m.shape, m.colour)))
    return list(dict.fromkeys(facts))


def reference_ordered(scene, reference):
    """Returns the scene with its objects in the order the reference caption names them (any it
    does not name after them, in scene order).

    The scene's own order is the order the world drew its objects in, which no text shows; a
    Generator target written in it asks the model for an order it cannot see (the count and
    presence items follow it), while in the reference's order the rubric is a function of the
    Generator's prompt (`data.generator_reference_order`)."""
    assignment = tw.match_mentions(scene, tw.parse_caption(reference)[0])
    named = [k for k in assignment if k is not None]
    order = named + [k for k in range(len(scene.objects)) if k not in named]
    return dataclasses.replace(scene, objects=tuple(scene.objects[k] for k in order))


def only_fact(scene):
    """Returns the scene's "mentions only <its objects>" Fact (objects as colour and shape)."""
    return Fact(
        "only", allowed=tuple(dict.fromkeys(tw.Mention(o.shape, o.colour) for o in scene.objects))
    )


def _rng(seed, salt, scene):
    return np.random.default_rng([seed, salt, *map(ord, scene.id)])


# Share of Judge records that judge a complete reference; the rest judge weak captions.
JUDGE_REFERENCE_SHARE = 0.05
# With judge_recolours: share of the other Judge records that judge a recoloured caption
# (`toyworld.recolour_captions`) outright. In the pool of two draws it is seldom the one kept (it
# fails few items), so drawn there it raised the unmet presence items whose shape the caption
# names from 33% to 38% of the unmet presence items; judged outright at this share, to 57% (seed
# 1, 400 scenes; 0.5: 62%, at the cost of halving the unmet count and background items).
JUDGE_RECOLOUR_SHARE = 0.4
MAX_RUBRIC_ITEMS = 10
# With judge_pair_absent: the most pair-absent items added to a scene's judged rubric.
JUDGE_PAIR_ABSENT_ITEMS = 2
# References the Generator reads. The toy world's references are paraphrases of one complete
# truth, so one carries all of it (PixMo-Cap has one per image too); more only lengthen the
# prompt (3 references: 429 tokens on average, 1: ~340).
GENERATOR_REFERENCES = 1


def scene_sft_records(
    scene,
    seed,
    mix=(2, 1, 1),
    num_candidates=4,
    policy_drop=0.0,
    judge_repeats=False,
    judge_fragments=False,
    judge_recolours=False,
    judge_pair_absent=False,
    generator_reference_order=False,
    weak_swap_colours=0.0,
    **rubric,
):
    """Returns the SFT records of one scene: mix = (policy, generator, judge) record counts.

    Every record is a dict with id, role, scene_id and target text; Policy and Generator
    records carry the scene (their image), Judge records the rubric and the judged caption.
    The Generator's candidates are *weak* captions (`toyworld.weak_captions`: erroneous,
    partial or image-blind, as RL's samples are), so its rubric targets what such captions
    miss and invent. The Judge grades that rubric on the candidates and on other weak captions
    of the scene (a small share on a complete reference), so its targets are near half "1".
    Judge targets are exactly right by construction (computed from the parsed caption).
    policy_drop > 0: Policy targets leave out each object with that probability
    (`toyworld.terse_caption`), as captions that skip details; the roles keep full references.
    judge_repeats: the Judge's captions are also drawn from `toyworld.repeat_captions` (a shape
    named more often than the scene has it), so unmet count items are not rare.
    judge_fragments: ... and from `toyworld.fragment_captions` (the background alone, a caption
    cut short), so a caption that names no object is seen failing its presence items.
    judge_recolours: JUDGE_RECOLOUR_SHARE of the Judge records that do not judge a reference judge
    a `toyworld.recolour_captions` caption (an object named in a colour no object of its shape
    has), so presence items are seen unmet on captions that name the shape.
    judge_pair_absent: the rubric the Judge records grade also holds up to JUDGE_PAIR_ABSENT_ITEMS
    "does not mention a <colour> <shape>" items (`pair_absent_facts`) for pairs that the Judge's
    captions name on a shape of the scene in a colour no object of that shape has, so the
    pair-absent kind, the one that binds a colour to a shape in an absent item, is not rare in
    the Judge's data (4% of its per-item examples without it). The Generator's records and RL's
    rubrics do not change.
    generator_reference_order: the Generator's target lists its count and presence items in the
    order its reference names the objects (`reference_ordered`), not the world's hidden draw
    order; the same items, so the Judge's records and RL's reward do not change.
    weak_swap_colours: the chance that a wrong colour in a weak caption (the Generator's candidates
    and the Judge's captions) is another object's colour of the scene (`toyworld.weak_captions`'
    swap_colours), as RL's samples' wrong colours nearly always are.
    rubric: `rubric_facts`'s options (`only_item`, `attribute_items`, `absent_shapes`; the keys
    of RUBRIC_DEFAULTS), as `rubric_options(config.data)` gives them.

    Long because the three roles' records share per-scene state built in one pass: the references
    feed the Policy and Generator records, the first Generator rubric and its weak captions are what
    every Judge record grades, and one rng draws the Judge's captions.
    """
    num_policy, num_generator, num_judge = mix
    references = tw.reference_captions(scene, seed, max(3, num_policy))
    ref_ids = [f"{scene.id}/ref{k}" for k in range(len(references))]
    records = [
        {
            "id": f"{scene.id}/policy{k}",
            "role": "policy",
            "scene_id": scene.id,
            "scene": scene,
            "caption_id": ref_ids[k] if not policy_drop else f"{scene.id}/terse{k}",
            "target": references[k]
            if not policy_drop
            else tw.terse_caption(scene, seed, k, policy_drop),
        }
        for k in range(num_policy)
    ]
    judged_rubric = shown = None
    written = reference_ordered(scene, references[0]) if generator_reference_order else scene
    for g in range(max(1, num_generator)):
        subset = tw.weak_captions(
            scene, seed, num_candidates, salt=g, swap_colours=weak_swap_colours
        )
        captions = [c["caption"] for c in subset]
        items = [
            item_of(f)
            for f in rubric_facts(written, captions, max_items=MAX_RUBRIC_ITEMS, **rubric)
        ]
        if judged_rubric is None:  # Judge records use the first rubric, in the scene's order.
            judged_rubric = [
                item_of(f)
                for f in rubric_facts(scene, captions, max_items=MAX_RUBRIC_ITEMS, **rubric)
            ]
            shown = subset
        if g < num_generator:
            records.append(
                {
                    "id": f"{scene.id}/generator{g}",
                    "role": "generator",
                    "scene_id": scene.id,
                    "scene": scene,
                    "references": references[:GENERATOR_REFERENCES],
                    "candidates": [c["caption"] for c in subset],
                    "caption_ids": [c["id"] for c in subset],
                    "target": roles.format_rubric(items),
                }
            )
    unseen = tw.weak_captions(
        scene, seed, num_candidates, salt=1000, swap_colours=weak_swap_colours
    )
    repeats = tw.repeat_captions(scene, seed, 2, salt=2000) if judge_repeats else []
    fragments = tw.fragment_captions(scene, seed, 2, salt=3000) if judge_fragments else []
    recolours = tw.recolour_captions(scene, seed, 2, salt=4000) if judge_recolours else []
    pool = [(c["id"], c["caption"]) for c in shown + unseen[:2] + repeats + fragments]
    if judge_pair_absent:
        extra = pair_absent_facts(scene, [text for _, text in pool])[:JUDGE_PAIR_ABSENT_ITEMS]
        judged_rubric = judged_rubric + [
            item for item in map(item_of, extra) if item not in judged_rubric
        ]
    rng = _rng(seed, 3, scene)
    facts = [parse_criterion(item.criterion) for item in judged_rubric]

    def decide(caption):
        mentions, background = tw.parse_caption(caption)
        return [judge_fact(f, mentions, background) for f in facts]

    for j in range(num_judge):
        if rng.random() < JUDGE_REFERENCE_SHARE:
            k = int(rng.integers(len(references)))
            caption_id, caption = ref_ids[k], references[k]
            decisions = decide(caption)
        elif recolours and rng.random() < JUDGE_RECOLOUR_SHARE:
            drawn = recolours[int(rng.integers(len(recolours)))]
            caption_id, caption = drawn["id"], drawn["caption"]
            decisions = decide(caption)
        else:
            # Of two weak captions, the one that fails more items: absent items hold for most
            # captions, so plain draws give ~60% "1"; this keeps the targets near half.
            drawn = [pool[int(i)] for i in rng.choice(len(pool), 2, replace=False)]
            judged = [(cid, text, decide(text)) for cid, text in drawn]
            caption_id, caption, decisions = min(judged, key=lambda t: sum(d.value for d in t[2]))
        records.append(
            {
                "id": f"{scene.id}/judge{j}",
                "role": "judge",
                "scene_id": scene.id,
                "rubric": [list(item) for item in judged_rubric],
                "caption": caption,
                "caption_id": caption_id,
                "target": roles.format_decisions(decisions),
            }
        )
    return records


def sft_records(seed, num_scenes, mix=(2, 1, 1), start=0, generator_other_image=0.0, **options):
    """Returns the SFT records of scenes start..start+num_scenes-1, grouped by scene (options:
    `scene_sft_records`' keywords: policy_drop, judge_repeats, judge_fragments, judge_recolours,
    judge_pair_absent
    and the rubric's; generator_other_image: `with_other_images`' share)."""
    scenes = tw.make_scenes(seed, num_scenes, start)
    records = [
        record for scene in scenes for record in scene_sft_records(scene, seed, mix, **options)
    ]
    if generator_other_image:
        records = with_other_images(records, scenes, seed, generator_other_image)
    return records


def with_other_images(records, scenes, seed, share):
    """Returns the records with about `share` of the Generator records showing another scene's
    image (one of `scenes`, drawn per record; `image_scene_id` names it). Their references,
    candidates and target stay their own scene's.

    The toy world's reference names every object of its scene exactly, so the rubric is a
    function of the reference and the candidates; the image adds nothing the reference lacks. A
    Generator trained on the true image alone writes its presence items from its own perception
    (it binds a colour to the wrong shape about as often as the Policy does; with another scene's
    image 78% of them are false, with another scene's reference 56%: docs/results.md, session 23);
    shown an image that does not match its text, it can only be right by reading the reference."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"generator_other_image must lie in [0, 1], got {share!r}")
    if len(scenes) < 2:
        raise ValueError(
            f"generator_other_image={share} needs at least 2 scenes to draw another image from, "
            f"got {len(scenes)}"
        )
    by_id = {scene.id: k for k, scene in enumerate(scenes)}
    out = []
    for record in records:
        if record["role"] == "generator":
            rng = np.random.default_rng([seed, 6, *map(ord, record["id"])])
            if rng.random() < share:
                own = by_id[record["scene_id"]]
                other = scenes[(own + 1 + int(rng.integers(len(scenes) - 1))) % len(scenes)]
                record = {**record, "scene": other, "image_scene_id": other.id}
        out.append(record)
    return out


# `rubric_facts`'s design options and their defaults: each is a `config.data` key of that name.
RUBRIC_DEFAULTS = {
    "only_item": False,
    "attribute_items": True,
    "absent_shapes": False,
    "count_items": False,
    "every_object": False,
    "count_floor": False,
    "unbound_items": False,
}


def rubric_options(data):
    """Returns the rubric keyword arguments (RUBRIC_DEFAULTS' keys) a config's `data` block
    sets, for `rubric_facts`, `scene_sft_records`, `sft_records` and `ExactRoles`."""
    return {key: data.get(key, default) for key, default in RUBRIC_DEFAULTS.items()}


def balance_judge_items(examples, seed):
    """Returns the examples with per-item Judge examples (`records.judge_items`) subsampled so
    that within each item kind half the labels are "1".

    Within a kind the labels are skewed (on 400 scenes of seed 1: absent items hold for 74% of
    the judged captions, present items for 30%, attribute 29%, background 37%), so a Judge that
    gives each kind its usual answer is right ~70% of the time without reading the caption, and
    SFT settles there. Each majority-label example is kept with probability minority / majority
    (a draw seeded by `seed` and its id, so the selection does not depend on order); only the
    lookup then lowers the loss. Examples that are not per-item Judge examples pass through.
    """

    def key(example):
        fact = parse_criterion(example["item"][0])
        (decision,), _ = roles.parse_decisions(example["target"], 1)
        return (report_kind(fact) if fact else None, decision.value)

    keys = [
        key(e) if e["role"] == "judge" and "item" in e else None for e in examples
    ]  # (kind, label) of each per-item Judge example, parsed once
    counts = collections.Counter(k for k in keys if k is not None)

    def keep(example, kind_value):
        if kind_value is None:
            return True
        kind, value = kind_value
        minority = min(counts[(kind, 0)], counts[(kind, 1)])
        rng = np.random.default_rng([seed, 17, zlib.crc32(example["id"].encode())])
        return rng.random() < minority / counts[(kind, value)]

    return [e for e, k in zip(examples, keys) if keep(e, k)]


def with_mention_rationales(examples):
    """Returns the examples with each toy Judge target's rationales rewritten as the caption's
    mentions of the item's shape (`mentions_rationale`, config data.judge_rationale="mentions"),
    per-item and whole-rubric examples alike; decisions, other kinds' rationales and other
    examples are unchanged. A target whose decisions cannot be read raises ValueError naming it."""
    out = []
    for example in examples:
        if example["role"] != "judge" or "target" not in example:
            out.append(example)
            continue
        rubric = [example["item"]] if "item" in example else example["rubric"]
        decisions, problems = roles.parse_decisions(example["target"], len(rubric))
        if problems:
            raise ValueError(f"Judge example {example['id']}: {'; '.join(problems)}")
        mentions, _ = tw.parse_caption(example["caption"])
        rewritten = []
        for item, decision in zip(rubric, decisions):
            fact = parse_criterion(item[0])
            listed = mentions_rationale(fact, mentions) if fact is not None else None
            rewritten.append(roles.Decision(decision.value, listed or decision.rationale))
        out.append(dict(example, target=roles.format_decisions(rewritten)))
    return out


# The item kinds that an invented mention fails: "does not mention a (<colour>) <shape>" and
# "mentions at most <n> <shape>s" (with `absent_shapes` and `count_items` every invented mention
# fails one of them in every sample; `rl.invention_weight` reweights them).
INVENTION_KINDS = ("absent", "at_most")


class ExactRoles:
    """The toy world's exact Generator and Judge, for RL's `rl.generator` / `rl.judge` = "exact".

    The rubric is what `scene_sft_records` teaches the Generator (the deficiencies of the
    shown captions, at most MAX_RUBRIC_ITEMS items); the decisions are the exact Judge's. It
    is the ceiling of the method on the toy world: RL with roles that make no mistakes.
    """

    def __init__(self, scenes, invention_weight=0.0, **rubric):
        self.scenes = scenes  # {image id: Scene}
        self.rubric_options = rubric  # `rubric_facts`'s options (RUBRIC_DEFAULTS' keys)
        # > 0: the weight of every item an invented mention fails (INVENTION_KINDS) instead of
        # WEIGHTS' (config rl.invention_weight); the Judge never sees weights, only the reward.
        if not invention_weight >= 0:
            raise ValueError(f"invention_weight={invention_weight!r}: must be >= 0")
        self.invention_weight = float(invention_weight)

    def rubric(self, image_id, shown_captions):
        """Returns the list[RubricItem] for the shown captions of one image."""
        facts = rubric_facts(
            self.scenes[image_id],
            list(shown_captions),
            max_items=MAX_RUBRIC_ITEMS,
            **self.rubric_options,
        )
        items = [item_of(f) for f in facts]
        if self.invention_weight:
            items = [
                item._replace(weight=self.invention_weight) if f.kind in INVENTION_KINDS else item
                for f, item in zip(facts, items)
            ]
        return items

    @staticmethod
    def decisions(rubric_items, caption):
        """Returns the exact 0/1 per item; an item outside the world's language counts 0."""
        mentions, background = tw.parse_caption(caption)
        facts = [parse_criterion(item.criterion) for item in rubric_items]
        return [0 if f is None else judge_fact(f, mentions, background).value for f in facts]


def image_records(seed, num_scenes, start=0):
    """Returns RL records {id, scene, references}: the image and its reference captions."""
    return [
        {
            "id": scene.id,
            "scene": scene,
            "references": tw.reference_captions(scene, seed)[:GENERATOR_REFERENCES],
        }
        for scene in tw.make_scenes(seed, num_scenes, start)
    ]


# One pre-token per word with its leading space, so decoding by plain concatenation (Fuse)
# gives back the exact text.
_PRETOKEN_PATTERN = r"\n| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]|\s"
# Pair tokens (`build_tokenizer(..., pair_tokens=True)`, config `data.pair_tokens`): one token
# per " <colour> <shape>", appended after the word tokens (the word ids do not move), and matched
# before them. Measured (docs/results.md, "Binding"): with them, whether a caption names a red
# circle is a lookup of one token, learned in ~750 steps (0.87 on the Policy's captions); with
# words alone the model reads "red" and "circle" apart and binds them to objects only slowly.
PAIR_TOKENS = tuple(f" {colour} {shape}" for colour in tw.COLOURS for shape in tw.SHAPES)
_PAIR_PATTERN = (
    rf" (?:{'|'.join(tw.COLOURS)}) (?:{'|'.join(tw.SHAPES)})(?![A-Za-z])|{_PRETOKEN_PATTERN}"
)
# Count tokens (`build_tokenizer(..., count_tokens=True)`, config `data.count_items`): the words
# of the count items ("mentions at most two circles") that the shipped base's 642 tokens lack,
# appended after the word (and pair) tokens, so every earlier id stays where it was. Their
# embedding rows are the shipped base's unused ones, learned in role SFT.
COUNT_TOKENS = (" most",) + tuple(f" {shape}s" for shape in tw.SHAPES)
# Loop tokens (`build_tokenizer(..., loop_tokens=True)`, config `data.loop_mix`): the words of
# ACE-Cap's evidence-loop prompts (roles.COMPOSER_INSTRUCTION, INSTRUCT_INSTRUCTION,
# FINAL_INSTRUCTION, `ASK:` / `READY`, the evidence's `Q (asked, not a fact):` line) that the
# shipped base's 642 tokens lack (measured: 19 of the Composer instruction's 44 tokens were
# <unk>), appended after the count tokens; 642 + 6 + 36 fit the base's 704 embedding rows.
# Floor tokens (`build_tokenizer(..., floor_tokens=True)`, config `data.count_floor`): the word of
# the at-least items ("mentions at least two circles") the count tokens lack, appended last.
FLOOR_TOKENS = (" least",)
LOOP_TOKENS = (
    " <", ">", " ASK", "ASK", " Ask", " READY", "READY", " Question", "Question", "Answer", "Evidence", "Q", "You",
    "asked", "question", " about", " answers", " below", " cannot", " detailed", " enough",
    " evidence", " fact", " facts", " final", " from", " here", " leaves", " open", " question",
    " questions", " reply", " say", " sentence", " that", " when",
)  # fmt: skip


def _vocabulary_corpus():
    """Returns texts holding every word the role prompts, captions, rubrics and decisions use."""
    texts = [
        roles.POLICY_INSTRUCTION,
        roles.GENERATOR_INSTRUCTION,
        roles.JUDGE_INSTRUCTION,
        "system user assistant References Candidates Rubric Caption",
        " ".join(tw.SHAPES + tuple(tw.COLOURS) + tuple(tw.BACKGROUNDS) + tw.POSITIONS),
        " ".join(tw.SIZE_WORDS) + " grey upper lower corner side centre middle along",
        " ".join(tw.INTROS + tw.VERBS),
        "An empty picture On there is",
        "0123456789 .,;:|-()[]'\"!?/",
    ]
    for record in sft_records(seed=12345, num_scenes=200, mix=(3, 1, 4)):
        messages = records_lib.conversation(record, image=None)
        texts += [
            part["text"] if isinstance(part, dict) else part
            for message in messages
            for part in (
                message["content"] if isinstance(message["content"], list) else [message["content"]]
            )
            if not isinstance(part, dict) or part.get("type") == "text"
        ]
    for fact_kind in ("present", "absent"):
        texts.append(roles.format_rubric([item_of(Fact(fact_kind, tw.Mention("circle", "red")))]))
    texts += [f"its {a} is not given no such circle is named placed" for a in tw.ATTRIBUTES]
    # Words of the first wave's longer rubric check field ("it must be called ...", "fails if
    # any ..."): the shipped base's tokenizer has them, and a rebuilt base must get the same ids.
    texts.append("must any fails")
    return texts + toybase.vocabulary_texts()


def build_vocabulary(pair_tokens=False, count_tokens=False, loop_tokens=False, floor_tokens=False):
    """Returns the token list: specials, <unk>, then every corpus piece with/without space and
    case, then (pair_tokens) the PAIR_TOKENS, then (count_tokens) the COUNT_TOKENS, then
    (loop_tokens) the LOOP_TOKENS, then (floor_tokens) the FLOOR_TOKENS."""
    words = set()
    for text in _vocabulary_corpus():
        words.update(re.findall(r"[A-Za-z]+|[0-9]|[^\sA-Za-z0-9]", text))
    pieces = set()
    for word in words:
        for variant in {word, word.lower(), word.capitalize()}:
            pieces.update({variant, " " + variant})
    vocab = list(SPECIAL_TOKENS) + [UNK_TOKEN, "\n", " "] + sorted(pieces - {" ", "\n"})
    return (
        vocab
        + list(PAIR_TOKENS if pair_tokens else ())
        + list(COUNT_TOKENS if count_tokens else ())
        + list(LOOP_TOKENS if loop_tokens else ())
        + list(FLOOR_TOKENS if floor_tokens else ())
    )


def build_tokenizer(
    out_dir, pair_tokens=False, count_tokens=False, loop_tokens=False, floor_tokens=False
):
    """Writes tokenizer.json + tokenizer_config.json to out_dir; returns out_dir.

    A word-level tokenizer with Qwen's special tokens, loadable with
    `transformers.AutoTokenizer.from_pretrained(out_dir)` and `processing.load_tokenizer`.
    pair_tokens: one more token per " <colour> <shape>" (PAIR_TOKENS), the same ids otherwise.
    count_tokens: the count items' words (COUNT_TOKENS) after those, the same ids otherwise.
    loop_tokens: the evidence loop's prompt words (LOOP_TOKENS) after those.
    floor_tokens: the at-least items' word (FLOOR_TOKENS) last.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = build_vocabulary(pair_tokens, count_tokens, loop_tokens, floor_tokens)
    tokenizer = Tokenizer(
        models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token=UNK_TOKEN)
    )
    pattern = _PAIR_PATTERN if pair_tokens else _PRETOKEN_PATTERN
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), "isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS) + [UNK_TOKEN])
    os.makedirs(out_dir, exist_ok=True)
    _write_atomically(os.path.join(out_dir, "tokenizer.json"), tokenizer.to_str(pretty=True))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 8192,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": UNK_TOKEN,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
    }
    _write_atomically(os.path.join(out_dir, "tokenizer_config.json"), json.dumps(config, indent=1))
    return out_dir


def _write_atomically(path, text):
    """Writes text to path through a private temporary file and a rename, so that a reader never
    sees a partial file: every process of a multi-host run builds the toy tokenizer into the same
    workdir, and one process read it while another was rewriting it."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the tokenizer files are for everyone
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
