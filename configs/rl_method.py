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
without its warm-up stage); "learned" (and "learned_tiny") that recipe with all three roles
learned (`learned_recipe`: the long role SFT at the mix (5, 2, 2), the EMA model as Generator,
the union of 4 sampled rubrics per image checked against the references, 400 RL updates). All
without the HF export.

(m, H) from the command line: --config.rl.momentum=0.99 --config.rl.sync_every=5.
Reuse an SFT run: point --workdir at it (SFT resumes at its last step, i.e. does nothing) or
copy its checkpoints/sft folder. Other ablations: configs/rl_*.py; all of them, over seeds:
`python -m mocojax.ablate` (docs/ablations.md).
"""

from configs import toyworld, toyworld_judge

ARGS = ("", "tiny", "default", "default_tiny", "learned", "learned_tiny")


def learned_recipe(config, tiny=False):
    """Sets the default recipe's config (configs/toyworld.py:long, or default_tiny's) to learn the
    Generator too, as session 42's run with all three roles learned (docs/results.md): role SFT
    at the mix (5, 2, 2), the EMA model writing K = 4 rubrics per image at temperature 1 (K = 2
    tiny), their union checked against the references by the Judge, 400 RL updates read on the
    validation range every 100."""
    config.data.mix = (5, 2, 2)
    rl = config.rl
    rl.generator = "ema"
    rl.rubric_check = "references"
    rl.rubric_samples, rl.generator_temperature = (2 if tiny else 4), 1.0
    if not tiny:
        rl.num_steps, rl.eval_every = 400, 100
    return config


def get_config(arg=""):
    """Returns the pipeline arg names (module docstring) with stages SFT, RL and eval."""
    if arg in ("", "tiny"):
        config = toyworld.paper_config(arg)
    elif arg == "default":
        config = toyworld.get_config("")
    elif arg == "learned":
        config = learned_recipe(toyworld.get_config("long"))
    elif arg in ("default_tiny", "learned_tiny"):
        config = toyworld_judge.get_config("tiny")
        # role SFT from the tiny model itself (no warm-up stage), as "default" from its base
        config.sft.init_stage = ""
        if arg == "learned_tiny":
            learned_recipe(config, tiny=True)
    else:
        raise ValueError(f"configs/rl_method.py: unknown arg {arg!r}; known: {ARGS}")
    config.stages = ("sft", "rl", "eval")
    return config
