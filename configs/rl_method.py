"""Toy world, the method: shared SFT init, then Policy RL with online rubrics from EMA roles
(m = 0.99, H = 1), then held-out eval of the RL Policy.

  python -m mocojax.main --config configs/rl_method.py --workdir runs/rl_method
  python -m mocojax.main --config configs/rl_method.py:tiny --workdir /tmp/rl_tiny   # smoke run

(m, H) from the command line: --config.rl.momentum=0.99 --config.rl.sync_every=5.
Reuse an SFT run: point --workdir at it (SFT resumes at its last step, i.e. does nothing) or
copy its checkpoints/sft folder. Other ablations: configs/rl_*.py.
"""

from configs import toyworld


def get_config(arg=""):
    """Returns configs/toyworld.py:paper (the paper's pipeline at toy size) without the HF export
    stage."""
    config = toyworld.paper_config(arg)
    config.stages = ("sft", "rl", "eval")
    return config
