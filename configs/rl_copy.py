"""Toy world ablation. Full copy, (m, H) = (0, 1): the roles are the Policy of the previous update (M7).

python -m mocojax.main --config configs/rl_copy.py --workdir runs/rl_copy
"""

from configs import rl_method


def get_config(arg=""):
    """Returns configs/rl_method.py with this ablation's change."""
    config = rl_method.get_config(arg)
    config.rl.momentum = 0.0
    return config
