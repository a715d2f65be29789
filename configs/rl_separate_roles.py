"""Toy world ablation: separately initialised roles (M4 frozen / M5 with EMA). The Policy starts
from this run's SFT; the Generator and Judge start from another run's SFT checkpoint, e.g. a
run with another seed, or a roles-only mix (--config.data.mix='(0, 1, 1)').

  python -m mocojax.main --config configs/rl_method.py --workdir runs/roles_sft \
      --config.stages='("sft",)' --config.seed=1
  python -m mocojax.main --config configs/rl_separate_roles.py --workdir runs/rl_separate_roles \
      --config.rl.roles_init=runs/roles_sft                      # M5: EMA from separate roles
  ... --config.rl.momentum=1.0                                   # M4: frozen separate roles
"""

from configs import rl_method


def get_config(arg=""):
    """Returns configs/rl_method.py whose roles start from config.rl.roles_init (set it)."""
    config = rl_method.get_config(arg)
    config.rl.roles_init = "runs/roles_sft"
    return config
