"""Packed SFT rows (sft.pack_rows): the same loss and gradients as the unpacked rows, no attention
across records."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mocojax import model, processing
from mocojax.data import pipeline, toyroles
from mocojax.train import sft, step as step_lib


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tokenizer_dir = toyroles.build_tokenizer(str(tmp_path_factory.mktemp("tok")))
    tokenizer = processing.load_tokenizer(tokenizer_dir)
    processor = processing.Processor(tokenizer, min_pixels=128 * 128, max_pixels=128 * 128)
    cfg = model.tiny(
        vocab_size=-(-len(tokenizer) // 64) * 64,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        vision_depth=1,
        vision_hidden=32,
        deepstack=(0,),
        image_token_id=processor.image_token_id,
        video_token_id=processor.video_token_id,
        vision_start_token_id=processor.vision_start_token_id,
        vision_end_token_id=processor.vision_end_token_id,
    )
    examples = toyroles.sft_records(seed=0, num_scenes=2)  # 2 Policy, 1 Generator, 1 Judge each
    batch = next(
        iter(pipeline.sft_dataset(examples, processor, global_batch_size=8, seed=0, buckets=(640,)))
    )
    return cfg, batch


def test_packing_puts_several_records_with_images_in_a_row_and_keeps_their_positions(setup):
    cfg, batch = setup
    packed = sft.pack_rows(cfg, batch, row_multiple=1)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    rows = packed["input_ids"].shape[0]
    assert rows < ids.shape[0]
    assert (packed["attention_mask"] > 0).sum() == mask.sum()
    want = model.prepare_inputs(
        cfg, ids, mask, batch["image_grid_thw"], batch["mm_token_type_ids"]
    ).positions
    found, later_images = set(), 0
    for row in range(rows):
        seg = packed["attention_mask"][row]
        for s in range(1, seg.max() + 1):
            at = np.flatnonzero(seg == s)
            tokens = packed["input_ids"][row, at]
            (r,) = [r for r in range(len(ids)) if np.array_equal(ids[r, : mask[r].sum()], tokens)]
            found.add(r)
            # Each record keeps its own positions (M-RoPE image positions included): they
            # restart at 0 in every segment.
            np.testing.assert_array_equal(packed["positions"][:, row, at], want[:, r, : len(at)])
            np.testing.assert_array_equal(
                packed["loss_mask"][row, at[1:]], batch["loss_mask"][r, 1 : len(at)]
            )
            assert (packed["role"][row, at] == batch["role"][r]).all()
            later_images += s > 1 and (tokens == cfg.image_token_id).any()
    assert found == set(range(len(ids)))
    assert later_images  # some record with an image sits after another record in its row
    # Images follow their records: the packed rows' image tokens in order match the grids.
    grid = packed["image_grid_thw"]
    assert (packed["input_ids"] == cfg.image_token_id).sum() == (grid.prod(-1) // 4).sum()
    assert len(packed["pixel_values"]) == len(batch["pixel_values"])
    assert sft.pack_rows(cfg, batch, row_multiple=4)["input_ids"].shape[0] % 4 == 0


def _sums_and_grads(cfg, params, batch):
    loss = functools.partial(sft._micro_loss, cfg)
    return jax.jit(lambda p, b: step_lib.accumulate(loss, p, b))(params, batch)


def test_packed_loss_and_gradients_equal_the_unpacked(setup):
    cfg, batch = setup
    params = model.init_params(cfg, 0)
    unpacked = sft.micro_batches(cfg, batch, 1, max_patches=512)
    packed = sft.micro_batches(cfg, batch, 2, max_patches=512, pack=True, pack_row_multiple=1)
    assert packed["input_ids"].shape[:2] == (2, 2)  # 4 packed rows in 2 micro-batches
    assert packed["role"].shape == packed["input_ids"].shape
    g_want, (nll_want, counts_want) = _sums_and_grads(cfg, params, unpacked)
    g_got, (nll_got, counts_got) = _sums_and_grads(cfg, params, packed)
    (tokens_got, role_nll_got, role_tokens_got) = counts_got
    (tokens_want, role_nll_want, role_tokens_want) = counts_want
    np.testing.assert_allclose(float(nll_got), float(nll_want), rtol=1e-5)
    np.testing.assert_allclose(role_nll_got, role_nll_want, rtol=1e-5)
    assert float(tokens_got) == float(tokens_want)
    np.testing.assert_array_equal(role_tokens_got, role_tokens_want)
    assert (np.asarray(role_tokens_want) > 0).all()  # all three roles present
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max()),
        g_got,
        g_want,
    )


def test_attention_does_not_cross_a_segment_boundary(setup):
    cfg, _ = setup
    params = model.init_params(cfg, 0)
    rng = np.random.default_rng(0)
    first, second = 7, 9
    ids = rng.integers(10, 200, (1, 20)).astype(np.int32)
    segments = np.array([[1] * first + [2] * second + [0] * 4], np.int32)
    positions = np.concatenate([np.arange(first), np.arange(second), np.zeros(4, int)])
    positions = np.broadcast_to(positions, (3, 1, 20)).astype(np.int32)
    changed = ids.copy()
    changed[0, :first] = rng.integers(10, 200, first)

    apply = jax.jit(lambda tokens, mask: model.apply(cfg, params, tokens, mask, positions)[0][0])
    logits = lambda tokens, mask: np.asarray(apply(tokens, mask))

    in_second = slice(first, first + second)
    np.testing.assert_array_equal(
        logits(changed, segments)[in_second], logits(ids, segments)[in_second]
    )
    # With one segment (a 0/1 mask) the same change does reach the later tokens.
    plain = (segments > 0).astype(np.int32)
    assert np.abs(logits(changed, plain)[in_second] - logits(ids, plain)[in_second]).max() > 1e-3


def test_segment_mask_of_a_0_1_mask_is_the_padding_mask():
    from mocojax.model import qwen3_vl

    mask = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(
        qwen3_vl.segment_mask(mask), qwen3_vl.attention_mask_4d(mask, 5, 0)
    )
