"""The ablation grid's rows: the SFT runs they start from (SFT_KINDS), Row and every row of the
table (ROWS: the paper's ablations and baselines, the (m, H) grid) with the paper's numbers, the
grids (GRID_TABLE: the paper's pipeline and the default command's recipe, each also tiny), the
rows the tracking-error plot draws, the tiny runs' overrides and the tabulated METRICS. Split from
mocojax/ablate.py, which re-exports these names (docs/ablations.md has what each row means)."""

import dataclasses

# SFT runs the rows start from: data.mix (Policy : Generator : Judge records per scene).
SFT_KINDS = {
    "shared": {"data.mix": (2, 1, 1)},
    "policy_only": {"data.mix": (2, 0, 0)},
    "roles_only": {"data.mix": (0, 1, 1)},
}
# The rows' paper numbers (seed 000; METHOD.md): average win rate (%) of Tables 3-5, and the
# parameter distance at step 600 (Fig. 4). RubiCap / EvoLM: Table 1's average (72.83) minus the
# margins the paper states (2.90 / 16.80), a different table than the ablations'.
PAPER_M8 = 72.14


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the table: a config (configs/<config>.py) with overrides, on an SFT run."""

    name: str
    what: str
    config: str = "rl_method"
    overrides: tuple = ()  # ((dotted key, value), ...)
    sft: str = "shared"  # SFT_KINDS key the run starts from
    roles_sft: str = ""  # SFT_KINDS key whose checkpoint initialises the roles (rl.roles_init)
    sft_only: bool = False  # the row is the SFT run itself, scored
    same_as: str = ""  # the row is another row's runs (listed, not run twice)
    paper_win_rate: float | None = None
    paper_tracking_error: float | None = None


def _grid_rows():
    rows = []
    for m in (0.9, 0.99, 0.999):
        for h in (1, 5, 10):
            paper = {(0.99, 1): PAPER_M8, (0.99, 5): 71.79}.get((m, h))
            tracking = {(0.99, 1): 0.084, (0.999, 1): 0.605}.get((m, h))
            rows.append(
                Row(
                    f"grid_m{m}_H{h}",
                    f"(m, H) = ({m}, {h}), shared init, EMA on both roles",
                    overrides=(("rl.momentum", m), ("rl.sync_every", h)),
                    same_as="M8_method" if (m, h) == (0.99, 1) else "",
                    paper_win_rate=paper,
                    paper_tracking_error=tracking,
                )
            )
    return rows


ROWS = (
    Row("M1_policy_sft", "Policy-only SFT (scored, no RL)", sft="policy_only", sft_only=True),
    Row("M2_shared_sft", "shared multi-role SFT (scored, no RL)", sft_only=True),
    Row(
        "M3_offline",
        "offline (fixed) rubrics: written once per image from the SFT Policy's samples by "
        "separately initialised frozen roles",
        config="rl_offline",
        sft="policy_only",
        roles_sft="roles_only",
        paper_win_rate=69.22 - 0.85,
    ),
    Row(
        "M4_separate_frozen",
        "online rubrics, separately initialised frozen roles",
        config="rl_separate_roles",
        overrides=(("rl.momentum", 1.0),),
        sft="policy_only",
        roles_sft="roles_only",
        paper_win_rate=69.22,
    ),
    Row(
        "M5_separate_ema",
        "M4 + EMA (m = 0.99, H = 1) from the separate roles",
        config="rl_separate_roles",
        sft="policy_only",
        roles_sft="roles_only",
        paper_win_rate=63.43,
    ),
    Row(
        "M6_shared_frozen",
        "shared init, frozen roles (m = 1)",
        config="rl_frozen",
        paper_win_rate=66.61,
        paper_tracking_error=0.867,
    ),
    Row(
        "M7_shared_copy",
        "shared init, full sync (m, H) = (0, 1)",
        config="rl_copy",
        paper_win_rate=68.73,
    ),
    Row(
        "M8_method",
        "shared init + EMA (m, H) = (0.99, 1): the method",
        paper_win_rate=PAPER_M8,
        paper_tracking_error=0.084,
    ),
    Row(
        "role_generator_ema",
        "EMA on the Generator only, Judge frozen",
        config="rl_generator_ema",
        paper_win_rate=69.07,
    ),
    Row(
        "role_judge_ema",
        "EMA on the Judge only, Generator frozen",
        config="rl_judge_ema",
        paper_win_rate=65.84,
    ),
    Row("role_both_ema", "EMA on both roles (= M8)", same_as="M8_method", paper_win_rate=PAPER_M8),
    *_grid_rows(),
    Row(
        "byol_cosine",
        "m from 0.99 to 1 by BYOL's half cosine, H = 1",
        overrides=(("rl.momentum_schedule", "byol_cosine"),),
    ),
    Row(
        "rubicap",
        "RubiCap: offline committee rubrics (K = 5 noisy teachers), frozen SFT Judge",
        config="rl_rubicap",
        paper_win_rate=72.83 - 2.90,
    ),
    Row(
        "evolm",
        "EvoLM: alternating Policy / Generator training on shared parameters",
        config="rl_evolm",
        paper_win_rate=72.83 - 16.80,
    ),
)
ROW_NAMES = tuple(r.name for r in ROWS)

# The default command's recipe (configs/toyworld.py) learns the Policy and the Judge only: its
# role SFT mixes Policy and Judge records 5:2 and RL takes its rubrics from the world's exact
# Generator, so the rows that need a learned Generator have no counterpart on it, and EMA on the
# Judge alone is the method itself.
DEFAULT_SFT_KINDS = {
    "shared": {"data.mix": (5, 0, 2)},  # the recipe's role SFT, scored (M2)
    "policy_only": {"data.mix": (5, 0, 0)},
    "roles_only": {"data.mix": (0, 0, 1)},  # the separately initialised Judge of M3-M5
    # The recipe's role SFT run until its Policy has seen as many batches as policy_only's 800:
    # at (5, 0, 2) the Policy gets ~300 of 800 batches (317 / 305 / 294 on seeds 1-3, the rest
    # are the per-item Judge's), so 2,000 steps give it ~790.
    "shared_long": {"data.mix": (5, 0, 2), "sft.num_steps": 2000},
}
DEFAULT_EXCLUDED = {
    "role_generator_ema": "EMA on a learned Generator: the recipe's Generator is the world's exact one",
    "evolm": "trains a learned Generator on the Policy's parameters: the recipe has none",
}
DEFAULT_SAME = {"role_judge_ema": "M8_method"}  # the Generator is exact: EMA on the Judge = M8
# Rows of the default grid only, each after the row it reads against: not the paper's rows but
# controls that say why one of them scores as it does.
DEFAULT_EXTRA = {
    "M8_method": (
        Row(
            "M2_shared_sft_long",
            "shared role SFT run 2,000 steps: its Policy sees as many batches as M1's (scored)",
            sft="shared_long",
            sft_only=True,
        ),
        Row(
            "M8_equal_policy_batches",
            "the method (EMA (0.99, 1)) from M2_shared_sft_long (control: M8 against M4 at "
            "equal Policy batches, not equal steps)",
            sft="shared_long",
        ),
    ),
    "rubicap": (
        Row(
            "rubicap_exact_judge",
            "RubiCap's committee rubrics judged by the world's exact Judge (control: the rubric "
            "without a Judge to game)",
            config="rl_rubicap",
            overrides=(("rl.judge", "exact"),),
        ),
    ),
}


def _default_rows():
    rows = []
    for row in ROWS:
        if row.name in DEFAULT_EXCLUDED:
            continue
        if row.name in DEFAULT_SAME:
            row = dataclasses.replace(
                row,
                what=f"{row.what} (= M8: the Generator is the world's exact one)",
                config="rl_method",
                same_as=DEFAULT_SAME[row.name],
            )
        rows.append(row)
        rows.extend(DEFAULT_EXTRA.get(row.name, ()))
    return tuple(rows)


@dataclasses.dataclass(frozen=True)
class Grid:
    """A grid: the arg every row's config takes (configs/rl_method.py), its SFT runs, its rows,
    the paper rows it has no counterpart for (name -> why) and whether its runs are short."""

    name: str
    config_arg: str
    sft_kinds: dict
    rows: tuple
    excluded: dict
    tiny: bool = False
    # Settings every run of the grid pins (before its SFT kind's and row's own), so that a change
    # of the config it builds on does not change the grid's runs.
    pinned: tuple = ()

    @property
    def row_names(self):
        return tuple(r.name for r in self.rows)


DEFAULT_ROWS = _default_rows()
# The step counts of the recipe the default grid's runs were made with (sessions 33-39): 800
# role-SFT steps (shared_long: 2,000) and 600 RL updates. Pinned, so that a later change of the
# default command's counts (e.g. to fit its time budget) leaves the grid's finished runs the
# grid's instead of refusing them as "started with other settings". (An RL run's sft.num_steps
# is inert: it starts from its SFT run's checkpoint.)
DEFAULT_PINNED = (("sft.num_steps", 800), ("rl.num_steps", 600))
GRID_TABLE = {
    "paper": Grid("paper", "", SFT_KINDS, ROWS, {}),
    "tiny": Grid("tiny", "tiny", SFT_KINDS, ROWS, {}, tiny=True),
    "default": Grid(
        "default",
        "default",
        DEFAULT_SFT_KINDS,
        DEFAULT_ROWS,
        DEFAULT_EXCLUDED,
        pinned=DEFAULT_PINNED,
    ),
    "default_tiny": Grid(
        "default_tiny", "default_tiny", DEFAULT_SFT_KINDS, DEFAULT_ROWS, DEFAULT_EXCLUDED, True
    ),
}
# The learned-Generator recipe (configs/rl_method.py:learned: the default recipe's long role SFT
# at the mix (5, 2, 2), the EMA model as Generator too, the union of 4 sampled rubrics per image
# checked against the references): the rows that need a learned Generator, which the default grid
# leaves out, beside the method, frozen roles, full sync and two controls.
LEARNED_SFT_KINDS = {"shared": {"data.mix": (5, 2, 2)}}
LEARNED_KEEP = (
    "M2_shared_sft",
    "M6_shared_frozen",
    "M7_shared_copy",
    "M8_method",
    "role_generator_ema",
    "role_judge_ema",
    "role_both_ema",
    "evolm",
)
LEARNED_EXTRA = {
    "M8_method": (
        Row(
            "exact_generator",
            "the method with the world's exact Generator in the learned one's place (control: "
            "the rubric the learned Generator is after)",
            overrides=(("rl.generator", "exact"), ("rl.rubric_samples", 1)),
        ),
        Row(
            "rubric_next_image",
            "the method, each image judged with the next image's rubric (trivial baseline: "
            "what the reward pays without the rubric's content)",
            overrides=(("rl.rubric_source", "next_image"),),
        ),
    ),
}
LEARNED_EXCLUDED = {
    **dict.fromkeys(
        ("M1_policy_sft", "M3_offline", "M4_separate_frozen", "M5_separate_ema"),
        "separately initialised roles: on the default grid (the learned grid keeps shared init)",
    ),
    **{
        r.name: "the momentum's settings: on the default grid (no (m, H) ordered there)"
        for r in ROWS
        if r.name.startswith("grid_") or r.name == "byol_cosine"
    },
    "rubicap": "a fixed committee rubric, no learned Generator: on the default grid",
}


def _learned_rows():
    rows = []
    for row in ROWS:
        if row.name in LEARNED_KEEP:
            rows.append(row)
            rows.extend(LEARNED_EXTRA.get(row.name, ()))
    return tuple(rows)


LEARNED_ROWS = _learned_rows()
# Session 42's run of the method on this recipe (docs/results.md) was made with these counts.
LEARNED_PINNED = (("sft.num_steps", 2000), ("rl.num_steps", 400), ("rl.eval_every", 100))
GRID_TABLE["learned"] = Grid(
    "learned", "learned", LEARNED_SFT_KINDS, LEARNED_ROWS, LEARNED_EXCLUDED, pinned=LEARNED_PINNED
)
GRID_TABLE["learned_tiny"] = Grid(
    "learned_tiny", "learned_tiny", LEARNED_SFT_KINDS, LEARNED_ROWS, LEARNED_EXCLUDED, True
)
# Rows whose tracking error the plot draws: m = 0.9, 0.99, 0.999 at H = 1, and frozen roles.
TRACKING_ROWS = {
    "m = 0.9": "grid_m0.9_H1",
    "m = 0.99": "M8_method",
    "m = 0.999": "grid_m0.999_H1",
    "frozen": "M6_shared_frozen",
}
# Rows the second plot (tracking_error_mh.png) draws: every (m, H) of the grid, and frozen roles.
MH_TRACKING_ROWS = {
    **{
        f"{m}, H = {h}": "M8_method" if (m, h) == (0.99, 1) else f"grid_m{m}_H{h}"
        for m in (0.9, 0.99, 0.999)
        for h in (1, 5, 10)
    },
    "frozen": "M6_shared_frozen",
}
# Short runs for tests (the tiny grids): 2 SFT steps and 2 RL updates of every row's tiny config.
TINY_OVERRIDES = (
    ("sft.num_steps", 2),
    ("sft.eval_every", 2),
    ("sft.checkpoint_every", 2),
    ("rl.num_steps", 2),
    ("rl.checkpoint_every", 2),
)
METRICS = (
    ("f1", "held-out F1"),
    ("f1_gain", "RL − SFT F1 (same seed)"),
    ("hallucinated_per_caption", "halluc./caption"),
    ("caption_words", "words"),
    ("judge_balanced_accuracy", "scored ckpt's Judge bal. acc"),
    ("rl_judge_gate", "RL's Judge at gate"),
    ("zero_variance_frac", "zero-var. groups"),
    ("reward_f1_corr_within", "within-group r"),
    ("final_tracking_error", "final tracking err."),
)
