"""Toy world, the method: shared SFT init, then Policy RL with online rubrics from EMA roles
(m = 0.99, H = 1), then held-out eval of the RL Policy.

  python -m mocojax.main --config configs/rl_method.py --workdir runs/rl_method
  python -m mocojax.main --config configs/rl_method.py:tiny --workdir /tmp/rl_tiny   # smoke run
  python -m mocojax.main --config configs/rl_method.py:default --workdir runs/rl_method_default

The arg picks the pipeline every ablation config (configs/rl_*.py) builds on: "" (and "tiny")
the paper's pipeline at toy size (`configs/toyworld.py:paper`: 2:1:1 role SFT, learned EMA
Generator and Judge); "default" (and "default_tiny") the default command's learned-Judge recipe
(`configs/toyworld.py`: Policy + Judge role SFT from the check base, the EMA Policy as the
per-item Judge, the world's exact Generator; "default_tiny" is configs/toyworld_judge.py:tiny
without its warm-up stage). All without the HF export.

(m, H) from the command line: --config.rl.momentum=0.99 --config.rl.sync_every=5.
Reuse an SFT run: point --workdir at it (SFT resumes at its last step, i.e. does nothing) or
copy its checkpoints/sft folder. Other ablations: configs/rl_*.py; all of them, over seeds:
`python -m mocojax.ablate` (docs/ablations.md).
"""

from configs import toyworld, toyworld_judge

ARGS = ("", "tiny", "default", "default_tiny")


def get_config(arg=""):
    """Returns the pipeline arg names (module docstring) with stages SFT, RL and eval."""
    if arg in ("", "tiny"):
        config = toyworld.paper_config(arg)
    elif arg == "default":
        config = toyworld.get_config("")
    elif arg == "default_tiny":
        config = toyworld_judge.get_config("tiny")
        # role SFT from the tiny model itself (no warm-up stage), as "default" from its base
        config.sft.init_stage = ""
    else:
        raise ValueError(f"configs/rl_method.py: unknown arg {arg!r}; known: {ARGS}")
    config.stages = ("sft", "rl", "eval")
    return config
