"""ACE-Cap's G2P reward on the toy world: Stage I multi-role SFT as configs/toyworld.py:paper, then
Policy GRPO on R_G (Gold-MCQ answered from the caption alone, +1 right / -0.5 Not Given / -1 wrong) instead
of the rubric reward, then held-out eval of the RL Policy (docs/acecap.md).

  python -m mocojax.main --config configs/acecap_g2p.py --workdir runs/acecap_g2p
  python -m mocojax.main --config configs/acecap_g2p.py:tiny --workdir /tmp/g2p_tiny   # smoke run

The judge is the toy world's exact oracle reader (a fixed text-only judge, as the paper's frozen
judge); --config.rl.judge=frozen makes the SFT model the judge, through the sampler. No Generator
runs, so no momentum copy is kept for it. Reuse an SFT run by pointing --workdir at it.
"""

from configs import toyworld


def get_config(arg=""):
    """Returns configs/toyworld.py:paper with rl.reward = "g2p", the exact judge, and no export
    stage."""
    config = toyworld.paper_config(arg)
    config.stages = ("sft", "rl", "eval")
    config.rl.reward = "g2p"
    config.rl.judge = "exact"
    return config
