"""Prints how a multi-process launcher runs a config's stages: consecutive runs of stages, one a line,
"multi" for those every process runs (mocojax.main.MULTI_HOST_STAGES: sft, rl) and "single" for
the follow-ups one process runs on the same workdir (eval, export, vision), in the config's order.

  python launch/stage_groups.py --config configs/toyworld.py --workdir DIR [--config.X=...]
  multi<TAB>('sft', 'rl')<TAB>--config configs/toyworld.py --workdir DIR '--config.stages=(...)' --config.distributed.enabled=True
  single<TAB>('eval', 'export')<TAB>... --config.distributed.enabled=False

The third field is mocojax.main's arguments for the group, quoted for a POSIX shell: the ones
given, less any --config.stages (ml_collections appends repeated tuple overrides instead of
replacing them), then the group's stages and distributed.enabled. Takes mocojax.main's own
flags, so it reads the config exactly as the run will; touches no device and writes nothing.
"""

import itertools
import os
import shlex
import sys

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # the repository root

from absl import app  # noqa: E402

from mocojax import main  # noqa: E402  (defines --config and --workdir)


def groups(stages):
    """Returns [(kind, stages)] for consecutive stages that run on all processes ("multi") or one ("single")."""
    kind = lambda stage: "multi" if stage in main.MULTI_HOST_STAGES else "single"  # noqa: E731
    return [(k, tuple(run)) for k, run in itertools.groupby(stages, key=kind)]


def without_stages(args):
    """Returns the arguments less every --config.stages=V and --config.stages V (or one dash)."""
    kept, skip = [], False
    for arg in args:
        name = arg.lstrip("-").split("=", 1)[0] if arg.startswith("-") else None
        if skip:
            skip = False
        elif name == "config.stages":
            skip = "=" not in arg
        else:
            kept.append(arg)
    return kept


def _print_groups(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    args = without_stages(sys.argv[1:])
    for kind, stages in groups(main._CONFIG.value.stages):
        group_args = [
            *args,
            f"--config.stages={stages!r}",
            f"--config.distributed.enabled={kind == 'multi'}",
        ]
        print(kind, repr(stages), shlex.join(group_args), sep="\t")


if __name__ == "__main__":
    app.run(_print_groups)
