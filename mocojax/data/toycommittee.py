"""RubiCap's offline rubric on the toy world (seeds 001 / 003): a committee of K noisy teacher
captions, their consensus, the student caption's deficiencies, one binary item per deficiency.

Noise model of a teacher (`teacher_caption`), independently per teacher k and per scene:
  - each object is left out with probability `omit`;
  - each attribute (colour, size, position) of a kept object is misstated with probability
    `wrong` (colour: one no object of that shape has; size: the other one; position: another cell);
  - the background is left out with probability `omit`, else misstated with probability `wrong`;
  - with probability `invent`, one object that is not in the scene (a free shape + colour at a
    free cell) is added.
Captions are written in the world's language with its varied wording (`toyworld.write_caption`).

The rubric writer reads the K captions as text (`consensus`): a fact is kept when at least
ceil(K / 2) teachers state it, RubiCap's majority rule. Facts: an object (shape + colour) is
present when >= ceil(K/2) teachers name it and absent when >= ceil(K/2) do not (for even K
a tie keeps neither); an object's size / position, and the background, when >= ceil(K/2)
teachers state the same value (a tie between two values keeps none). `diagnose` compares the
student caption with the consensus and keeps only its deficiencies, with RubiCap's severities
(toyroles.WEIGHTS): critical 3.0 = a consensus object it misses or an object it invents that
the consensus says is absent; important 2.0 = a consensus size / position it misses or
misstates; minor 1.0 = a consensus background it misses or misstates. Each deficiency is one
binary item in the four templates the Judge reads (`toyroles.item_of`).
"""

import dataclasses
import math

import numpy as np

from mocojax.data import toyroles, toyworld as tw

# Severity order of RubiCap (critical, important, minor) over the toy world's item kinds.
SEVERITY = {
    "present": "critical",
    "absent": "critical",
    "attribute": "important",
    "background": "minor",
}
DEFAULT_NOISE = dict(omit=0.1, wrong=0.1, invent=0.2)


@dataclasses.dataclass(frozen=True)
class Consensus:
    """What at least ceil(K/2) of K teachers agree on.

    size: K; counts: {(shape, colour): teachers naming it}; present: the pairs named by a
    majority (and not left out by one: for even K a tie keeps neither); attributes:
    {(shape, colour, attribute): value} for present objects; background: the agreed value or None.
    """

    size: int
    counts: dict
    present: frozenset
    attributes: dict
    background: str | None

    def is_absent(self, pair):
        """Returns whether a majority of the teachers leave (shape, colour) out (and no tie)."""
        count = self.counts.get(pair, 0)
        return majority(self.size - count, self.size) and not majority(count, self.size)


def _check_prob(name, value):
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ValueError(f"teacher noise {name}={value!r}: must be a probability in [0, 1]")


def teacher_caption(scene, seed, k, omit=0.1, wrong=0.1, invent=0.2):
    """Returns teacher k's noisy caption of the scene (the module's noise model; deterministic in
    (seed, scene, k))."""
    for name, value in (("omit", omit), ("wrong", wrong), ("invent", invent)):
        _check_prob(name, value)
    rng = np.random.default_rng([seed, 29, k, *map(ord, scene.id)])
    pairs = {(o.shape, o.colour) for o in scene.objects}
    cells = {o.position for o in scene.objects}
    mentions = []
    for i in rng.permutation(len(scene.objects)):
        obj = scene.objects[i]
        if rng.random() < omit:
            continue
        colour, size, position = obj.colour, obj.size, obj.position
        if rng.random() < wrong:
            options = [c for c in tw.COLOURS if (obj.shape, c) not in pairs]
            colour = options[int(rng.integers(len(options)))]
        if rng.random() < wrong:
            size = "small" if size == "large" else "large"
        if rng.random() < wrong:
            options = [p for p in tw.POSITIONS if p != position]
            position = options[int(rng.integers(len(options)))]
        mentions.append(tw.Mention(obj.shape, colour, size, position))
    background = None if rng.random() < omit else scene.background
    if background is not None and rng.random() < wrong:
        options = [b for b in tw.BACKGROUNDS if b != background]
        background = options[int(rng.integers(len(options)))]
    if rng.random() < invent:
        free = [(s, c) for s in tw.SHAPES for c in tw.COLOURS if (s, c) not in pairs]
        free_cells = [p for p in tw.POSITIONS if p not in cells]
        if free_cells:
            shape, colour = free[int(rng.integers(len(free)))]
            cell = free_cells[int(rng.integers(len(free_cells)))]
            mention = tw.Mention(shape, colour, tw.SIZES[int(rng.integers(2))], cell)
            mentions.insert(int(rng.integers(len(mentions) + 1)), mention)
    return tw.write_caption(mentions, background, rng)


def committee_captions(scene, seed, size, noise=None):
    """Returns the captions of a committee of `size` teachers (`teacher_caption`, noise kwargs)."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"committee size must be a positive int, got {size!r}")
    return [teacher_caption(scene, seed, k, **(noise or DEFAULT_NOISE)) for k in range(size)]


def majority(count, size):
    """Returns whether `count` of `size` teachers is RubiCap's consensus: count >= ceil(size/2)."""
    return count >= math.ceil(size / 2)


def _agreed_value(values, size):
    """Returns the one value at least ceil(size/2) teachers state, or None (none or a tie)."""
    counts = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    agreed = [v for v, c in counts.items() if majority(c, size)]
    return agreed[0] if len(agreed) == 1 else None


def consensus(captions):
    """Returns the Consensus of K teacher captions (text in the world's language)."""
    size = len(captions)
    if size == 0:
        raise ValueError("consensus needs at least one teacher caption")
    named = {}  # (shape, colour) -> {teacher: first mention}
    backgrounds = []
    for k, caption in enumerate(captions):
        mentions, background = tw.parse_caption(caption)
        for m in mentions:
            if m.colour is not None:
                named.setdefault((m.shape, m.colour), {}).setdefault(k, m)
        if background is not None:
            backgrounds.append(background)
    counts = {pair: len(by) for pair, by in named.items()}
    # A tie (even K: K/2 name it, K/2 do not) keeps neither presence nor absence.
    present = {
        pair
        for pair, count in counts.items()
        if majority(count, size) and not majority(size - count, size)
    }
    attributes = {}
    for pair in present:
        for attribute in ("size", "position"):
            stated = [getattr(m, attribute) for m in named[pair].values()]
            value = _agreed_value([v for v in stated if v is not None], size)
            if value is not None:
                attributes[(*pair, attribute)] = value
    return Consensus(size, counts, frozenset(present), attributes, _agreed_value(backgrounds, size))


def diagnose(agreed, student_caption):
    """Returns the student caption's deficiencies against the consensus as toyroles.Facts, most
    severe first (critical, important, minor), each once.

    An invented object is one the student names whose absence the consensus holds
    (`Consensus.is_absent`: a majority of teachers leave it out, e.g. none names it).
    """
    mentions, background = tw.parse_caption(student_caption)
    by_pair = {}
    for m in mentions:
        if m.colour is not None:
            by_pair.setdefault((m.shape, m.colour), []).append(m)
    facts = []
    for shape, colour in sorted(agreed.present):
        if (shape, colour) not in by_pair:
            facts.append(toyroles.Fact("present", tw.Mention(shape, colour)))
    for pair in by_pair:
        if agreed.is_absent(pair):
            facts.append(toyroles.Fact("absent", tw.Mention(*pair)))
    for (shape, colour, attribute), value in sorted(agreed.attributes.items()):
        stated = [getattr(m, attribute) for m in by_pair.get((shape, colour), [])]
        if stated and value not in stated:
            facts.append(toyroles.Fact("attribute", tw.Mention(shape, colour), attribute, value))
    if agreed.background is not None and background != agreed.background:
        facts.append(toyroles.Fact("background", value=agreed.background))
    order = {"critical": 0, "important": 1, "minor": 2}
    facts = list(dict.fromkeys(facts))
    facts.sort(key=lambda f: order[SEVERITY[f.kind]])
    return facts


def rubicap_rubric(committee, student_caption):
    """Returns RubiCap's rubric (list[RubricItem]) for one image: one binary item per deficiency
    of the student caption against the committee's consensus, weighted 3 / 2 / 1 by severity."""
    return [toyroles.item_of(f) for f in diagnose(consensus(committee), student_caption)]
