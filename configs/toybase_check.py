"""The check base: the shipped toy base continued on the learned-Judge recipe's warm-up, so runs of
configs/toyworld.py (the default) and configs/toyworld_judge.py:check start from a model that
already checks a caption against a criterion.

The recipe's Judge learns to bind colour to shape only after a long warm-up of its own (3,000
steps of 32 per-item questions whose learning rate anneals over the first 1,000 and restarts;
docs/results.md, sessions 18-19): ~45 min of every recipe run on 2 CPU cores. Its question is
the toy base's `truth` task form ("Caption: <caption>" then "Check: <criterion>", answered
"<criterion> | <rationale> | yes/no", no role instruction, no image), so it is trained once here,
on scenes of data seed 6 (no eval seed), and shipped in mocojax/assets/toybase_check:

  python -m mocojax.main --config configs/toybase_check.py --workdir runs/toybase_check \
      --config.export.out_dir=mocojax/assets/toybase_check
  python -m mocojax.main --config configs/toybase_check.py:tiny --workdir /tmp/check_tiny  # smoke run

Whether a warm-up binds colour to shape is a draw: on data seeds 5, 6 and 8 its Judge passed 81%,
36% and 82% of presence items naming the shape in another colour (benchmarks/judge_curve.py on
each seed's own validation scenes; the recipe's own warm-ups on seeds 1-3: 35-47%). Seed 6's is
shipped (session 30, docs/results.md). Its toybase.json names the scenes it and its parent base
trained on (validation refuses a toy run whose held-out scenes are among them). Deterministic on
one machine type, as the base's build is (XLA's CPU code differs between machines).
"""

from configs import toyworld, toyworld_judge


def get_config(arg=""):
    """Returns the recipe's warm-up stage alone on data seed 6, then the export of its checkpoint
    (arg "tiny": a smoke run from a random tiny model)."""
    config = toyworld_judge.get_config(arg)
    config.stages = ("warmup", "export")
    config.sft.init_stage = "warmup"  # the recipe's; no sft stage runs here
    if arg != "tiny":
        config.model.init_from = toyworld.BASE_DIR  # the shipped toy base
        config.warmup.num_steps = 3000
        config.warmup.restart_at = 1000
    config.data.seed = 6  # its Judge binds colour to shape; seeds 5 and 8 did not (docstring)
    # packed and chunked: same losses as unpacked to float32 rounding, ~1.9x the warm-up's
    # steps/s (session 29, docs/results.md)
    config.data.pack = True
    config.model.attention_chunk = 64
    config.export.stage = "warmup"
    config.export.built_by = "python -m mocojax.main --config configs/toybase_check.py"
    return config
