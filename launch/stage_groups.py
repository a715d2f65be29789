"""Prints how a multi-process launcher runs a config's stages: consecutive runs of stages, one a line,
"multi STAGES" for those every process runs (mocojax.main.MULTI_HOST_STAGES: sft, rl) and
"single STAGES" for the follow-ups one process runs on the same workdir (eval, export, vision).

  python launch/stage_groups.py --config configs/toyworld.py --workdir DIR [--config.X=...]
  multi ('sft', 'rl')
  single ('eval', 'export')

STAGES is a tuple literal for `--config.stages=STAGES`. Takes mocojax.main's own flags, so it
reads the config exactly as the run will; touches no device and writes nothing.
"""

import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

from absl import app  # noqa: E402

from mocojax import main  # noqa: E402  (defines --config and --workdir)


def groups(stages):
    """Returns [(kind, stages)] for consecutive stages that run on all processes ("multi") or one ("single")."""
    kind = lambda stage: "multi" if stage in main.MULTI_HOST_STAGES else "single"  # noqa: E731
    return [(k, tuple(run)) for k, run in itertools.groupby(stages, key=kind)]


def _print_groups(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    for kind, stages in groups(main._CONFIG.value.stages):
        print(kind, repr(stages))


if __name__ == "__main__":
    app.run(_print_groups)
