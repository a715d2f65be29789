"""benchmarks/rl_summary.py on a hand-made workdir: the eval rows, the gain, first/last-20 means,
the recoloured pass rate and the zero-variance split read from rl_samples.jsonl and the validation readout per update."""

import importlib.util
import json
import os

REPO = os.path.join(os.path.dirname(__file__), os.pardir)


def _load():
    spec = importlib.util.spec_from_file_location(
        "rl_summary", os.path.join(REPO, "benchmarks", "rl_summary.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rl_summary_reads_a_runs_files_by_hand(tmp_path, capsys):
    evals = {"sft_800": (0.5, 20.0, 0.4), "rl_600": (0.6, 15.0, 0.55), "rl_40": (0.1, 1.0, 0.0)}
    for name, (f1, words, sampled) in evals.items():
        with open(tmp_path / f"eval_{name}.json", "w") as f:
            row = {"policy/f1": f1, "policy/caption_words": words, "policy_sampled/f1": sampled}
            json.dump(row, f)
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"stage": "sft", "step": 800, "true/caption_f1": 9.0}) + "\n")
        for step in range(41):  # step 0 (the gate) is not an update
            f1 = 0.2 if step <= 20 else 0.8
            row = {"stage": "rl", "step": step, "true/caption_f1": f1}
            if step % 20 == 0:  # the validation readout (rl.eval_every=20), update 0 included
                row["val/policy/f1"] = 0.5 + step / 100
                row["val/policy/caption_words"] = 20.0
            f.write(json.dumps(row) + "\n")
    rubric = [{"criterion": "mentions a red circle", "check": "named", "weight": 3.0}]
    samples = [
        # a blue circle named: the red circle's item is recoloured; passed, then failed
        {"step": 5, "captions": ["A blue circle."], "rubric": rubric, "decisions": [[1]]},
        {"step": 400, "captions": ["A blue circle."], "rubric": rubric, "decisions": [[0]]},
        # no circle named: not a recoloured item, not counted
        {"step": 400, "captions": ["A red star."], "rubric": rubric, "decisions": [[1]]},
    ]
    for rewards, said, right in (  # groups of two captions naming a red circle (not recoloured)
        ([1.0, 1.0], [[1], [1]], [[1], [0]]),  # equal, exactly 1 vs 0: Judge-caused
        ([1.0, 1.0], [[1], [1]], [[1], [1]]),  # equal, exactly equal: rubric-limited
        ([1.0, 0.0], [[1], [0]], [[1], [1]]),  # not zero-variance
    ):
        samples.append(
            {
                "step": 400,
                "captions": ["A red circle."] * 2,
                "rubric": rubric,
                "decisions": said,
                "rewards": rewards,
                "truth": {"decision_right": right},
            }
        )
    with open(tmp_path / "rl_samples.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in samples)
    _load().main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| rl | 0.600 |" in out  # the latest RL eval (step 600, not 40)
    assert "F1 +0.100, words -25%, sampled F1 +0.150" in out
    assert f"| {tmp_path} | 40 | 0.20 -> 0.80 |" in out  # 40 updates; first 20 / last 20
    assert "first / last 100 updates: 1.00 -> 0.00" in out
    assert "67% of 3 logged groups = 33% rubric-limited" in out and "+ 33% Judge-caused" in out
    assert f"| {tmp_path} | 0 | 0.500 | +0.000 | — | 20.0 |" in out
    assert f"| {tmp_path} | 20 | 0.700 | +0.200 | — | 20.0 |" in out
    assert f"| {tmp_path} | 40 | 0.900 | +0.400 | — | 20.0 |" in out


def test_rl_summary_rescores_logged_groups_with_other_rubric_options(tmp_path, capsys):
    """--rubric attribute_items=True: a group whose captions differ only in the object's place is
    flat under the run's rubric (no place items) and not once the exact Generator may write them."""
    import numpy as np

    from mocojax.data import toyroles, toyworld as tw

    records = toyroles.image_records(1, 40)
    scene = next(r["scene"] for r in records if len(r["scene"].objects) == 1)
    (obj,) = scene.objects
    elsewhere = next(p for p in tw.POSITIONS if p != obj.position)
    rng = np.random.default_rng(0)
    captions = [
        tw.write_caption(
            [tw.Mention(obj.shape, obj.colour, obj.size, obj.position if k < 4 else elsewhere)],
            scene.background,
            rng,
        )
        for k in range(8)
    ]
    config = {"data": {"seed": 1, "num_train_scenes": 40, "attribute_items": False}, "rl": {}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    row = {"step": 5, "image_id": scene.id, "captions": captions, "subset": [0, 1, 4, 5]}
    (tmp_path / "rl_samples.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "metrics.jsonl").write_text("")
    module = _load()
    assert module.exact_zero_variance(str(tmp_path), {"attribute_items": True}) == (1, 1.0, 0.0)
    module.main([str(tmp_path), "--rubric", "attribute_items=True"])
    out = capsys.readouterr().out
    assert "zero-variance 100% with the run's rubric, 0% with attribute_items=True" in out


def test_rl_summary_rescores_with_the_runs_invention_weight(tmp_path):
    """A group whose captions either miss one object (its presence item, weight 3) or invent a
    star (an absent-shape item, weight rl.invention_weight) is flat at the rubric's own weights and
    not at the run's 4: the exact rescoring uses the weights the run was rewarded with."""
    import numpy as np

    from mocojax.data import toyroles, toyworld as tw

    records = toyroles.image_records(1, 200)
    scene = next(
        r["scene"]
        for r in records
        if len(r["scene"].objects) == 2 and "star" not in {o.shape for o in r["scene"].objects}
    )
    first, second = scene.objects
    rng = np.random.default_rng(0)
    named = [tw.Mention(o.shape, o.colour, o.size, o.position) for o in scene.objects]
    missing = tw.write_caption(named[:1], scene.background, rng)
    invented = tw.write_caption(named + [tw.Mention("star", "red")], scene.background, rng)
    captions = [missing] * 4 + [invented] * 4
    data = {"seed": 1, "num_train_scenes": 200, "attribute_items": False, "absent_shapes": True}
    row = {"step": 5, "image_id": scene.id, "captions": captions, "subset": [0, 1, 4, 5]}
    (tmp_path / "rl_samples.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "metrics.jsonl").write_text("")
    module = _load()
    for weight, flat in ((0.0, 1.0), (4.0, 0.0)):
        config = {"data": data, "rl": {"invention_weight": weight}}
        (tmp_path / "config.json").write_text(json.dumps(config))
        assert module.exact_zero_variance(str(tmp_path), {}) == (1, flat, flat), weight


def test_rl_summary_tabulates_the_judges_errors_on_rls_samples_by_hand(tmp_path, capsys):
    """Per item kind, the share of true items the Judge failed and of false items it passed, and
    the within-group r between its reward error and caption length, from rl_samples.jsonl."""
    rubric = [
        {"criterion": "mentions a red circle", "check": "named", "weight": 3.0},
        {"criterion": "does not mention a star", "check": "not named", "weight": 1.0},
    ]
    group = {
        "step": 400,
        "captions": ["A red circle.", "A blue circle and a red circle.", "A red star."],
        "rubric": rubric,
        # caption 2: its true presence item failed; caption 3: its false absence item passed
        "decisions": [[1, 1], [0, 1], [1, 1]],
        "rewards": [1.0, 0.25, 1.0],
        "truth": {
            "decision_right": [[1, 1], [0, 1], [1, 0]],
            "exact_rewards": [1.0, 1.0, 0.75],
            "words": [3, 7, 3],
        },
    }
    # an update older than the last 100: not counted
    old = dict(group, step=200, decisions=[[0, 0], [0, 0], [0, 0]])
    (tmp_path / "rl_samples.jsonl").write_text(json.dumps(old) + "\n" + json.dumps(group) + "\n")
    (tmp_path / "metrics.jsonl").write_text("")
    module = _load()
    table, r, groups = module.judge_errors_from_samples(str(tmp_path))
    # present: 3 true items, 1 failed, no false ones; absent shape: 2 true passed, 1 false passed
    assert table == {"absent shape": (2, 0.0, 1, 1.0), "present": (3, 1 / 3, 0, None)}
    # errors [0, -0.75, +0.25] against words [3, 7, 3]: r by hand
    errors, words = [0.0, -0.75, 0.25], [3.0, 7.0, 3.0]
    e = [x - sum(errors) / 3 for x in errors]
    w = [x - sum(words) / 3 for x in words]
    expected = sum(a * b for a, b in zip(e, w)) / (
        sum(a * a for a in e) ** 0.5 * sum(b * b for b in w) ** 0.5
    )
    assert groups == 1 and abs(r - expected) < 1e-12 and r < -0.9
    module.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert f"| {tmp_path} | present | 3 | 0.333 | 0 | — | {expected:.3f} over 1 groups |" in out
