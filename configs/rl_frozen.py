"""Toy world ablation. Frozen roles (m = 1): the Generator and Judge stay the SFT model (M6).

python -m mocojax.main --config configs/rl_frozen.py --workdir runs/rl_frozen
"""

from configs import rl_method


def get_config(arg=""):
    """Returns configs/rl_method.py with this ablation's change."""
    config = rl_method.get_config(arg)
    config.rl.momentum = 1.0
    return config
