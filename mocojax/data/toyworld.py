"""The toy world: seeded shape scenes whose every caption, rubric and judgement is checkable.

A scene is 1-4 objects on a plain background; each object has a shape, a colour, a size and a
cell of a 3x3 grid (one object per cell, one object per shape+colour). This module draws
scenes, writes captions in the world's small language (paraphrased, reordered, or with
controlled errors), parses that language back, and scores captions exactly against the scene.
Rubrics, Judge decisions, SFT records and the tokenizer live in `toyroles.py`.

    python -m mocojax.data.toyworld --contact-sheet docs/img/toyworld_100.png
"""

import argparse
import dataclasses
import re

import numpy as np

# Split out (move only, #14); re-exported so `toyworld.<name>` keeps working.
from mocojax.data.toyworld_scenes import (  # noqa: F401
    ATTRIBUTES,
    BACKGROUNDS,
    COLOURS,
    POSITIONS,
    SHAPES,
    SIZES,
    Mention,
    Obj,
    Scene,
    _shape_points,
    contact_sheet,
    make_scene,
    make_scenes,
    render,
    scene_id,
)

# Synonyms the captions use, mapped to canonical words by the parser.
SIZE_WORDS = {"small": "small", "little": "small", "large": "large", "big": "large"}
_BACKGROUND_WORDS = {"white": "white", "gray": "gray", "grey": "gray", "black": "black"}
_VERTICAL = {"top": "top", "upper": "top", "bottom": "bottom", "lower": "bottom"}
_HORIZONTAL = {"left": "left", "right": "right"}
_CENTRE = {"center", "centre", "middle"}
_SEPARATORS = {",", ".", ";", ":", "and"}

INTROS = ("The image shows", "There is", "We see", "This picture contains", "It shows")
VERBS = ("sits", "is", "appears", "can be seen")
_CORNER_FORMS = ("in the {v} {h}", "at the {v} {h}", "in the {v} {h} corner", "in the {vs} {h}")
_EDGE_V_FORMS = ("at the {v}", "in the {v} middle", "at the {v} center", "along the {v}")
_EDGE_H_FORMS = ("on the {h}", "at the {h}", "in the middle {h}", "on the {h} side")
_CENTRE_FORMS = ("in the center", "in the middle", "at the centre")


def _position_phrase(position, rng):
    """Returns a paraphrase of `position`, e.g. 'in the upper left corner'."""
    words = position.split()
    if position == "center":
        return str(rng.choice(_CENTRE_FORMS))
    if len(words) == 2:
        synonym = {"top": "upper", "bottom": "lower"}[words[0]]
        form = str(rng.choice(_CORNER_FORMS))
        return form.format(v=words[0], vs=synonym, h=words[1])
    if position in ("top", "bottom"):
        return str(rng.choice(_EDGE_V_FORMS)).format(v=position)
    return str(rng.choice(_EDGE_H_FORMS)).format(h=position)


def _noun_phrase(mention, rng, article="a"):
    """Returns 'a large red circle in the top left' with only the attributes mentioned."""
    words = [article]
    if mention.size:
        synonyms = [w for w, canon in SIZE_WORDS.items() if canon == mention.size]
        words.append(str(rng.choice(synonyms)))
    if mention.colour:
        words.append(mention.colour)
    words.append(mention.shape)
    if mention.position:
        words.append(_position_phrase(mention.position, rng))
    return " ".join(words)


def _join(phrases):
    """Returns 'x', 'x and y' or 'x, y and z'."""
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def write_caption(mentions, background, rng):
    """Returns a caption stating `mentions` (in the given order) and the background if not None.

    The sentence frame, synonyms and position phrasing are drawn from `rng`, so captions of
    the same content vary in wording but always parse back to the same content.
    """
    style = int(rng.integers(3)) if mentions else 2
    bg = background
    if bg == "gray" and rng.random() < 0.3:
        bg = "grey"
    if style == 0 and mentions:
        phrases = [_noun_phrase(m, rng) for m in mentions]
        caption = f"{rng.choice(INTROS)} {_join(phrases)}"
        return caption + (f", on a {bg} background." if bg else ".")
    if style == 1 and mentions:
        sentences = []
        for mention in mentions:
            phrase = _noun_phrase(dataclasses.replace(mention, position=None), rng)
            verb = str(rng.choice(VERBS))
            tail = f" {verb} {_position_phrase(mention.position, rng)}" if mention.position else ""
            sentences.append(phrase[0].upper() + phrase[1:] + tail + ".")
        if bg:
            sentences.append(f"The background is {bg}.")
        return " ".join(sentences)
    phrases = [_noun_phrase(m, rng) for m in mentions]
    if bg and phrases:
        return f"On a {bg} background there is {_join(phrases)}."
    if phrases:
        return f"There is {_join(phrases)}."
    return f"An empty {bg} background." if bg else "An empty picture."


def _mention_of(obj):
    return Mention(obj.shape, obj.colour, obj.size, obj.position)


def terse_caption(scene, seed, k, drop):
    """Returns a caption that leaves out each object with probability `drop` (at least one kept),
    like a human or teacher caption that skips details; deterministic in (seed, scene, k)."""
    rng = np.random.default_rng([seed, 13, k, *map(ord, scene.id)])
    keep = [i for i in rng.permutation(len(scene.objects)) if rng.random() >= drop]
    keep = keep or [int(rng.integers(len(scene.objects)))]
    return write_caption([_mention_of(scene.objects[i]) for i in keep], scene.background, rng)


def reference_captions(scene, seed, count=3):
    """Returns `count` complete captions of the scene, varied in order, frame and wording."""
    rng = np.random.default_rng([seed, 1, *map(ord, scene.id)])
    captions = []
    for _ in range(count):
        order = rng.permutation(len(scene.objects))
        captions.append(
            write_caption([_mention_of(scene.objects[i]) for i in order], scene.background, rng)
        )
    return captions


ERROR_TYPES = (
    "missing_object",
    "wrong_colour",
    "wrong_size",
    "wrong_position",
    "hallucinated_object",
    "missing_background",
)


def _apply_error(scene, mentions, background, error, rng, swap_colours=0.0):
    """Returns (mentions, background) with `error` applied, or None if it cannot apply.

    swap_colours: the chance that the colour an error gives a mention ("wrong_colour", the new
    colour of a "repeated_object", the pair of a "hallucinated_object") is one the scene shows on
    another object (a swap, when one fits) instead of any colour that fits; no draw is made for
    it at 0, so the default captions do not change."""
    scene_colours = {o.colour for o in scene.objects}

    def pick(options, swapped):  # swapped(option): the option puts a seen colour elsewhere
        if swap_colours and rng.random() < swap_colours:
            options = [o for o in options if swapped(o)] or options
        return options[int(rng.integers(len(options)))]

    used_pairs = {(o.shape, o.colour) for o in scene.objects}
    used_cells = {m.position for m in mentions} | {o.position for o in scene.objects}
    if error == "missing_object":
        if len(mentions) < 2:
            return None
        drop = int(rng.integers(len(mentions)))
        return mentions[:drop] + mentions[drop + 1 :], background
    if error == "missing_background":
        return (mentions, None) if background else None
    if error == "repeated_object":
        # A second mention of a shape the caption names: the same colour in another cell, or a
        # colour no object of that shape has (what a Policy's repeats and recolourings look like).
        free_cells = [p for p in POSITIONS if p not in used_cells]
        if not free_cells or not mentions:
            return None
        base = mentions[int(rng.integers(len(mentions)))]
        colours = [base.colour] + [c for c in COLOURS if (base.shape, c) not in used_pairs]
        extra = Mention(
            base.shape,
            pick(colours, lambda c: c in scene_colours),  # the base's own colour included
            SIZES[int(rng.integers(2))],
            free_cells[int(rng.integers(len(free_cells)))],
        )
        at = int(rng.integers(len(mentions) + 1))
        return mentions[:at] + [extra] + mentions[at:], background
    if error == "hallucinated_object":
        free_pairs = [(s, c) for s in SHAPES for c in COLOURS if (s, c) not in used_pairs]
        free_cells = [p for p in POSITIONS if p not in used_cells]
        if not free_cells:
            return None
        shapes = {o.shape for o in scene.objects}
        shape, colour = pick(free_pairs, lambda p: p[0] in shapes and p[1] in scene_colours)
        extra = Mention(
            shape,
            colour,
            SIZES[int(rng.integers(2))],
            free_cells[int(rng.integers(len(free_cells)))],
        )
        at = int(rng.integers(len(mentions) + 1))
        return mentions[:at] + [extra] + mentions[at:], background
    k = int(rng.integers(len(mentions)))
    mention = mentions[k]
    if error == "wrong_colour":
        # Never a colour another object of this shape has: that would be a different object.
        options = [c for c in COLOURS if (mention.shape, c) not in used_pairs]
        new = dataclasses.replace(mention, colour=pick(options, lambda c: c in scene_colours))
    elif error == "wrong_size":
        new = dataclasses.replace(mention, size="small" if mention.size == "large" else "large")
    else:
        options = [p for p in POSITIONS if p != mention.position]
        new = dataclasses.replace(mention, position=options[int(rng.integers(len(options)))])
    return mentions[:k] + [new] + mentions[k + 1 :], background


def _with_errors(scene, mentions, background, todo, rng, swap_colours=0.0):
    """Returns (mentions, background, the errors of `todo` that applied), applied in order."""
    errors = []
    for error in todo:
        applied = _apply_error(scene, mentions, background, error, rng, swap_colours)
        if applied is not None:
            (mentions, background), errors = applied, errors + [error]
    return mentions, background, errors


def candidate_captions(scene, seed, count=4):
    """Returns `count` dicts {id, caption, errors}: captions with 0-2 controlled errors each."""
    rng = np.random.default_rng([seed, 2, *map(ord, scene.id)])
    candidates = []
    for j in range(count):
        mentions = [_mention_of(scene.objects[i]) for i in rng.permutation(len(scene.objects))]
        background, errors = scene.background, []
        for _ in range(int(rng.choice(3, p=[0.15, 0.5, 0.35]))):
            error = ERROR_TYPES[int(rng.integers(len(ERROR_TYPES)))]
            applied = _apply_error(scene, mentions, background, error, rng)
            if applied is not None:
                (mentions, background), errors = applied, errors + [error]
        candidates.append(
            {
                "id": f"{scene.id}/cand{j}",
                "caption": write_caption(mentions, background, rng),
                "errors": errors,
            }
        )
    return candidates


# Kinds of "weak" caption, with their odds: what a Policy early in RL writes (RL-like role data).
WEAK_KINDS = {"errors": 0.55, "blind": 0.2, "partial": 0.2, "complete": 0.05}


def weak_captions(scene, seed, count=4, salt=0, swap_colours=0.0):
    """Returns `count` dicts {id, caption, errors, kind}: captions like an untrained Policy's.

    kind "errors": 1-4 controlled errors (repeats allowed, so two invented objects happen);
    "blind": a complete caption of another scene of the world (written without the image);
    "partial": one object only, sometimes with a wrong attribute; "complete": no error.
    Over 2,000 captions of seed 0 the mean F1 is 0.62 (`candidate_captions`: 0.87).
    swap_colours: `_apply_error`'s chance that an error's colour is another object's colour. At 0,
    23% of the wrong colours on a shape of the scene are (seed 2, 300 scenes); of those RL's
    Policy writes, 97% are (a colour it sees, put on the wrong shape; docs/results.md, session 24).
    """
    rng = np.random.default_rng([seed, 4, salt, *map(ord, scene.id)])
    kinds, odds = list(WEAK_KINDS), list(WEAK_KINDS.values())
    captions = []
    for j in range(count):
        kind = kinds[int(rng.choice(len(kinds), p=odds))]
        errors = []
        if kind == "blind":
            other = make_scene(seed + 104729, int(rng.integers(1 << 30)))
            order = rng.permutation(len(other.objects))
            caption = write_caption(
                [_mention_of(other.objects[i]) for i in order], other.background, rng
            )
        else:
            mentions = [_mention_of(scene.objects[i]) for i in rng.permutation(len(scene.objects))]
            background = scene.background
            if kind == "partial":
                mentions = mentions[:1]
                background = background if rng.random() < 0.5 else None
                todo = [ERROR_TYPES[int(rng.integers(1, 4))]] if rng.random() < 0.5 else []
            elif kind == "errors":
                todo = [
                    ERROR_TYPES[int(rng.integers(len(ERROR_TYPES)))]
                    for _ in range(int(rng.integers(1, 5)))
                ]
            else:
                todo = []
            mentions, background, errors = _with_errors(
                scene, mentions, background, todo, rng, swap_colours
            )
            caption = write_caption(mentions, background, rng)
        captions.append(
            {"id": f"{scene.id}/weak{salt}-{j}", "caption": caption, "errors": errors, "kind": kind}
        )
    return captions


def repeat_captions(scene, seed, count=2, salt=0):
    """Returns `count` dicts {id, caption, errors, kind "repeat"}: the scene's caption with, half
    the time, one more error of ERROR_TYPES, then a second mention of a shape it names
    (`_apply_error`'s "repeated_object"), so it names that shape more often than the scene has it.

    Weak captions rarely do (6% of the count items they are judged on are unmet, seed 4), while
    RL's samples repeat and recolour objects; these give a Judge the unmet count items to learn
    from (`data.judge_repeats`). A caption that cannot take the repeat (no free cell) is the
    scene's caption with its errors alone.
    """
    rng = np.random.default_rng([seed, 5, salt, *map(ord, scene.id)])
    captions = []
    for j in range(count):
        mentions = [_mention_of(scene.objects[i]) for i in rng.permutation(len(scene.objects))]
        todo = [ERROR_TYPES[int(rng.integers(len(ERROR_TYPES)))]] if rng.random() < 0.5 else []
        mentions, background, errors = _with_errors(
            scene, mentions, scene.background, todo + ["repeated_object"], rng
        )
        captions.append(
            {
                "id": f"{scene.id}/repeat{salt}-{j}",
                "caption": write_caption(mentions, background, rng),
                "errors": errors,
                "kind": "repeat",
            }
        )
    return captions


def recolour_captions(scene, seed, count=2, salt=0):
    """Returns `count` dicts {id, caption, errors, kind "recolour"}: the scene's caption with one
    object (two, half the time, when the scene has two) named in a colour no object of its shape
    has (`_apply_error`'s "wrong_colour"), so a presence item "mentions a <colour> <shape>" is
    unmet although the caption names the shape.

    Measured (docs/results.md, session 16): a learned Judge passed 45-92% of such items on RL's
    samples in the first 100 updates and 88-99% in the last (it read "mentions a red square" as
    "names a square"), so the Policy was paid for a square in any colour; the Judge's other
    captions give it few of them (a third of its unmet presence items). `data.judge_recolours` puts these
    in the Judge's captions.
    """
    rng = np.random.default_rng([seed, 7, salt, *map(ord, scene.id)])
    captions = []
    for j in range(count):
        mentions = [_mention_of(scene.objects[i]) for i in rng.permutation(len(scene.objects))]
        todo = ["wrong_colour"] * (1 + int(len(mentions) > 1 and rng.random() < 0.5))
        mentions, background, errors = _with_errors(scene, mentions, scene.background, todo, rng)
        captions.append(
            {
                "id": f"{scene.id}/recolour{salt}-{j}",
                "caption": write_caption(mentions, background, rng),
                "errors": errors,
                "kind": "recolour",
            }
        )
    return captions


def fragment_captions(scene, seed, count=2, salt=0):
    """Returns `count` dicts {id, caption, errors, kind "fragment"}: what a Policy writes when RL
    has collapsed it, each one of (drawn evenly)
    - the background alone ("On a gray background.", "The background is gray."), and
    - the scene's caption cut after its first 2..n-1 words ("A large blue circle can.").

    Weak captions always name an object, so a Judge trained on them had never seen a caption
    that names none; measured (docs/results.md, session 15) it passed "mentions a blue circle"
    on "On a gray background." and RL collapsed onto such captions. `data.judge_fragments`
    puts these in the Judge's captions.
    """
    rng = np.random.default_rng([seed, 6, salt, *map(ord, scene.id)])
    bg = scene.background
    captions = []
    for j in range(count):
        if rng.random() < 0.5:
            frames = (f"On a {bg} background.", f"The background is {bg}.", f"A {bg} background.")
            caption, errors = str(frames[int(rng.integers(len(frames)))]), ["background_only"]
        else:
            mentions = [_mention_of(scene.objects[i]) for i in rng.permutation(len(scene.objects))]
            words = write_caption(mentions, bg, rng).rstrip(".").split()
            cut = int(rng.integers(2, max(3, len(words))))
            caption, errors = " ".join(words[:cut]).rstrip(",") + ".", ["truncated"]
        captions.append(
            {
                "id": f"{scene.id}/fragment{salt}-{j}",
                "caption": caption,
                "errors": errors,
                "kind": "fragment",
            }
        )
    return captions


def _words(text):
    """Returns the lower-cased words and separator punctuation of `text`."""
    return re.findall(r"[a-z]+|[,.;:]", text.lower())


def position_of(words):
    """Returns the canonical position named by a run of words, or None."""
    vertical = next((_VERTICAL[w] for w in words if w in _VERTICAL), None)
    horizontal = next((_HORIZONTAL[w] for w in words if w in _HORIZONTAL), None)
    if vertical and horizontal:
        return f"{vertical} {horizontal}"
    if vertical or horizontal:
        return vertical or horizontal
    return "center" if any(w in _CENTRE for w in words) else None


def parse_caption(text):
    """Returns (list[Mention], background or None) stated by a caption in this world's language.

    Size and colour words attach to the next shape word; position words attach to the last
    shape word of their clause (clauses end at punctuation or 'and'). Words it does not know
    are ignored, so any wording that keeps this order parses.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_caption needs text, got {type(text).__name__}")
    mentions, background = [], None
    pending, position_words, clause_has_background = {}, [], False

    def close_position():
        if mentions and position_words:
            where = position_of(position_words)
            if where and mentions[-1].position is None:
                mentions[-1] = dataclasses.replace(mentions[-1], position=where)
        position_words.clear()

    for word in _words(text):
        if word in _SEPARATORS:
            close_position()
            pending, clause_has_background = {}, False
        elif word == "background":
            clause_has_background = True
            if "background" in pending:
                background = pending.pop("background")
        elif word in _BACKGROUND_WORDS:
            if clause_has_background:
                background = _BACKGROUND_WORDS[word]
            else:
                pending["background"] = _BACKGROUND_WORDS[word]
        elif word in SIZE_WORDS:
            close_position()
            pending["size"] = SIZE_WORDS[word]
        elif word in COLOURS:
            close_position()
            pending["colour"] = word
        elif word in SHAPES:
            close_position()
            mentions.append(Mention(word, pending.get("colour"), pending.get("size")))
            pending = {}
        elif word in _VERTICAL or word in _HORIZONTAL or word in _CENTRE:
            position_words.append(word)
    close_position()
    return mentions, background


def _mention_score(mention, obj):
    """Returns the number of facts a mention states correctly about obj (-1: other shape)."""
    if mention.shape != obj.shape:
        return -1
    return 1 + sum(getattr(mention, a) == getattr(obj, a) for a in ATTRIBUTES)


def match_mentions(scene, mentions):
    """Returns a list, per mention, of the index of the scene object it describes or None.

    The matching is one-to-one, same shape only, and maximises the facts stated correctly:
    a dynamic programme over mentions x subsets of objects, so long model captions with many
    mentions stay cheap.
    """
    # best[mask] = (score, assignment) over the mentions seen so far using objects in mask.
    best = {0: (0, ())}
    for mention in mentions:
        step = {}
        for mask, (score, assignment) in best.items():
            options = [(score, assignment + (None,), mask)]
            for k, obj in enumerate(scene.objects):
                gain = _mention_score(mention, obj)
                if gain >= 0 and not mask & (1 << k):
                    options.append((score + gain, assignment + (k,), mask | (1 << k)))
            for new_score, new_assignment, new_mask in options:
                if new_mask not in step or new_score > step[new_mask][0]:
                    step[new_mask] = (new_score, new_assignment)
        best = step
    score, assignment = max(best.values(), key=lambda entry: entry[0])
    return list(assignment)


def caption_metrics(scene, caption):
    """Returns exact fact-level precision, recall, F1 and the hallucinated objects of a caption,
    with the counts behind them: mentions, objects missed, and per attribute (colour, size,
    position) how often a matched mention stated it and stated it right.

    Facts: each object's existence, colour, size and position, and the background colour.
    A stated fact is correct when the mention is matched to a scene object (same shape) with
    that attribute; every fact of an unmatched mention is wrong, and that mention is a
    hallucinated object.
    """
    mentions, background = parse_caption(caption)
    assignment = match_mentions(scene, mentions)
    stated = correct = 0
    hallucinated = []
    # per attribute, over the mentions matched to an object: [stated, stated right]
    attributes = {a: [0, 0] for a in ATTRIBUTES}
    for mention, k in zip(mentions, assignment):
        facts = 1 + sum(getattr(mention, a) is not None for a in ATTRIBUTES)
        stated += facts
        if k is None:
            hallucinated.append(mention)
            continue
        correct += _mention_score(mention, scene.objects[k])
        for a in ATTRIBUTES:
            if getattr(mention, a) is not None:
                attributes[a][0] += 1
                attributes[a][1] += getattr(mention, a) == getattr(scene.objects[k], a)
    if background is not None:
        stated += 1
        correct += background == scene.background
    total = 4 * len(scene.objects) + 1
    precision = correct / stated if stated else 0.0
    recall = correct / total
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "hallucinated": hallucinated,
        "num_mentions": len(mentions),
        "missing_objects": len(scene.objects) - sum(k is not None for k in assignment),
        "num_objects": len(scene.objects),
        "attributes": {a: tuple(counts) for a, counts in attributes.items()},
    }


def caption_breakdown(metrics):
    """Returns what a list of caption_metrics dicts says about the captions' objects and
    attributes (pooled over captions): object_recall (scene objects some mention matched),
    object_precision (mentions matched to an object), and per attribute a the share of matched
    mentions stating it (`<a>_stated`) and the share of those right (`<a>_accuracy`).

    F1 counts three attribute facts per object, so a caption can gain or lose F1 through its
    attributes with the same objects: these say which (docs/results.md, session 10).
    """
    objects = sum(m["num_objects"] for m in metrics)
    mentions = sum(m["num_mentions"] for m in metrics)
    matched = objects - sum(m["missing_objects"] for m in metrics)  # one object per mention
    out = {
        "object_recall": matched / objects if objects else 0.0,
        "object_precision": matched / mentions if mentions else 0.0,
    }
    for a in ATTRIBUTES:
        stated = sum(m["attributes"][a][0] for m in metrics)
        right = sum(m["attributes"][a][1] for m in metrics)
        out[f"{a}_stated"] = stated / matched if matched else 0.0
        out[f"{a}_accuracy"] = right / stated if stated else 0.0
    return out


def main(argv=None):
    """Writes the contact sheet named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contact-sheet", required=True, help="PNG path to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=100)
    args = parser.parse_args(argv)
    contact_sheet(args.seed, args.count).save(args.contact_sheet, optimize=True)


if __name__ == "__main__":
    main()
