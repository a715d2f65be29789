"""Toy world baseline: EvoLM as the paper reproduces it, alternating training in which the Policy
and the Generator share parameters and both are trained (mocojax.train.evolm). Odd updates: the
method's Policy update with the live shared params as Generator and the frozen SFT model as
Judge; even updates: GRPO on N sampled rubrics per image, rewarded by how much more the
reference caption meets a rubric than the current Policy's captions do.

  python -m mocojax.main --config configs/rl_evolm.py --workdir runs/rl_evolm
"""

from configs import rl_method


def get_config(arg=""):
    """Returns configs/rl_method.py with EvoLM's alternating Policy / Generator updates."""
    if arg.startswith("default"):
        raise ValueError(
            f"configs/rl_evolm.py:{arg}: training a learned Generator has no counterpart on the default "
            "recipe, whose Generator is the world's exact one (docs/ablations.md)"
        )
    config = rl_method.get_config(arg)
    config.rl.train_generator = True
    config.rl.generator = "policy"  # the Generator IS the Policy's parameters
    config.rl.judge = "frozen"
    # EvoLM's Generator updates sample their own rubrics; its Policy updates use one greedy
    # rubric (the learned grid's union of draws is the method's, not EvoLM's)
    config.rl.rubric_samples, config.rl.rubric_votes = 1, 1
    return config
