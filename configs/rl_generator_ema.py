"""Toy world ablation. Role ablation: EMA on the Generator only; the Judge stays the SFT model.

python -m mocojax.main --config configs/rl_generator_ema.py --workdir runs/rl_generator_ema
"""

from configs import rl_method


def get_config(arg=""):
    """Returns configs/rl_method.py with this ablation's change."""
    if arg.startswith("default"):
        raise ValueError(
            f"configs/rl_generator_ema.py:{arg}: EMA on a learned Generator has no counterpart on the default "
            "recipe, whose Generator is the world's exact one (docs/ablations.md)"
        )
    config = rl_method.get_config(arg)
    config.rl.generator, config.rl.judge = "ema", "frozen"
    return config
