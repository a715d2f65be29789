"""Training metrics: JSONL in the workdir, TensorBoard events, a tqdm progress bar, a summary table.

Only process 0 writes; every process may call the writer.
"""

import json
import math
import os
import time

import jax
import tqdm
from tensorboardX import SummaryWriter

_BAR_KEYS = ("loss", "eval/loss")


def truncate_jsonl(path, keep):
    """Rewrites a JSONL file (if it exists) with only the rows for which keep(row) is true.

    A line that is not JSON (the half-written last row of a killed run) is dropped. The new
    file replaces the old one atomically. Returns the number of rows dropped.
    """
    if not os.path.isfile(path):
        return 0
    kept, dropped = [], 0
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                dropped += 1
                continue
            if keep(row):
                kept.append(line if line.endswith("\n") else line + "\n")
            else:
                dropped += 1
    if dropped:
        with open(path + ".tmp", "w") as f:
            f.writelines(kept)
        os.replace(path + ".tmp", path)
    return dropped


def keep_until(stage, step):
    """Returns keep(row) for truncate_jsonl: rows of other stages, and this stage's rows up to
    `step` (a resume from checkpoint `step` replays every later one; from 0, all of them)."""
    return lambda row: row.get("stage", stage) != stage or (step > 0 and row.get("step", 0) <= step)


class MetricWriter:
    """Writes one stage's per-step scalars to <workdir>/metrics.jsonl and <workdir>/tb/<stage>.

    Opening it at initial_step (the restored checkpoint's step) first drops the rows of this
    stage that a resumed run writes again, and TensorBoard hides its events past initial_step
    (purge_step), so a reader sees one row per step after any number of resumes.
    """

    def __init__(self, workdir, stage, *, total_steps, initial_step=0):
        self.stage = stage
        self.enabled = jax.process_index() == 0
        self.history = {}
        self._tokens = 0
        self._start = time.perf_counter()
        if not self.enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        path = os.path.join(workdir, "metrics.jsonl")
        truncate_jsonl(path, keep_until(stage, initial_step))
        self._jsonl = open(path, "a")
        tb_dir = os.path.join(workdir, "tb", stage)
        # TensorBoard hides this stage's events at steps >= purge_step from earlier runs.
        purge_step = initial_step + 1 if initial_step else (0 if os.path.isdir(tb_dir) else None)
        self._tb = SummaryWriter(tb_dir, purge_step=purge_step)
        self._bar = tqdm.tqdm(
            total=total_steps, initial=initial_step, desc=stage, unit="step", dynamic_ncols=True
        )

    def write(self, step, scalars, tokens=0):
        """Records the scalars of one step; tokens (this step's input tokens) feeds the bar's tokens/s."""
        scalars = {k: float(v) for k, v in scalars.items()}
        for key, value in scalars.items():
            self.history.setdefault(key, []).append((step, value))
        self._tokens += tokens
        if not self.enabled:
            return
        # Strict JSON: a non-finite value (a NaN loss, a role absent from the batch) is written as null.
        record = {k: (v if math.isfinite(v) else None) for k, v in scalars.items()}
        self._jsonl.write(
            json.dumps({"stage": self.stage, "step": step, "time": time.time(), **record}) + "\n"
        )
        self._jsonl.flush()
        for key, value in scalars.items():
            if math.isfinite(value):
                self._tb.add_scalar(f"{self.stage}/{key}", value, step)
        elapsed = time.perf_counter() - self._start
        postfix = {
            k.replace("eval/", "eval_"): f"{self.history[k][-1][1]:.4f}"
            for k in _BAR_KEYS
            if k in self.history
        }
        postfix["tok/s"] = f"{self._tokens / max(elapsed, 1e-9):.0f}"
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(step - self._bar.n)

    def summary(self):
        """Returns the end-of-stage table (first / last / min of every scalar, and wall time) as text."""
        rows = [("metric", "first", "last", "min")]
        for key in sorted(self.history):
            values = [v for _, v in self.history[key]]
            finite = [v for v in values if math.isfinite(v)]
            rows.append(
                (
                    key,
                    f"{values[0]:.4g}",
                    f"{values[-1]:.4g}",
                    f"{min(finite):.4g}" if finite else "nan",
                )
            )
        rows.append(("wall time (s)", "", f"{time.perf_counter() - self._start:.1f}", ""))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
        lines.insert(1, "-+-".join("-" * w for w in widths))
        return f"== {self.stage} summary ==\n" + "\n".join(lines)

    def close(self):
        """Closes the bar and files and prints the summary table."""
        if not self.enabled:
            return
        self._bar.close()
        self._jsonl.close()
        self._tb.close()
        if self.history:
            print(self.summary(), flush=True)
