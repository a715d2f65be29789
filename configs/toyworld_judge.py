"""Toy world, the recipe with which a learned Judge raises held-out F1 in RL: a Judge-only warm-up,
role SFT with the Policy's share raised, 600 Policy RL updates scored by the EMA model as Judge,
and the held-out eval of both checkpoints (docs/results.md has every run behind each choice).

  python -m mocojax.main --config configs/toyworld_judge.py --workdir runs/toyworld_judge   # ~80 min beside another run
  python -m mocojax.main --config configs/toyworld_judge.py:check --workdir runs/judge_check  # ~19 min idle
  python -m mocojax.main --config configs/toyworld_judge.py:tiny --workdir /tmp/judge_tiny  # smoke run

What differs from configs/toyworld.py:paper, and why (session numbers point into docs/results.md):
- the rubric is the one exact roles met the RL target with (session 11): `absent_shapes` +
  `count_items`, without the size and place items a learned Judge cannot check (sessions 8-9);
- the Judge answers per item in the `reason` form (criterion | rationale | yes/no), the form in
  which it learned to search a caption for a word (session 12);
- a `warmup` stage trains the Judge alone first: 3,000 steps of 32 whose learning rate anneals
  over the first 1,000 and then restarts on the 3,000-step cosine (`warmup.restart_at=1000`).
  With this schedule the Judge learned to bind colour to shape (session 18); one cosine over the
  same steps and records did not teach it on any of seeds 1-3 (session 19). `:check` skips it:
  role SFT starts from mocojax/assets/toybase_check (configs/toybase_check.py: this warm-up run
  once on seed-6 scenes), packed and chunked; with the export it is configs/toyworld.py's
  default. Seed 3's warm-up served seeds 1-2 as well as their own (+0.055 / +0.074; session 29);
  from the check base RL gained +0.037 / +0.053 / +0.015 on seeds 1-3 at the role-SFT mix
  (5, 0, 1) (validation +0.031 / +0.076 / +0.031; session 30; session 29's seed-5 base: +0.066 /
  +0.022 / +0.077) and gains +0.060 / +0.058 / +0.054 at `:check`'s (5, 0, 2) (validation +0.050
  / +0.031 / +0.089; session 33), against the full recipe's +0.061 / +0.061 / +0.074 at (5, 0, 1)
  (validation +0.062 / +0.044 / +0.096); without an arg this config keeps its own warm-up;
- role SFT starts from the warm-up with the record mix (5, 0, 1): per-item Judge records are ~5
  per scene, so the paper's 2:1:1 leaves the Policy ~30% of the batches and an imprecise Policy
  from which RL loses F1 whoever judges (sessions 13-14). The Policy learns terse captions
  (`policy_drop=0.4`). `:check` mixes (5, 0, 2): from the check base, twice the Judge's share
  keeps more of its warm-up and RL gains +0.060 / +0.058 / +0.054 on seeds 1-3 (validation
  +0.050 / +0.031 / +0.089; session 33; from (5, 0, 1)'s role-SFT Policies the world's exact
  Judge gains +0.074 / +0.073 / +0.055, the learned one +0.037 / +0.053 / +0.015);
- the Judge's captions include repeated shapes and captions that name no object
  (`judge_repeats`, `judge_fragments`): without them RL collapsed on seed 1 onto captions like
  "On a gray background.", which the Judge passed (session 15);
- RL keeps GRPO's k3 KL to the role-SFT Policy (`rl.kl_beta=0.05`; Shao et al. 2024): without
  it the Policy sharpens onto its mode, groups lose their reward variance and even exact roles
  lose F1 (session 20); RL's lr is 1e-4, chosen on the validation range (session 25);
- **the Generator is the world's exact one** (`rl.generator="exact"`): a learned Generator of
  this rubric good enough for RL is not trained yet (sessions 22-24), so this config measures
  the learned Judge alone. The Judge is the EMA of the Policy (m = 0.99, H = 1), as the method's.

Measured (200 held-out scenes, paired 95% intervals; README "Honest status" has the table):
as shipped, one command per seed, held-out F1 RL - SFT +0.061 / +0.061 / +0.074 on seeds 1-3
(sessions 26-27; hallucinations falling, words +0% to +9%); another RL random stream from the
same role-SFT checkpoints moves each gain by 0.002-0.010 (session 27); zero-variance groups
15-22% over the last 100 updates. 1,000 RL updates (session 26) and 16 samples per group
(session 27) were not better on the validation range, so it keeps 600 updates of 8 x 4. The same command is deterministic
on one machine but not bitwise the same run on another (XLA's CPU code differs).
"""

import os

from configs import toyworld

# configs/toybase_check.py's export: the toy base continued on this recipe's Judge warm-up
CHECK_BASE_DIR = os.path.join(os.path.dirname(toyworld.BASE_DIR), "toybase_check")


def get_config(arg=""):
    """Returns configs/toyworld.py:paper with the learned-Judge recipe above (arg "tiny": smoke run;
    "check": from the check base, without the warm-up stage)."""
    if arg not in ("", "tiny", "check"):
        raise ValueError(f"configs/toyworld_judge.py: unknown arg {arg!r}; known: '', tiny, check")
    config = toyworld.paper_config("tiny" if arg == "tiny" else "")
    config.stages = ("warmup", "sft", "rl", "eval")
    data = config.data
    data.judge_per_item = True
    data.judge_item_form = "reason"
    data.absent_shapes = True
    data.count_items = True
    data.attribute_items = False
    data.policy_drop = 0.4
    data.mix = (5, 0, 1)
    data.judge_repeats = True
    data.judge_fragments = True
    config.sft.init_stage = "warmup"
    # every row below was measured unpacked and unchunked (configs/toyworld.py now packs and
    # chunks: same evals to 3 decimals on the default job, not yet measured on this recipe)
    data.pack = False
    config.model.attention_chunk = 0
    if arg == "check":  # role SFT from the check base (the warm-up ran once, there), packed
        config.stages = ("sft", "rl", "eval")
        config.sft.init_stage = ""
        config.model.init_from = CHECK_BASE_DIR
        data.pack = True
        config.model.attention_chunk = 64
        # twice the Judge's records of the (5, 0, 1) mix: the role-SFT Judge keeps more of the
        # warm-up's lookups (validation, seeds 1-3: within kinds 0.934 / 0.955 / 0.948 against
        # 0.908 / 0.937 / 0.924) and RL gains +0.060 / +0.058 / +0.054 on the eval scenes
        # (validation +0.050 / +0.031 / +0.089; (5, 0, 1): +0.037 / +0.053 / +0.015, validation
        # +0.031 / +0.076 / +0.031); the SFT Policy starts 0.01-0.03 lower and RL ends where
        # (5, 0, 1)'s did (docs/results.md, session 33)
        data.mix = (5, 0, 2)
    config.rl.generator = "exact"
    config.rl.kl_beta = 0.05  # GRPO's k3 KL to the role-SFT Policy (Shao et al. 2024; session 20)
    # half the toy RL lr (session 25: chosen on the validation range, seeds 1-3: mean gain +0.081
    # against +0.061 at 2e-4; positions decay less)
    config.rl.lr = 1e-4
    config.eval.stage = "sft,rl"
    if arg != "tiny":
        config.warmup.num_steps = 3000
        config.warmup.restart_at = 1000
        config.sft.num_steps = 800
        config.rl.num_steps = 600
        config.rl.judge_max_new_tokens = 24  # "<criterion> | <rationale> | yes" of one item
    return config
