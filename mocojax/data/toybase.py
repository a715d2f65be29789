"""The toy base model's pretraining tasks: teach the tiny VLM to see and read the toy world.

The paper starts from a pretrained Qwen3-VL that already sees and reads; the toy model starts
from random weights. These tasks are the analogue of that pretraining: generic questions
about the picture and about caption text, *not* the role prompts (no rubric, no judging
format), so the roles are still taught by Stage I. Every answer is exact, so the base can be
scored task by task (`score`).

Image tasks (carried in the "policy" loss slot, with the scene as image):
  object    "What is in the picture?"              -> "a large red circle at the top left",
            on a one-object scene of its own (the easiest way into vision)
  grid      "List the objects cell by cell."       -> row-major listing + background
  cell      "What is at the top left?"             -> "a large red circle" | "nothing"
  find      "Where is the red circle?"             -> "at the top left" | "there is no red circle"
  count     "How many objects are there?"          -> "3"
  caption   "Write a caption."                     -> one of the world's reference captions
Text tasks (carried in the "judge" loss slot, no image; they teach reading a caption):
  read      "Caption: ... List the objects it names."  -> canonical listing of the parse
  names     "Caption: ... Does it name a red circle?"  -> "yes" | "no"
  attr      "Caption: ... What colour is the circle?"  -> "red" | "not given" | "no circle"
  check     "Caption: ... Does it name each item? ..." + "1 | a red circle" lines
            -> "1 | yes" lines: names for 3-6 objects at once, numbered as rubric lines are;
            half named, the rest mostly a named shape in another colour (off by default)
  bind      the names question with negatives that need binding: half named, ~35% a colour
            and a shape the caption names on two different objects, the rest random (off by
            default; names alone is learned as "are both words there", docs/results.md)

Captions read by the text tasks mix references, the world's erroneous candidates and
"blind" captions (random scenes' references), so reading is learned on wrong text too.
"""

import collections

import numpy as np

from mocojax import roles
from mocojax.data import toyworld as tw

IMAGE_TASKS = ("object", "grid", "cell", "find", "count", "caption")
TEXT_TASKS = ("read", "names", "attr", "check", "bind", "truth", "truthattr")
TASKS = IMAGE_TASKS + TEXT_TASKS
# Records per scene and task (a scene's image is rendered once per record). `check`, `bind`,
# `truth` and `truthattr` are last in TASKS and 0 here, so the shipped base's records are
# unchanged by them. `truthattr`: `truth` asked about attribute items only (the weakest kind).
DEFAULT_TASK_MIX = {
    "object": 2,
    "grid": 1,
    "cell": 2,
    "find": 1,
    "count": 0,
    "caption": 1,
    "read": 1,
    "names": 1,
    "attr": 1,
    "check": 0,
    "bind": 0,
    "truth": 0,
    "truthattr": 0,
}

OBJECT_PROMPT = "What is in the picture?"
GRID_PROMPT = "List the objects cell by cell."
COUNT_PROMPT = "How many objects are there?"
CAPTION_PROMPT = "Write a caption."
READ_PROMPT = "List the objects it names."
CHECK_PROMPT = "Does it name each item? One line per item."
TRUTH_PROMPT = roles.JUDGE_CHECK_PROMPT  # then a rubric criterion (shipped tokenizer words only)
CHECK_ITEMS = (3, 6)  # items per check question, inclusive
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def describe(mention):
    """Returns 'large red circle at the top left' with only the attributes a mention states."""
    words = [w for w in (mention.size, mention.colour, mention.shape) if w]
    return " ".join(words) + (f" at the {mention.position}" if mention.position else "")


def grid_listing(scene):
    """Returns the scene listed in row-major cell order: 'top left: large red circle. ... background: white.'"""
    by_cell = {o.position: o for o in scene.objects}
    parts = [
        f"{cell}: {o.size} {o.colour} {o.shape}."
        for cell in tw.POSITIONS
        if (o := by_cell.get(cell))
    ]
    return " ".join(parts + [f"background: {scene.background}."])


def read_listing(mentions, background):
    """Returns the canonical listing of a parsed caption, in the caption's own order."""
    parts = [describe(m) + "." for m in mentions] or ["no objects."]
    return " ".join(parts + [f"background: {background or 'not given'}."])


def _mention(obj):
    return tw.Mention(obj.shape, obj.colour, obj.size, obj.position)


def _some_caption(scene, seed, rng):
    """Returns a caption of the scene that is right, partly wrong, or written blind."""
    kind = int(rng.integers(3))
    if kind == 0:
        return str(rng.choice(tw.reference_captions(scene, seed)))
    if kind == 1:
        return str(rng.choice([c["caption"] for c in tw.candidate_captions(scene, seed)]))
    other = tw.make_scene(seed + 7919, int(rng.integers(1 << 30)))
    return str(rng.choice(tw.reference_captions(other, seed)))


def _record(scene, task, k, prompt, target, caption=None):
    record = {
        "id": f"{scene.id}/base-{task}{k}",
        "role": "judge" if task in TEXT_TASKS else "policy",
        "task": task,
        "scene_id": scene.id,
        "prompt": prompt,
        "target": target,
    }
    if caption is None:
        record["scene"] = scene
    else:
        record["caption"] = caption
    return record


def scene_base_records(scene, seed, task_mix=None):
    """Returns the base-task records of one scene (see the module doc); deterministic in (seed, scene)."""
    task_mix = DEFAULT_TASK_MIX if task_mix is None else task_mix
    unknown = set(task_mix) - set(TASKS)
    if unknown:
        raise ValueError(f"unknown base tasks {sorted(unknown)}; known: {TASKS}")
    rng = np.random.default_rng([seed, 11, *map(ord, scene.id)])
    by_cell = {o.position: o for o in scene.objects}
    pairs = {(o.shape, o.colour): o for o in scene.objects}
    records = []
    for task in TASKS:
        for k in range(task_mix.get(task, 0)):
            if task == "object":
                single = tw.make_scene(seed, int(rng.integers(1 << 30)), max_objects=1)
                single = tw.Scene(f"{scene.id}-single{k}", single.background, single.objects)
                record = _record(
                    single, task, k, OBJECT_PROMPT, "a " + describe(_mention(single.objects[0]))
                )
                records.append(dict(record, id=f"{scene.id}/base-{task}{k}", scene_id=scene.id))
            elif task == "grid":
                records.append(_record(scene, task, k, GRID_PROMPT, grid_listing(scene)))
            elif task == "cell":
                # Half the questions ask about an occupied cell.
                if rng.random() < 0.5:
                    cell = scene.objects[int(rng.integers(len(scene.objects)))].position
                else:
                    cell = tw.POSITIONS[int(rng.integers(len(tw.POSITIONS)))]
                obj = by_cell.get(cell)
                answer = f"a {obj.size} {obj.colour} {obj.shape}" if obj else "nothing"
                records.append(_record(scene, task, k, f"What is at the {cell}?", answer))
            elif task == "find":
                if rng.random() < 0.6:
                    obj = scene.objects[int(rng.integers(len(scene.objects)))]
                    shape, colour = obj.shape, obj.colour
                else:
                    shape = tw.SHAPES[int(rng.integers(len(tw.SHAPES)))]
                    colour = list(tw.COLOURS)[int(rng.integers(len(tw.COLOURS)))]
                obj = pairs.get((shape, colour))
                answer = f"at the {obj.position}" if obj else f"there is no {colour} {shape}"
                records.append(_record(scene, task, k, f"Where is the {colour} {shape}?", answer))
            elif task == "count":
                records.append(
                    _record(scene, task, k, COUNT_PROMPT, NUMBER_WORDS[len(scene.objects)])
                )
            elif task == "caption":
                captions = tw.reference_captions(scene, seed + 1, 3)
                records.append(_record(scene, task, k, CAPTION_PROMPT, captions[k % 3]))
            else:
                caption = _some_caption(scene, seed, rng)
                mentions, background = tw.parse_caption(caption)
                records.append(_text_record(scene, task, k, caption, mentions, background, rng))
    return records


def _text_record(scene, task, k, caption, mentions, background, rng):
    if task == "read":
        return _record(
            scene,
            task,
            k,
            f"Caption: {caption}\n{READ_PROMPT}",
            read_listing(mentions, background),
            caption,
        )
    if task == "check":
        return _check_record(scene, k, caption, mentions, rng)
    if task == "bind":
        return _bind_record(scene, k, caption, mentions, rng)
    if task in ("truth", "truthattr"):
        kinds = ("attribute",) if task == "truthattr" else None
        return _truth_record(scene, k, caption, mentions, background, rng, kinds, task)
    if task == "names":
        if mentions and rng.random() < 0.5:
            m = mentions[int(rng.integers(len(mentions)))]
            shape, colour = m.shape, m.colour or "red"
        else:
            shape = tw.SHAPES[int(rng.integers(len(tw.SHAPES)))]
            colour = list(tw.COLOURS)[int(rng.integers(len(tw.COLOURS)))]
        named = any(m.shape == shape and m.colour == colour for m in mentions)
        return _record(
            scene,
            task,
            k,
            f"Caption: {caption}\nDoes it name a {colour} {shape}?",
            "yes" if named else "no",
            caption,
        )
    # attr: an attribute of an object the caption may or may not name; a shape named twice is
    # asked about with its colour, so every question has one answer.
    attribute = tw.ATTRIBUTES[int(rng.integers(len(tw.ATTRIBUTES)))]
    if mentions and rng.random() < 0.8:
        m = mentions[int(rng.integers(len(mentions)))]
        shape, colour = m.shape, None
        if sum(n.shape == shape for n in mentions) > 1 and m.colour:
            colour = m.colour
            if attribute == "colour":
                attribute = "size"
    else:
        shape, colour = tw.SHAPES[int(rng.integers(len(tw.SHAPES)))], None
    question = {"colour": "What colour is", "size": "What size is", "position": "Where is"}[
        attribute
    ]
    noun = f"{colour} {shape}" if colour else shape
    named = [m for m in mentions if m.shape == shape and (colour is None or m.colour == colour)]
    if not named:
        answer = f"no {noun} is named"
    else:
        value = getattr(named[0], attribute)
        answer = (
            "not given"
            if value is None
            else (f"at the {value}" if attribute == "position" else value)
        )
    return _record(scene, task, k, f"Caption: {caption}\n{question} the {noun}?", answer, caption)


# Shares of bind questions: a pair the caption names, then a colour and a shape it names on two
# different objects (the rest: a random pair).
BIND_NAMED, BIND_CROSSED = 0.5, 0.35


def _bind_record(scene, k, caption, mentions, rng):
    """A names question whose unnamed pairs are mostly crossed: both words are in the caption,
    on different objects, so only reading colour and shape together answers it."""
    named = sorted({(m.colour, m.shape) for m in mentions if m.colour})
    colours = sorted({m.colour for m in mentions if m.colour})
    shapes = sorted({m.shape for m in mentions})
    crossed = [(c, s) for c in colours for s in shapes if (c, s) not in named]
    u = rng.random()
    if named and u < BIND_NAMED:
        colour, shape = named[int(rng.integers(len(named)))]
    elif crossed and u < BIND_NAMED + BIND_CROSSED:
        colour, shape = crossed[int(rng.integers(len(crossed)))]
    else:
        shape = tw.SHAPES[int(rng.integers(len(tw.SHAPES)))]
        colour = list(tw.COLOURS)[int(rng.integers(len(tw.COLOURS)))]
    return _record(
        scene,
        "bind",
        k,
        f"Caption: {caption}\nDoes it name a {colour} {shape}?",
        "yes" if (colour, shape) in named else "no",
        caption,
    )


def truth_facts(scene, caption, mentions):
    """Returns the rubric facts a `truth` question may ask about a caption: the items the exact
    Generator would write for it (`toyroles.rubric_facts`: what it misses, gets wrong or
    invents, filled with the scene's objects and background), a presence item for every
    colour-shape pair it names, the attribute items of every object of the scene and an absent
    item for each crossed pair of the scene (a colour and a shape on different objects), and the
    scene's `mentions only <its objects>` item, each fact once."""
    from mocojax.data import toyroles  # toyroles builds its vocabulary from this module

    facts = toyroles.rubric_facts(scene, [caption], max_items=toyroles.MAX_RUBRIC_ITEMS)
    facts += [toyroles.Fact("present", tw.Mention(m.shape, m.colour)) for m in mentions if m.colour]
    # the attribute items the Generator writes for any of the scene's objects, and an absent item
    # for every pair of a shape and a colour the scene has on different objects
    facts += [
        toyroles.attribute_fact(scene, k, a)
        for k in range(len(scene.objects))
        for a in tw.ATTRIBUTES
    ]
    pairs = {(o.shape, o.colour) for o in scene.objects}
    facts += [
        toyroles.Fact("absent", tw.Mention(a.shape, b.colour))
        for a in scene.objects
        for b in scene.objects
        if (a.shape, b.colour) not in pairs
    ]
    facts += [toyroles.only_fact(scene)] if scene.objects else []
    return list(dict.fromkeys(facts))


def _truth_record(scene, k, caption, mentions, background, rng, kinds=None, task="truth"):
    """A rubric criterion stated about a caption ("Check: mentions a red circle"), answered
    "yes" or "no" from the caption alone: the per-item Judge's question without its role
    prompt. The criterion is one of `truth_facts`; the caption is one side, drawn at random, of
    the minimal pair `toypairs.pair_content` makes for it (mostly a binding swap: the same words,
    an attribute moved to another object), rewritten by the world's caption writer, so within
    each item kind about half the answers are "yes" and only the words the item asks about
    decide. The record's `kind` is the item kind (present / absent / attribute / background /
    only); `kinds` limits the kinds asked (falling back to all when the caption offers none)."""
    from mocojax.data import toypairs, toyroles

    by_kind = collections.defaultdict(list)
    for fact in truth_facts(scene, caption, mentions):
        by_kind[fact.kind].append(fact)
    if kinds and any(by_kind.get(kind) for kind in kinds):
        by_kind = {kind: by_kind[kind] for kind in kinds if by_kind.get(kind)}
    kind = sorted(by_kind)[int(rng.integers(len(by_kind)))]  # every kind about equally often
    fact = by_kind[kind][int(rng.integers(len(by_kind[kind])))]
    pair = toypairs.pair_content(fact, mentions, background, rng)
    if pair is not None:
        chosen_mentions, chosen_background = pair[int(rng.integers(2))]
        caption = tw.write_caption(chosen_mentions, chosen_background, rng)
    decision = toyroles.judge_fact(fact, *tw.parse_caption(caption))
    criterion = toyroles.item_of(fact).criterion
    record = _record(
        scene,
        task,
        k,
        roles.check_question(caption, criterion),
        "yes" if decision.value else "no",
        caption,
    )
    return dict(record, kind=fact.kind)


def _check_record(scene, k, caption, mentions, rng):
    """A multi-item names question: 3-6 distinct (colour, shape) items in random order, half of
    them (as far as the caption allows) named by it; an unnamed item is a named shape in another
    colour when the caption allows (the answer then needs colour and shape together)."""
    named_pairs = sorted({(m.colour, m.shape) for m in mentions if m.colour})
    count = int(rng.integers(CHECK_ITEMS[0], CHECK_ITEMS[1] + 1))
    num_named = min(len(named_pairs), (count + int(rng.integers(2))) // 2)
    items = [named_pairs[int(i)] for i in rng.choice(len(named_pairs), num_named, replace=False)]
    while len(items) < count:
        shape = (
            mentions[int(rng.integers(len(mentions)))].shape
            if mentions and rng.random() < 0.7
            else tw.SHAPES[int(rng.integers(len(tw.SHAPES)))]
        )
        pair = (list(tw.COLOURS)[int(rng.integers(len(tw.COLOURS)))], shape)
        if pair not in items and pair not in named_pairs:
            items.append(pair)
    items = [items[int(i)] for i in rng.permutation(count)]
    lines = "\n".join(f"{j} | a {colour} {shape}" for j, (colour, shape) in enumerate(items, 1))
    answers = "\n".join(
        f"{j} | {'yes' if (colour, shape) in named_pairs else 'no'}"
        for j, (colour, shape) in enumerate(items, 1)
    )
    return _record(
        scene, "check", k, f"Caption: {caption}\n{CHECK_PROMPT}\n{lines}", answers, caption
    )


def check_answers(text):
    """Returns {item number: "yes" | "no"} read from `check` answer lines ("2 | no")."""
    answers = {}
    for line in text.splitlines():
        number, sep, answer = line.partition("|")
        if sep and number.strip().isdigit() and answer.strip().lower() in ("yes", "no"):
            answers.setdefault(int(number), answer.strip().lower())
    return answers


def parse_task_mix(text):
    """Returns {task: records per scene} from "names=3,attr=3,read=1" ("" : DEFAULT_TASK_MIX)."""
    if not text:
        return dict(DEFAULT_TASK_MIX)
    mix = {}
    for part in text.split(","):
        task, sep, count = part.strip().partition("=")
        if not sep or task not in TASKS or not count.strip().isdigit():
            raise ValueError(
                f"bad task mix entry {part!r} in {text!r}: want task=count with task in {TASKS}"
            )
        mix[task] = int(count)
    if not any(mix.values()):
        raise ValueError(f"task mix {text!r} has no records")
    return mix


def base_records(seed, num_scenes, start=0, task_mix=None):
    """Returns the base-task records of scenes start..start+num_scenes-1, grouped by scene."""
    return [
        record
        for scene in tw.make_scenes(seed, num_scenes, start)
        for record in scene_base_records(scene, seed, task_mix)
    ]


def vocabulary_texts():
    """Returns texts holding every word the base tasks write (for the toy tokenizer)."""
    texts = [
        OBJECT_PROMPT,
        GRID_PROMPT,
        COUNT_PROMPT,
        CAPTION_PROMPT,
        READ_PROMPT,
        CHECK_PROMPT,
        " ".join(NUMBER_WORDS),
        "What is at the nothing Where there is no Caption: Does it name a yes no What colour size",
        "no objects. background: not given. no circle is named",
    ]
    texts += [r["prompt"] + "\n" + r["target"] for r in base_records(54321, 60)]
    return texts


def score(record, output):
    """Returns 1.0 when a base-task output is exactly right (whitespace and case aside), else 0.0.

    The caption task is scored by fact-level F1 against the scene instead, the check task by
    the share of its items answered right.
    """
    if record["task"] == "caption":
        return tw.caption_metrics(record["scene"], output)["f1"]
    if record["task"] == "check":  # the share of items answered right (a missing line is wrong)
        truth, said = check_answers(record["target"]), check_answers(output)
        return float(np.mean([said.get(j) == answer for j, answer in truth.items()]))
    return float(" ".join(output.lower().split()) == " ".join(record["target"].lower().split()))
