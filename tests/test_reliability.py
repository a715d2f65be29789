"""Issue #13: bad rows, bad values, broken checkpoints and hostile text never crash a run or pass
silently. One section per defect of the issue; docs/reliability.md maps each probe to its test."""

import json
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rl_patterns
from PIL import Image
from test_data import _write_jsonl, image_dir  # noqa: F401  (image_dir is a fixture)

from mocojax import processing, roles
from mocojax.data import records, toyroles, toyworld
from mocojax.train import state as state_lib


def _load(tmp_path, image_dir, rows, **kwargs):
    """Returns records.load_jsonl of rows written to a JSONL file, images under image_dir."""
    return records.load_jsonl(
        _write_jsonl(tmp_path / "d.jsonl", rows), image_root=str(image_dir), **kwargs
    )


GOOD = {
    "id": "ok",
    "image": "a.png",
    "references": ["A red box."],
    "candidates": [{"id": "c0", "caption": "A blue box."}],
    "rubric": [{"criterion": "says red", "check": "red", "weight": 2}],
    "decisions": {"c0": [{"value": 0, "rationale": "blue"}]},
}


def _row(record_id, **changes):
    row = json.loads(json.dumps(GOOD))
    row["id"] = record_id
    for key, value in changes.items():
        row[key] = value
    return row


# 1. Every field of every row is type-checked: strict names record and field, lenient counts.
WRONG_TYPES = {
    "caption_int": (
        _row("t1", candidates=[{"id": "c0", "caption": 5}]),
        "candidates[0].caption",
        "bad_field",
    ),
    "reference_int": (_row("t2", references=["fine", 7]), "references[1]", "bad_field"),
    "image_list": (_row("t3", image=["a.png"]), "image", "bad_field"),
    "id_float": (_row(1.5), "id", "bad_field"),
    "candidate_id_list": (
        _row("t5", candidates=[{"id": [1], "caption": "x"}]),
        "candidates[0].id",
        "bad_field",
    ),
    "criterion_int": (
        _row("t6", rubric=[{"criterion": 3, "weight": 1}]),
        "rubric[0].criterion",
        "bad_rubric",
    ),
    "rationale_int": (
        _row("t7", decisions={"c0": [{"value": 1, "rationale": 9}]}),
        "rationale",
        "bad_decisions",
    ),
    "candidates_dict": (_row("t8", candidates={"c0": "x"}), "candidates", "bad_field"),
}


@pytest.mark.parametrize("name", sorted(WRONG_TYPES))
def test_wrong_field_type_strict_names_record_and_field(name, image_dir, tmp_path):
    row, field, _ = WRONG_TYPES[name]
    with pytest.raises(records.BadRecord, match="record .*" + re.escape(field)):
        _load(tmp_path, image_dir, [GOOD, row], strict=True)


def test_wrong_field_types_lenient_skip_and_count_per_reason(image_dir, tmp_path):
    rows = [GOOD] + [row for row, _, _ in WRONG_TYPES.values()]
    loaded, report = _load(tmp_path, image_dir, rows)
    assert [r["id"] for r in loaded] == ["ok"]
    want = {}
    for _, _, reason in WRONG_TYPES.values():
        want[reason] = want.get(reason, 0) + 1
    assert report.read == len(rows) and report.kept == 1 and dict(report.skipped) == want


# 2. Garbage values: non-finite or non-positive weights, decisions other than 0/1, duplicate ids.
GARBAGE = {
    "weight_nan": _row("g1", rubric=[{"criterion": "c", "weight": "nan"}]),
    "weight_inf": _row("g2", rubric=[{"criterion": "c", "weight": "inf"}]),
    "weight_big_inf": '{"id": "g3", "image": "a.png", "references": ["x"], "rubric": [{"criterion": "c", "weight": 1e999}]}',
    "weight_string_number": _row("g4", rubric=[{"criterion": "c", "weight": "2"}]),
    "decision_7": _row("g5", decisions={"c0": [{"value": 7}]}),
    "decision_minus_3": _row("g6", decisions={"c0": [{"value": -3}]}),
    "decision_half": _row("g7", decisions={"c0": [{"value": 0.5}]}),
    "duplicate_id": _row("ok"),
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_values_are_refused_in_strict_mode(name, image_dir, tmp_path):
    with pytest.raises(records.BadRecord, match=r"record (g\d|ok):"):
        _load(tmp_path, image_dir, [GOOD, GARBAGE[name]], strict=True)


def test_garbage_values_lenient_skip_and_count(image_dir, tmp_path):
    loaded, report = _load(tmp_path, image_dir, [GOOD, *GARBAGE.values()])
    assert [r["id"] for r in loaded] == ["ok"]
    assert dict(report.skipped) == {"bad_rubric": 4, "bad_decisions": 3, "duplicate_id": 1}


def test_data_strict_config_key_turns_strict_mode_on(image_dir, tmp_path):
    import ml_collections

    from mocojax import config_utils

    path = _write_jsonl(tmp_path / "d.jsonl", [GOOD, GARBAGE["decision_7"]])
    config = ml_collections.ConfigDict({"data": {"image_root": str(image_dir), "strict": False}})
    assert [r["id"] for r in config_utils.user_records(config, path)] == ["ok"]
    config.data.strict = True
    with pytest.raises(records.BadRecord, match="record g5: .*must be 0 or 1"):
        config_utils.user_records(config, path)


# 3. Image paths stay inside image_root.
@pytest.mark.parametrize(
    "image", ["../outside/secret.png", "sub/../../outside/secret.png", "/etc/passwd"]
)
def test_image_paths_outside_the_root_are_refused(image, image_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    Image.new("RGB", (8, 8)).save(outside / "secret.png")
    rows = [GOOD, _row("esc", image=image)]
    with pytest.raises(
        records.BadRecord, match="record esc: field 'image'.*(outside the image root|absolute)"
    ):
        _load(tmp_path, image_dir, rows, strict=True)
    loaded, report = _load(tmp_path, image_dir, rows)
    assert [r["id"] for r in loaded] == ["ok"] and dict(report.skipped) == {"image_outside_root": 1}


def test_image_in_a_subfolder_of_the_root_is_fine(image_dir, tmp_path):
    (image_dir / "sub").mkdir()
    Image.new("RGB", (8, 8)).save(image_dir / "sub" / "b.png")
    loaded, _ = _load(tmp_path, image_dir, [_row("sub", image="sub/./b.png")], strict=True)
    assert loaded[0]["image"] == str(image_dir / "sub" / "b.png")


# 4. Over-long rows are refused at load, naming the record, or cut per max_length.
@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return processing.load_tokenizer(toyroles.build_tokenizer(str(tmp_path_factory.mktemp("tok"))))


def test_over_long_reference_is_refused_at_load_naming_the_record(image_dir, tmp_path, tokenizer):
    long_row = _row("long", references=["a red circle " * 400])
    examples = records.sft_examples(_load(tmp_path, image_dir, [GOOD, long_row], strict=True)[0])
    processor = processing.Processor(tokenizer, min_pixels=32 * 32, max_pixels=64 * 64)
    with pytest.raises(
        records.BadRecord, match=r"record long/policy0: role example of \d+ tokens .* bucket 768"
    ):
        records.check_lengths(examples, processor, (128, 768), strict=True)
    kept, report = records.check_lengths(examples, processor, (128, 768))
    # The reference is the Policy's reply and sits in the Generator's prompt; the Judge never sees it.
    assert [e["id"] for e in kept] == ["ok/policy0", "ok/generator", "ok/judge/c0", "long/judge/c0"]
    assert dict(report.skipped) == {"too_long": 2}
    # The count is exact: the longest kept row is what the Processor renders.
    for example in kept:
        image = records.example_image(example)
        batch = processor([records.conversation(example, image)], mode="sft")
        assert batch["input_ids"].shape[1] == records.example_length(example, processor)[0]
    # With max_length <= the largest bucket the Processor cuts a reply (kept), never a prompt (refused).
    cutting = processing.Processor(
        tokenizer, min_pixels=32 * 32, max_pixels=64 * 64, max_length=768
    )
    kept, report = records.check_lengths(examples, cutting, (128, 768))
    assert "long/policy0" in [e["id"] for e in kept] and len(kept) == 5
    assert dict(report.skipped) == {"too_long": 1} and "long/generator" in report.examples[0]


# 7. Parsers see model output: linear time on hostile text, never raise on text.
def _seconds(fn, *args):
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


HOSTILE = {
    "spaces_then_pipe": " " * 16000 + "x |",
    "bullets_and_spaces": "- " + " " * 16000 + "item" + " " * 16000 + "x |",
    "many_dropped_items": "".join(f"{k} | 0 | c{k} | d\n" for k in range(1, 40001)),
    "many_duplicate_items": "".join(f"{k} | 1 | same | d\n" for k in range(1, 40001)),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_parsers_are_linear_on_hostile_text(name):
    text = HOSTILE[name]
    # Linear: well under a second here; the backtracking / quadratic versions took 8-57 s.
    assert _seconds(roles.parse_rubric, text) < 1.5
    assert _seconds(roles.parse_decisions, text, 20) < 1.5


def test_parsers_never_raise_on_huge_ids_and_toy_parser_names_non_text():
    huge = "9" * 4400
    items, problems = roles.parse_rubric(f"{huge} | 2 | a | b\n1 | 3 | c | d\n")
    assert items == [roles.RubricItem("c", "d", 3.0)]
    decisions, problems = roles.parse_decisions(f"{huge} | 1 | yes\n1 | 1 | ok\n", 1)
    assert decisions == [roles.Decision(1, "ok")]
    assert (
        roles.parse_rubric(None)[0] == []
        and roles.parse_decisions(None, 2)[0] == [roles.Decision(0, "")] * 2
    )
    with pytest.raises(TypeError, match="parse_caption needs text, got NoneType"):
        toyworld.parse_caption(None)
    assert toyworld.parse_caption(" " * 100000 + "x |") == ([], None)


# 5. Numeric config keys are validated before any work; non-finite updates are skipped and a
#    run of them fails the run.
@pytest.mark.parametrize(
    "key, value",
    [
        ("optimizer.lr", float("inf")),
        ("optimizer.lr", float("nan")),
        ("optimizer.eps", float("inf")),
        ("optimizer.grad_clip_norm", float("nan")),
        ("optimizer.weight_decay", float("inf")),
        ("optimizer.b1", float("nan")),
        ("optimizer.end_lr_ratio", float("nan")),
        ("optimizer.max_skipped_steps", 0),
        ("rl.lr", float("nan")),
        ("rl.lr", float("inf")),
        ("rl.end_lr_ratio", 2.0),
        ("rl.end_lr_ratio", -0.5),
        ("rl.kl_beta", float("nan")),
        ("rl.kl_beta", float("inf")),
        ("rl.clip_eps_high", float("inf")),
        ("rl.temperature", float("nan")),
        ("rl.temperature", -1.0),
        ("rl.adv_eps", float("nan")),
        ("rl.adv_eps", -1e-6),
        ("rl.adv_eps", 0.0),
        ("rl.momentum", float("nan")),
        ("rl.top_p", float("nan")),
        ("rl.max_skipped_steps", 0),
        ("data.min_pixels", 0),
        ("data.max_pixels", -1),
        ("data.max_length", 0),
        ("data.max_length", -5),
        ("data.min_pixels", 200 * 200),
        ("mesh", "bogus=4"),
        ("mesh", "bogus=-1"),
        ("mesh", "fsdp=0"),
    ],
)
def test_bad_numeric_config_value_fails_before_any_work_naming_the_key(
    key, value, monkeypatch, tmp_path
):
    from mocojax import config_utils, main

    config = main_config()
    section, _, name = key.rpartition(".")
    with config.unlocked():
        (config[section] if section else config)[name] = value
    monkeypatch.setattr(
        config_utils, "build_setup", lambda *a, **k: pytest.fail("validation must come first")
    )
    with pytest.raises(ValueError, match=re.escape(f"config.{key}=")):
        main.run(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def main_config():
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        "toyworld_config",
        os.path.join(os.path.dirname(__file__), os.pardir, "configs", "toyworld.py"),
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config("tiny")


def _adam(lr):
    import ml_collections

    opt = ml_collections.ConfigDict(
        dict(
            lr=lr,
            warmup_ratio=0.0,
            end_lr_ratio=1.0,
            b1=0.9,
            b2=0.98,
            eps=1e-8,
            weight_decay=0.0,
            grad_clip_norm=1.0,
        )
    )
    return state_lib.make_optimizer(opt, total_steps=10)


def test_update_that_makes_params_non_finite_is_skipped():
    # A finite loss and gradient times an infinite rate: without the guard every weight turns NaN.
    optimizer = _adam(float("inf"))
    params = {"w": jnp.ones((3,)), "b": jnp.zeros((2,))}
    state = state_lib.init_state(params, optimizer, jax.random.key(0))
    grads = {"w": jnp.full((3,), 0.5), "b": jnp.full((2,), 0.1)}
    new_state, metrics = state_lib.apply_gradients(state, grads, optimizer, jnp.float32(1.0))
    assert int(metrics["skipped"]) == 1 and np.isfinite(float(metrics["grad_norm"]))
    jax.tree.map(np.testing.assert_array_equal, new_state["params"], params)
    jax.tree.map(np.testing.assert_array_equal, new_state["opt_state"], state["opt_state"])
    # An overflow in one leaf alone is enough.
    new_state, metrics = state_lib.apply_gradients(state, grads, _adam(1.0), jnp.float32(1.0))
    assert int(metrics["skipped"]) == 0
    big = {"w": jnp.full((3,), 3e38), "b": jnp.zeros((2,))}
    state = state_lib.init_state(big, _adam(1e38), jax.random.key(0))
    _, metrics = state_lib.apply_gradients(
        state, {"w": -grads["w"], "b": grads["b"]}, _adam(1e38), jnp.float32(1.0)
    )
    assert int(metrics["skipped"]) == 1


def test_skip_guard_fails_after_k_consecutive_skips_only():
    guard = state_lib.SkipGuard(3, "sft", "optimizer.max_skipped_steps")
    for step, skipped in enumerate([1, 1, 0, 1, 1, 0, 0], 1):
        guard.update(skipped, step)  # never 3 in a row
    guard.update(1, 8)
    guard.update(1, 9)
    with pytest.raises(
        RuntimeError,
        match=r"sft: 3 consecutive updates \(to step 10\) were skipped .*"
        r"config.optimizer.max_skipped_steps=3",
    ):
        guard.update(1, 10)


# 10. A non-finite batch through the real SFT and GRPO steps (jitted as the trainers jit them),
#     then the loops: K skipped updates in a row fail the run.
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny toy config, its Setup (tokenizer, processor, model config) and initial params."""
    from mocojax import config_utils

    config = main_config()
    config.optimizer.warmup_ratio = config.rl.warmup_ratio = 0.0  # step 1 moves the params
    setup = config_utils.build_setup(config, str(tmp_path_factory.mktemp("tiny")))
    return config, setup, setup.load_params()


def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _copy(tree):
    return jax.tree.map(jnp.array, tree)


def _rollout(config, setup, num_new=4):
    """A Rollout of two toy images with fixed captions and rewards that vary within each group."""
    rows, n = config.rl.images_per_step * config.rl.num_samples, config.rl.num_samples
    return rl_patterns.toy_rollout(
        config,
        setup,
        tokens=np.random.default_rng(0).integers(20, 200, size=(rows, num_new)),
        logprobs=np.full((rows, num_new), -3.0, np.float32),
        lengths=np.full(rows, num_new),
        rewards=np.tile(np.linspace(0.0, 1.0, n, dtype=np.float32), (rows // n, 1)),
    )


def test_non_finite_batch_through_the_real_grpo_step_is_skipped(tiny):
    from mocojax import sharding
    from mocojax.train import rl

    config, setup, params = tiny
    cfg = setup.model_config
    rollout = _rollout(config, setup)
    batch = rl.train_batch(cfg, rollout, config.rl, rl.advantages(rollout, config.rl))
    optimizer = rl.rl_optimizer(config)
    step = rl.make_grpo_step(cfg, optimizer, config.rl)
    mesh = sharding.make_mesh(None)
    state = state_lib.init_state(_copy(params), optimizer, jax.random.key(0))
    poisoned = dict(
        batch, old_logprobs=np.full_like(batch["old_logprobs"], np.nan)
    )  # a broken sampler
    state, metrics = step(state, rl.place_batch(mesh, poisoned), None)
    assert int(metrics["skipped"]) == 1 and int(metrics["no_signal_skipped"]) == 0
    assert _same(state["params"], params) and float(metrics["update_norm"]) == 0.0
    state, metrics = step(state, rl.place_batch(mesh, batch), None)
    assert int(metrics["skipped"]) == 0 and float(metrics["update_norm"]) > 0


def test_sft_loop_fails_the_run_after_k_skipped_updates_in_a_row(tiny, tmp_path, monkeypatch):
    """The loop around the step: isolated skips pass, K in a row stop the run naming the key, and
    the checkpoint written before holds the last finite params. (The step is a stand-in that
    reports skipped=1 on chosen steps; the real step's skip is tested above.)"""
    from mocojax import checkpoint
    from mocojax.train import sft

    config = tiny[0].copy_and_resolve_references()
    config.stages = ("sft",)
    config.sft.num_steps, config.sft.eval_every, config.sft.checkpoint_every = 6, 100, 2
    with config.unlocked():
        config.optimizer.max_skipped_steps = 2
    skipped_at = {1, 3, 5, 6}

    def fake_make_train_step(*args):
        def step(state, batch):
            number = int(state["step"]) + 1
            zero = np.float32(0.0)
            metrics = {
                "loss": np.float32(np.nan if number in skipped_at else 1.0),
                "target_tokens": zero,
                "grad_norm": zero,
                "skipped": np.int32(number in skipped_at),
                **{f"{k}_{r}": zero for k in ("loss", "tokens") for r in records.ROLES},
            }
            return dict(state, step=state["step"] + 1), metrics

        return step

    monkeypatch.setattr(sft, "make_train_step", fake_make_train_step)
    with pytest.raises(
        RuntimeError,
        match=r"sft: 2 consecutive updates \(to step 6\) were skipped.*"
        r"config.optimizer.max_skipped_steps=2",
    ):
        sft.run_sft(config, str(tmp_path))
    with open(tmp_path / "metrics.jsonl") as f:
        assert [(r["step"], r["skipped"]) for r in map(json.loads, f)] == [
            (1, 1),
            (2, 0),
            (3, 1),
            (4, 0),
            (5, 1),
            (6, 1),
        ]
    assert checkpoint.latest_step(str(tmp_path), "sft") == 4


# 6. A corrupt latest checkpoint: fall back to the newest that restores, naming the broken one.
def _saved_steps(workdir, steps=(1, 2)):
    from mocojax import checkpoint, model

    cfg = model.tiny(
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        vision_depth=1,
        vision_hidden=32,
        deepstack=(),
    )
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda a: rng.standard_normal(a.shape).astype(a.dtype), model.abstract_params(cfg)
    )
    manager = checkpoint.Manager(workdir, "sft", keep=5)
    for step in steps:
        state = {
            "params": jax.tree.map(lambda x: x + step, params),
            "step": np.int32(step),
            "rng": jax.random.key(step),
        }
        manager.save(step, state, {"data": {"next_index": step}, "skipped": 0})
    manager.close()
    abstract = {
        "params": model.abstract_params(cfg),
        "step": jax.ShapeDtypeStruct((), np.int32),
        "rng": jax.eval_shape(lambda: jax.random.key(0)),
    }
    return cfg, params, abstract


def _truncate_arrays(step_dir):
    """Cuts the largest array data file of the params item to half its size."""
    files = [p for p in (step_dir / "params").rglob("*") if p.is_file() and p.parent.name == "d"]
    victim = max(files, key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])


@pytest.mark.parametrize("damage", ["truncated_array", "emptied_extra_metadata"])
def test_corrupt_latest_checkpoint_falls_back_to_the_newest_that_restores(damage, tmp_path, caplog):
    from mocojax import checkpoint

    workdir = str(tmp_path)
    cfg, params, abstract = _saved_steps(workdir)
    broken = tmp_path / "checkpoints" / "sft" / "2"
    if damage == "truncated_array":
        _truncate_arrays(broken)
    else:
        (broken / "extra" / "metadata").write_text("")
    if damage == "truncated_array":  # eval and export read params only (read-only, nothing moved)
        with caplog.at_level("WARNING"):
            restored, step = checkpoint.restore_params(workdir, "sft", cfg)
        assert step == 1 and str(broken) in caplog.text
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b + 1), restored, params)
        assert broken.is_dir()
    caplog.clear()
    manager = checkpoint.Manager(workdir, "sft", keep=5)
    with caplog.at_level("WARNING"):
        state, extra = manager.restore_latest(abstract)
    assert int(state["step"]) == 1 and extra["data"] == {"next_index": 1}
    assert f"checkpoint {broken} does not restore" in caplog.text
    # The broken step is set aside, so the resumed run can write step 2 again.
    assert not broken.exists() and (tmp_path / "checkpoints" / "sft.broken" / "2").is_dir()
    manager.save(2, dict(state, step=np.int32(2)), extra)
    manager.close()
    assert checkpoint.latest_step(workdir, "sft") == 2


def test_no_restorable_checkpoint_is_one_clear_error_naming_the_directory(tmp_path):
    from mocojax import checkpoint

    workdir = str(tmp_path)
    cfg, _, abstract = _saved_steps(workdir)
    for step in (1, 2):
        _truncate_arrays(tmp_path / "checkpoints" / "sft" / str(step))
    where = re.escape(str(tmp_path / "checkpoints" / "sft"))
    with pytest.raises(
        RuntimeError, match=rf"no checkpoint under {where} restores \(broken steps \[2, 1\]\)"
    ):
        checkpoint.restore_params(workdir, "sft", cfg)
    manager = checkpoint.Manager(workdir, "sft", keep=5)
    with pytest.raises(RuntimeError, match=rf"no checkpoint under {where} restores"):
        manager.restore_latest(abstract)
    manager.close()
    assert (tmp_path / "checkpoints" / "sft" / "2").is_dir()  # nothing moved when nothing restores


# 9. Replayed steps after a resume leave one row per step (metrics.jsonl, rl_samples.jsonl, TensorBoard).
def _tb_events(folder):
    """Returns (step, kind) of every event in a TensorBoard folder's event files (TFRecord framing)."""
    import struct

    from tensorboardX.proto import event_pb2

    out = []
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            kind = event.WhichOneof("what")
            if kind == "session_log":
                kind = (
                    "start"
                    if event.session_log.status == event.session_log.START
                    else "session_log"
                )
            out.append((event.step, kind))
    return out


def test_resumed_writer_keeps_one_metrics_row_per_step(tmp_path):
    from mocojax import metrics

    path = tmp_path / "metrics.jsonl"
    first = metrics.MetricWriter(str(tmp_path), "sft", total_steps=5)
    for step in range(1, 6):  # killed after writing step 5, with checkpoint 3 the latest
        first.write(step, {"loss": 1.0 / step})
    first.close()
    with open(path, "a") as f:
        f.write(
            json.dumps({"stage": "rl", "step": 9, "loss": 0.5})
            + "\n"
            + '{"stage": "sft", "step": 6, "lo'
        )
    resumed = metrics.MetricWriter(str(tmp_path), "sft", total_steps=5, initial_step=3)
    for step in (4, 5):
        resumed.write(step, {"loss": 2.0 / step})
    resumed.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["stage"], r["step"]) for r in rows] == [
        ("sft", 1),
        ("sft", 2),
        ("sft", 3),
        ("rl", 9),
        ("sft", 4),
        ("sft", 5),
    ]
    assert rows[-1]["loss"] == pytest.approx(0.4)  # the replayed value, not the first run's
    # TensorBoard: the resumed run opens with a START event at step 4, which hides older events >= 4.
    events = _tb_events(tmp_path / "tb" / "sft")
    assert (4, "start") in events
    # A restart from scratch (no checkpoint) drops every row of the stage.
    again = metrics.MetricWriter(str(tmp_path), "sft", total_steps=5)
    again.close()
    assert [(r["stage"], r["step"]) for r in map(json.loads, path.read_text().splitlines())] == [
        ("rl", 9)
    ]


def test_rl_samples_rows_past_the_restored_step_are_dropped(tmp_path):
    from mocojax import metrics

    path = tmp_path / "rl_samples.jsonl"
    path.write_text(
        "".join(json.dumps({"step": s, "image_id": i}) + "\n" for s in (1, 2, 3, 4) for i in "ab")
    )
    assert metrics.truncate_jsonl(str(path), lambda row: row["step"] <= 2) == 4
    assert [(r["step"], r["image_id"]) for r in map(json.loads, path.read_text().splitlines())] == [
        (1, "a"),
        (1, "b"),
        (2, "a"),
        (2, "b"),
    ]


# 8. HF import: sizes bounded before shapes, truncated files named, no weights from outside the
#    directory, float weights only, non-finite tensors reported.
@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from mocojax import hf, model

    folder = tmp_path_factory.mktemp("hf")
    cfg = model.tiny()
    hf.save_pretrained(str(folder), cfg, model.init_params(cfg, 0))
    return folder


def _hf_copy(hf_dir, tmp_path):
    import shutil

    target = tmp_path / "ckpt"
    shutil.copytree(hf_dir, target)
    return target


def test_hf_config_far_larger_than_the_weights_fails_fast(hf_dir, tmp_path):
    from mocojax import hf

    ckpt = _hf_copy(hf_dir, tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 10**7
    (ckpt / "config.json").write_text(json.dumps(config))
    start = time.perf_counter()
    with pytest.raises(
        ValueError,
        match=r"config.json describes \d+ tensors .*num_hidden_layers=10000000.*"
        r"does not match the weights",
    ):
        hf.load_pretrained(ckpt)
    assert time.perf_counter() - start < 10  # it used to build 10**7 names per layer row first


def test_hf_truncated_safetensors_names_the_file(hf_dir, tmp_path):
    from mocojax import hf

    ckpt = _hf_copy(hf_dir, tmp_path)
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[:40])  # the header cut short
    with pytest.raises(
        ValueError,
        match=re.escape(str(ckpt / "model.safetensors")) + ": not a readable safetensors",
    ):
        hf.load_pretrained(ckpt)


@pytest.mark.parametrize(
    "target", ["../other/model.safetensors", "/tmp/elsewhere/model.safetensors"]
)
def test_hf_index_pointing_outside_the_directory_is_refused(target, hf_dir, tmp_path):
    import shutil

    from mocojax import hf

    ckpt = _hf_copy(hf_dir, tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(ckpt / "model.safetensors", other / "model.safetensors")
    os.remove(ckpt / "model.safetensors")
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    index["weight_map"] = {name: target for name in index["weight_map"]}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        ValueError, match=re.escape(repr(target)) + " is outside the checkpoint directory"
    ):
        hf.load_pretrained(ckpt)


@pytest.mark.parametrize("damage", ["int8", "nan", "inf"])
def test_hf_non_float_or_non_finite_weights_are_refused_naming_the_tensor(damage, hf_dir, tmp_path):
    from safetensors.numpy import load_file, save_file

    from mocojax import hf

    ckpt = _hf_copy(hf_dir, tmp_path)
    tensors = load_file(ckpt / "model.safetensors")
    name = "model.language_model.layers.1.mlp.up_proj.weight"
    if damage == "int8":
        tensors[name] = np.ones(tensors[name].shape, np.int8)
        message = rf"tensor {re.escape(name)} has dtype I8; the weights must be floating point"
    else:
        tensors[name] = tensors[name].copy()
        tensors[name][0, :3] = np.nan if damage == "nan" else np.inf
        message = rf"tensor {re.escape(name)} holds 3 non-finite values"
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=message):
        hf.load_pretrained(ckpt)


# ------------------------------------------------------- a file every process writes at once
def test_toy_tokenizer_rebuilt_by_other_processes_always_reads_whole(tmp_path):
    # Every process of a multi-host run builds the toy tokenizer into the same workdir at each
    # stage; a process that read it while another rewrote it failed (CI, 2026-12-01).
    import subprocess
    import sys

    out_dir = str(tmp_path / "tokenizer")
    toyroles.build_tokenizer(out_dir)
    rebuild = (
        "from mocojax.data import toyroles\n"
        f"for _ in range(3): toyroles.build_tokenizer({out_dir!r})"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", rebuild], cwd=root, env=dict(os.environ, PYTHONPATH=root)
        )
        for _ in range(2)
    ]
    reads, partial = 0, []
    while any(writer.poll() is None for writer in writers):
        for name in ("tokenizer.json", "tokenizer_config.json"):
            reads += 1
            try:
                with open(os.path.join(out_dir, name)) as f:
                    json.load(f)
            except ValueError as error:
                partial.append(f"{name}: {error}")
    assert [writer.wait() for writer in writers] == [0, 0]
    assert reads > 100 and not partial, (reads, partial[:3])
    assert sorted(os.listdir(out_dir)) == ["tokenizer.json", "tokenizer_config.json"]
    processing.load_tokenizer(out_dir)
