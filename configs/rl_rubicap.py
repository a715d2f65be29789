"""Toy world baseline: RubiCap (seeds 001 / 003). Rubrics built offline, once per image, from a
committee of K = 5 noisy teacher captions drawn from the toy world: facts at least ceil(K/2)
teachers state, the SFT Policy's greedy caption diagnosed against them, one binary item per
deficiency weighted 3 / 2 / 1 (mocojax.data.toycommittee states the noise model). A FROZEN
text-only Judge (the shared SFT model) scores every rollout; the same normalised weighted
reward; GRPO. No Generator model runs.

  python -m mocojax.main --config configs/rl_rubicap.py --workdir runs/rl_rubicap
  ... --config.rl.committee_size=3 --config.rl.committee_omit=0.2   # committee and noise
  ... --config.rl.judge=exact                                       # the world's exact Judge
"""

from configs import rl_method


def get_config(arg=""):
    """Returns configs/rl_method.py with RubiCap's offline committee rubrics and a frozen Judge."""
    config = rl_method.get_config(arg)
    config.rl.rubrics = "committee"
    config.rl.judge = "frozen"
    config.rl.generator = "frozen"  # unused: no Generator model runs (no copy is kept for it)
    return config
