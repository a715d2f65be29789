"""Stage I SFT step: it runs, learns, reports per-role losses that add up, masks prompts, accumulates, skips NaN."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from mocojax import losses, model, processing
from mocojax.data import pipeline, toyroles
from mocojax.train import sft, state as state_lib


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
