"""Hand-computed checks of the SFT NLL, GRPO advantages, GRPO loss aggregations, clipping and KL."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mocojax import losses

LN2, LN4 = math.log(2.0), math.log(4.0)


def _logits_from_counts(counts):
    # softmax(log c) = c / sum(c): every probability below is a ratio of small integers.
    return jnp.log(jnp.asarray(counts, jnp.float32))


def _sft_batch():
    # [B=2, L=2, V=4]; probability of each target = count / sum(counts):
    #   (0,0) [1,1,1,1] target 0 -> 1/4, nll ln 4
    #   (0,1) [1,1,2,4] target 3 -> 4/8, nll ln 2
    #   (1,0) [1,1,2,4] target 2 -> 2/8, nll ln 4   (masked: a prompt token)
    #   (1,1) [1,3,2,2] target 1 -> 3/8, nll ln 8/3
    logits = _logits_from_counts([[[1, 1, 1, 1], [1, 1, 2, 4]], [[1, 1, 2, 4], [1, 3, 2, 2]]])
    targets = jnp.array([[0, 3], [2, 1]])
    loss_mask = jnp.array([[1, 1], [0, 1]])
    return logits, targets, loss_mask


def test_token_logprobs_hand_computed():
    logits, targets, _ = _sft_batch()
    expected = np.log([[1 / 4, 1 / 2], [1 / 4, 3 / 8]])
    np.testing.assert_allclose(losses.token_logprobs(logits, targets), expected, rtol=1e-6)


def test_token_logprobs_float32_for_bf16_logits():
    # 4096-way vocabulary of bf16 logits; the reference is float64 on the same (bf16) values.
    logits = jax.random.normal(jax.random.key(0), (2, 3, 4096)).astype(jnp.bfloat16) * 4
    targets = jnp.arange(6).reshape(2, 3) * 100
    lp = losses.token_logprobs(logits, targets)
    assert lp.dtype == jnp.float32
    x = np.asarray(logits.astype(jnp.float32), np.float64)
    lse = np.log(np.sum(np.exp(x), axis=-1))
    expected = np.take_along_axis(x, np.asarray(targets)[..., None], -1)[..., 0] - lse
    np.testing.assert_allclose(lp, expected, rtol=1e-5)
    # The same reduction carried out in bf16 is visibly wrong: that is what the upcast avoids.
    lp_bf16 = jax.nn.log_softmax(logits, axis=-1)
    lp_bf16 = jnp.take_along_axis(lp_bf16, targets[..., None], -1)[..., 0]
    assert np.max(np.abs(np.asarray(lp_bf16, np.float64) - expected)) > 1e-3


def _role_sums(logits, targets, loss_mask, group_ids, num_groups):
    """The SFT trainer's reduction (sft.batch_nll): per-token NLL summed per group over masked tokens."""
    return losses.per_group_sums(
        -losses.token_logprobs(logits, targets), loss_mask, group_ids, num_groups
    )


def test_sft_nll_sum_hand_computed_and_mask_excludes_prompt():
    logits, targets, loss_mask = _sft_batch()
    one_group = jnp.zeros(2, jnp.int32)
    sums, counts = _role_sums(logits, targets, loss_mask, one_group, 1)
    # ln 4 + ln 2 + ln 8/3 = ln(64/3) over 3 tokens.
    np.testing.assert_allclose(sums, [math.log(64 / 3)], rtol=1e-6)
    np.testing.assert_array_equal(counts, [3])
    # Changing the masked prompt position (1, 0) leaves the sum unchanged.
    changed = logits.at[1, 0].set(jnp.array([9.0, -3.0, 0.5, 2.0]))
    np.testing.assert_allclose(
        _role_sums(changed, targets, loss_mask, one_group, 1)[0], sums, rtol=1e-7
    )
    # Unmasking it adds ln 4 and a token.
    full, full_counts = _role_sums(logits, targets, jnp.ones_like(loss_mask), one_group, 1)
    np.testing.assert_allclose(full, [math.log(64 / 3) + LN4], rtol=1e-6)
    np.testing.assert_array_equal(full_counts, [4])


def test_sft_nll_of_bf16_logits_is_float32():
    logits, targets, loss_mask = _sft_batch()
    sums, counts = _role_sums(
        logits.astype(jnp.bfloat16), targets, loss_mask, jnp.zeros(2, jnp.int32), 1
    )
    assert sums.dtype == jnp.float32 and counts.dtype == jnp.float32


def test_per_group_sums_add_up_to_mixed_loss():
    logits, targets, loss_mask = _sft_batch()
    # Row 0 is a Policy record (group 0), row 1 a Judge record (group 2); no Generator rows.
    sums, counts = _role_sums(logits, targets, loss_mask, jnp.array([0, 2]), 3)
    # Policy: ln 4 + ln 2 = ln 8 over 2 tokens; Judge: ln 8/3 over 1 token.
    np.testing.assert_allclose(sums, [math.log(8), 0.0, math.log(8 / 3)], rtol=1e-6)
    np.testing.assert_array_equal(counts, [2, 0, 1])
    per_role = sums / jnp.maximum(counts, 1)
    # Token-weighted per-role losses: (2 * ln8/2 + 0 + 1 * ln(8/3)) / 3 = the mixed loss ln(64/3) / 3.
    np.testing.assert_allclose(
        jnp.sum(per_role * counts) / jnp.sum(counts), math.log(64 / 3) / 3, rtol=1e-6
    )
    with pytest.raises(ValueError, match="group_ids"):
        losses.per_group_sums(jnp.zeros((2, 2)), loss_mask, jnp.array([0, 1, 2]), 3)


@pytest.mark.parametrize("chunk", [0, 4, 5, 13, 40])
def test_chunked_token_logprobs_equal_unchunked_values_and_gradients(chunk):
    # L = 13 positions, not a multiple of 4 or 5: the last chunk is padded and cut.
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.normal(size=(3, 13, 8)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(8, 50)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 50, size=(3, 13)))
    mask = jnp.asarray(rng.integers(0, 2, size=(3, 13)), jnp.float32)

    def loss(h, w, chunked):
        head = lambda x: x @ w  # the closed-over weight must get its gradient through the chunks
        lp = (
            losses.chunked_token_logprobs(h, targets, head, chunk)
            if chunked
            else losses.token_logprobs(head(h), targets)
        )
        return jnp.sum(lp * mask), lp

    (want, lp_want), g_want = jax.value_and_grad(
        functools.partial(loss, chunked=False), (0, 1), has_aux=True
    )(hidden, weight)
    (got, lp_got), g_got = jax.jit(
        jax.value_and_grad(functools.partial(loss, chunked=True), (0, 1), has_aux=True)
    )(hidden, weight)
    np.testing.assert_allclose(lp_got, lp_want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for a, b in zip(g_got, g_want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_chunked_token_logprobs_hold_one_chunk_of_logits():
    # The compiled gradient's temporaries shrink with the chunk: [B, L, V] logits are never held.
    hidden = jax.ShapeDtypeStruct((4, 1024, 16), jnp.float32)
    targets = jax.ShapeDtypeStruct((4, 1024), jnp.int32)
    weight = jax.ShapeDtypeStruct((16, 4096), jnp.float32)

    def temps(chunk):
        fn = lambda h, w, t: jnp.sum(losses.chunked_token_logprobs(h, t, lambda x: x @ w, chunk))
        compiled = jax.jit(jax.grad(fn, (0, 1))).lower(hidden, weight, targets).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    logits_bytes = 4 * 1024 * 4096 * 4  # one float32 [B, L, V]
    assert temps(0) >= logits_bytes
    assert temps(128) < logits_bytes / 2


def test_grpo_advantages_hand_computed_with_zero_variance_group():
    rewards = jnp.array(
        [
            [1.0, 0.0, 1.0, 0.0],  # mean 1/2, std 1/2 -> +-1
            [0.5, 0.5, 0.5, 0.5],  # zero variance -> all 0
            [1.0, 0.0, 0.0, 0.0],
        ]
    )  # mean 1/4, var 3/16, std sqrt(3)/4
    adv = losses.grpo_advantages(rewards, eps=0.0)
    s3 = math.sqrt(3.0)
    # Group 2: (3/4) / (sqrt3/4) = sqrt3; (-1/4) / (sqrt3/4) = -1/sqrt3.
    expected = [[1, -1, 1, -1], [0, 0, 0, 0], [s3, -1 / s3, -1 / s3, -1 / s3]]
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    # The zero-variance group stays exactly 0 with the default eps (0 / eps), never NaN.
    np.testing.assert_array_equal(losses.grpo_advantages(rewards)[1], np.zeros(4))
    # eps shrinks the scale: 0.5 / (0.5 + 1e-6).
    np.testing.assert_allclose(
        losses.grpo_advantages(rewards, eps=1e-6)[0, 0], 0.5 / 0.500001, rtol=1e-7
    )
    np.testing.assert_array_equal(losses.zero_variance_groups(rewards), [False, True, False])


def test_grpo_advantages_use_population_std():
    # Sample std of [1, 0] is 1/sqrt2 (advantage +-0.707); population std 1/2 gives +-1.
    np.testing.assert_allclose(
        losses.grpo_advantages(jnp.array([[1.0, 0.0]]), eps=0.0), [[1.0, -1.0]]
    )
    # N = 1 is defined: one rollout has zero variance.
    np.testing.assert_array_equal(losses.grpo_advantages(jnp.array([[0.7]])), [[0.0]])


def _on_policy_batch():
    # old = logprobs, so rho = 1 and each valid token's loss is -A.
    # Row 0: A = 1, two valid tokens; row 1: A = -3, one valid token.
    logprobs = jnp.log(jnp.array([[0.5, 0.25, 0.125], [0.5, 0.5, 0.5]]))
    advantages = jnp.array([1.0, -3.0])
    mask = jnp.array([[1, 1, 0], [1, 0, 0]])
    return logprobs, advantages, mask


@pytest.mark.parametrize(
    "aggregation, expected",
    [
        ("seq_mean_token_mean", 1.0),  # row means -1 and 3 -> (-1 + 3) / 2
        ("token_mean", 1.0 / 3.0),  # (-1 - 1 + 3) / 3 tokens
        ("seq_mean_token_sum_norm", 1 / 6),  # (-1 - 1 + 3) / (B=2 x T=3)
    ],
)
def test_grpo_loss_aggregations(aggregation, expected):
    logprobs, advantages, mask = _on_policy_batch()
    loss, metrics = losses.grpo_loss(logprobs, logprobs, advantages, mask, aggregation=aggregation)
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert metrics["ratio_mean"] == 1.0
    assert metrics["clip_frac_low"] == 0.0 and metrics["clip_frac_high"] == 0.0


def test_grpo_loss_padding_row():
    logprobs, advantages, mask = _on_policy_batch()
    # A third, fully masked row (A = 5) is not a sequence: the GRPO seq mean stays (-1 + 3) / 2,
    # while Dr. GRPO's constant normaliser grows to B=3 x T=3: (-1 - 1 + 3) / 9.
    logprobs = jnp.concatenate([logprobs, logprobs[:1]])
    advantages = jnp.append(advantages, 5.0)
    mask = jnp.concatenate([mask, jnp.zeros((1, 3), mask.dtype)])
    seq, _ = losses.grpo_loss(logprobs, logprobs, advantages, mask)
    norm, _ = losses.grpo_loss(
        logprobs, logprobs, advantages, mask, aggregation="seq_mean_token_sum_norm"
    )
    np.testing.assert_allclose([seq, norm], [1.0, 1 / 9], rtol=1e-6)


def _clip_batch():
    # Five one-token rows with ratios rho = exp(lp - old) and advantages A.
    ratios = jnp.array([1.5, 0.5, 0.5, 1.5, 1.25])
    advantages = jnp.array([1.0, -1.0, 1.0, -1.0, 1.0])
    old = jnp.full((5, 1), math.log(0.5))
    logprobs = old + jnp.log(ratios)[:, None]
    return logprobs, old, advantages, jnp.ones((5, 1))


def test_grpo_loss_clips_both_sides_asymmetric():
    logprobs, old, advantages, mask = _clip_batch()
    kwargs = dict(clip_eps=0.2, clip_eps_high=0.28, aggregation="token_mean")
    loss_fn = lambda lp: losses.grpo_loss(lp, old, advantages, mask, **kwargs)
    (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(logprobs)
    # Per row, -min(rho A, clip(rho, 0.8, 1.28) A):
    #   rho 1.5,  A +1: -min(1.5, 1.28)   = -1.28  clipped high, no gradient
    #   rho 0.5,  A -1: -min(-0.5, -0.8)  =  0.8   clipped low, no gradient
    #   rho 0.5,  A +1: -min(0.5, 0.8)    = -0.5   unclipped
    #   rho 1.5,  A -1: -min(-1.5, -1.28) =  1.5   unclipped
    #   rho 1.25, A +1: -min(1.25, 1.25)  = -1.25  inside 1 + 0.28
    # mean = (-1.28 + 0.8 - 0.5 + 1.5 - 1.25) / 5 = -0.73 / 5
    np.testing.assert_allclose(loss, -0.146, rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_frac_low"], 0.2)
    np.testing.assert_allclose(metrics["clip_frac_high"], 0.2)
    np.testing.assert_allclose(metrics["ratio_mean"], 5.25 / 5, rtol=1e-6)
    np.testing.assert_allclose([metrics["ratio_min"], metrics["ratio_max"]], [0.5, 1.5], rtol=1e-6)
    # d(-rho A)/d lp = -rho A / 5 where unclipped, 0 where clipped.
    np.testing.assert_allclose(grad[:, 0], [0.0, 0.0, -0.1, 0.3, -0.25], rtol=1e-5, atol=1e-7)


def test_grpo_loss_symmetric_clip_default():
    logprobs, old, advantages, mask = _clip_batch()
    loss, metrics = losses.grpo_loss(logprobs, old, advantages, mask, aggregation="token_mean")
    # clip_eps_high defaults to 0.2: row 5 now clips at 1.2.
    # (-1.2 + 0.8 - 0.5 + 1.5 - 1.2) / 5 = -0.6 / 5
    np.testing.assert_allclose(loss, -0.12, rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_frac_high"], 0.4)


def test_k3_kl_hand_computed():
    # One row, two tokens, on policy with A = 0, so the loss is kl_beta x the KL term.
    # Token 1: lp = ln 1/2, ref = ln 1/4, d = -ln 2: e^d - d - 1 = 1/2 + ln2 - 1 = ln2 - 1/2
    # Token 2: lp = ln 1/4, ref = ln 1/2, d = +ln 2: 2 - ln2 - 1 = 1 - ln2
    # mean = (ln2 - 1/2 + 1 - ln2) / 2 = 1/4
    logprobs = jnp.log(jnp.array([[0.5, 0.25]]))
    ref = jnp.log(jnp.array([[0.25, 0.5]]))
    np.testing.assert_allclose(losses.k3_kl(logprobs, ref), [[LN2 - 0.5, 1 - LN2]], rtol=1e-6)
    loss, metrics = losses.grpo_loss(
        logprobs, logprobs, jnp.zeros(1), jnp.ones((1, 2)), kl_beta=0.1, ref_logprobs=ref
    )
    np.testing.assert_allclose(metrics["kl"], 0.25, rtol=1e-6)
    np.testing.assert_allclose(loss, 0.025, rtol=1e-6)
    # KL is reported without entering the loss when kl_beta = 0; it is 0 when ref = logprobs.
    loss, metrics = losses.grpo_loss(
        logprobs, logprobs, jnp.zeros(1), jnp.ones((1, 2)), ref_logprobs=ref
    )
    assert loss == 0.0 and "kl" in metrics
    np.testing.assert_array_equal(losses.k3_kl(logprobs, logprobs), [[0.0, 0.0]])


def test_grpo_loss_under_jit():
    logprobs, advantages, mask = _on_policy_batch()
    loss_fn = jax.jit(functools.partial(losses.grpo_loss, aggregation="token_mean"))
    np.testing.assert_allclose(loss_fn(logprobs, logprobs, advantages, mask)[0], 1 / 3, rtol=1e-6)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(aggregation="sequence_mean"), "Unknown aggregation"),
        (dict(advantages=jnp.ones((2, 1))), "advantages"),
        (dict(mask=jnp.ones((2, 2))), "mask"),
        (dict(old_logprobs=jnp.zeros((3, 3))), "old_logprobs"),
        (dict(ref_logprobs=jnp.zeros((2,))), "ref_logprobs"),
        (dict(kl_beta=0.1), "ref_logprobs"),
        (dict(clip_eps=-0.1), "clip_eps"),
    ],
)
def test_grpo_loss_errors(change, message):
    logprobs, advantages, mask = _on_policy_batch()
    kwargs = dict(logprobs=logprobs, old_logprobs=logprobs, advantages=advantages, mask=mask)
    kwargs.update(change)
    with pytest.raises(ValueError, match=message):
        losses.grpo_loss(**kwargs)
