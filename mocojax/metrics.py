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


class MetricWriter:
    """Writes one stage's per-step scalars to <workdir>/metrics.jsonl and <workdir>/tb/<stage>."""

    def __init__(self, workdir, stage, *, total_steps, initial_step=0):
        self.stage = stage
        self.enabled = jax.process_index() == 0
        self.history = {}
        self._tokens = 0
        self._start = time.perf_counter()
        if not self.enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
        self._tb = SummaryWriter(os.path.join(workdir, "tb", stage))
        self._bar = tqdm.tqdm(total=total_steps, initial=initial_step, desc=stage, unit="step",
                              dynamic_ncols=True)

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
        self._jsonl.write(json.dumps({"stage": self.stage, "step": step, "time": time.time(), **record}) + "\n")
        self._jsonl.flush()
        for key, value in scalars.items():
            if math.isfinite(value):
                self._tb.add_scalar(f"{self.stage}/{key}", value, step)
        elapsed = time.perf_counter() - self._start
        postfix = {k.replace("eval/", "eval_"): f"{self.history[k][-1][1]:.4f}" for k in _BAR_KEYS if k in self.history}
        postfix["tok/s"] = f"{self._tokens / max(elapsed, 1e-9):.0f}"
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(step - self._bar.n)

    def summary(self):
        """Returns the end-of-stage table (first / last / min of every scalar, and wall time) as text."""
        rows = [("metric", "first", "last", "min")]
        for key in sorted(self.history):
            values = [v for _, v in self.history[key]]
            finite = [v for v in values if math.isfinite(v)]
            rows.append((key, f"{values[0]:.4g}", f"{values[-1]:.4g}", f"{min(finite):.4g}" if finite else "nan"))
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
