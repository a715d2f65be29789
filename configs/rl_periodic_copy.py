"""Toy world ablation. Periodic copy, (m, H) = (0, 5): the roles jump to the Policy every 5 updates.

python -m mocojax.main --config configs/rl_periodic_copy.py --workdir runs/rl_periodic_copy
"""

from configs import rl_method


def get_config(arg=""):
    """Returns configs/rl_method.py with this ablation's change."""
    config = rl_method.get_config(arg)
    config.rl.momentum, config.rl.sync_every = 0.0, 5
    return config
