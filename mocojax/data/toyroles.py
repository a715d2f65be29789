"""The toy world's rubrics, Judge truth, SFT records for all three roles, and its tokenizer.

Rubric criteria are written in four templates that `parse_criterion` reads back, so any
rubric (written by us or by a model) can be checked against the scene, and any Judge
decision against the caption:

  mentions a red circle                      (present; weight 3 when a candidate missed it)
  does not mention a green star              (absent; weight 3 against an invented object)
  the circle at the top left is red          (attribute; weight 2 when one was wrong/missing)
  the background is white                    (detail; weight 1)
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

WEIGHTS = {"present": 3.0, "absent": 3.0, "attribute": 2.0, "background": 1.0}
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


@dataclasses.dataclass(frozen=True)
class Fact:
    """The meaning of one rubric criterion in this world.

    kind: present / absent (object = shape + colour, colour may be None for absent),
    attribute (referent mention, attribute name, value) or background (value).
    """

    kind: str
    referent: tw.Mention | None = None
    attribute: str | None = None
    value: str | None = None


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
    value = _value_phrase(fact.attribute, fact.value)
    return roles.RubricItem(
        f"the {_referent_phrase(fact.referent)} is {value}", value, WEIGHTS["attribute"]
    )


def parse_criterion(criterion):
    """Returns the Fact a criterion states in this world's language, or None if it states none."""
    text = " ".join(criterion.lower().split())
    for prefix, kind in (("does not mention", "absent"), ("mentions", "present")):
        if text.startswith(prefix):
            mentions, _ = tw.parse_caption(text[len(prefix) :])
            if len(mentions) == 1 and (kind == "absent" or mentions[0].colour):
                return Fact(kind, tw.Mention(mentions[0].shape, mentions[0].colour))
            return None
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


def judge_fact(fact, mentions, background):
    """Returns the exact Decision(0/1, rationale) for `fact` on a caption's parsed content."""
    if fact.kind == "present":
        named = any(_matches(m, fact.referent) for m in mentions)
        return roles.Decision(int(named), "it is named" if named else "it is not named")
    if fact.kind == "absent":
        named = any(_matches(m, fact.referent) for m in mentions)
        return roles.Decision(int(not named), "it is mentioned" if named else "it is not mentioned")
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


def _scene_content(scene):
    return [tw.Mention(o.shape, o.colour, o.size, o.position) for o in scene.objects]


def fact_is_true(scene, fact):
    """Returns whether `fact` holds of the scene (a complete caption of it meets the item)."""
    return bool(judge_fact(fact, _scene_content(scene), scene.background).value)


def rubric_truth_rate(scene, rubric_items):
    """Returns (fraction of items true of the scene, number of items in no known template).

    Items the world's language cannot read count as not true: the Judge could not check them.
    """
    if not rubric_items:
        return 0.0, 0
    facts = [parse_criterion(item.criterion) for item in rubric_items]
    true = sum(f is not None and fact_is_true(scene, f) for f in facts)
    return true / len(facts), sum(f is None for f in facts)


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


def judge_confusion(rubric_items, caption, decisions, by_kind=False):
    """Returns counts {"tp", "fn", "tn", "fp", "unreadable"} of a Judge's decisions on one caption.

    Positive = the caption truly meets the item. With these, `balanced_accuracy` is the mean
    of the true-positive and true-negative rates, which an always-"1" Judge scores 0.5 on.
    by_kind=True: {fact kind (present / absent / attribute / background, "unreadable"): counts}.
    """
    mentions, background = tw.parse_caption(caption)
    counts = {}
    for item, decision in zip(rubric_items, decisions):
        fact = parse_criterion(item.criterion)
        bucket = counts.setdefault("unreadable" if fact is None else fact.kind, _no_decisions())
        if fact is None:
            bucket["unreadable"] += 1
            continue
        truth = judge_fact(fact, mentions, background).value
        said = int(getattr(decision, "value", decision))
        bucket[("t" if said == truth else "f") + ("p" if said else "n")] += 1
    return counts if by_kind else pooled_confusion(counts)


def pooled_confusion(by_kind):
    """Returns the confusion counts of {kind: counts} summed over kinds."""
    return {key: sum(counts[key] for counts in by_kind.values()) for key in _no_decisions()}


def balanced_accuracy(counts):
    """Returns (TPR + TNR) / 2 of confusion counts (a rate without cases counts as 1)."""
    tpr = counts["tp"] / (counts["tp"] + counts["fn"]) if counts["tp"] + counts["fn"] else 1.0
    tnr = counts["tn"] / (counts["tn"] + counts["fp"]) if counts["tn"] + counts["fp"] else 1.0
    return (tpr + tnr) / 2


def _referent_for(scene, k, attribute):
    """Returns the shortest description of object k that does not use `attribute`."""
    obj = scene.objects[k]
    if sum(o.shape == obj.shape for o in scene.objects) == 1:
        return tw.Mention(obj.shape)
    if attribute == "colour":
        return tw.Mention(obj.shape, position=obj.position)
    return tw.Mention(obj.shape, colour=obj.colour)


def rubric_facts(scene, candidate_captions, max_items=8, min_items=3):
    """Returns the Facts of the target rubric: what the candidates missed, got wrong or invented.

    Ordered by weight (RubiCap's severity scheme; items against invented objects first, so
    every invented object keeps its item under the cap), then by first occurrence. When the
    candidates leave fewer than `min_items` deficiencies, presence items for the scene's
    objects and the background fill the rubric so it still separates good captions from bad.
    """
    pairs = {(o.shape, o.colour) for o in scene.objects}
    facts = []
    for caption in candidate_captions:
        mentions, background = tw.parse_caption(caption)
        assignment = tw.match_mentions(scene, mentions)
        for k, obj in enumerate(scene.objects):
            if k not in assignment:
                facts.append(Fact("present", tw.Mention(obj.shape, obj.colour)))
                continue
            mention = mentions[assignment.index(k)]
            facts += [
                Fact("attribute", _referent_for(scene, k, a), a, getattr(obj, a))
                for a in tw.ATTRIBUTES
                if getattr(mention, a) != getattr(obj, a)
            ]
        facts += [
            Fact("absent", tw.Mention(m.shape, m.colour))
            for m, k in zip(mentions, assignment)
            if k is None and m.colour is not None and (m.shape, m.colour) not in pairs
        ]
        if background != scene.background:
            facts.append(Fact("background", value=scene.background))
    facts = list(dict.fromkeys(facts))
    if len(facts) < min_items:
        fill = [Fact("present", tw.Mention(o.shape, o.colour)) for o in scene.objects]
        facts += [f for f in fill + [Fact("background", value=scene.background)] if f not in facts]
    order = {kind: rank for rank, kind in enumerate(("absent", "present", "attribute"))}
    facts.sort(key=lambda f: order.get(f.kind, 3))
    return facts[:max_items]


def _rng(seed, salt, scene):
    return np.random.default_rng([seed, salt, *map(ord, scene.id)])


# Share of Judge records that judge a complete reference; the rest judge weak captions.
JUDGE_REFERENCE_SHARE = 0.05
MAX_RUBRIC_ITEMS = 10
# References the Generator reads. The toy world's references are paraphrases of one complete
# truth, so one carries all of it (PixMo-Cap has one per image too); more only lengthen the
# prompt (3 references: 429 tokens on average, 1: ~340).
GENERATOR_REFERENCES = 1


def scene_sft_records(scene, seed, mix=(2, 1, 1), num_candidates=4, policy_drop=0.0):
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
    rubric = shown = None
    for g in range(max(1, num_generator)):
        subset = tw.weak_captions(scene, seed, num_candidates, salt=g)
        items = [
            item_of(f)
            for f in rubric_facts(scene, [c["caption"] for c in subset], max_items=MAX_RUBRIC_ITEMS)
        ]
        if rubric is None:  # Judge records use the first rubric.
            rubric, shown = items, subset
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
    unseen = tw.weak_captions(scene, seed, num_candidates, salt=1000)
    pool = [(c["id"], c["caption"]) for c in shown + unseen[:2]]
    rng = _rng(seed, 3, scene)
    facts = [parse_criterion(item.criterion) for item in rubric]

    def decide(caption):
        mentions, background = tw.parse_caption(caption)
        return [judge_fact(f, mentions, background) for f in facts]

    for j in range(num_judge):
        if rng.random() < JUDGE_REFERENCE_SHARE:
            k = int(rng.integers(len(references)))
            caption_id, caption = ref_ids[k], references[k]
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
                "rubric": [list(item) for item in rubric],
                "caption": caption,
                "caption_id": caption_id,
                "target": roles.format_decisions(decisions),
            }
        )
    return records


def sft_records(seed, num_scenes, mix=(2, 1, 1), start=0, policy_drop=0.0):
    """Returns the SFT records of scenes start..start+num_scenes-1, grouped by scene."""
    return [
        record
        for scene in tw.make_scenes(seed, num_scenes, start)
        for record in scene_sft_records(scene, seed, mix, policy_drop=policy_drop)
    ]


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
        return (fact.kind if fact else None, decision.value)

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


class ExactRoles:
    """The toy world's exact Generator and Judge, for RL's `rl.generator` / `rl.judge` = "exact".

    The rubric is what `scene_sft_records` teaches the Generator (the deficiencies of the
    shown captions, at most MAX_RUBRIC_ITEMS items); the decisions are the exact Judge's. It
    is the ceiling of the method on the toy world: RL with roles that make no mistakes.
    """

    def __init__(self, scenes):
        self.scenes = scenes  # {image id: Scene}

    def rubric(self, image_id, shown_captions):
        """Returns the list[RubricItem] for the shown captions of one image."""
        facts = rubric_facts(
            self.scenes[image_id], list(shown_captions), max_items=MAX_RUBRIC_ITEMS
        )
        return [item_of(f) for f in facts]

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


def build_vocabulary():
    """Returns the token list: specials, <unk>, then every corpus piece with/without space and case."""
    words = set()
    for text in _vocabulary_corpus():
        words.update(re.findall(r"[A-Za-z]+|[0-9]|[^\sA-Za-z0-9]", text))
    pieces = set()
    for word in words:
        for variant in {word, word.lower(), word.capitalize()}:
            pieces.update({variant, " " + variant})
    return list(SPECIAL_TOKENS) + [UNK_TOKEN, "\n", " "] + sorted(pieces - {" ", "\n"})


def build_tokenizer(out_dir):
    """Writes tokenizer.json + tokenizer_config.json to out_dir; returns out_dir.

    A word-level tokenizer with Qwen's special tokens, loadable with
    `transformers.AutoTokenizer.from_pretrained(out_dir)` and `processing.load_tokenizer`.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = build_vocabulary()
    tokenizer = Tokenizer(
        models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token=UNK_TOKEN)
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(_PRETOKEN_PATTERN), "isolated")
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
