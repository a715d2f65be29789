"""Pairwise win rate (CapArena): a judge compares the scored model's caption with a fixed
baseline's caption of the same image, position randomised per pair (seeded).

Verdicts are parsed tolerantly ("Caption 1 is better" / "Caption 2 is better" / "Tie", any
case, the LAST verdict in the text wins, since judges reason first); an unparseable verdict is
counted and left out of the rate, never a crash. A win scores 1, a tie 0.5, a loss 0; the rate
comes with a seeded bootstrap 95% interval and the mean caption length (words) of both sides.
"""

import re

import numpy as np

# Linear time: every alternative starts on a literal word and \s*+ never backtracks.
_VERDICT = re.compile(
    r"caption\s*+#?([12])\b\s*+(?:is\s*+)?(?:the\s*+)?better|\b(tie)\b|\b(tied)\b", re.I
)
MAX_VERDICT_CHARS = 20_000  # a runaway judge output is read from its tail only


def parse_verdict(text):
    """Returns 1 or 2 (that caption is better), 0 (tie) or None (unparseable); never raises."""
    if not isinstance(text, str):
        return None
    last = None
    for match in _VERDICT.finditer(text[-MAX_VERDICT_CHARS:]):
        last = int(match.group(1)) if match.group(1) else 0
    return last


def bootstrap_ci(scores, seed, num_resamples=1000, level=0.95):
    """Returns the (low, high) percentile bootstrap interval of the mean of scores (nan, nan if empty)."""
    scores = np.asarray(scores, np.float64)
    if scores.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = scores[rng.integers(scores.size, size=(num_resamples, scores.size))].mean(1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def words(caption):
    """Returns the number of whitespace-separated words of a caption."""
    return len(caption.split())


def win_rate(records, model_captions, baseline_captions, judge, *, seed=0, num_resamples=1000):
    """Returns the model's win rate against the baseline on records (both caption lists aligned
    with records, None where a side has no caption of that image).

    A record without a baseline caption (None: the baseline has fewer images) is skipped and
    counted in "skipped_no_baseline". Empty captions are judged as they are (they should lose)
    and counted in "empty_captions".

    Long because the pairing (a seeded coin per record for which caption is shown first), the
    verdict tally and the returned counts and position-bias diagnostics share the same per-pair
    lists (kept, model_first, the verdicts); split, those lists would be passed between helpers.
    """
    if not len(records) == len(model_captions) == len(baseline_captions):
        raise ValueError(
            f"{len(records)} records, {len(model_captions)} model and {len(baseline_captions)} "
            "baseline captions: align them with the records first (None where missing)"
        )
    pairs, kept, model_first = [], [], []
    for i, (record, ours, theirs) in enumerate(zip(records, model_captions, baseline_captions)):
        if ours is None or theirs is None:
            continue
        first = bool(
            np.random.default_rng([seed, i]).integers(2)
        )  # the model's caption shown first?
        pairs.append((ours, theirs) if first else (theirs, ours))
        kept.append(record)
        model_first.append(first)
    verdict_texts = judge.compare(kept, pairs) if pairs else []
    scores, wins, ties, losses, unparseable, picked_first = [], 0, 0, 0, 0, 0
    for text, first in zip(verdict_texts, model_first):
        verdict = parse_verdict(text)
        if verdict is None:
            unparseable += 1
            continue
        if verdict == 0:
            ties += 1
            scores.append(0.5)
            continue
        picked_first += verdict == 1
        won = (verdict == 1) == first
        wins += won
        losses += not won
        scores.append(float(won))
    low, high = bootstrap_ci(scores, seed, num_resamples)
    decisive = wins + losses
    return {
        "win_rate": float(np.mean(scores)) if scores else float("nan"),
        "ci95_low": low,
        "ci95_high": high,
        "wins": wins,
        "ties": ties,
        "losses": losses,
        "unparseable": unparseable,
        "pairs": len(pairs),
        "skipped_no_baseline": sum(c is None for c in baseline_captions),
        "empty_captions": sum(not c.strip() for pair in pairs for c in pair),
        "first_position_pick_rate": picked_first / decisive if decisive else float("nan"),
        "mean_words_model": float(
            np.mean([words(c) for c in model_captions if c is not None] or [0])
        ),
        "mean_words_baseline": float(
            np.mean([words(c) for c in baseline_captions if c is not None] or [0])
        ),
        "judge": getattr(judge, "name", type(judge).__name__),
        "examples": [
            {"id": r.get("id"), "model_first": f, "verdict": t}
            for r, f, t in zip(kept[:3], model_first, verdict_texts)
        ],
    }
