"""benchmarks/bench_gpu.py on CPU with the tiny shape (the script's check; its timed GPU run is no
test), and its analytic FLOP count against a hand-computed case and the model's own weights."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from mocojax import model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_gpu.py")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flops_of_a_hand_computed_sft_step():
    bench = _bench()
    cfg = model.tiny(num_layers=2, vision_depth=1, deepstack=(0,))
    # d 64, 4 heads x 16, 2 kv heads x 16, MLP 128, vocab 256; vision 32 wide, MLP 64, 1 block,
    # patch_dim 3 * 2 * 16^2 = 1536, merge 2 (merged width 128), one DeepStack merger.
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128  # q, k + v, o, gate + up + down
    assert layer == 36_864
    rows, seq, patches = 2, 8, 16
    text = 2 * layer * 2 * rows * seq  # 2 layers, 16 tokens
    attention = 4 * 4 * 16 * 2 * rows * (8 * 9 // 2)  # 36 causal pairs per row
    head = 2 * 64 * 256 * rows * (seq - 1)
    vision = 2 * (1536 * 32 + (4 * 32 * 32 + 2 * 32 * 64)) * rows * patches
    vision_attention = 4 * 32 * 1 * patches**2 * rows
    mergers = 2 * 2 * (128 * 128 + 128 * 64) * rows * patches // 4
    expected = 3 * (text + attention + head + vision + vision_attention + mergers)
    assert expected == 3 * (2_359_296 + 36_864 + 458_752 + 3_670_016 + 65_536 + 786_432)
    assert bench.sft_flops(cfg, rows, seq, patches) == expected
    # Decoding 3 tokens after a 5-token cache: 2 model steps per row, over 5 + 1 and 5 + 2 keys.
    per_step = 2 * layer * 2 + 2 * 64 * 256
    assert bench.decode_flops(cfg, 4, 5, 3) == 4 * (2 * per_step + 4 * 4 * 16 * 2 * (6 + 7))


def test_flop_formula_covers_the_models_matmul_weights():
    """The weights matmul_params counts are the model's own matrices, for the cut 4B config."""
    bench = _bench()
    cfg = bench.config("4b", 2, 3, "bfloat16", True)
    assert (cfg.text.num_hidden_layers, cfg.vision.depth) == (2, 3)
    assert cfg.vision.deepstack_visual_indexes == (
        0,
        1,
    )  # (5, 11, 17) of 24 blocks, cut to 3, 2 kept
    w = bench.matmul_params(cfg)
    params = model.abstract_params(cfg)
    size = lambda tree: sum(math.prod(x.shape) for x in jax.tree.leaves(tree))
    text = params["text"]["layers"]
    text_weights = size({k: v for k, v in text["attn"].items() if k.endswith("_proj")}) + size(
        text["mlp"]
    )
    assert text_weights == 2 * w["text_layer"]
    assert math.prod(params["text"]["embed"].shape) == w["lm_head"]  # tied in the 4B
    visual = params["visual"]
    kernels = lambda tree: size(
        [x for p, x in jax.tree_util.tree_leaves_with_path(tree) if "kernel" in str(p[-1])]
    )
    assert kernels(visual["patch_embed"]) == w["vision_patch"]
    assert kernels(visual["blocks"]) == 3 * w["vision_block"]
    assert kernels(visual["merger"]) + kernels(visual["deepstack_mergers"]) == 3 * w["merger"]


def test_bench_gpu_tiny_on_cpu_prints_three_measurements():
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="1")
    # The cheapest programs to compile (float32, no remat, 1 layer, XLA's optimisations off): the
    # compiles are the test's whole time.
    argv = ["--shape", "tiny", "--steps", "1", "--samples", "2", "--layers", "1"]
    argv += ["--dtype", "float32", "--no-remat", "--peak-tflops", "1"]
    result = subprocess.run(
        [sys.executable, SCRIPT, *argv], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(x) for x in result.stdout.splitlines() if x.startswith("{")]
    assert [r["measurement"] for r in lines] == ["sft_step", "grpo_update", "decode"]
    for r in lines:
        for key in ("seconds", "tokens_per_s", "flops", "tflops", "mfu"):
            assert np.isfinite(r[key]) and r[key] > 0, (r["measurement"], key, r[key])
        assert r["device"] == "cpu"
        assert math.isclose(r["mfu"], r["tflops"])  # --peak-tflops 1
    assert lines[2]["tokens"] == 2 * 8  # N = 2 rows x the tiny shape's 8 new tokens
    assert "| sft_step |" in result.stdout and "| decode |" in result.stdout


def test_bench_gpu_rejects_bad_sizes(capsys):
    bench = _bench()
    for argv, message in (
        (["--image-patches", "15"], "--image-patches=15 must be a square"),
        (["--seq", "5"], "--seq=5 leaves no text around the image's 4 tokens"),
        (["--layers", "4"], "--layers=4: the tiny shape has 1..3"),
        (["--decode-tokens", "1"], "--decode-tokens must be >= 2"),
    ):
        with pytest.raises(SystemExit) as exit_:
            bench.main(["--shape", "tiny", *argv])
        assert exit_.value.code == 2 and message in capsys.readouterr().err, argv
