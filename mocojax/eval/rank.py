"""Blind ranking of K methods' captions: per image the judge sees the K captions anonymised and
in a seeded random order, and answers "Ranking: 2 > 1 = 3" and "Hallucinated: 2" (or "none").

Per method: mean rank (1 = best; tied captions share the mean of their places), first-place
share (a k-way tie for first gives each 1/k), and the hallucination penalty: the share of its
captions the judge flags as inventing an object. An unparseable ranking is counted and skipped;
an image some method has no caption of is skipped and counted.
"""

import re

import numpy as np

_TOKEN = re.compile(r"\d{1,9}|[=>,<]")
MAX_RANK_CHARS = 20_000


def _line_with(lines, word):
    return next((line for line in lines if word in line.lower()), None)


def parse_ranking(text, k):
    """Returns (ranks [k] floats or None if unreadable, set of flagged 0-based indices, problems).

    Reads the line containing "ranking" (else the first line with a number): caption numbers
    best first, '>' or ',' between places, '=' between tied captions. Out-of-range and repeated
    numbers are dropped; captions left out share the last places. Never raises.
    """
    problems = []
    if not isinstance(text, str):
        return None, set(), [f"ranking is not text: {type(text).__name__}"]
    lines = text[-MAX_RANK_CHARS:].splitlines()
    line = _line_with(lines, "ranking") or next((x for x in lines if re.search(r"\d", x)), "")
    line = line.split(":", 1)[1] if ":" in line else line
    groups, seen, join = [], set(), False
    for token in _TOKEN.findall(line):
        if token == "=":
            join = True
            continue
        if not token.isdigit():
            join = False
            continue
        index = int(token) - 1
        if not 0 <= index < k or index in seen:
            problems.append(f"caption {token}: out of range or repeated, dropped")
            continue
        seen.add(index)
        if join and groups:
            groups[-1].append(index)
        else:
            groups.append([index])
        join = False
    if not groups:
        return None, set(), problems + ["no ranking found"]
    missing = [i for i in range(k) if i not in seen]
    if missing:
        problems.append(
            f"captions {[i + 1 for i in missing]} not ranked: they share the last places"
        )
        groups.append(missing)
    ranks, place = [0.0] * k, 1
    for group in groups:
        for index in group:
            ranks[index] = place + (len(group) - 1) / 2
        place += len(group)
    flagged_line = _line_with(lines, "halluc") or ""
    flagged_line = flagged_line.split(":", 1)[1] if ":" in flagged_line else flagged_line
    flagged = {int(t) - 1 for t in re.findall(r"\d{1,9}", flagged_line) if 1 <= int(t) <= k}
    return ranks, flagged, problems


def blind_rank(records, method_captions, judge, *, seed=0):
    """Returns {"methods": {name: {mean_rank, first_place_share, hallucination_penalty}}, ...}.

    method_captions: {name: list aligned with records, None where that method has no caption}.
    """
    names = list(method_captions)
    if len(names) < 2:
        raise ValueError(f"blind ranking needs at least 2 methods, got {names}")
    kept, lists, orders, skipped = [], [], [], 0
    for i, record in enumerate(records):
        captions = [method_captions[n][i] for n in names]
        if any(c is None for c in captions):
            skipped += 1
            continue
        order = np.random.default_rng([seed, i]).permutation(len(names))  # shown position -> method
        kept.append(record)
        lists.append([captions[m] for m in order])
        orders.append(order)
    texts = judge.rank(kept, lists) if kept else []
    ranks = {n: [] for n in names}
    first = {n: 0.0 for n in names}
    flagged = {n: 0 for n in names}
    unparseable = 0
    for text, order in zip(texts, orders):
        shown_ranks, shown_flagged, _ = parse_ranking(text, len(names))
        if shown_ranks is None:
            unparseable += 1
            continue
        top = [pos for pos, r in enumerate(shown_ranks) if r == min(shown_ranks)]
        for pos, method in enumerate(order):
            name = names[method]
            ranks[name].append(shown_ranks[pos])
            first[name] += 1 / len(top) if pos in top else 0.0
            flagged[name] += pos in shown_flagged
    ranked = len(ranks[names[0]])
    methods = {
        n: {
            "mean_rank": float(np.mean(ranks[n])) if ranked else float("nan"),
            "first_place_share": first[n] / ranked if ranked else float("nan"),
            "hallucination_penalty": flagged[n] / ranked if ranked else float("nan"),
        }
        for n in names
    }
    return {
        "methods": methods,
        "images": ranked,
        "unparseable": unparseable,
        "skipped_missing_caption": skipped,
        "judge": getattr(judge, "name", type(judge).__name__),
        "examples": [
            {"id": r.get("id"), "shown_order": [names[m] for m in o], "ranking": t}
            for r, o, t in zip(kept[:3], orders, texts)
        ],
    }
