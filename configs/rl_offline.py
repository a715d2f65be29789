"""Toy world ablation M3: offline (fixed) rubrics. As M4 (separately initialised frozen roles,
configs/rl_separate_roles.py with m = 1), but each image's rubric is written once, by the frozen
Generator from M captions of the SFT Policy, and reused at every update (rl.rubrics = "offline",
mocojax.train.offline_rubrics).

  python -m mocojax.main --config configs/rl_offline.py --workdir runs/rl_offline \
      --config.rl.roles_init=runs/roles_sft
"""

from configs import rl_separate_roles


def get_config(arg=""):
    """Returns configs/rl_separate_roles.py with frozen roles and offline rubrics."""
    config = rl_separate_roles.get_config(arg)
    config.rl.momentum = 1.0
    config.rl.rubrics = "offline"
    return config
