"""The toy world's rubric facts and Judge truth: Fact, the criterion templates (`item_of` writes
them, `parse_criterion` reads them back), the exact judgement of a fact against a caption or a
scene (`judge_fact`, `fact_is_true`) and the Judge's accuracy and confusion counts. Split from
mocojax/data/toyroles.py (whose docstring lists the templates), which re-exports these names."""

import dataclasses
import re

from mocojax import roles
from mocojax.data import toyworld as tw

WEIGHTS = {
    "present": 3.0,
    "absent": 3.0,
    "attribute": 2.0,
    "background": 1.0,
    "only": 3.0,
    "at_most": 3.0,
    "at_least": 3.0,
    "colour": 2.0,
    "no_colour": 2.0,
}
ONLY_PREFIX = "mentions only"
AT_MOST_PREFIX = "mentions at most"
AT_LEAST_PREFIX = "mentions at least"
# the count kinds: their criterion's prefix and check field
COUNT_KINDS = {
    "at_most": (AT_MOST_PREFIX, "no more named"),
    "at_least": (AT_LEAST_PREFIX, "no fewer named"),
}
COUNT_WORDS = ("one", "two", "three", "four")  # the toy world has at most 4 objects
# the colour kinds (`data.unbound_items`): a colour word anywhere in the caption, no shape bound
COLOUR_KINDS = {"colour": "mentions the colour", "no_colour": "does not mention the colour"}


@dataclasses.dataclass(frozen=True)
class Fact:
    """The meaning of one rubric criterion in this world.

    kind: present / absent (object = shape + colour, colour may be None for absent),
    attribute (referent mention, attribute name, value), background (value), only
    (`allowed`: the scene's objects as Mention(shape, colour); the caption names nothing else)
    or at_most (referent: a shape, value: a count word; the caption names no more objects of
    that shape, whatever their colour) or at_least (the same; it names no fewer), or colour /
    no_colour (value: a colour; the caption does / does not name something of that colour,
    whatever its shape).
    """

    kind: str
    referent: tw.Mention | None = None
    attribute: str | None = None
    value: str | None = None
    allowed: tuple = ()


def _referent_phrase(referent):
    words = [w for w in (referent.size, referent.colour, referent.shape) if w]
    return " ".join(words) + (f" at the {referent.position}" if referent.position else "")


def _value_phrase(attribute, value):
    return f"at the {value}" if attribute == "position" else value


def item_of(fact):
    """Returns the RubricItem (criterion, check, weight) that states `fact`."""
    if fact.kind == "present":
        noun = _referent_phrase(fact.referent)
        return roles.RubricItem(f"mentions a {noun}", "named", WEIGHTS["present"])
    if fact.kind == "absent":
        noun = _referent_phrase(fact.referent)
        return roles.RubricItem(f"does not mention a {noun}", "not named", WEIGHTS["absent"])
    if fact.kind == "background":
        return roles.RubricItem(
            f"the background is {fact.value}", fact.value, WEIGHTS["background"]
        )
    if fact.kind in COUNT_KINDS:
        plural = "s" if fact.value != COUNT_WORDS[0] else ""
        prefix, check = COUNT_KINDS[fact.kind]
        return roles.RubricItem(
            f"{prefix} {fact.value} {fact.referent.shape}{plural}", check, WEIGHTS[fact.kind]
        )
    if fact.kind in COLOUR_KINDS:
        check = "named" if fact.kind == "colour" else "not named"
        return roles.RubricItem(
            f"{COLOUR_KINDS[fact.kind]} {fact.value}", check, WEIGHTS[fact.kind]
        )
    if fact.kind == "only":
        nouns = [f"a {_referent_phrase(m)}" for m in fact.allowed]
        listing = nouns[0] if len(nouns) == 1 else ", ".join(nouns[:-1]) + " and " + nouns[-1]
        return roles.RubricItem(f"{ONLY_PREFIX} {listing}", "nothing else", WEIGHTS["only"])
    value = _value_phrase(fact.attribute, fact.value)
    if _phrase_form(fact):
        noun = _referent_phrase(dataclasses.replace(fact.referent, **{fact.attribute: fact.value}))
        return roles.RubricItem(f"mentions a {noun}", value, WEIGHTS["attribute"])
    return roles.RubricItem(
        f"the {_referent_phrase(fact.referent)} is {value}", value, WEIGHTS["attribute"]
    )


def _phrase_form(fact):
    """Whether an attribute fact is written as the phrase it asks for ("mentions a small red
    circle") rather than as a predicate ("the circle is small"): when its referent names the
    colour, so the phrase holds the colour-shape pair (one token with `data.pair_tokens`) and the
    check is a lookup of that pair with one word or place beside it. Measured (docs/results.md,
    session 9): the toy base checked predicate-form attribute items at 0.44-0.70 and the same
    items as phrases at 0.60-0.84 before any training on them."""
    return (
        fact.kind == "attribute"
        and fact.referent.colour is not None
        and fact.attribute in ("size", "position")
        and getattr(fact.referent, fact.attribute) is None
    )


def parse_criterion(criterion):
    """Returns the Fact a criterion states in this world's language, or None if it states none."""
    text = " ".join(criterion.lower().split())
    for kind, (prefix, _) in COUNT_KINDS.items():
        count_item = re.fullmatch(rf"{prefix} ([a-z]+) ([a-z]+?)s?", text)
        if count_item:
            count, shape = count_item.groups()
            if count not in COUNT_WORDS or shape not in tw.SHAPES:
                return None
            return Fact(kind, tw.Mention(shape), value=count)
    for kind, prefix in COLOUR_KINDS.items():
        colour_item = re.fullmatch(rf"{prefix} ([a-z]+)", text)
        if colour_item:
            colour = colour_item.group(1)
            return Fact(kind, value=colour) if colour in tw.COLOURS else None
    if text.startswith(ONLY_PREFIX):
        mentions, background = tw.parse_caption(text[len(ONLY_PREFIX) :])
        allowed = tuple(tw.Mention(m.shape, m.colour) for m in mentions)
        if not allowed or background or any(m.colour is None for m in allowed):
            return None
        return Fact("only", allowed=allowed)
    for prefix, kind in (("does not mention", "absent"), ("mentions", "present")):
        if text.startswith(prefix):
            mentions, _ = tw.parse_caption(text[len(prefix) :])
            if len(mentions) != 1 or (kind == "present" and not mentions[0].colour):
                return None
            mention = mentions[0]
            if kind == "present" and (mention.size or mention.position):
                # the phrase form of an attribute item: "mentions a small red circle"
                attribute = "size" if mention.size else "position"
                referent = dataclasses.replace(mention, **{attribute: None})
                return Fact("attribute", referent, attribute, getattr(mention, attribute))
            return Fact(kind, tw.Mention(mention.shape, mention.colour))
    if " is " not in text:
        return None
    subject, predicate = text.split(" is ", 1)
    if "background" in subject.split():
        _, background = tw.parse_caption(f"{predicate} background")
        return Fact("background", value=background) if background else None
    mentions, _ = tw.parse_caption(subject)
    words = re.findall(r"[a-z]+", predicate)
    values = {
        "colour": [w for w in words if w in tw.COLOURS],
        "size": [tw.SIZE_WORDS[w] for w in words if w in tw.SIZE_WORDS],
        "position": [p] if (p := tw.position_of(words)) else [],
    }
    stated = [(a, v[0]) for a, v in values.items() if len(v) == 1]
    if len(mentions) != 1 or len(stated) != 1 or any(len(v) > 1 for v in values.values()):
        return None
    attribute, value = stated[0]
    if getattr(mentions[0], attribute) is not None:
        return None
    return Fact("attribute", mentions[0], attribute, value)


def _matches(mention, referent):
    return mention.shape == referent.shape and all(
        getattr(referent, a) is None or getattr(mention, a) == getattr(referent, a)
        for a in tw.ATTRIBUTES
    )


def only_allows(fact, mention):
    """Whether an `only` fact allows a caption's mention: one of its objects' shapes, with that
    object's colour or none (size and place do not matter)."""
    return any(
        mention.shape == a.shape and mention.colour in (None, a.colour) for a in fact.allowed
    )


def judge_fact(fact, mentions, background):
    """Returns the exact Decision(0/1, rationale) for `fact` on a caption's parsed content."""
    if fact.kind in ("present", "absent", *COLOUR_KINDS):
        if fact.kind in COLOUR_KINDS:
            named = any(m.colour == fact.value for m in mentions)
        else:
            named = any(_matches(m, fact.referent) for m in mentions)
        if fact.kind in ("present", "colour"):
            return roles.Decision(int(named), "it is named" if named else "it is not named")
        return roles.Decision(int(not named), "it is mentioned" if named else "it is not mentioned")
    if fact.kind in COUNT_KINDS:
        named = sum(m.shape == fact.referent.shape for m in mentions)
        limit = COUNT_WORDS.index(fact.value) + 1
        met = named <= limit if fact.kind == "at_most" else named >= limit
        return roles.Decision(
            int(met), f"it names {named} {fact.referent.shape}" + "s" * (named != 1)
        )
    if fact.kind == "only":
        invented = [m for m in mentions if not only_allows(fact, m)]
        if invented:
            return roles.Decision(0, f"it names a {_referent_phrase(invented[0])}")
        return roles.Decision(1, "it names nothing else")
    if fact.kind == "background":
        if background is None:
            return roles.Decision(0, "the background is not given")
        return roles.Decision(int(background == fact.value), f"it is called {background}")
    candidates = [m for m in mentions if _matches(m, fact.referent)]
    if not candidates:
        return roles.Decision(0, f"no such {fact.referent.shape} is named")
    stated = [getattr(m, fact.attribute) for m in candidates]
    if fact.value in stated:
        return roles.Decision(1, f"it is {_value_phrase(fact.attribute, fact.value)}")
    given = [v for v in stated if v is not None]
    if not given:
        return roles.Decision(0, f"its {fact.attribute} is not given")
    return roles.Decision(0, f"it is {_value_phrase(fact.attribute, given[0])}")


# How a toy Judge target's rationale is written (config data.judge_rationale): "verdict", the
# lookup's outcome (`judge_fact`: "it is named", "it names 2 circles"); "mentions", the caption's
# mentions of the item's shape copied out (`mentions_rationale`), from which every
# presence, absence and count decision follows.
RATIONALES = ("verdict", "mentions")


def mentions_rationale(fact, mentions):
    """Returns, for a presence, absence or count fact, the caption's mentions of the fact's shape
    in caption order -- "it names blue circle, red circle" or "it names no circle" -- else None
    (other kinds keep `judge_fact`'s rationale). The decision is then a function of the copied
    words: is "blue circle" among them, how many are there."""
    if fact.kind not in ("present", "absent", *COUNT_KINDS):
        return None
    shape = fact.referent.shape
    named = [" ".join(w for w in (m.colour, shape) if w) for m in mentions if m.shape == shape]
    return "it names " + (", ".join(named) if named else f"no {shape}")


def _scene_content(scene):
    return [tw.Mention(o.shape, o.colour, o.size, o.position) for o in scene.objects]


def fact_is_true(scene, fact):
    """Returns whether `fact` holds of the scene (a complete caption of it meets the item)."""
    return bool(judge_fact(fact, _scene_content(scene), scene.background).value)


def rubric_truth_rate(scene, rubric_items):
    """Returns (fraction of items true of the scene, number of items in no known template).

    Items the world's language cannot read count as not true: the Judge could not check them.
    """
    return truth_rate_of_kinds(rubric_truth_by_kind(scene, rubric_items)[0])


def truth_rate_of_kinds(by_kind):
    """Returns `rubric_truth_rate`'s (fraction true, number unreadable) from the first output of
    `rubric_truth_by_kind`; (0.0, 0) for an empty rubric."""
    true = sum(t for t, _ in by_kind.values())
    total = sum(n for _, n in by_kind.values())
    return (true / total if total else 0.0), by_kind.get("unreadable", [0, 0])[1]


def rubric_truth_by_kind(scene, rubric_items):
    """Returns ({`report_kind` or "unreadable": [items true of the scene, items]}, swapped) of one
    rubric: swapped counts the false "mentions a <colour> <shape>" items whose colour and shape the
    scene both has, on different objects (a binding error: the objects seen, a colour put on the
    wrong one), against those that name a colour or a shape the scene lacks."""
    by_kind, swapped = {}, 0
    colours, shapes = {o.colour for o in scene.objects}, {o.shape for o in scene.objects}
    for item in rubric_items:
        fact = parse_criterion(item.criterion)
        true = fact is not None and fact_is_true(scene, fact)
        counts = by_kind.setdefault("unreadable" if fact is None else report_kind(fact), [0, 0])
        counts[0] += true
        counts[1] += 1
        if fact is not None and fact.kind == "present" and not true and fact.referent.colour:
            swapped += fact.referent.shape in shapes and fact.referent.colour in colours
    return by_kind, swapped


def judge_accuracy(rubric_items, caption, decisions):
    """Returns (fraction of readable items the Judge decided right, number of unreadable items)."""
    mentions, background = tw.parse_caption(caption)
    facts = [parse_criterion(item.criterion) for item in rubric_items]
    scored = [(f, d) for f, d in zip(facts, decisions) if f is not None]
    if not scored:
        return 0.0, len(facts)
    right = sum(
        judge_fact(f, mentions, background).value == int(getattr(d, "value", d)) for f, d in scored
    )
    return right / len(scored), len(facts) - len(scored)


def _no_decisions():
    return dict(tp=0, fn=0, tn=0, fp=0, unreadable=0)


def report_kind(fact):
    """Returns the kind a fact's Judge decisions are counted under: its kind, except that a
    colourless absent item (`absent_shapes`: "does not mention a star", a word lookup) is
    "absent_shape", apart from the pair absent items (which bind a colour to a shape)."""
    if fact.kind == "absent" and fact.referent.colour is None:
        return "absent_shape"
    return fact.kind


def judge_confusion(rubric_items, caption, decisions, by_kind=False):
    """Returns counts {"tp", "fn", "tn", "fp", "unreadable"} of a Judge's decisions on one caption.

    Positive = the caption truly meets the item. With these, `balanced_accuracy` is the mean
    of the true-positive and true-negative rates, which an always-"1" Judge scores 0.5 on.
    by_kind=True: {`report_kind` (present / absent / absent_shape / at_most / at_least / attribute /
    background / only, "unreadable"): counts}.
    """
    mentions, background = tw.parse_caption(caption)
    counts = {}
    for item, decision in zip(rubric_items, decisions):
        fact = parse_criterion(item.criterion)
        said = int(getattr(decision, "value", decision))
        right = fact is not None and judge_fact(fact, mentions, background).value == said
        count_decision(counts, fact, said, right)
    return counts if by_kind else pooled_confusion(counts)


def count_decision(counts, fact, said, right):
    """Counts one Judge decision (said 0/1, right or not) of `fact` (None: unreadable) into
    counts, {`report_kind` or "unreadable": confusion counts} (in place)."""
    bucket = counts.setdefault("unreadable" if fact is None else report_kind(fact), _no_decisions())
    if fact is None:
        bucket["unreadable"] += 1
    else:
        bucket[("t" if right else "f") + ("p" if said else "n")] += 1


def is_recoloured(fact, mentions):
    """Whether a presence item "mentions a <colour> <shape>" is unmet on a caption that names its
    shape (in other colours): the case where a Judge that checks the shape word alone says "1"
    (measured on RL's samples, docs/results.md session 16: 45-99% passed)."""
    if fact is None or fact.kind != "present" or fact.referent.colour is None:
        return False
    shape = fact.referent.shape
    return any(m.shape == shape for m in mentions) and not any(
        _matches(m, fact.referent) for m in mentions
    )


def count_recoloured(tally, fact, mentions, said):
    """Counts one decision into tally [passed, total] (in place) when `is_recoloured`: the
    Judge passed (said 1) an unmet presence item whose shape the caption names."""
    if is_recoloured(fact, mentions):
        tally[0] += int(said)
        tally[1] += 1


def add_confusion(total, by_kind):
    """Adds the counts of {kind: confusion counts} into total, {kind: counts} (in place)."""
    for kind, counts in by_kind.items():
        for key, count in counts.items():
            total.setdefault(kind, dict.fromkeys(counts, 0))[key] += count


def pooled_confusion(by_kind):
    """Returns the confusion counts of {kind: counts} summed over kinds."""
    return {key: sum(counts[key] for counts in by_kind.values()) for key in _no_decisions()}


def balanced_accuracy(counts):
    """Returns (TPR + TNR) / 2 of confusion counts (a rate without cases counts as 1)."""
    tpr = counts["tp"] / (counts["tp"] + counts["fn"]) if counts["tp"] + counts["fn"] else 1.0
    tnr = counts["tn"] / (counts["tn"] + counts["fp"]) if counts["tn"] + counts["fp"] else 1.0
    return (tpr + tnr) / 2
