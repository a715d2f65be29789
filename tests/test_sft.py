"""Stage I SFT step: it runs, learns, reports per-role losses that add up, masks prompts, accumulates, skips NaN;
packed rows (sft.pack_rows) give the same loss and gradients, with no attention across records."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from mocojax import losses, model, processing
from mocojax.data import pipeline, toyroles
from mocojax.model import qwen3_vl
from mocojax.train import sft, state as state_lib, step as step_lib


@pytest.fixture(scope="module")
def train_step(setup):
    """One jitted step (no donation) shared by the tests, so each batch shape compiles once."""
    cfg = setup[0]
    return jax.jit(lambda state, batch: sft.train_step(cfg, _optimizer(), state, batch))


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
    examples = toyroles.sft_records(
        seed=0, num_scenes=2
    )  # 2 Policy, 1 Generator, 1 Judge per scene
    batch = next(
        iter(pipeline.sft_dataset(examples, processor, global_batch_size=8, seed=0, buckets=(640,)))
    )
    return cfg, processor, batch


def _optimizer(lr=1e-2):
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
    return state_lib.make_optimizer(opt, total_steps=100)


def test_step_runs_and_loss_falls_on_a_fixed_batch(setup, train_step):
    cfg, _, host_batch = setup
    state = state_lib.init_state(model.init_params(cfg, 0), _optimizer(), jax.random.key(0))
    batch = sft.micro_batches(cfg, host_batch, num_micro=1)
    history = []
    for _ in range(10):
        state, metrics = train_step(state, batch)
        history.append(float(metrics["loss"]))
    assert int(state["step"]) == 10 and int(metrics["skipped"]) == 0
    assert np.isfinite(history).all()
    assert history[-1] < 0.75 * history[0], history


def test_per_role_losses_add_up_to_the_mixed_loss_by_token_weight(setup, train_step):
    cfg, _, host_batch = setup
    state = state_lib.init_state(model.init_params(cfg, 0), _optimizer(), jax.random.key(0))
    _, metrics = train_step(state, sft.micro_batches(cfg, host_batch, 1))
    names = ("policy", "generator", "judge")
    tokens = np.array([float(metrics[f"tokens_{n}"]) for n in names])
    role_losses = np.array([float(metrics[f"loss_{n}"]) for n in names])
    assert (tokens > 0).all()  # the batch holds all three roles
    assert tokens.sum() == float(metrics["target_tokens"])
    np.testing.assert_allclose(
        (role_losses * tokens).sum() / tokens.sum(), float(metrics["loss"]), rtol=1e-5
    )


def test_loss_mask_excludes_prompt_tokens(setup):
    cfg, processor, host_batch = setup
    params = model.init_params(cfg, 0)
    micro = jax.tree.map(lambda x: x[0], sft.micro_batches(cfg, host_batch, 1))
    nll, tokens, _, _ = sft.batch_nll(cfg, params, micro)
    ids, mask = host_batch["input_ids"], host_batch["loss_mask"]
    im_start = processor.im_start_token_id
    for row in range(ids.shape[0]):
        # The reply starts after the last "<|im_start|>assistant\n"; everything before is prompt.
        reply_start = np.flatnonzero(ids[row] == im_start)[-1] + 3
        masked = np.flatnonzero(mask[row])
        # One contiguous span: the reply and its <|im_end|>, nothing of the prompt.
        np.testing.assert_array_equal(masked, np.arange(reply_start, reply_start + len(masked)))
        assert ids[row, masked[-1]] == processor.im_end_token_id
    # The loss is the mean NLL of exactly the masked (reply) tokens.
    logits, _ = model.apply(
        cfg,
        params,
        micro["input_ids"],
        micro["attention_mask"],
        micro["positions"],
        micro["pixel_values"],
        micro["vision"],
    )
    logprobs = np.asarray(losses.token_logprobs(logits[:, :-1], micro["input_ids"][:, 1:]))
    targets = mask[:, 1:].astype(bool)
    np.testing.assert_allclose(float(nll), -logprobs[targets].sum(), rtol=1e-5)
    assert float(tokens) == targets.sum()


def test_chunked_log_softmax_chunked_attention_and_remat_change_no_loss_or_gradient(setup):
    # 640 positions in chunks of 100 (the last one partial); attention 96 queries at a time (the
    # last chunk partial); remat on decoder layers and vision blocks.
    cfg, _, host_batch = setup
    params = model.init_params(cfg, 0)
    micro = jax.tree.map(lambda x: x[0], sft.micro_batches(cfg, host_batch, 1))
    run = lambda c: jax.jit(jax.value_and_grad(lambda p: sft.batch_nll(c, p, micro)[0]))(params)
    want, g_want = run(cfg)
    got, g_got = run(cfg.replace(logits_chunk=100, attention_chunk=96, remat=True))
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max()),
        g_got,
        g_want,
    )


def test_gradient_accumulation_matches_one_big_batch(setup, train_step):
    cfg, _, host_batch = setup
    params = model.init_params(cfg, 0)
    results = []
    for num_micro in (1, 2):
        state = state_lib.init_state(params, _optimizer(), jax.random.key(0))
        batch = sft.micro_batches(cfg, host_batch, num_micro)
        assert batch["input_ids"].shape[:2] == (num_micro, 8 // num_micro)
        state, metrics = train_step(state, batch)
        results.append((float(metrics["loss"]), float(metrics["grad_norm"]), state["params"]))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-4)
    # Adam's first step moves a weight by lr * g / (|g| + eps). Where |g| >> eps that is lr in
    # size, and the two runs must agree to 1% of lr. Where |g| is near or below eps (0.2% of the
    # weights here, e.g. patch-embedding inputs that hardly vary over the batch: measured
    # |update| 0.035-0.047 lr) float32 summation order changes the fraction by percents of lr,
    # so those weights are only checked to move less than lr in both runs.
    lr, compared, total = 1e-2, 0, 0
    for a, b, p in zip(
        *(map(np.asarray, jax.tree.leaves(tree)) for tree in (results[0][2], results[1][2], params))
    ):
        conditioned = np.abs(a - p) >= 0.99 * lr
        np.testing.assert_allclose(a[conditioned], b[conditioned], atol=1e-4)
        assert (np.abs(a - p)[~conditioned] < lr).all() and (np.abs(b - p)[~conditioned] < lr).all()
        compared, total = compared + conditioned.sum(), total + conditioned.size
    assert (
        compared > 0.5 * total
    )  # most weights are compared exactly (the rest: zero or tiny gradients)


def test_non_finite_loss_skips_the_update_and_counts_it():
    optimizer = _optimizer()
    params = {"w": jnp.ones((3,))}
    state = state_lib.init_state(params, optimizer, jax.random.key(0))
    grads = {"w": jnp.full((3,), 0.5)}
    skipped_state, metrics = state_lib.apply_gradients(
        state, grads, optimizer, jnp.float32(jnp.nan)
    )
    assert int(metrics["skipped"]) == 1 and int(skipped_state["step"]) == 1
    np.testing.assert_array_equal(skipped_state["params"]["w"], params["w"])
    jax.tree.map(np.testing.assert_array_equal, skipped_state["opt_state"], state["opt_state"])
    inf_grads = {"w": jnp.array([0.5, jnp.inf, 0.5])}
    assert (
        int(state_lib.apply_gradients(state, inf_grads, optimizer, jnp.float32(1.0))[1]["skipped"])
        == 1
    )
    updated, metrics = state_lib.apply_gradients(state, grads, optimizer, jnp.float32(1.0))
    assert int(metrics["skipped"]) == 0 and not np.array_equal(updated["params"]["w"], params["w"])


def test_schedule_warms_up_then_decays():
    schedule = state_lib.learning_rate_schedule(1e-5, total_steps=300, warmup_ratio=0.05)
    assert float(schedule(0)) == 0.0
    np.testing.assert_allclose(float(schedule(15)), 1e-5, rtol=1e-6)  # 5% of 300 steps
    assert float(schedule(150)) < 1e-5 and float(schedule(299)) < 1e-7


def test_restarted_schedule_by_hand():
    """restart_at=R: the R-step schedule (annealed) until step R, then the total's own cosine
    from step R: lr 1e-3, 5% warmup, end 5%; values from the cosine formula."""
    lr, end = 1e-3, 0.05
    schedule = state_lib.learning_rate_schedule(lr, 3000, 0.05, end, restart_at=1000)

    def cosine(step, total, warm):
        return lr * end + (lr - lr * end) * 0.5 * (
            1 + np.cos(np.pi * (step - warm) / (total - warm))
        )

    np.testing.assert_allclose(float(schedule(25)), lr / 2, rtol=1e-6)  # 50 warmup steps of 1000
    np.testing.assert_allclose(float(schedule(500)), cosine(500, 1000, 50), rtol=1e-5)
    np.testing.assert_allclose(float(schedule(999)), cosine(999, 1000, 50), rtol=1e-5)
    np.testing.assert_allclose(float(schedule(1000)), cosine(1000, 3000, 150), rtol=1e-5)
    np.testing.assert_allclose(float(schedule(2500)), cosine(2500, 3000, 150), rtol=1e-5)
    assert float(schedule(999)) < 0.06 * lr < 0.7 * lr < float(schedule(1000))  # the jump
    with pytest.raises(ValueError, match="restart_at=3000"):
        state_lib.learning_rate_schedule(lr, 3000, 0.05, end, restart_at=3000)


def test_non_finite_batch_through_the_real_step_is_skipped_and_the_next_trains(setup, train_step):
    """Issue #13 item 10 (docs/reliability.md): NaN pixels through the jitted SFT step. Same
    batch shape as the tests above, so the compiled step is shared."""
    cfg, _, host_batch = setup
    params = model.init_params(cfg, 0)
    state = state_lib.init_state(params, _optimizer(), jax.random.key(0))
    assert host_batch["pixel_values"] is not None
    poisoned = dict(host_batch, pixel_values=np.full_like(host_batch["pixel_values"], np.nan))
    state, metrics = train_step(state, sft.micro_batches(cfg, poisoned, 1))
    assert int(metrics["skipped"]) == 1 and not np.isfinite(float(metrics["loss"]))
    assert int(state["step"]) == 1
    jax.tree.map(np.testing.assert_array_equal, state["params"], params)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(state["opt_state"]))
    state, metrics = train_step(state, sft.micro_batches(cfg, host_batch, 1))
    assert int(metrics["skipped"]) == 0 and np.isfinite(float(metrics["loss"]))
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(params))
    )


def test_packing_puts_several_records_with_images_in_a_row_and_keeps_their_positions(setup):
    cfg, _, batch = setup
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
    cfg, _, batch = setup
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


def test_a_text_only_batch_gets_an_image_batchs_vision_shapes_and_the_same_loss(setup):
    """With one fixed image size, a batch without images (the Judge's) packs its padding patches
    in an image batch's vision rows, so the step compiles once for both; its loss is the same."""
    cfg, processor, batch = setup
    data = ml_collections.ConfigDict(
        dict(min_pixels=128 * 128, max_pixels=128 * 128, max_patches=512)
    )
    row_len = sft.text_row_len(data)
    assert row_len == 64  # a 128 px image: 8 x 8 patches of 16 px, the next power of two
    with_images = sft.micro_batches(cfg, batch, 1, 512, pack=True, text_row_len=row_len)
    assert with_images["vision"].packed_patch.shape[-1] == row_len
    judge = [e for e in toyroles.sft_records(seed=0, num_scenes=2) if e["role"] == "judge"]
    text = next(
        iter(pipeline.sft_dataset(judge, processor, global_batch_size=2, seed=0, buckets=(640,)))
    )
    assert text["image_grid_thw"] is None
    fixed = sft.micro_batches(cfg, text, 1, 512, pack=True, text_row_len=row_len)
    default = sft.micro_batches(cfg, text, 1, 512, pack=True)
    shapes = lambda b: jax.tree.map(np.shape, b["vision"])
    assert shapes(fixed) == shapes(with_images)
    assert shapes(default) != shapes(with_images)  # today's 16-slot rows: another program
    params = model.init_params(cfg, 0)
    _, (nll_fixed, counts_fixed) = _sums_and_grads(cfg, params, fixed)
    _, (nll_default, counts_default) = _sums_and_grads(cfg, params, default)
    assert float(counts_fixed[0]) == float(counts_default[0]) > 0
    np.testing.assert_allclose(float(nll_fixed), float(nll_default), rtol=1e-6)
    # Images of several sizes (min_pixels < max_pixels) or no fixed patch count: no fixed row.
    assert sft.text_row_len(ml_collections.ConfigDict(dict(data, min_pixels=64 * 64))) is None
    assert sft.text_row_len(ml_collections.ConfigDict(dict(data, max_patches=None))) is None


def test_attention_does_not_cross_a_segment_boundary(setup):
    cfg, _, _ = setup
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
    mask = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(
        qwen3_vl.segment_mask(mask), qwen3_vl.attention_mask_4d(mask, 5, 0)
    )
