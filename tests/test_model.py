"""Qwen3-VL port: parity with transformers' PyTorch model on the same random weights, layer by layer."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hf_reference import hf_config, hf_logits, image_prompt, left_pad, random_hf_model
from safetensors.numpy import load_file, save_file

from mocojax import hf, model
from mocojax.model import rope

TOL = 1e-4

CONFIGS = {
    # GQA (4 query heads share 2 kv heads), untied lm_head, DeepStack on the first two layers.
    "gqa_untied": model.tiny(num_heads=4, num_kv_heads=2, tie_word_embeddings=False),
    # MQA (one kv head), tied lm_head, DeepStack taps at vision layers 1 and 2.
    "mqa_tied": model.tiny(num_heads=4, num_kv_heads=1, tie_word_embeddings=True, deepstack=(1, 2)),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    """(cfg, HF model, our params loaded from the HF model's save_pretrained directory, directory)."""
    cfg = CONFIGS[request.param]
    ref = random_hf_model(cfg, seed=len(request.param))
    path = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(path)
    loaded_cfg, params = hf.load_pretrained(path, dtype=jnp.float32)
    assert loaded_cfg == cfg
    return cfg, ref, params, path


def _max_err(a, b, mask=None):
    diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    if mask is not None:
        diff = diff[np.asarray(mask).astype(bool)]
    return float(diff.max())


def test_text_only_logits(pair):
    cfg, ref, params, _ = pair
    ids = np.random.default_rng(1).integers(0, 240, (2, 11))
    mask = np.ones_like(ids)
    expected = hf_logits(ref, cfg, ids, mask).logits.numpy()
    assert np.abs(expected).max() > 1.0  # weights large enough that errors would show
    assert _max_err(model.forward(cfg, params, ids, mask), expected) <= TOL


@pytest.mark.parametrize(
    "grids", [[(1, 4, 6)], [(1, 4, 6), (1, 8, 2)]], ids=["one_image", "two_images"]
)
def test_image_logits(pair, grids):
    cfg, ref, params, _ = pair
    ids, pixels, grid = image_prompt(cfg, grids, np.random.default_rng(2))
    ids, mask = ids[None], np.ones((1, len(ids)), np.int64)
    expected = hf_logits(ref, cfg, ids, mask, pixels, grid).logits.numpy()
    assert _max_err(model.forward(cfg, params, ids, mask, pixels, grid), expected) <= TOL


def test_left_padded_batch(pair):
    """A left-padded batch equals both HF on the same batch and HF on each row alone (unpadded)."""
    cfg, ref, params, _ = pair
    rng = np.random.default_rng(3)
    img_ids, pixels, grid = image_prompt(cfg, [(1, 4, 4)], rng, text_len=2)
    text_ids = rng.integers(0, 240, 7)
    ids, mask = left_pad([text_ids, img_ids])
    ours = np.asarray(model.forward(cfg, params, ids, mask, pixels, grid))
    batched = hf_logits(ref, cfg, ids, mask, pixels, grid).logits.numpy()
    assert _max_err(ours, batched, mask) <= TOL
    alone_text = hf_logits(ref, cfg, text_ids[None], np.ones((1, 7))).logits.numpy()[0]
    alone_img = hf_logits(
        ref, cfg, img_ids[None], np.ones((1, len(img_ids))), pixels, grid
    ).logits.numpy()[0]
    assert _max_err(ours[0, -7:], alone_text) <= TOL
    assert _max_err(ours[1], alone_img) <= TOL


def test_vision_tower_and_each_deepstack_feature(pair):
    cfg, ref, params, _ = pair
    _, pixels, grid = image_prompt(cfg, [(1, 4, 6), (1, 2, 8)], np.random.default_rng(4))
    with torch.no_grad():
        out = ref.model.visual(
            torch.as_tensor(pixels), grid_thw=torch.as_tensor(grid), return_dict=True
        )
    tokens, deepstack = model.encode_images(
        cfg, params, pixels, model.vision_metadata(cfg.vision, grid)
    )
    assert _max_err(tokens, out.pooler_output.numpy()) <= TOL
    assert (
        deepstack.shape[0]
        == len(out.deepstack_features)
        == len(cfg.vision.deepstack_visual_indexes)
    )
    for ours, theirs in zip(deepstack, out.deepstack_features):
        assert _max_err(ours, theirs.numpy()) <= TOL


def test_vision_padding_patches_are_inert(pair):
    """Bucketed (padded) patch counts leave the real image tokens unchanged."""
    cfg, _, params, _ = pair
    _, pixels, grid = image_prompt(cfg, [(1, 4, 6)], np.random.default_rng(5))
    exact, _ = model.encode_images(cfg, params, pixels, model.vision_metadata(cfg.vision, grid))
    padded_pixels = np.concatenate([pixels, np.ones((8, pixels.shape[1]), np.float32)])
    padded, _ = model.encode_images(
        cfg, params, padded_pixels, model.vision_metadata(cfg.vision, grid, pad_to=32)
    )
    # Different array shapes let XLA block the matmuls differently: a few float32 ulps apart
    # (~1e-6 on values ~3). A padding patch leaking into an image's attention moves tokens by O(1).
    np.testing.assert_allclose(np.asarray(padded)[: exact.shape[0]], exact, rtol=1e-5, atol=1e-5)


def test_first_decoder_layer_output(pair):
    cfg, ref, params, _ = pair
    ids, pixels, grid = image_prompt(cfg, [(1, 4, 4)], np.random.default_rng(6))
    ids, mask = ids[None], np.ones((1, len(ids)), np.int64)
    out = hf_logits(ref, cfg, ids, mask, pixels, grid, output_hidden_states=True)
    inputs = model.prepare_inputs(cfg, ids, mask, grid)
    _, aux = model.apply(
        cfg,
        params,
        jnp.asarray(ids),
        jnp.asarray(mask),
        jnp.asarray(inputs.positions),
        jnp.asarray(pixels),
        jax.tree.map(jnp.asarray, inputs.vision),
        output_hidden_states=True,
    )
    # HF hidden_states[0] is the embedding output, [1] the first decoder layer's output.
    assert _max_err(aux["hidden_states"][0], out.hidden_states[1].numpy()) <= TOL


def test_mrope_is_interleaved_like_transformers():
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    text = model.TextConfig(head_dim=128, mrope_section=(24, 20, 20))
    axis = rope.mrope_axis_of_frequency(text)
    # Hand layout: T,H,W repeated for 20 triples (frequencies 0..59), then a T-only tail 60..63.
    assert axis[:6].tolist() == [0, 1, 2, 0, 1, 2]
    assert axis[57:64].tolist() == [0, 1, 2, 0, 0, 0, 0]
    assert (axis == 1).sum() == 20 and (axis == 2).sum() == 20 and (axis == 0).sum() == 24

    hf_text = hf_config(model.ModelConfig(text=text)).text_config
    emb = Qwen3VLTextRotaryEmbedding(hf_text)
    rng = np.random.default_rng(7)
    # Positions below 64 keep fp32 angle rounding (|angle| * 2^-24) far under the tolerance,
    # while any layout mistake moves cos/sin by O(1).
    positions = rng.integers(0, 64, (3, 2, 9))
    cos_ref, sin_ref = emb(torch.zeros(1, dtype=torch.float32), torch.as_tensor(positions))
    cos, sin = rope.text_rope(text, jnp.asarray(positions), jnp.float32)
    assert _max_err(cos, cos_ref.numpy()) <= 1e-5 and _max_err(sin, sin_ref.numpy()) <= 1e-5


def test_vision_position_interpolation_like_transformers():
    from transformers.vision_utils import (
        get_vision_interpolation_indices_and_weights,
        get_vision_position_ids,
    )

    vision = model.VisionConfig()  # 48x48 learned grid, as the real checkpoints
    grid = np.array([[1, 6, 10], [1, 64, 32], [2, 4, 4]])
    meta = model.vision_metadata(vision, grid)
    idx, w = get_vision_interpolation_indices_and_weights(
        torch.as_tensor(grid),
        num_grid_per_side=48,
        mode="bilinear",
        align_corners=True,
        spatial_merge_size=2,
    )
    table = np.random.default_rng(8).standard_normal((48 * 48, 3))
    ours = (table[meta.interp_idx] * meta.interp_w[..., None]).sum(1)
    theirs = (table[idx.numpy()] * w.numpy()[..., None]).sum(1)
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    np.testing.assert_array_equal(
        meta.rot_pos, get_vision_position_ids(torch.as_tensor(grid), 2).numpy()
    )
    # Block-diagonal attention: one segment per image and temporal frame.
    assert np.unique(meta.segment).tolist() == [0, 1, 2, 3]


def test_vision_attention_rows_pack_frames_without_splitting():
    vision = model.VisionConfig()
    grid = np.array([[1, 4, 6], [1, 8, 4], [2, 2, 2]])  # frames of 24, 32, 4, 4 patches
    meta = model.vision_metadata(vision, grid)
    assert meta.row_len == 32  # next power of two >= the largest frame
    # Next-fit by hand: row 0 = frame 0 (24) + nothing else fits? 24 + 32 > 32 -> row 1 = frame 1,
    # row 2 = frames 2 and 3 (4 + 4).
    assert meta.packed_patch.shape == (3, 32)
    flat = meta.packed_segment.reshape(-1)
    np.testing.assert_array_equal(flat[meta.slot], meta.segment)
    np.testing.assert_array_equal(meta.packed_patch.reshape(-1)[meta.slot], np.arange(64))
    assert (meta.packed_segment[0, 24:] == -2).all() and meta.packed_segment[2, :8].tolist() == [
        2
    ] * 4 + [3] * 4
    padded = model.vision_metadata(vision, grid, pad_to=100)
    # A fixed 2 * ceil(P / R) rows whatever the images; padding patches never share a frame's row slots.
    assert padded.packed_patch.shape == (8, 32) and (padded.segment[64:] == -1).all()
    np.testing.assert_array_equal(padded.packed_patch.reshape(-1)[padded.slot], np.arange(100))
    with pytest.raises(ValueError, match="does not fit attention rows"):
        model.vision_metadata(vision, grid, row_len=16)


def test_rope_index_like_transformers(pair):
    cfg, ref, _, _ = pair
    rng = np.random.default_rng(9)
    a, _, grid_a = image_prompt(cfg, [(1, 4, 6), (1, 2, 8)], rng)
    b, _, grid_b = image_prompt(cfg, [(1, 6, 2)], rng, text_len=1)
    ids, mask = left_pad([a, b])
    grid = np.concatenate([grid_a, grid_b])
    pos, deltas = model.get_rope_index(cfg, ids, mask, grid)
    pos_ref, deltas_ref = ref.model.get_rope_index(
        torch.as_tensor(ids),
        torch.as_tensor((ids == cfg.image_token_id).astype(np.int64)),
        image_grid_thw=torch.as_tensor(grid),
        attention_mask=torch.as_tensor(mask),
    )
    np.testing.assert_array_equal(pos[:, mask.astype(bool)], pos_ref.numpy()[:, mask.astype(bool)])
    np.testing.assert_array_equal(deltas, deltas_ref.numpy().ravel())


def test_save_pretrained_loads_in_transformers(pair, tmp_path):
    from transformers import Qwen3VLForConditionalGeneration

    cfg, ref, params, src = pair
    out = tmp_path / "export"
    hf.save_pretrained(out, cfg, params, max_shard_bytes=40_000)  # force several shards + index
    files = sorted(os.listdir(out))
    assert (
        "model.safetensors.index.json" in files
        and sum(f.endswith(".safetensors") for f in files) > 1
    )
    reloaded = Qwen3VLForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    ids, pixels, grid = image_prompt(cfg, [(1, 4, 4)], np.random.default_rng(10))
    ids, mask = ids[None], np.ones((1, len(ids)), np.int64)
    expected = hf_logits(reloaded, cfg, ids, mask, pixels, grid).logits.numpy()
    assert _max_err(model.forward(cfg, params, ids, mask, pixels, grid), expected) <= TOL
    assert reloaded.config.tie_word_embeddings == cfg.tie_word_embeddings
    if cfg.tie_word_embeddings:
        assert (
            reloaded.lm_head.weight.data_ptr()
            == reloaded.model.language_model.embed_tokens.weight.data_ptr()
        )


def test_load_save_load_is_bit_identical(pair, tmp_path):
    cfg, _, params, _ = pair
    hf.save_pretrained(tmp_path / "a", cfg, params)
    cfg2, params2 = hf.load_pretrained(tmp_path / "a")
    assert cfg2 == cfg
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        assert x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
    hf.save_pretrained(tmp_path / "b", cfg2, params2)
    a, b = (
        load_file(tmp_path / "a" / "model.safetensors"),
        load_file(tmp_path / "b" / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_bf16_params_round_trip(pair, tmp_path):
    cfg, _, params, _ = pair
    hf.save_pretrained(tmp_path / "f32", cfg, params)
    cfg16, p16 = hf.load_pretrained(tmp_path / "f32", dtype=jnp.bfloat16)
    assert cfg16.param_dtype == "bfloat16" and all(
        x.dtype == jnp.bfloat16 for x in jax.tree.leaves(p16)
    )
    hf.save_pretrained(tmp_path / "bf16", cfg16, p16)
    _, again = hf.load_pretrained(tmp_path / "bf16", dtype=jnp.bfloat16)
    assert all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(p16), jax.tree.leaves(again))
    )


def test_bf16_compute_tracks_fp32(pair):
    """bf16 activations (fp32 master params) stay close to fp32: a smoke test of the dtype split."""
    cfg, _, params, _ = pair
    ids, pixels, grid = image_prompt(cfg, [(1, 4, 4)], np.random.default_rng(11))
    ids, mask = ids[None], np.ones((1, len(ids)), np.int64)
    f32 = np.asarray(model.forward(cfg, params, ids, mask, pixels, grid))
    b16 = np.asarray(model.forward(cfg.replace(dtype="bfloat16"), params, ids, mask, pixels, grid))
    assert b16.dtype == np.float32  # logits are accumulated in float32
    rel = np.abs(f32 - b16).max() / np.abs(f32).max()
    assert 0 < rel < 0.1


def test_tie_flag_inside_text_config_is_honoured(tmp_path):
    cfg = model.tiny(tie_word_embeddings=True)
    d = cfg.to_hf_dict()
    d["tie_word_embeddings"] = False  # only text_config says tied, as in some published configs
    assert model.ModelConfig.from_hf_dict(d).tie_word_embeddings


@pytest.mark.parametrize("name", ["2b", "4b", "8b", "32b"])
def test_preset_parameter_counts_match_transformers(name):
    from transformers import Qwen3VLForConditionalGeneration

    cfg = model.preset(name)
    with torch.device("meta"):
        ref = Qwen3VLForConditionalGeneration(hf_config(cfg))
    expected = sum(p.numel() for p in ref.parameters())
    assert model.count_params(model.abstract_params(cfg)) == expected


def test_param_axes_cover_every_parameter():
    cfg = model.tiny()
    shapes = model.abstract_params(cfg)
    axes = model.param_axes(cfg)
    pairs = jax.tree.leaves(
        jax.tree.map(
            lambda s, a: (len(s.shape), len(a)),
            shapes,
            axes,
            is_leaf=lambda x: isinstance(x, tuple),
        )
    )
    flat_shapes, flat_axes = (
        jax.tree.leaves(shapes),
        jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple)),
    )
    assert len(flat_shapes) == len(flat_axes) > 0 and pairs
    for s, a in zip(flat_shapes, flat_axes):
        assert len(a) == len(s.shape) and all(isinstance(n, str) for n in a)
    assert axes["text"]["layers"]["attn"]["q_proj"] == ("layers", "embed", "heads", "head_dim")


# ------------------------------------------------------------------ bad checkpoints
def _tiny_checkpoint(tmp_path):
    cfg = model.tiny()
    hf.save_pretrained(tmp_path, cfg, model.init_params(cfg, 0))
    return cfg


def test_error_on_non_qwen3vl_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="not a Qwen3-VL config"):
        hf.load_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        hf.load_pretrained(tmp_path / "..")


def test_error_on_missing_and_unexpected_tensors(tmp_path):
    _tiny_checkpoint(tmp_path)
    f = tmp_path / "model.safetensors"
    tensors = load_file(f)
    tensors.pop("model.language_model.norm.weight")
    tensors["model.extra.weight"] = np.zeros(3, np.float32)
    save_file(tensors, f)
    with pytest.raises(
        ValueError,
        match=r"missing 1 tensors \['model.language_model.norm.weight'\].*unexpected 1 tensors \['model.extra.weight'\]",
    ):
        hf.load_pretrained(tmp_path)


def test_error_on_shape_mismatch(tmp_path):
    _tiny_checkpoint(tmp_path)
    f = tmp_path / "model.safetensors"
    tensors = load_file(f)
    tensors["model.visual.pos_embed.weight"] = np.zeros((9, 32), np.float32)
    save_file(tensors, f)
    with pytest.raises(
        ValueError, match=r"model.visual.pos_embed.weight has shape \(9, 32\), expected \(16, 32\)"
    ):
        hf.load_pretrained(tmp_path)


def test_error_on_pickle_only_checkpoint(tmp_path):
    _tiny_checkpoint(tmp_path)
    for name in os.listdir(tmp_path):
        if name.endswith(".safetensors") or name.endswith(".index.json"):
            os.remove(tmp_path / name)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(FileNotFoundError, match="pickle checkpoints are never loaded"):
        hf.load_pretrained(tmp_path)


def test_error_on_image_token_mismatch():
    cfg = model.tiny()
    params = model.init_params(cfg, 0)
    ids, pixels, grid = image_prompt(cfg, [(1, 4, 4)], np.random.default_rng(12))
    with pytest.raises(ValueError, match="image tokens and images do not match"):
        model.forward(
            cfg,
            params,
            ids[None, :-6],
            np.ones((1, len(ids) - 6)),
            pixels,
            grid * np.array([1, 2, 1]),
        )
    with pytest.raises(ValueError, match="no image_grid_thw"):
        model.forward(cfg, params, ids[None], np.ones((1, len(ids))))
