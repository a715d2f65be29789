"""The paper's ablations and baselines on the toy world: one command, one table, several seeds.

  python -m mocojax.ablate --grid paper --seeds 3 --workdir runs/ablate --dry-run   # the plan
  python -m mocojax.ablate --grid paper --seeds 3 --workdir runs/ablate             # run it
  python -m mocojax.ablate --grid tiny --seeds 1 --workdir /tmp/ablate_tiny         # every row, seconds each
  python -m mocojax.ablate --grid default --seeds 3 --workdir runs/ablate_default   # on the default recipe
  python -m mocojax.ablate --grid learned --seeds 3 --workdir runs/ablate_learned   # all roles learned

Grids (ablate_rows.GRID_TABLE): "paper" builds every row on the paper's pipeline at toy size
(configs/rl_method.py), "default" on the default command's learned-Judge recipe
(configs/rl_method.py:default: the world's exact Generator, so the rows that need a learned one
are left out and named in the table's notes), "learned" on that recipe with all three roles
learned (configs/rl_method.py:learned: the role ablation, EvoLM, frozen roles and full sync, with
the exact-Generator control and the next-image trivial baseline); "tiny" / "default_tiny" /
"learned_tiny" are their 2-step runs.

Per seed s (data seed s and init seed s; `--seeds N` is s = 1..N, `--seeds 2,3` or `2-3`
those seeds, so seeds can run on separate machines) three SFT runs are shared by the rows
that start from them, as the paper reuses its SFT checkpoints: the shared multi-role SFT (M2;
theta_0 = phi_0 of every shared-init row), a Policy-only SFT (M1; the Policy of M3-M5) and a
roles-only SFT (the separately initialised Generator / Judge of M3-M5; on the default grid the
Judge alone). Each RL row runs in
<workdir>/rows/<row>/seed<s> on a copy of its SFT run's checkpoints/sft (the README's "RL from an
existing SFT checkpoint"), with stages ("rl", "eval") and the eval scoring the RL Policy.

Resume: a run whose result file exists is skipped; any other run is started again on its
workdir, where mocojax.main resumes from the latest checkpoint. A workdir started with settings
other than the planned ones (a default changed since) stops the grid before anything runs.
Side by side: invocations on one workdir never run the same run twice (each run under its
workdir's lock, mocojax.workdir_lock; one left by a killed invocation is taken over), and an RL
row waits for its SFT runs' results, whichever invocation makes them.
Results: <workdir>/results.json, <workdir>/results.md (per row mean ± std over seeds, the paper's number beside it),
<workdir>/tracking_error.png (tracking error vs step for m = 0.9, 0.99, 0.999 at H = 1 and frozen)
and <workdir>/tracking_error_mh.png (every (m, H) row and frozen). They cover every row and seed
finished in the workdir, whichever invocation (`--rows`, `--seeds`) ran it, so invocations run
side by side or one after another on one workdir add up to one table.
docs/ablations.md has what each row means.
"""

import argparse
import dataclasses
import glob
import importlib
import json
import os
import re
import shutil
import sys
import time

import numpy as np

from mocojax import workdir_lock

# Split out (move only, #14); re-exported so `ablate.<name>` keeps working.
from mocojax.ablate_rows import (  # noqa: F401
    GRID_TABLE,
    METRICS,
    MH_TRACKING_ROWS,
    PAPER_M8,
    ROW_NAMES,
    ROWS,
    SFT_KINDS,
    TINY_OVERRIDES,
    TRACKING_ROWS,
    Row,
    _grid_rows,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRIDS = tuple(GRID_TABLE)
# The RL gate's score of the Judge it starts with (mocojax.train.rl_evals.judge_gate).
GATE_KEY = "gate/judge_balanced_accuracy_within_kind"


@dataclasses.dataclass(frozen=True)
class Run:
    """One planned run: an SFT run (kind, seed) or an RL row (row, seed)."""

    kind: str  # "sft" or "rl"
    name: str  # SFT kind or row name
    seed: int
    workdir: str
    config: str
    overrides: tuple
    sft_from: str = ""  # RL: the SFT run whose checkpoints/sft it copies
    arg: str = ""  # the config's arg (configs/rl_method.py: the pipeline, tiny or not)

    @property
    def result_path(self):
        return os.path.join(self.workdir, "ablate_result.json")

    @property
    def needs(self):
        """The SFT runs' result files this run starts from (its own SFT, M3-M5's roles SFT):
        it may not start before they exist."""
        roles = dict(self.overrides).get("rl.roles_init", "")
        return tuple(
            os.path.join(workdir, "ablate_result.json")
            for workdir in (self.sft_from, roles)
            if workdir
        )

    def command(self):
        """Returns the equivalent `python -m mocojax.main` command line."""
        arg = f":{self.arg}" if self.arg else ""
        flags = " ".join(f"--config.{k}={_flag_value(v)}" for k, v in self.overrides)
        return f"python -m mocojax.main --config configs/{self.config}.py{arg} --workdir {self.workdir} {flags}"


def _flag_value(value):
    if isinstance(value, str):
        return f"'{value}'" if value else "''"
    if isinstance(value, tuple):
        return "'(" + ",".join(json.dumps(v) for v in value) + ",)'"
    return repr(value)


def sft_workdir(root, kind, seed):
    return os.path.join(root, "sft", kind, f"seed{seed}")


def seed_list(seeds):
    """Returns the seeds as a sorted tuple of distinct ints >= 1.

    seeds: an int N (seeds 1..N), a sequence of ints, or the `--seeds` text: "N", "a,b,..."
    (those seeds) or "a-b" (a..b), so one machine can run seed 2 while another runs seed 3 on a
    copy of the same grid workdir.
    """
    if isinstance(seeds, str):
        text = seeds.strip()
        try:
            if re.fullmatch(r"\d+", text):
                return seed_list(int(text))
            if re.fullmatch(r"\d+-\d+", text):
                low, high = (int(x) for x in text.split("-"))
                if low > high:
                    raise ValueError
                return seed_list(list(range(low, high + 1)))
            return seed_list([int(x) for x in text.split(",")])
        except ValueError:
            raise ValueError(
                f"--seeds {seeds!r}: give N (seeds 1..N), a comma list such as 2,3, or a range "
                "such as 2-3, of seeds >= 1"
            ) from None
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1:
            raise ValueError(f"--seeds {seeds!r}: must be a positive int")
        return tuple(range(1, seeds + 1))
    values = list(seeds) if isinstance(seeds, (list, tuple, range)) else []
    if not values or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in values):
        raise ValueError(f"--seeds {seeds!r}: must be ints >= 1")
    return tuple(sorted(set(values)))


def plan(grid, seeds, root, rows=None):
    """Returns the list of Runs of the grid (SFT runs first), each once, for the seeds
    (`seed_list`: N means 1..N).

    rows: names of the rows to plan (default all); an alias row plans its target's runs.
    """
    g = grid_of(grid)
    seeds = seed_list(seeds)
    names = list(rows) if rows else list(g.row_names)
    for name in names:
        if name in g.excluded:
            raise ValueError(f"row {name!r} is not in the {grid} grid: {g.excluded[name]}")
    unknown = [n for n in names if n not in g.row_names]
    if unknown:
        raise ValueError(f"unknown row(s) {unknown}; rows are {list(g.row_names)}")
    by_name = {r.name: r for r in g.rows}
    chosen = [by_name[by_name[n].same_as] if by_name[n].same_as else by_name[n] for n in names]
    chosen = list(dict.fromkeys(chosen))
    root = os.path.abspath(root)
    extra = TINY_OVERRIDES if g.tiny else ()
    runs = []
    for seed in seeds:
        common = (("seed", seed), ("data.seed", seed))
        kinds = dict.fromkeys(k for r in chosen for k in (r.sft, r.roles_sft) if k)
        for kind in kinds:
            runs.append(
                Run(
                    "sft",
                    kind,
                    seed,
                    sft_workdir(root, kind, seed),
                    "rl_method",
                    # The tiny runs' step counts win over a kind's own (shared_long's 2,000).
                    tuple(
                        {
                            **dict(g.pinned + common + tuple(g.sft_kinds[kind].items())),
                            "stages": ("sft", "eval"),
                            "eval.stage": "sft",
                            **dict(extra),
                        }.items()
                    ),
                    arg=g.config_arg,
                )
            )
        for row in chosen:
            if row.sft_only:
                continue
            roles = (
                (("rl.roles_init", sft_workdir(root, row.roles_sft, seed)),)
                if row.roles_sft
                else ()
            )
            runs.append(
                Run(
                    "rl",
                    row.name,
                    seed,
                    os.path.join(root, "rows", row.name, f"seed{seed}"),
                    row.config,
                    g.pinned
                    + extra
                    + common
                    + row.overrides
                    + roles
                    + (("stages", ("rl", "eval")), ("eval.stage", "rl")),
                    sft_from=sft_workdir(root, row.sft, seed),
                    arg=g.config_arg,
                )
            )
    return runs


def grid_of(grid):
    """Returns the Grid named grid (GRID_TABLE), or a ValueError naming the grids."""
    if grid not in GRID_TABLE:
        raise ValueError(f"--grid {grid!r}: must be one of {GRIDS}")
    return GRID_TABLE[grid]


def _set(config, key, value):
    *path, leaf = key.split(".")
    node = config
    for part in path:
        node = node[part]
    if leaf not in node:
        raise KeyError(f"config has no key {key!r}")
    node[leaf] = value


def load_config(run):
    """Returns the run's ConfigDict: configs/<config>.py[:<arg>] with the overrides applied."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    module = importlib.import_module(f"configs.{run.config}")
    config = module.get_config(run.arg)
    for key, value in run.overrides:
        _set(config, key, value)
    return config


def _latest_eval(workdir, stage):
    paths = glob.glob(os.path.join(workdir, f"eval_{stage}_*.json"))
    if not paths:
        raise FileNotFoundError(f"no eval_{stage}_*.json in {workdir}: the run did not finish")
    path = max(paths, key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
    with open(path) as f:
        return json.load(f)


def _rl_rows(workdir):
    """Returns the RL rows of the run's metrics.jsonl (step 0, the gate's, included)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in map(json.loads, f) if r.get("stage") == "rl"]


def _first_gate(rows):
    return next((r[GATE_KEY] for r in rows if GATE_KEY in r), None)


def rl_judge_gate(workdir):
    """Returns the within-kind balanced accuracy of the Judge the RL run used, measured by its
    gate before the first update (metrics.jsonl's step-0 `gate/...`), or None without a gate.
    For separately initialised roles (M3-M5) this is the roles model's Judge, which the scored
    checkpoint's own Judge role (the eval's judge/balanced_accuracy) is not."""
    return _first_gate(_rl_rows(workdir))


def _mean_of(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(values)) if values else None


def run_result(run, wall_s):
    """Returns the run's table metrics, read from its workdir (eval json and metrics.jsonl)."""
    stage = "sft" if run.kind == "sft" else "rl"
    result = _latest_eval(run.workdir, stage)
    out = {
        "f1": result["policy/f1"],
        "hallucinated_per_caption": result["policy/hallucinated_per_caption"],
        "caption_words": result["policy/caption_words"],
        "judge_balanced_accuracy": result["judge/balanced_accuracy"],
        "step": result["step"],
        "wall_s": wall_s,
    }
    if run.kind == "rl":
        every = _rl_rows(run.workdir)
        rows = [r for r in every if r["step"] > 0]
        tracking = [
            (r["step"], r["tracking_error"]) for r in rows if r.get("tracking_error") is not None
        ]
        out.update(
            zero_variance_frac=_mean_of(rows, "zero_variance_frac"),
            reward_f1_corr_within=_mean_of(rows, "true/reward_f1_corr_within"),
            final_tracking_error=tracking[-1][1] if tracking else None,
            tracking_error=tracking,
            rl_judge_gate=_first_gate(every),
        )
    return out


def prepare(run):
    """Gives an RL run its SFT checkpoint: a copy of the SFT run's checkpoints/sft (once)."""
    if run.kind != "rl":
        return
    target = os.path.join(run.workdir, "checkpoints", "sft")
    if os.path.isdir(target):
        return
    source = os.path.join(run.sft_from, "checkpoints", "sft")
    if not os.path.isdir(source):
        raise FileNotFoundError(f"{run.name} seed {run.seed}: no SFT checkpoint at {source}")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copytree(source, target)


def _flatten(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def settings_changed(run, config):
    """Returns "key: recorded -> planned" for every setting the run's workdir was started with
    (its config.json) that the planned config now sets otherwise (a key only one side has, from
    another version of the code, is not compared); [] for a workdir not started yet.

    A path inside the grid's workdir (another run's SFT, `rl.roles_init`) is compared by its
    part under the grid root, and a path inside this checkout (the shipped base of
    `model.init_from`) by its part under the checkout, so a grid copied or moved elsewhere, or
    resumed from another clone of the repository, still resumes. An SFT run's `rl.*` settings
    are not compared: its stages (sft, eval) never read them, so an SFT checkpoint serves every
    grid whose RL differs (the default grid's and the learned grid's alike)."""
    path = os.path.join(run.workdir, "config.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        recorded = _flatten(json.load(f))
    planned = _flatten(json.loads(config.to_json_best_effort()))
    root = os.path.dirname(os.path.dirname(os.path.dirname(run.workdir)))  # <root>/<x>/<y>/seed<s>

    def same(old, new):
        if isinstance(old, str) and isinstance(new, str):
            for base in (root, REPO):
                if new.startswith(base + os.sep):
                    return old.endswith(new[len(base) :])
        return old == new

    return [
        f"{key}: {recorded[key]!r} -> {planned[key]!r}"
        for key in sorted(recorded.keys() & planned.keys())
        if not same(recorded[key], planned[key])
        and not (run.kind == "sft" and key.startswith("rl."))
    ]


def execute(runs, log=print, poll_s=30.0):
    """Runs every run whose result file is missing (resuming its workdir); returns the results
    {(kind, name, seed): metrics}, read back from the result files.

    A run whose workdir was started with other settings (a changed default, another override)
    stops the grid before anything runs: resuming or reusing it would mix two recipes in one row.

    Invocations side by side on one workdir (`--rows` / `--seeds` splits on a machine with more
    cores) share the work: each run is taken under its workdir's lock (`mocojax.workdir_lock`,
    the lock `python -m mocojax.main` holds; one left by a killed run is taken over), a run
    another live invocation holds is left to it (this one does its other runs first, then waits
    for the result, polling every poll_s seconds), and an RL run starts only once its SFT runs'
    results exist, whichever invocation made them.
    """
    from mocojax import config_utils, main as main_lib

    # Every config validated before anything runs: a bad row fails now, not after hours.
    changed = {}
    for run in runs:
        config = load_config(run)
        config_utils.validate(config, main_lib.STAGES)
        if diff := settings_changed(run, config):
            changed[f"{run.kind} {run.name} seed {run.seed} ({run.workdir})"] = diff
    if changed:
        lines = [f"  {name}: " + "; ".join(diff) for name, diff in changed.items()]
        raise ValueError(
            "these runs were started with other settings than the grid now plans (a default "
            "changed since, or other overrides); use a new --workdir, or delete their workdirs "
            "to run them again:\n" + "\n".join(lines)
        )
    results = {}
    tags = {
        run: f"[{k + 1}/{len(runs)}] {run.kind} {run.name} seed {run.seed}"
        for k, run in enumerate(runs)
    }
    pending, said = list(runs), set()
    while pending:
        progressed = False
        for run in list(pending):
            tag = tags[run]
            if not os.path.exists(run.result_path):
                if not all(os.path.exists(path) for path in run.needs):
                    continue  # its SFT run is another invocation's, still running
                try:
                    # The run's own workdir lock, held from the copy of its SFT checkpoint to its
                    # result file (mocojax.main takes the same lock when run alone).
                    held = workdir_lock.acquire(run.workdir)
                except workdir_lock.WorkdirInUse as error:
                    if run not in said:
                        log(
                            f"{tag}: running in another invocation ({error.holder}); doing others first"
                        )
                        said.add(run)
                    continue
                try:
                    if not os.path.exists(run.result_path):  # finished while we looked
                        log(f"{tag}: running in {run.workdir}")
                        prepare(run)
                        start = time.perf_counter()
                        main_lib.run(load_config(run), run.workdir, lock_held=True)
                        result = run_result(run, time.perf_counter() - start)
                        with open(run.result_path, "w") as f:
                            json.dump(result, f, indent=1)
                finally:
                    workdir_lock.release(held)
            else:
                log(f"{tag}: done" + (" (by another invocation)" if run in said else ", skipped"))
            with open(run.result_path) as f:
                results[(run.kind, run.name, run.seed)] = json.load(f)
            pending.remove(run)
            progressed = True
        if pending and not progressed:
            time.sleep(poll_s)
    return results


def workdir_seeds(root):
    """Returns the seeds (sorted) that have a run directory in the grid workdir root:
    sft/<kind>/seed<s> or rows/<row>/seed<s>."""
    seeds = set()
    for path in glob.glob(os.path.join(root, "sft", "*", "seed*")) + glob.glob(
        os.path.join(root, "rows", "*", "seed*")
    ):
        if m := re.fullmatch(r"seed(\d+)", os.path.basename(path)):
            if int(m.group(1)) >= 1:
                seeds.add(int(m.group(1)))
    return tuple(sorted(seeds))


def finished_results(grid, root, known=(), log=print):
    """Returns {(kind, name, seed): metrics} of every run of the grid finished in root (any seed
    with a run directory, whichever invocation ran it) whose key is not in known, so that the
    table covers every finished row, not only this invocation's. A finished run started with
    other settings than the grid now plans is left out, and said to be."""
    seeds = workdir_seeds(root)
    if not seeds:
        return {}
    results = {}
    for run in plan(grid, seeds, root):
        key = (run.kind, run.name, run.seed)
        if key in known or not os.path.exists(run.result_path):
            continue
        if diff := settings_changed(run, load_config(run)):
            log(
                f"not in the table: {run.kind} {run.name} seed {run.seed} ran with other "
                f"settings than the grid now plans ({'; '.join(diff)})"
            )
            continue
        with open(run.result_path) as f:
            results[key] = json.load(f)
        if run.kind == "rl" and "rl_judge_gate" not in results[key]:
            # a run finished before the column existed: its gate is in its metrics.jsonl
            results[key]["rl_judge_gate"] = rl_judge_gate(run.workdir)
    return results


def _result_key(row):
    """Returns the (kind, name) under which results hold a row's runs: its SFT run for a scored
    SFT row, else its RL run (row: the row itself, not an alias of it)."""
    return ("sft", row.sft) if row.sft_only else ("rl", row.name)


def rows_with_results(grid, results, rows=None):
    """Returns the grid's row names (grid order) that have a result in results, and rows (the
    invoked ones, done or not; None: the whole grid). A row that reuses another's runs
    (row.same_as: grid_m0.99_H1 is M8_method) is listed only when invoked, as it adds no run."""
    g = grid_of(grid)
    have = {(kind, name) for kind, name, _ in results}
    out = []
    for row in g.rows:
        if rows is None or row.name in rows:
            out.append(row.name)
        elif not row.same_as:
            if _result_key(row) in have:
                out.append(row.name)
    return out


def _stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def aggregate(results, seeds, rows=None, grid="paper"):
    """Returns {row name: {"what", "seeds", "mean", "std", "paper", "tracking_error"}} per row
    of the grid (rows: those names only; seeds: `seed_list`'s forms)."""
    g = grid_of(grid)
    seeds = seed_list(seeds)
    names = list(rows) if rows else list(g.row_names)
    by_name = {r.name: r for r in g.rows}
    table = {}
    for name in names:
        row = by_name[name]
        source = by_name[row.same_as] if row.same_as else row
        key = _result_key(source)
        per_seed = {s: results[(*key, s)] for s in seeds if (*key, s) in results}
        # An RL row's gain: its F1 minus that of the SFT run it started from, seed by seed.
        gains = {
            s: r["f1"] - results[("sft", source.sft, s)]["f1"]
            for s, r in per_seed.items()
            if not source.sft_only
            and r.get("f1") is not None
            and results.get(("sft", source.sft, s), {}).get("f1") is not None
        }
        stats = {
            m: _stats(
                list(gains.values()) if m == "f1_gain" else [r.get(m) for r in per_seed.values()]
            )
            for m, _ in METRICS
        }
        curves = [r.get("tracking_error") or [] for r in per_seed.values()]
        table[name] = {
            "what": row.what,
            "same_as": row.same_as,
            "seeds": per_seed,
            "mean": {m: v[0] for m, v in stats.items()},
            "std": {m: v[1] for m, v in stats.items()},
            "paper": {"win_rate": row.paper_win_rate, "tracking_error": row.paper_tracking_error},
            "tracking_error": mean_curve(curves),
        }
    return table


def mean_curve(curves):
    """Returns [(step, mean value)] over the curves at the steps all of them have."""
    if not curves or not all(curves):
        return []
    steps = set.intersection(*[{s for s, _ in c} for c in curves])
    return [(s, float(np.mean([dict(c)[s] for c in curves]))) for s in sorted(steps)]


def _cell(mean, std, digits=3):
    if mean is None:
        return "—"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown_table(table, seeds, note=""):
    """Returns the results table as markdown (mean ± std over seeds; paper numbers beside)."""
    seeds = seed_list(seeds)
    head = (
        ["row", "what", "seeds"]
        + [label for _, label in METRICS]
        + [
            "paper win rate (%)",
            "paper tracking err.",
        ]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in table.items():
        paper = row["paper"]
        cells = [
            name,
            row["what"],
            f"{len(row['seeds'])}/{len(seeds)}",
            *[_cell(row["mean"][m], row["std"][m]) for m, _ in METRICS],
            "—" if paper["win_rate"] is None else f"{paper['win_rate']:.2f}",
            "—" if paper["tracking_error"] is None else f"{paper['tracking_error']:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [
        "",
        "Toy-world metrics on held-out scenes of each data seed (greedy): F1, hallucinated "
        "objects per caption and words of the scored Policy; RL − SFT F1 is an RL row's F1 "
        "minus that of the SFT run it started from, on the same seed and scenes, before the "
        "mean over seeds; the Judge's balanced accuracy is "
        "that of the scored checkpoint's Judge role (the RL Policy's parameters, not the "
        'momentum copy); "RL\'s Judge at gate" is the within-kind balanced accuracy of the Judge '
        "the RL run used, measured on RL-like captions before its first update (for separately "
        "initialised roles, the roles model's Judge). Zero-variance groups, within-group r(reward, true F1) and the tracking "
        "error ||theta - phi|| come from the RL run's metrics.jsonl (means over updates; the "
        "last sync). The paper's numbers are win rates on PixMo-Cap / DenseFusion (Tables 3-5) "
        "and parameter distances at step 600 of an 8B model: a different scale and metric, "
        "beside the rows for the direction of each claim only.",
    ]
    if note:
        notes.append(note)
    return "\n".join(lines + notes) + "\n"


# Plot colours (RGB) per series, in TRACKING_ROWS order.
COLOURS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (90, 90, 90))


def _lighter(colour, amount):
    """Returns colour mixed with white (amount 0: the colour, 1: white)."""
    return tuple(round(c + (255 - c) * amount) for c in colour)


# MH_TRACKING_ROWS' colours: m's colour of COLOURS, lighter as H grows (1, 5, 10); frozen grey.
MH_COLOURS = tuple(_lighter(c, a) for c in COLOURS[:3] for a in (0.0, 0.4, 0.7)) + (COLOURS[3],)


def plot_tracking(table, path, size=(640, 400), rows=None, colours=COLOURS):
    """Writes a PNG of tracking error vs step for the series of rows ({label: row name}, default
    TRACKING_ROWS) present in table, drawn in colours (one per series, in rows' order; pillow);
    returns the labels drawn."""
    from PIL import Image, ImageDraw

    rows = TRACKING_ROWS if rows is None else rows
    series = [
        (label, table[name]["tracking_error"], colour)
        for (label, name), colour in zip(rows.items(), colours, strict=True)
        if name in table and table[name]["tracking_error"]
    ]
    width, height = size
    left, right, top, bottom = 60, 150, 20, 40
    image = Image.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(image)
    draw.rectangle([left, top, width - right, height - bottom], outline=(0, 0, 0))
    draw.text((left, height - bottom + 18), "Policy update (step)", fill=(0, 0, 0))
    draw.text((4, top), "||theta-phi||", fill=(0, 0, 0))
    if not series:
        draw.text((left + 10, top + 10), "no tracking error logged", fill=(0, 0, 0))
        image.save(path)
        return []
    steps = [s for _, curve, _ in series for s, _ in curve]
    values = [v for _, curve, _ in series for _, v in curve]
    s0, s1 = min(steps), max(max(steps), min(steps) + 1)
    v1 = max(max(values), 1e-12) * 1.05
    x = lambda s: left + (s - s0) / (s1 - s0) * (width - right - left)
    y = lambda v: height - bottom - v / v1 * (height - bottom - top)
    draw.text((left - 30, top - 6), f"{v1:.3g}", fill=(0, 0, 0))
    draw.text((left - 12, height - bottom - 6), "0", fill=(0, 0, 0))
    draw.text((left, height - bottom + 4), str(s0), fill=(0, 0, 0))
    draw.text((width - right - 20, height - bottom + 4), str(s1), fill=(0, 0, 0))
    for k, (label, curve, colour) in enumerate(series):
        points = [(x(s), y(v)) for s, v in curve]
        if len(points) > 1:
            draw.line(points, fill=colour, width=2)
        for px, py in points:
            draw.ellipse([px - 2, py - 2, px + 2, py + 2], fill=colour)
        ly = top + 10 + 18 * k
        draw.line(
            [(width - right + 10, ly + 6), (width - right + 30, ly + 6)], fill=colour, width=3
        )
        draw.text((width - right + 36, ly), label, fill=(0, 0, 0))
    image.save(path)
    return [label for label, _, _ in series]


def excluded_note(grid):
    """Returns the table note naming the paper rows the grid has no counterpart for ("" if none)."""
    excluded = grid_of(grid).excluded
    if not excluded:
        return ""
    names_by_reason = {}  # rows left out for one reason are named together, the reason once
    for name, why in excluded.items():
        names_by_reason.setdefault(why, []).append(name)
    return (
        f"Not in the {grid} grid: "
        + "; ".join(f"{', '.join(names)} ({why})" for why, names in names_by_reason.items())
        + "."
    )


def write_outputs(root, grid, seeds, table, wall_s, note=""):
    """Writes results.json, results.md, tracking_error.png (m at H = 1, frozen) and
    tracking_error_mh.png (every (m, H) row, frozen) into root."""
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump(
            {"grid": grid, "seeds": list(seed_list(seeds)), "wall_s": wall_s, "rows": table},
            f,
            indent=1,
        )
    with open(os.path.join(root, "results.md"), "w") as f:
        f.write(markdown_table(table, seeds, note))
    plot_tracking(table, os.path.join(root, "tracking_error.png"))
    plot_tracking(
        table,
        os.path.join(root, "tracking_error_mh.png"),
        size=(640, 480),
        rows=MH_TRACKING_ROWS,
        colours=MH_COLOURS,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--grid",
        choices=GRIDS,
        default="paper",
        help="the pipeline the rows build on: paper, default (the default command's recipe), "
        "or their 2-step tiny runs",
    )
    parser.add_argument(
        "--seeds",
        default="3",
        help="data / init seeds: N (1..N), a comma list (2,3) or a range (2-3); one seed s: s-s",
    )
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="list the planned runs and stop")
    parser.add_argument(
        "--compile-cache",
        default="",
        help="JAX's persistent compilation cache (default <workdir>/jax_cache; 'off': none): "
        "every run builds its jitted steps anew, so without it each row compiles them again",
    )
    args = parser.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r] or None
    runs = plan(args.grid, args.seeds, args.workdir, rows)
    if args.dry_run:
        for run in runs:
            state = "done" if os.path.exists(run.result_path) else "to run"
            sft = f"  (SFT from {run.sft_from})" if run.sft_from else ""
            print(f"{run.kind:3s} {run.name:22s} seed {run.seed}  [{state}]{sft}")
            print(f"    {run.command()}")
        grid = grid_of(args.grid)
        for r in grid.rows:
            if rows is not None and r.name not in rows:
                continue
            if r.same_as:
                print(f"row {r.name} reuses the runs of {r.same_as}")
            elif r.sft_only:
                print(f"row {r.name} scores the SFT runs sft/{r.sft}/seed<s>")
        for name, why in grid.excluded.items():
            print(f"paper row {name} has no {args.grid}-grid counterpart: {why}")
        print(f"{len(runs)} runs")
        return runs
    # Said first: `--seeds 2` is seeds 1 and 2, not seed 2 alone (that is --seeds 2-2).
    print(f"seeds {', '.join(map(str, seed_list(args.seeds)))}: {len(runs)} runs")
    start = time.perf_counter()
    root = os.path.abspath(args.workdir)
    if args.compile_cache != "off":
        from mocojax import config_utils

        config_utils.use_compile_cache(args.compile_cache or os.path.join(root, "jax_cache"))
    results = execute(runs)
    # The table covers every row and seed finished in the workdir, whichever invocation ran it.
    results.update(finished_results(args.grid, root, known=results))
    seeds = tuple(sorted(set(seed_list(args.seeds)) | {s for _, _, s in results}))
    # Wall time of every run, resumed ones included (their earlier part is not counted).
    wall = sum(r["wall_s"] for r in results.values())
    table = aggregate(results, seeds, rows_with_results(args.grid, results, rows), args.grid)
    note = excluded_note(args.grid)
    write_outputs(root, args.grid, seeds, table, wall, note)
    print(markdown_table(table, seeds, note))
    print(f"grid wall time (this invocation): {time.perf_counter() - start:.0f} s")
    return runs


if __name__ == "__main__":
    main()
