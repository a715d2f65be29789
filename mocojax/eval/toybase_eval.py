"""Exact quality of a toy base model, task by task, on held-out scenes (greedy decoding).

Every task's score sits next to its trivial baseline: the best *fixed* answer for that task
(the most common target among the held-out records, e.g. "nothing" for `cell`), so a base that
only learned the answer prior scores no better than the baseline.
"""

import collections

import numpy as np

from mocojax.data import toybase
from mocojax.eval import toyworld_eval

# The base's own mix, plus one multi-item names question, one binding names question and one
# rubric-criterion question per scene (last in the task order, so the other tasks' held-out
# records are the same without them).
EVAL_TASK_MIX = dict(toybase.DEFAULT_TASK_MIX, check=1, bind=1, truth=1, truthattr=1)


def evaluate(
    cfg, params, processor, *, seed, start, num_scenes, batch_size, max_new_tokens, image_size
):
    """Returns {"base/<task>": score, "base/<task>_fixed_answer": baseline, ...} on held-out scenes."""
    records = toybase.base_records(seed, num_scenes, start, task_mix=EVAL_TASK_MIX)
    outputs = toyworld_eval.generate_texts(
        cfg, params, processor, records, batch_size, max_new_tokens, image_size
    )
    result, examples = {}, {}
    for task in toybase.TASKS:
        pairs = [(r, o) for r, o in zip(records, outputs) if r["task"] == task]
        if not pairs:
            continue
        result[f"base/{task}"] = float(np.mean([toybase.score(r, o) for r, o in pairs]))
        if task == "caption":
            # Image-blind baseline: the reference caption of another held-out scene.
            shifted = [
                (r, pairs[(k + 1) % len(pairs)][0]["target"]) for k, (r, _) in enumerate(pairs)
            ]
            result["base/caption_blind"] = float(np.mean([toybase.score(r, o) for r, o in shifted]))
        elif task == "check":  # the better of answering every item "yes" or every item "no"
            result["base/check_fixed_answer"] = max(
                float(
                    np.mean(
                        [
                            toybase.score(
                                r,
                                "\n".join(
                                    f"{j} | {a}" for j in range(1, toybase.CHECK_ITEMS[1] + 1)
                                ),
                            )
                            for r, _ in pairs
                        ]
                    )
                )
                for a in ("yes", "no")
            )
        else:
            fixed, _ = collections.Counter(r["target"] for r, _ in pairs).most_common(1)[0]
            result[f"base/{task}_fixed_answer"] = float(
                np.mean([toybase.score(r, fixed) for r, _ in pairs])
            )
        if task == "truth":  # per item kind: labels are about half "yes" within each kind
            for kind in sorted({r["kind"] for r, _ in pairs}):
                result[f"base/truth_{kind}"] = float(
                    np.mean([toybase.score(r, o) for r, o in pairs if r["kind"] == kind])
                )
        examples[task] = [
            {"prompt": r["prompt"], "target": r["target"], "output": o} for r, o in pairs[:2]
        ]
    result["num_scenes"] = num_scenes
    result["examples"] = examples
    return result
