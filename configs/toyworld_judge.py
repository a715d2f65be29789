"""Toy world, the recipe with which a learned Judge raises held-out F1 in RL (docs/results.md,
session 15): a Judge-only warm-up, role SFT with the Policy's share raised, then 600 Policy RL
updates scored by the EMA model as Judge, and the held-out eval of both checkpoints.

  python -m mocojax.main --config configs/toyworld_judge.py --workdir runs/toyworld_judge   # ~55-60 min on 2 idle cores
  python -m mocojax.main --config configs/toyworld_judge.py:tiny --workdir /tmp/judge_tiny  # smoke run

What differs from configs/toyworld.py, and why:
- the rubric is the one exact roles met the RL target with (session 11): `absent_shapes` +
  `count_items`, without the size and place items a learned Judge cannot check (sessions 8-9);
- the Judge answers per item in the `reason` form (criterion | rationale | yes/no), the form in
  which it learned to search a caption for a word (session 12);
- a `warmup` stage trains the Judge alone first: 3,000 steps of 32 whose learning rate anneals
  over the first 1,000 and then restarts on the 3,000-step cosine (`warmup.restart_at=1000`; the
  schedule with which the Judge learned to bind colour to shape, session 18; one cosine over the
  same 3,000 steps and the same records did not teach it on any of seeds 1-3, session 19), then
  role SFT starts from it with the record mix (5, 0, 1): per-item Judge records are ~5 per scene, so the paper's
  2:1:1 (or (2, 0, 1)) leaves the Policy ~30% of the batches and an imprecise Policy (object
  precision 0.71-0.72) from which RL loses F1 whoever judges (sessions 13-14); (5, 0, 1) gives
  it half of them. The Policy learns terse captions (`policy_drop=0.4`);
- the Judge's captions also include repeated shapes and captions that name no object
  (`judge_repeats`, `judge_fragments`): without them RL collapsed on seed 1 onto captions like
  "On a gray background.", which the Judge passed;
- RL keeps GRPO's k3 KL to the role-SFT Policy (`rl.kl_beta=0.05`; Shao et al. 2024, whose
  clipped surrogate the method uses): without it the Policy sharpens onto its mode, groups lose
  their reward variance (up to 70-78% at the end even with exact roles) and RL trades recall for
  precision and lets positions decay, so exact roles lost F1 from session 19's role-SFT Policies
  (-0.009 / -0.030 / -0.009, seeds 1-3) and the learned Judge was flat; with it exact roles gave
  +0.073 / +0.007 / +0.094 and the learned EMA Judge +0.055 / +0.020 / +0.074 on seeds 1-3 (session 20);
- **the Generator is the world's exact one** (`rl.generator="exact"`): a learned Generator of
  this rubric is not trained yet, so this config measures the learned Judge alone. The Judge is
  the EMA of the Policy (m = 0.99, H = 1), as the method's.

Measured (200 held-out scenes, docs/results.md sessions 15-16): held-out F1 SFT -> RL seed 4
0.575 -> 0.594 (+0.019, hallucinations 0.46 -> 0.17, words -13%), seed 1 0.572 -> 0.501 (-0.071,
one-object captions), seed 2 0.577 -> 0.528 (-0.049, words -29%), seed 3 0.546 -> 0.480 (-0.066, words -20%). The Judge passes
presence items on captions naming the shape in another colour (45-92% on RL's samples in the first 100 updates, 88-99% in the last): it does
not bind colour to shape, which `data.judge_recolours` did not teach (session 16). Without the two caption switches: seed 4 +0.017, seed 1 collapsed
(0.575 -> 0.193); exact roles from those SFT checkpoints +0.051 / +0.026, and from seed 3's
+0.064 (session 17). With `--config.data.count_floor=True` (at-least items, session 17): seed 1
0.567 -> 0.590 (+0.023), seed 3 0.571 -> 0.381 (the Judge learned every kind worse; gamed).
The 1,000-step warm-up (--config.warmup.num_steps=1000 --config.warmup.restart_at=0, the
numbers above) stops on the Judge's plateau. Continued to 3,000 steps (session 18: the schedule
this config now has, bitwise the same run by construction, tests/test_main.py) it learns to bind
colour to shape and RL gives +0.011 / +0.017 / +0.001 on seeds 1-3 (hallucinations falling, none
gamed); with one 3,000-step cosine instead (--config.warmup.restart_at=0, session 19) the Judge
does not bind (on recoloured presence items it passes 0.91 / 0.60 / 0.86 on the validation range,
against 0.59 / 0.24 / 0.32) and RL's rows are in docs/results.md. All the rows above ran without
a KL term. With `rl.kl_beta=0.05` (session 20, RL rerun from existing role-SFT checkpoints):
from the one-cosine warm-ups +0.055 / +0.020 / +0.074 on seeds 1-3 (seeds 1 and 3 meet the RL
target: hallucinations -59% / -66%, words -15% / -2%), from this schedule on seed 2 +0.033
(hallucinations +27%). As shipped, one command per seed (session 21): +0.013 / +0.033 / +0.056 on
seeds 1-3 (SFT 0.558 / 0.568 / 0.542; seed 3 meets the target, hallucinations -51%, words +5%);
on the validation range (`benchmarks/role_curve.py`) this warm-up's RL Policies beat the
one-cosine ones (mean F1 0.597 against 0.581) and beta 0.1 ties 0.05, so neither changed.
Session 25: RL at `rl.lr=1e-4` (now the default; it was 2e-4) from those role-SFT checkpoints,
chosen on the validation range (+0.073 / +0.057 / +0.114 on seeds 1-3 against +0.032 / +0.058 /
+0.092); on the eval scenes +0.044 / +0.036 / +0.079 (against +0.013 / +0.033 / +0.056),
hallucinations 0.40 -> 0.32 / 0.35 -> 0.36 / 0.41 -> 0.28, words +5% / +10% / +11%, positions
right 0.28 -> 0.25 (0.15 at 2e-4). Seed 3 meets the RL target, seeds 1-2 miss it by 0.006 / 0.014.
Session 26, this config as shipped in one command per seed on a fresh machine (which did not
reproduce session 21's checkpoints bitwise): +0.061 / +0.061 on seeds 1-2 (hallucinations
0.41 -> 0.34 / 0.52 -> 0.50, words +3% / +9%; zero-variance groups 12% / 23% at the end); ~80 min
per seed with another run beside it (warm-up 44, SFT 7, RL 25). 1,000 RL updates were not better
on the validation range (+0.083 / +0.037 against +0.062 / +0.044), so it keeps 600.
"""

from configs import toyworld


def get_config(arg=""):
    """Returns configs/toyworld.py with the learned-Judge recipe above (arg "tiny": smoke run)."""
    config = toyworld.get_config(arg)
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
