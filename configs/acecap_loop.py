"""ACE-Cap's active evidence acquisition on the toy world, trained with LOOP-GRPO (docs/acecap.md):
Stage I multi-role SFT as configs/toyworld.py:paper plus the loop's Instruct and Composer records
(`data.loop_mix`, mocojax/data/toyloop.py: exact answers and teacher transcripts), then the
`loop` stage: per update, the Policy's c_0, G Composer rollouts that ASK or say READY, the
Instruct answers, the final captions; R_G of each on the scene's Gold-MCQ; LOOP-GRPO's
per-action advantages on the Composer's spans; then the held-out eval of the loop.

  python -m mocojax.main --config configs/acecap_loop.py --workdir runs/acecap_loop
  python -m mocojax.main --config configs/acecap_loop.py --workdir runs/acecap_loop_control \\
      --config.loop.control=True        # the broadcast-advantage GRPO control on the same loop
  python -m mocojax.main --config configs/acecap_loop.py:tiny --workdir /tmp/loop_tiny   # smoke run

The Instruct role is the world's exact answerer by default (`loop.instruct="exact"`, as RL's
exact roles measure one learned role at a time); `--config.loop.instruct=model` makes the model
answer. Reuse an SFT run by pointing --workdir at it and `--config.stages='("loop",)'`.
The defaults of c_q, c_s, lam and K are ours (the paper gives none): mocojax/loop_grpo.py says why.
"""

from configs import toyworld
from mocojax.train import loop as loop_lib


def get_config(arg=""):
    """Returns configs/toyworld.py:paper with the loop's records and the loop stage (arg "tiny":
    smoke run)."""
    config = toyworld.paper_config(arg)
    config.stages = ("sft", "loop")
    config.data.loop_mix = (1, 1)
    config.loop = loop_lib.loop_defaults()
    if arg == "tiny":
        loop = config.loop
        loop.num_steps, loop.images_per_step, loop.num_rollouts = 2, 2, 2
        loop.max_questions, loop.checkpoint_every, loop.log_samples_every = 2, 1, 1
        loop.eval_scenes, loop.eval_batch = 2, 2
        loop.caption_max_new_tokens = loop.action_max_new_tokens = 8
        loop.answer_max_new_tokens, loop.final_max_new_tokens = 8, 8
    return config
