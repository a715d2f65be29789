"""The ablation runner (mocojax.ablate) and the baselines' pure functions (RubiCap's committee
rubric, EvoLM's Generator reward), on hand-computed numbers; then every row of the tiny grid
run for 2 SFT steps + 2 RL updates in one process (compiled programs shared), and its resume.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from PIL import Image

from mocojax import ablate, ablate_rows, config_utils, main as main_lib, roles, workdir_lock
from mocojax.data import toycommittee as tc, toyroles, toyworld as tw
from mocojax.train import evolm

# --- RubiCap's committee rubric -------------------------------------------------------------

COMMITTEE = [
    "A large red circle at the top left and a small blue square at the bottom. The background is white.",
    "A large red circle in the top left. The background is white.",
    "A small red circle at the top left and a green star in the center. The background is black.",
]


def test_consensus_keeps_what_a_majority_of_teachers_state():
    agreed = tc.consensus(COMMITTEE)  # K = 3: a fact needs 2 teachers
    assert agreed.present == {("circle", "red")}
    assert agreed.counts == {("circle", "red"): 3, ("square", "blue"): 1, ("star", "green"): 1}
    assert agreed.is_absent(("square", "blue")) and agreed.is_absent(("star", "green"))
    assert agreed.is_absent(("diamond", "purple"))  # no teacher names it
    assert not agreed.is_absent(("circle", "red"))
    # size: large, large, small -> large; position: top left x3; background: white, white, black
    assert agreed.attributes == {
        ("circle", "red", "size"): "large",
        ("circle", "red", "position"): "top left",
    }
    assert agreed.background == "white"


def test_consensus_tie_keeps_neither_presence_nor_absence():
    agreed = tc.consensus(["A red circle on a white background.", "A blue star."])  # K = 2
    assert agreed.present == frozenset()
    assert not agreed.is_absent(("circle", "red")) and not agreed.is_absent(("star", "blue"))
    assert agreed.background == "white"  # 1 of 2 teachers states it: 1 >= ceil(2 / 2)
    items = tc.rubicap_rubric(
        ["A red circle on a white background.", "A blue star."], "A blue star."
    )
    assert items == [roles.RubricItem("the background is white", "white", 1.0)]


def test_rubicap_rubric_one_item_per_deficiency_with_severity_weights():
    student = "A small red circle and a green star. The background is black."
    items = tc.rubicap_rubric(COMMITTEE, student)
    assert [(i.criterion, i.weight) for i in items] == [
        ("does not mention a green star", 3.0),  # critical: invented object
        ("mentions a red circle at the top left", 2.0),  # important: missing position
        ("mentions a large red circle", 2.0),  # important: wrong size
        ("the background is white", 1.0),  # minor: wrong background
    ]
    # The same normalised weighted reward: a caption meeting the first two items only.
    caption = "A small red circle at the top left."
    decisions = toyroles.ExactRoles.decisions(items, caption)
    assert decisions == [1, 1, 0, 0]
    assert roles.rubric_reward([i.weight for i in items], decisions) == pytest.approx(5 / 8)
    # A student with no deficiency gets an empty rubric (the group then has no signal).
    complete = "A large red circle at the top left. The background is white."
    assert tc.rubicap_rubric(COMMITTEE, complete) == []
    # A missing consensus object is a critical item.
    assert [i.criterion for i in tc.rubicap_rubric(COMMITTEE, "The background is white.")] == [
        "mentions a red circle"
    ]


def test_teacher_noise_model():
    scene = tw.make_scene(3, 11)
    clean = tc.teacher_caption(scene, 3, 0, omit=0.0, wrong=0.0, invent=0.0)
    assert tw.caption_metrics(scene, clean)["f1"] == 1.0
    silent = tc.teacher_caption(scene, 3, 0, omit=1.0, wrong=0.0, invent=0.0)
    assert tw.parse_caption(silent) == ([], None)
    inventive = tc.teacher_caption(scene, 3, 0, omit=0.0, wrong=0.0, invent=1.0)
    metrics = tw.caption_metrics(scene, inventive)
    assert len(metrics["hallucinated"]) == (1 if len(scene.objects) < 9 else 0)
    assert metrics["recall"] == 1.0
    assert tc.committee_captions(scene, 3, 4) == tc.committee_captions(scene, 3, 4)  # seeded
    with pytest.raises(ValueError, match="omit=1.5: must be a probability"):
        tc.teacher_caption(scene, 3, 0, omit=1.5)
    with pytest.raises(ValueError, match="committee size must be a positive int"):
        tc.committee_captions(scene, 3, 0)
    with pytest.raises(ValueError, match="at least one teacher caption"):
        tc.consensus([])


# --- EvoLM's Generator reward --------------------------------------------------------------


def test_discrimination_reward_by_hand():
    # s(ref) = (3 + 2) / 6; s(y1) = 3 / 6, s(y2) = 1 / 6 -> g = 5/6 - 2/6 = 0.5
    g = evolm.discrimination_reward([3.0, 2.0, 1.0], [1, 1, 0], [[1, 0, 0], [0, 0, 1]])
    assert g == pytest.approx(0.5)
    assert evolm.discrimination_reward([3.0], [0], [[1], [1]]) == pytest.approx(-1.0)
    assert evolm.discrimination_reward([], [], [[], []]) == evolm.UNPARSED_REWARD
    assert [evolm.AlternatingSource.is_generator_step(s) for s in (1, 2, 3, 4)] == [
        False,
        True,
        False,
        True,
    ]


# --- the runner ----------------------------------------------------------------------------


def test_dry_run_lists_every_row_seed_and_sft_checkpoint(tmp_path, capsys):
    runs = ablate.main(["--grid", "paper", "--seeds", "3", "--workdir", str(tmp_path), "--dry-run"])
    out = capsys.readouterr().out
    run_rows = [r for r in ablate.ROWS if not r.sft_only and not r.same_as]
    assert len(runs) == 3 * (len(ablate.SFT_KINDS) + len(run_rows))
    assert f"{len(runs)} runs" in out
    for row in ablate.ROWS:
        assert row.name in out
    assert "row grid_m0.99_H1 reuses the runs of M8_method" in out
    for seed in (1, 2, 3):
        sft = {r.name: r for r in runs if r.kind == "sft" and r.seed == seed}
        assert set(sft) == set(ablate.SFT_KINDS)  # one SFT checkpoint per kind and seed
        for run in runs:
            if run.kind == "rl" and run.seed == seed:
                assert run.sft_from in {s.workdir for s in sft.values()}
                assert dict(run.overrides)["data.seed"] == seed
    by_name = {r.name: r for r in runs if r.seed == 1}
    assert by_name["M4_separate_frozen"].sft_from.endswith("sft/policy_only/seed1")
    assert dict(by_name["M4_separate_frozen"].overrides)["rl.roles_init"].endswith(
        "sft/roles_only/seed1"
    )
    assert dict(by_name["grid_m0.999_H10"].overrides)["rl.momentum"] == 0.999
    assert "--config.rl.sync_every=10" in by_name["grid_m0.999_H10"].command()
    assert not os.listdir(tmp_path)  # a dry run writes nothing
    # Every planned config loads and validates.
    for run in runs:
        config_utils.validate(ablate.load_config(run), main_lib.STAGES)
    with pytest.raises(ValueError, match="unknown row"):
        ablate.plan("paper", 1, str(tmp_path), ["M9"])
    with pytest.raises(ValueError, match="--seeds 0"):
        ablate.plan("paper", 0, str(tmp_path))
    with pytest.raises(ValueError, match="--grid 'huge'"):
        ablate.plan("huge", 1, str(tmp_path))


def test_seeds_as_a_count_a_list_or_a_range_plan_only_those_seeds(tmp_path, capsys):
    assert ablate.seed_list(3) == (1, 2, 3)
    assert ablate.seed_list("3") == (1, 2, 3)
    assert ablate.seed_list("3,2") == (2, 3)
    assert ablate.seed_list(" 2-4 ") == (2, 3, 4)
    assert ablate.seed_list([5, 2, 5]) == (2, 5)
    for bad in ("0", "2-1", "a", "1,,2", "-1", [], [0], [1.5], True):
        with pytest.raises(ValueError, match="--seeds"):
            ablate.seed_list(bad)
    runs = ablate.main(
        [
            "--grid",
            "paper",
            "--seeds",
            "2-3",
            "--workdir",
            str(tmp_path),
            "--dry-run",
            "--rows",
            "M8_method",
        ]
    )
    assert {r.seed for r in runs} == {2, 3}
    assert [(r.kind, r.name, r.seed) for r in runs] == [
        ("sft", "shared", 2),
        ("rl", "M8_method", 2),
        ("sft", "shared", 3),
        ("rl", "M8_method", 3),
    ]
    assert all(dict(r.overrides)["data.seed"] == r.seed == dict(r.overrides)["seed"] for r in runs)
    assert runs[1].sft_from.endswith("sft/shared/seed2")
    assert "seed 1" not in capsys.readouterr().out
    # The table counts the seeds asked for: seed 3 of seeds 2-3 done reads 1/2.
    table = ablate.aggregate({("rl", "M8_method", 3): {"f1": 0.5}}, "2,3", ["M8_method"])
    assert set(table["M8_method"]["seeds"]) == {3}
    assert "| 1/2 |" in ablate.markdown_table(table, (2, 3))


def test_markdown_table_and_plot_by_hand(tmp_path):
    results = {
        ("rl", "M8_method", 1): {"f1": 0.5, "tracking_error": [(1, 0.1), (2, 0.2)]},
        ("rl", "M8_method", 2): {"f1": 0.7, "tracking_error": [(1, 0.3), (2, 0.4)]},
        ("rl", "M6_shared_frozen", 1): {"f1": 0.4, "tracking_error": [(1, 1.0), (2, 2.0)]},
        ("sft", "shared", 1): {"f1": 0.45},
        ("sft", "shared", 2): {"f1": 0.55},
    }
    names = ["M2_shared_sft", "M8_method", "role_both_ema", "M6_shared_frozen"]
    table = ablate.aggregate(results, 2, names)
    assert table["M8_method"]["mean"]["f1"] == pytest.approx(0.6)
    # RL − SFT seed by seed: M8 0.05 and 0.15; M6 (seed 1 only) -0.05; the SFT row has none.
    assert table["M8_method"]["mean"]["f1_gain"] == pytest.approx(0.1)
    assert table["M8_method"]["std"]["f1_gain"] == pytest.approx(np.std([0.05, 0.15], ddof=1))
    assert table["M6_shared_frozen"]["mean"]["f1_gain"] == pytest.approx(-0.05)
    assert table["M2_shared_sft"]["mean"]["f1_gain"] is None
    assert table["M8_method"]["std"]["f1"] == pytest.approx(np.std([0.5, 0.7], ddof=1))
    assert table["role_both_ema"]["mean"]["f1"] == pytest.approx(0.6)  # M8's runs
    assert table["M8_method"]["tracking_error"] == [
        (1, pytest.approx(0.2)),
        (2, pytest.approx(0.3)),
    ]
    assert table["M6_shared_frozen"]["std"]["f1"] == 0.0  # one seed
    text = ablate.markdown_table(table, 2)
    assert "| M8_method |" in text and "0.600 ± 0.141" in text and "72.14" in text
    assert "0.100 ± 0.071" in text  # M8's gain over its SFT runs
    assert "| 1/2 |" in text  # M6 has one seed of two
    path = tmp_path / "plot.png"
    assert ablate.plot_tracking(table, path) == ["m = 0.99", "frozen"]
    image = np.asarray(Image.open(path).convert("RGB"))
    colours = {tuple(c) for c in image.reshape(-1, 3)}
    assert ablate.COLOURS[1] in colours and ablate.COLOURS[3] in colours  # m = 0.99, frozen
    assert ablate.COLOURS[0] not in colours  # no m = 0.9 run
    # The (m, H) plot: m's colour lighter as H grows; the rows present only.
    table["grid_m0.9_H5"] = {"tracking_error": [(1, 0.05), (2, 0.06)]}
    path = tmp_path / "plot_mh.png"
    labels = ablate.plot_tracking(
        table, path, rows=ablate.MH_TRACKING_ROWS, colours=ablate.MH_COLOURS
    )
    assert labels == ["0.9, H = 5", "0.99, H = 1", "frozen"]
    assert ablate.MH_COLOURS[1] == (121, 173, 210)  # (31, 119, 180) + 0.4 of the way to white
    image = np.asarray(Image.open(path).convert("RGB"))
    colours = {tuple(c) for c in image.reshape(-1, 3)}
    assert {ablate.MH_COLOURS[1], ablate.MH_COLOURS[3], ablate.MH_COLOURS[9]} <= colours
    assert ablate.MH_COLOURS[0] not in colours  # no (0.9, 1) run


def test_rl_judge_gate_is_the_runs_first_gate_row(tmp_path):
    assert ablate.rl_judge_gate(str(tmp_path)) is None  # no metrics.jsonl
    rows = [
        {"stage": "sft", "step": 5, ablate.GATE_KEY: 0.1},  # not RL's
        {"stage": "rl", "step": 1, "reward_mean": 0.5},
        {"stage": "rl", "step": 0, ablate.GATE_KEY: 0.875},
        {"stage": "rl", "step": 0, ablate.GATE_KEY: 0.5},  # a resumed run's later row
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    assert ablate.rl_judge_gate(str(tmp_path)) is None  # RL without a gate
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert ablate.rl_judge_gate(str(tmp_path)) == 0.875


def test_invocations_side_by_side_share_the_runs_and_a_killed_ones_lock_is_taken_over(
    tmp_path, monkeypatch
):
    """A run whose workdir another live run holds (mocojax.workdir_lock) is left to it, and the RL
    row that needs it waits for its result, then runs here under its own workdir's lock; a lock
    left by a killed invocation is taken over."""
    sft_run, rl_run = ablate.plan("tiny", "1-1", str(tmp_path), ["M8_method"])
    assert (sft_run.kind, rl_run.kind) == ("sft", "rl")
    assert rl_run.needs == (sft_run.result_path,)
    ran, logs = [], []
    lock = os.path.join(sft_run.workdir, workdir_lock.LOCK_NAME)

    def fake_run(config, workdir, lock_held=False):
        assert lock_held  # the runner holds the run's workdir lock, as this process
        with open(os.path.join(workdir, workdir_lock.LOCK_NAME)) as f:
            assert json.load(f)["pid"] == os.getpid()
        if workdir == rl_run.workdir:  # an RL row never starts before its SFT result exists
            assert os.path.exists(sft_run.result_path)
        ran.append(workdir)

    monkeypatch.setattr(main_lib, "run", fake_run)
    monkeypatch.setattr(ablate, "prepare", lambda run: None)
    monkeypatch.setattr(ablate, "run_result", lambda run, wall: {"f1": 0.5, "wall_s": wall})
    host = socket.gethostname()

    def write_lock(pid):
        os.makedirs(sft_run.workdir, exist_ok=True)
        with open(lock, "w") as f:
            json.dump({"pid": pid, "host": host, "started": 0, "argv": ["other"]}, f)

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_lock(other.pid)

        def other_invocation_finishes():
            time.sleep(0.5)
            with open(sft_run.result_path, "w") as f:
                json.dump({"f1": 0.4, "wall_s": 1.0}, f)
            os.remove(lock)

        finisher = threading.Thread(target=other_invocation_finishes)
        finisher.start()
        results = ablate.execute([sft_run, rl_run], log=logs.append, poll_s=0.05)
        finisher.join()
    finally:
        other.kill()
        other.wait()
    assert ran == [rl_run.workdir]  # the SFT run was the other invocation's
    assert results[("sft", "shared", 1)]["f1"] == 0.4
    assert results[("rl", "M8_method", 1)]["f1"] == 0.5
    assert any(f"running in another invocation (pid {other.pid} on {host}" in x for x in logs)
    assert any("done (by another invocation)" in line for line in logs)
    assert not os.path.exists(lock)
    assert not os.path.exists(os.path.join(rl_run.workdir, workdir_lock.LOCK_NAME))
    # A lock whose process is gone (a killed invocation): taken over, the run resumes here.
    for run in (sft_run, rl_run):
        os.remove(run.result_path)
    write_lock(other.pid)  # other has exited
    ran.clear()
    ablate.execute([sft_run, rl_run], log=logs.append, poll_s=0.05)
    assert ran == [sft_run.workdir, rl_run.workdir]
    assert not os.path.exists(lock)


@pytest.fixture(scope="module")
def tiny_grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("ablate_tiny")
    ablate.main(["--grid", "tiny", "--seeds", "1", "--workdir", str(root)])
    return root


def test_tiny_grid_runs_every_row(tiny_grid):
    with open(tiny_grid / "results.json") as f:
        results = json.load(f)
    assert list(results["rows"]) == list(ablate.ROW_NAMES)
    for name, row in results["rows"].items():
        assert set(row["seeds"]) == {"1"}, name
        assert 0.0 <= row["mean"]["f1"] <= 1.0, name
    for row in ablate.ROWS:
        if row.sft_only or row.same_as:
            continue
        with open(tiny_grid / "rows" / row.name / "seed1" / "metrics.jsonl") as f:
            steps = [r["step"] for r in map(json.loads, f) if r["stage"] == "rl" and r["step"] > 0]
        assert steps == [1, 2], row.name
    # Every RL row's "RL's Judge at gate" is its own run's step-0 gate (separate roles: the
    # roles model's Judge), the SFT rows have none.
    for row in ablate.ROWS:
        if row.same_as:
            continue
        seed1 = results["rows"][row.name]["seeds"]["1"]
        if row.sft_only:
            assert "rl_judge_gate" not in seed1, row.name
        else:
            workdir = tiny_grid / "rows" / row.name / "seed1"
            gate = ablate.rl_judge_gate(str(workdir))
            rl = json.loads((workdir / "config.json").read_text())["rl"]
            if rl["judge"] == "exact" or rl["reward"] != "rubric":  # no model Judge to gate
                assert gate is None, row.name
            else:
                assert gate is not None and 0.0 <= gate <= 1.0, row.name
            assert seed1["rl_judge_gate"] == gate, row.name
    assert (tiny_grid / "results.md").read_text().count("\n| ") == len(ablate.ROWS)
    assert Image.open(tiny_grid / "tracking_error.png").size == (640, 400)
    # RubiCap wrote its committee rubrics without a model: every item readable.
    with open(tiny_grid / "rows" / "rubicap" / "seed1" / "metrics.jsonl") as f:
        rl_rows = [r for r in map(json.loads, f) if r["stage"] == "rl" and r["step"] > 0]
    assert all(r["rubric_items"] >= 1 and r["generator_problems"] == 0.0 for r in rl_rows)
    assert all(r["true/rubric_item_unreadable"] == 0.0 for r in rl_rows)
    # EvoLM alternates: update 1 trains the Policy, update 2 the shared Generator.
    with open(tiny_grid / "rows" / "evolm" / "seed1" / "metrics.jsonl") as f:
        evo = {r["step"]: r for r in map(json.loads, f) if r["stage"] == "rl" and r["step"] > 0}
    assert "reward_mean" in evo[1] and "generator/reward_mean" not in evo[1]
    assert "generator/reward_mean" in evo[2] and -1.0 <= evo[2]["generator/reward_mean"] <= 1.0


def test_tiny_grid_resumes(tiny_grid, monkeypatch):
    ran = []
    real_run = main_lib.run
    monkeypatch.setattr(main_lib, "run", lambda config, workdir, **kw: ran.append(workdir))
    ablate.main(["--grid", "tiny", "--seeds", "1", "--workdir", str(tiny_grid)])
    assert ran == []  # every result exists: nothing runs
    # A row killed after its RL checkpoint: its result is gone, it runs again and resumes.
    row_dir = tiny_grid / "rows" / "M7_shared_copy" / "seed1"
    os.remove(row_dir / "ablate_result.json")
    monkeypatch.setattr(
        main_lib,
        "run",
        lambda config, workdir, **kw: ran.append(workdir) or real_run(config, workdir, **kw),
    )
    ablate.main(["--grid", "tiny", "--seeds", "1", "--workdir", str(tiny_grid)])
    assert ran == [str(row_dir)]
    with open(row_dir / "metrics.jsonl") as f:
        steps = [r["step"] for r in map(json.loads, f) if r["stage"] == "rl" and r["step"] > 0]
    assert steps == [1, 2]  # resumed at step 2: no update ran twice
    assert (row_dir / "ablate_result.json").exists()


def test_an_invocation_of_some_rows_tables_every_row_finished_in_the_workdir(
    tiny_grid, monkeypatch, capsys
):
    """`--rows M8_method` on a finished grid rewrites results.json with every finished row (an
    alias row only when named), leaving out and naming a run started with other settings."""
    ran = []
    monkeypatch.setattr(main_lib, "run", lambda config, workdir, **kw: ran.append(workdir))
    path = tiny_grid / "rows" / "M7_shared_copy" / "seed1" / "config.json"
    original = path.read_text()
    recorded = json.loads(original)
    recorded["rl"]["momentum"] = 0.5
    try:
        path.write_text(json.dumps(recorded))
        ablate.main(
            ["--grid", "tiny", "--seeds", "1", "--workdir", str(tiny_grid)]
            + ["--rows", "M8_method"]
        )
        out = capsys.readouterr().out
        with open(tiny_grid / "results.json") as f:
            rows = json.load(f)["rows"]
        aliases = {r.name for r in ablate.ROWS if r.same_as}
        expected = [n for n in ablate.ROW_NAMES if n not in aliases | {"M7_shared_copy"}]
        assert list(rows) == expected
        assert "not in the table: rl M7_shared_copy seed 1 ran with other settings" in out
        assert "rl.momentum: " in out
        assert (tiny_grid / "results.md").read_text().count("\n| ") == len(expected)
        assert Image.open(tiny_grid / "tracking_error_mh.png").size == (640, 480)
    finally:
        path.write_text(original)
    assert ran == []


def test_a_run_started_from_another_clone_of_the_repository_counts_as_the_same(tmp_path):
    """model.init_from (the shipped base inside the checkout) recorded under another clone's
    path is the same setting; another base, or another value, is not."""
    run = ablate.plan("default", 1, str(tmp_path), ["M8_method"])[0]
    config = ablate.load_config(run)
    planned = config.model.init_from
    assert planned.startswith(ablate.REPO + os.sep)  # the shipped check base
    os.makedirs(run.workdir)
    recorded = json.loads(config.to_json_best_effort())

    def changed(init_from):
        recorded["model"]["init_from"] = init_from
        with open(os.path.join(run.workdir, "config.json"), "w") as f:
            json.dump(recorded, f)
        return ablate.settings_changed(run, config)

    assert changed("/another/clone" + planned[len(ablate.REPO) :]) == []
    assert changed(planned) == []
    assert changed("/another/clone/mocojax/assets/toybase") == [
        f"model.init_from: '/another/clone/mocojax/assets/toybase' -> {planned!r}"
    ]


def test_an_sft_runs_rl_settings_are_not_compared(tmp_path):
    """An SFT run (stages sft, eval) never reads config.rl, so its recorded rl.* may differ from
    the plan (the default grid's SFT checkpoint serving the learned grid); its other settings,
    and an RL run's rl.*, may not."""
    sft, rl_run = ablate.plan("learned", 1, str(tmp_path), ["M8_method"])
    assert (sft.kind, rl_run.kind) == ("sft", "rl")
    for run in (sft, rl_run):
        config = ablate.load_config(run)
        recorded = json.loads(config.to_json_best_effort())
        recorded["rl"]["generator"], recorded["rl"]["num_steps"] = "exact", 600
        os.makedirs(run.workdir)
        with open(os.path.join(run.workdir, "config.json"), "w") as f:
            json.dump(recorded, f)
        expected = (
            [] if run is sft else ["rl.generator: 'exact' -> 'ema'", "rl.num_steps: 600 -> 400"]
        )
        assert ablate.settings_changed(run, config) == expected
        recorded["sft"]["global_batch_size"] = 2 * config.sft.global_batch_size
        with open(os.path.join(run.workdir, "config.json"), "w") as f:
            json.dump(recorded, f)
        batch = config.sft.global_batch_size
        assert f"sft.global_batch_size: {2 * batch} -> {batch}" in ablate.settings_changed(
            run, config
        )


def test_workdir_seeds_are_the_run_directories_seeds(tmp_path):
    assert ablate.workdir_seeds(tmp_path) == ()
    for d in (
        "sft/shared/seed3",
        "rows/M8_method/seed2",
        "rows/M6_shared_frozen/seed2",
        "rows/M8_method/seed0",
        "rows/M8_method/seedx",
        "rows/M8_method/other",
    ):
        (tmp_path / d).mkdir(parents=True)
    assert ablate.workdir_seeds(tmp_path) == (2, 3)


def test_grid_refuses_a_workdir_started_with_other_settings(tiny_grid, monkeypatch, tmp_path):
    """A finished (or half-finished) run whose config.json differs from the planned config, as
    after a changed default, stops the grid before any run starts, naming the run and the key."""
    ran = []
    monkeypatch.setattr(main_lib, "run", lambda config, workdir, **kw: ran.append(workdir))
    path = tiny_grid / "rows" / "M8_method" / "seed1" / "config.json"
    original = path.read_text()
    recorded = json.loads(original)
    recorded["rl"]["lr"] = recorded["rl"]["lr"] * 2
    recorded["a_key_of_another_version"] = 1  # only one side has it: not compared
    try:
        path.write_text(json.dumps(recorded))
        with pytest.raises(ValueError, match=r"rl M8_method seed 1 .*rl\.lr: ") as error:
            ablate.main(["--grid", "tiny", "--seeds", "1", "--workdir", str(tiny_grid)])
        assert "a_key_of_another_version" not in str(error.value)
        assert "M7_shared_copy" not in str(error.value)
        assert ran == []
    finally:
        path.write_text(original)
    ablate.main(["--grid", "tiny", "--seeds", "1", "--workdir", str(tiny_grid)])
    assert ran == []  # restored: every run done, nothing refused
    # A copy of the grid elsewhere resumes: its rows' paths into the grid (rl.roles_init of
    # M3-M5) point into the old root, and count as the same run.
    copy = tmp_path / "moved_grid"
    shutil.copytree(tiny_grid, copy)
    ablate.main(["--grid", "tiny", "--seeds", "1", "--workdir", str(copy)])
    assert ran == []


# --- the grid on the default command's recipe -----------------------------------------------


def test_default_grid_plans_the_recipes_rows_and_names_the_ones_it_leaves_out(tmp_path, capsys):
    from configs import toyworld

    runs = ablate.main(
        ["--grid", "default", "--seeds", "2", "--workdir", str(tmp_path), "--dry-run"]
    )
    out = capsys.readouterr().out
    grid = ablate.GRID_TABLE["default"]
    names = grid.row_names
    # Rows that need a learned Generator are out, and said to be; EMA on the Judge alone is M8.
    assert "role_generator_ema" not in names and "evolm" not in names
    assert "paper row evolm has no default-grid counterpart" in out
    assert "row role_judge_ema reuses the runs of M8_method" in out
    # The default grid's control rows: RubiCap's rubric with the exact Judge after RubiCap's, the
    # role SFT at M1's Policy batches and the method from it after M8's.
    extra = {"rubicap_exact_judge", "M2_shared_sft_long", "M8_equal_policy_batches"}
    assert set(names) == set(ablate.ROW_NAMES) - {"role_generator_ema", "evolm"} | extra
    assert names[names.index("rubicap") + 1] == "rubicap_exact_judge"
    m8 = names.index("M8_method")
    assert names[m8 + 1 : m8 + 3] == ("M2_shared_sft_long", "M8_equal_policy_batches")
    run_rows = [r for r in grid.rows if not r.sft_only and not r.same_as]
    assert len(runs) == 2 * (len(grid.sft_kinds) + len(run_rows))
    # Every run builds on the default command's recipe: its config, its own SFT mix as M2.
    recipe = toyworld.get_config("")
    assert grid.sft_kinds["shared"]["data.mix"] == tuple(recipe.data.mix)
    for run in runs:
        assert run.arg == "default" and f"configs/{run.config}.py:default " in run.command()
        config = ablate.load_config(run)
        config_utils.validate(config, main_lib.STAGES)
        # the world's exact Generator (RubiCap's rubrics are its committee's: no Generator runs)
        assert config.rl.generator == "exact" or config.rl.rubrics == "committee"
        assert config.model.init_from == recipe.model.init_from
        assert config.data.judge_per_item == recipe.data.judge_per_item
        assert "export" not in config.stages
    by_name = {r.name: r for r in runs if r.seed == 1}
    assert dict(by_name["policy_only"].overrides)["data.mix"] == (5, 0, 0)
    assert dict(by_name["roles_only"].overrides)["data.mix"] == (0, 0, 1)  # a Judge alone
    assert ablate.load_config(by_name["M6_shared_frozen"]).rl.momentum == 1.0
    assert ablate.load_config(by_name["rubicap"]).rl.rubrics == "committee"
    control = ablate.load_config(by_name["rubicap_exact_judge"])
    assert control.rl.rubrics == "committee" and control.rl.judge == "exact"
    assert ablate.load_config(by_name["rubicap"]).rl.judge == "frozen"
    # The grid pins the step counts its runs were made with (800 role-SFT steps, 600 updates),
    # whatever the recipe's now are; the long role SFT is the recipe's mix for 2,000 steps, and
    # the method's RL (the same EMA) starts from it.
    assert ablate.load_config(by_name["shared"]).sft.num_steps == 800
    assert {ablate.load_config(r).rl.num_steps for r in runs if r.kind == "rl"} == {600}
    long_sft = ablate.load_config(by_name["shared_long"])
    assert long_sft.sft.num_steps == 2000
    assert tuple(long_sft.data.mix) == tuple(recipe.data.mix)
    equal = by_name["M8_equal_policy_batches"]
    assert equal.sft_from == str(tmp_path / "sft" / "shared_long" / "seed1")
    method = ablate.load_config(by_name["M8_method"])
    assert ablate.load_config(equal).rl.to_dict() == method.rl.to_dict()
    with pytest.raises(ValueError, match="not in the default grid: trains a learned Generator"):
        ablate.plan("default", 1, str(tmp_path), ["evolm"])
    assert not os.listdir(tmp_path)
    from configs import rl_evolm, rl_generator_ema

    for excluded in (rl_evolm, rl_generator_ema):  # refused on the recipe, with the reason
        with pytest.raises(ValueError, match="no counterpart on the default recipe"):
            excluded.get_config("default")
    assert "Not in the default grid: role_generator_ema" in ablate.excluded_note("default")
    assert ablate.excluded_note("paper") == ""


def test_the_long_config_is_the_default_at_the_grids_long_role_sft():
    """configs/toyworld.py:long, whose numbers docs/results.md reads off the default grid's
    M2_shared_sft_long / M8_equal_policy_batches rows, is the default command with the long role
    SFT's step count and nothing else changed."""
    from configs import toyworld

    default = ablate._flatten(toyworld.get_config("").to_dict())
    long = ablate._flatten(toyworld.get_config("long").to_dict())
    assert {k for k in default if default[k] != long[k]} == {"sft.num_steps"}
    kind = ablate_rows.DEFAULT_SFT_KINDS["shared_long"]
    assert long["sft.num_steps"] == kind["sft.num_steps"] == 2000 > default["sft.num_steps"]
    assert tuple(long["data.mix"]) == kind["data.mix"]
    with pytest.raises(ValueError, match="known: '', long, paper, tiny"):
        toyworld.get_config("longer")


def test_default_tiny_grid_runs_every_kind_of_row(tmp_path):
    """Every default-grid row but the (m, H) grid's (M8 with two other numbers, whose configs the
    dry-run test validates) runs 2 SFT steps + 2 updates from the recipe's tiny config."""
    grid = ablate.GRID_TABLE["default_tiny"]
    names = [n for n in grid.row_names if not n.startswith("grid_")]
    ablate.main(
        ["--grid", "default_tiny", "--seeds", "1", "--workdir", str(tmp_path)]
        + ["--rows", ",".join(names)]
    )
    with open(tmp_path / "results.json") as f:
        results = json.load(f)
    assert results["grid"] == "default_tiny" and list(results["rows"]) == names
    for name, row in results["rows"].items():
        assert set(row["seeds"]) == {"1"}, name
        assert 0.0 <= row["mean"]["f1"] <= 1.0, name
    for row in grid.rows:
        if row.sft_only or row.same_as or row.name not in names:
            continue
        with open(tmp_path / "rows" / row.name / "seed1" / "metrics.jsonl") as f:
            rl_rows = [r for r in map(json.loads, f) if r["stage"] == "rl" and r["step"] > 0]
        assert [r["step"] for r in rl_rows] == [1, 2], row.name
        # the exact Generator's rubrics (or RubiCap's committee): every item readable
        assert all(r["true/rubric_item_unreadable"] == 0.0 for r in rl_rows), row.name
    # The tiny runs' 2 steps win over the long role SFT's own 2,000.
    with open(tmp_path / "sft" / "shared_long" / "seed1" / "metrics.jsonl") as f:
        sft_steps = [r["step"] for r in map(json.loads, f) if r["stage"] == "sft"]
    assert max(sft_steps) == 2
    text = (tmp_path / "results.md").read_text()
    assert text.count("\n| ") == len(names)
    assert "Not in the default_tiny grid: role_generator_ema" in text


# --- the grid on the learned-Generator recipe -----------------------------------------------


def test_learned_grid_plans_the_rows_that_need_a_learned_generator(tmp_path, capsys):
    """The learned grid: the default recipe's long role SFT at the mix (5, 2, 2) and RL with the
    EMA Generator's union of 4 draws checked against the references (session 42's run, whose step
    counts it pins), the role ablation and EvoLM the default grid leaves out, and two controls."""
    from configs import rl_method, toyworld

    runs = ablate.main(
        ["--grid", "learned", "--seeds", "1", "--workdir", str(tmp_path), "--dry-run"]
    )
    out = capsys.readouterr().out
    names = ablate.GRID_TABLE["learned"].row_names
    assert names == (
        "M2_shared_sft",
        "M6_shared_frozen",
        "M7_shared_copy",
        "M8_method",
        "exact_generator",
        "rubric_next_image",
        "role_generator_ema",
        "role_judge_ema",
        "role_both_ema",
        "evolm",
    )
    assert "paper row rubicap has no learned-grid counterpart" in out
    assert "row role_both_ema reuses the runs of M8_method" in out
    long = toyworld.get_config("long")
    by_name = {r.name: ablate.load_config(r) for r in runs}
    assert set(by_name) == {"shared"} | set(names) - {"M2_shared_sft", "role_both_ema"}
    for name, config in by_name.items():
        config_utils.validate(config, main_lib.STAGES)
        assert tuple(config.data.mix) == (5, 2, 2) and config.sft.num_steps == 2000, name
        assert config.model.init_from == long.model.init_from, name
        assert (config.rl.num_steps, config.rl.eval_every) == (400, 100), name
        assert config.rl.rubric_check == "references", name
    roles = {n: (c.rl.generator, c.rl.judge, c.rl.momentum) for n, c in by_name.items()}
    assert roles["M8_method"] == ("ema", "ema", 0.99)
    assert roles["M6_shared_frozen"] == ("ema", "ema", 1.0)
    assert roles["role_generator_ema"] == ("ema", "frozen", 0.99)
    assert roles["role_judge_ema"] == ("frozen", "ema", 0.99)
    assert roles["exact_generator"][0] == "exact" and by_name["M7_shared_copy"].rl.momentum == 0.0
    draws = {n: (c.rl.rubric_samples, c.rl.generator_temperature) for n, c in by_name.items()}
    assert draws["M8_method"] == draws["rubric_next_image"] == (4, 1.0)
    assert draws["exact_generator"][0] == draws["evolm"][0] == 1
    assert by_name["rubric_next_image"].rl.rubric_source == "next_image"
    assert by_name["evolm"].rl.train_generator and by_name["evolm"].rl.generator == "policy"
    # the method's config is the learned recipe on the default's long config, nothing else
    method = ablate._flatten(by_name["M8_method"].to_dict())
    recipe = ablate._flatten(rl_method.learned_recipe(toyworld.get_config("long")).to_dict())
    assert {k for k in method if method[k] != recipe.get(k)} <= {
        "seed",
        "data.seed",
        "stages",
        "eval.stage",
    }
    # the rows left out for one reason are named together, the reason once
    note = ablate.excluded_note("learned")
    assert "M1_policy_sft, M3_offline, M4_separate_frozen, M5_separate_ema (separately" in note
    assert note.count("the momentum's settings") == 1 and "byol_cosine (the momentum's" in note
    with pytest.raises(ValueError, match="not in the learned grid: separately initialised"):
        ablate.plan("learned", 1, str(tmp_path), ["M4_separate_frozen"])


def test_learned_tiny_grid_runs_the_trivial_baseline_on_the_learned_recipe(tmp_path):
    """2 SFT steps + 2 updates of the learned recipe's tiny config for its trivial baseline: the
    model Generator samples 2 rubrics per image, the Judge checks their union against the
    references, and each image is judged with the next image's rubric. (Every row's config is
    validated by the dry-run test above.)"""
    ablate.main(
        ["--grid", "learned_tiny", "--seeds", "1", "--workdir", str(tmp_path)]
        + ["--rows", "rubric_next_image"]
    )
    with open(tmp_path / "results.json") as f:
        results = json.load(f)
    assert results["grid"] == "learned_tiny"
    assert list(results["rows"]) == ["M2_shared_sft", "rubric_next_image"]  # its SFT, scored
    workdir = tmp_path / "rows" / "rubric_next_image" / "seed1"
    with open(workdir / "config.json") as f:
        rl_cfg = json.load(f)["rl"]
    assert (rl_cfg["rubric_samples"], rl_cfg["rubric_check"]) == (2, "references")
    assert (rl_cfg["generator"], rl_cfg["rubric_source"]) == ("ema", "next_image")
    with open(workdir / "metrics.jsonl") as f:
        rl_rows = [r for r in map(json.loads, f) if r["stage"] == "rl" and r["step"] > 0]
    assert [r["step"] for r in rl_rows] == [1, 2]
    assert all("rubric_checked_out" in r for r in rl_rows)
    text = (tmp_path / "results.md").read_text()
    assert "Not in the learned_tiny grid: M1_policy_sft" in text
    assert "rubicap (a fixed committee rubric, no learned Generator" in text
