"""Sampler: greedy parity with transformers' generate, logprobs against a full forward, shared
prefill / shared prefix, sampling statistics, bucketing and errors (tiny random model, CPU)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hf_reference import image_prompt, left_pad, random_hf_model

from mocojax import hf, model, sampling, sampling_core
from mocojax.model import qwen3_vl, text as text_model

TOL = 1e-4
CFG = model.tiny(num_heads=4, num_kv_heads=2)
SPECIAL = (
    CFG.image_token_id,
    CFG.video_token_id,
    CFG.vision_start_token_id,
    CFG.vision_end_token_id,
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(HF model, our params loaded from its save_pretrained directory)."""
    ref = random_hf_model(CFG, seed=7)
    path = tmp_path_factory.mktemp("hf")
    ref.save_pretrained(path)
    cfg, params = hf.load_pretrained(path, dtype=jnp.float32)
    assert cfg == CFG
    return ref, params


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _prompts(case: str):
    """Returns (ids [B, L], mask [B, L], pixels or None, grid or None) of a named test prompt."""
    rng = np.random.default_rng(11)
    if case == "text":
        ids = rng.integers(0, 240, (1, 9))
        return ids, np.ones_like(ids), None, None
    if case in ("one_image", "two_images"):
        grids = [(1, 4, 6)] if case == "one_image" else [(1, 4, 6), (1, 8, 2)]
        ids, pixels, grid = image_prompt(CFG, grids, rng)
        return ids[None], np.ones((1, len(ids)), np.int64), pixels, grid
    img_ids, pixels, grid = image_prompt(CFG, [(1, 4, 4)], rng, text_len=2)
    ids, mask = left_pad([rng.integers(0, 240, 7), img_ids])
    return ids, mask, pixels, grid


@pytest.mark.parametrize("case", ["text", "one_image", "two_images", "left_padded_batch"])
def test_greedy_matches_transformers_generate(pair, case):
    ref, params = pair
    ids, mask, pixels, grid = _prompts(case)
    inputs = dict(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
    if pixels is not None:
        inputs.update(
            pixel_values=torch.as_tensor(pixels),
            image_grid_thw=torch.as_tensor(grid),
            mm_token_type_ids=torch.as_tensor((ids == CFG.image_token_id).astype(np.int64)),
        )
    with torch.no_grad():
        expected = ref.generate(
            **inputs,
            do_sample=False,
            max_new_tokens=32,
            min_new_tokens=32,
            eos_token_id=None,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    expected_tokens = expected.sequences[:, ids.shape[1] :].numpy()
    expected_logp = _log_softmax(torch.stack(expected.logits, 1).numpy())
    expected_logp = np.take_along_axis(expected_logp, expected_tokens[..., None], -1)[..., 0]

    out = sampling.generate(CFG, params, ids, mask, pixels, grid, max_new_tokens=32)
    np.testing.assert_array_equal(np.asarray(out.tokens), expected_tokens)
    np.testing.assert_allclose(np.asarray(out.logprobs), expected_logp, atol=TOL, rtol=0)
    np.testing.assert_array_equal(np.asarray(out.lengths), 32)


@pytest.mark.parametrize("shared", [False, True], ids=["copied", "shared_prompt_cache"])
def test_sampled_logprobs_equal_full_forward_and_scorer(pair, shared):
    """Sampled rows (several EOS ids, some rows end early) against log_softmax(forward(prompt + tokens)),
    with each prompt's cache copied to its N rows and kept once (cfg.shared_prompt_cache)."""
    _, params = pair
    ids, mask, pixels, grid = _prompts("left_padded_batch")
    n, steps = 3, 24
    eos = SPECIAL + tuple(range(8))
    cfg_sampler = CFG.replace(shared_prompt_cache=shared)
    out = sampling.generate(
        cfg_sampler,
        params,
        ids,
        mask,
        pixels,
        grid,
        max_new_tokens=steps,
        num_samples=n,
        temperature=1.0,
        eos_token_ids=eos,
        rng=jax.random.key(3),
    )
    tokens, logprobs, lengths = (np.asarray(x) for x in (out.tokens, out.logprobs, out.lengths))
    done = np.asarray(out.mask)
    assert (
        0 < lengths.min() < steps == lengths.max()
    )  # some rows stopped early, some ran to the end
    for r, length in enumerate(lengths):
        assert length == steps or tokens[r, length - 1] in eos
        assert not np.isin(tokens[r, : length - 1], eos).any()
    assert (tokens[~done] == 0).all() and (logprobs[~done] == 0).all()

    # A special id can only be a row's last token (an EOS): it predicts nothing, so it can be replaced.
    full_ids = np.concatenate(
        [np.repeat(ids, n, 0), np.where(np.isin(tokens, SPECIAL), 0, tokens)], 1
    )
    full_mask = np.concatenate([np.repeat(mask, n, 0), done], 1)
    logits = model.forward(
        CFG, params, full_ids, full_mask, np.tile(pixels, (n, 1)), np.tile(grid, (n, 1))
    )
    logp = _log_softmax(np.asarray(logits)[:, ids.shape[1] - 1 : -1])
    expected = np.where(done, np.take_along_axis(logp, tokens[..., None], -1)[..., 0], 0.0)
    np.testing.assert_allclose(logprobs, expected, atol=TOL, rtol=0)

    # The scorer, whole and with its log-softmax in chunks of 5 positions (24 = 4 x 5 + 4).
    for cfg in (cfg_sampler, cfg_sampler.replace(logits_chunk=5)):
        scored = sampling.sequence_logprobs(
            cfg,
            params,
            ids,
            mask,
            pixels,
            grid,
            completion=tokens,
            completion_mask=done,
            num_samples=n,
        )
        np.testing.assert_allclose(np.asarray(scored), expected, atol=TOL, rtol=0)


def test_shared_prefill_encodes_each_prompt_once(pair, monkeypatch):
    """N samples of B prompts prefill B rows once and equal N-fold repeated prompts, same rng."""
    _, params = pair
    ids, mask, pixels, grid = _prompts("left_padded_batch")
    n = 4
    encoded_rows = []
    prefill_jit = sampling.prefill_jit

    def spy(cfg, params, prompt, **kw):
        encoded_rows.append(prompt.input_ids.shape[0])
        return prefill_jit(cfg, params, prompt, **kw)

    monkeypatch.setattr(sampling, "prefill_jit", spy)
    kw = dict(max_new_tokens=16, temperature=1.0, top_k=50, rng=jax.random.key(5))
    shared = sampling.generate(CFG, params, ids, mask, pixels, grid, num_samples=n, **kw)
    assert encoded_rows == [2]
    repeated = sampling.generate(
        CFG,
        params,
        np.repeat(ids, n, 0),
        np.repeat(mask, n, 0),
        np.tile(pixels, (n, 1)),
        np.tile(grid, (n, 1)),
        num_samples=1,
        **kw,
    )
    assert encoded_rows == [2, 2 * n]
    np.testing.assert_array_equal(np.asarray(shared.tokens), np.asarray(repeated.tokens))
    np.testing.assert_allclose(
        np.asarray(shared.logprobs), np.asarray(repeated.logprobs), atol=1e-5
    )
    assert len({tuple(row) for row in np.asarray(shared.tokens)}) == 2 * n  # the samples differ


def _random_continuations(rng, lengths):
    """Returns (token lists, right-padded ids [R, max], mask) of random continuations."""
    continuations = [rng.integers(0, 240, k) for k in lengths]
    ids = np.zeros((len(lengths), max(lengths)), np.int64)
    mask = np.zeros_like(ids)
    for r, c in enumerate(continuations):
        ids[r, : len(c)], mask[r, : len(c)] = c, 1
    return continuations, ids, mask


@pytest.mark.parametrize("shared", [False, True], ids=["copied", "shared_prompt_cache"])
def test_shared_prefix_continuations_match_full_prompts(pair, shared):
    """Prefix (image + rubric) once per group + N captions == generating from each full prompt
    (the prefix's cache copied to the N rows, or kept once: cfg.shared_prompt_cache)."""
    _, params = pair
    rng = np.random.default_rng(13)
    prefix_ids, pixels, grid = image_prompt(CFG, [(1, 4, 4)], rng, text_len=3)
    prefixes = [prefix_ids, rng.integers(0, 240, 6)]
    ids, mask = left_pad(prefixes)
    n = 2
    continuations, cont_ids, cont_mask = _random_continuations(rng, [3, 5, 1, 4])
    out = sampling.generate_with_shared_prefix(
        CFG.replace(shared_prompt_cache=shared),
        params,
        ids,
        mask,
        pixels,
        grid,
        continuations=cont_ids,
        continuation_mask=cont_mask,
        max_new_tokens=16,
        num_samples=n,
    )
    full_ids, full_mask = left_pad(
        [np.concatenate([prefixes[r // n], c]) for r, c in enumerate(continuations)]
    )
    expected = sampling.generate(
        CFG,
        params,
        full_ids,
        full_mask,
        np.tile(pixels, (n, 1)),
        np.tile(grid, (n, 1)),
        max_new_tokens=16,
    )
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(expected.tokens))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(expected.logprobs), atol=TOL)


def test_prefix_index_rows_match_full_prompts(pair):
    """Text prefixes shared by uneven numbers of rows (3, 1, 2; rows out of order) == generating
    from each full prompt; bad indices and empty continuations are refused."""
    _, params = pair
    rng = np.random.default_rng(17)
    prefixes = [rng.integers(0, 240, k) for k in (7, 4, 9)]
    ids, mask = left_pad(prefixes)
    index = np.array([0, 2, 0, 1, 2, 0])
    continuations, cont_ids, cont_mask = _random_continuations(rng, [3, 5, 1, 4, 2, 6])
    out = sampling.generate_with_prefix_index(
        CFG,
        params,
        ids,
        mask,
        prefix_index=index,
        continuations=cont_ids,
        continuation_mask=cont_mask,
        max_new_tokens=12,
    )
    full_ids, full_mask = left_pad(
        [np.concatenate([prefixes[b], c]) for b, c in zip(index, continuations)]
    )
    expected = sampling.generate(CFG, params, full_ids, full_mask, max_new_tokens=12)
    assert out.tokens.shape == expected.tokens.shape
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(expected.tokens))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(expected.logprobs), atol=TOL)
    call = functools.partial(sampling.generate_with_prefix_index, CFG, params, ids, mask)
    with pytest.raises(ValueError, match="prefix_index must name"):
        call(
            prefix_index=index + 1,
            continuations=cont_ids,
            continuation_mask=cont_mask,
            max_new_tokens=4,
        )
    empty = cont_mask.copy()
    empty[1] = 0
    with pytest.raises(ValueError, match="at least one token"):
        call(prefix_index=index, continuations=cont_ids, continuation_mask=empty, max_new_tokens=4)


def _reference_distribution(logits, temperature, top_k, top_p):
    """Returns the probabilities [V] that temperature, top-k, then top-p leave (float64, by loops)."""
    p = np.exp(np.asarray(logits, np.float64) / temperature)
    p /= p.sum()
    order = np.argsort(-p)
    kept = order[:top_k] if top_k else order
    if top_p < 1.0:
        q, mass, nucleus = p[kept] / p[kept].sum(), 0.0, []
        for token, prob in zip(kept, q):
            if mass >= top_p:
                break
            nucleus.append(token)
            mass += prob
        kept = np.array(nucleus)
    out = np.zeros_like(p)
    out[kept] = p[kept] / p[kept].sum()
    return out


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.6), (1.5, 5, 0.7)],
)
def test_sampling_statistics(temperature, top_k, top_p):
    """Empirical frequencies of 40k draws match the filtered softmax within 5 standard errors."""
    logits = np.log(np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02], np.float32))
    draws = 40_000
    sampler = sampling.Sampler(max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p)
    keys = jax.random.split(jax.random.key(0), draws)
    tokens = np.asarray(
        jax.jit(sampling.choose_tokens, static_argnums=2)(
            jnp.broadcast_to(logits, (draws, logits.size)), keys, sampler
        )
    )
    expected = _reference_distribution(logits, temperature, top_k, top_p)
    freq = np.bincount(tokens, minlength=logits.size) / draws
    assert (freq[expected == 0] == 0).all()
    sigma = np.sqrt(expected * (1 - expected) / draws)
    assert (np.abs(freq - expected) <= 5 * sigma + 1e-12).all(), (freq, expected)


def test_deterministic_for_an_rng_and_all_eos_stops_at_once(pair):
    _, params = pair
    ids, mask, _, _ = _prompts("text")
    kw = dict(max_new_tokens=16, num_samples=3, temperature=1.0, top_p=0.9)
    a = sampling.generate(CFG, params, ids, mask, rng=jax.random.key(1), **kw)
    b = sampling.generate(CFG, params, ids, mask, rng=jax.random.key(1), **kw)
    c = sampling.generate(CFG, params, ids, mask, rng=jax.random.key(2), **kw)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.logprobs), np.asarray(b.logprobs))
    assert (np.asarray(a.tokens) != np.asarray(c.tokens)).any()
    every = sampling.generate(
        CFG,
        params,
        ids,
        mask,
        eos_token_ids=range(CFG.text.vocab_size),
        pad_id=-1,
        rng=jax.random.key(1),
        **kw,
    )
    np.testing.assert_array_equal(np.asarray(every.lengths), 1)
    assert (np.asarray(every.tokens)[:, 1:] == -1).all() and (
        np.asarray(every.logprobs)[:, 1:] == 0
    ).all()


def test_decode_writes_the_cache_in_place(pair):
    """The compiled decode loop holds no copy, fill or concatenation of the whole KV cache: each
    step writes its token's k/v in place (passing the cache through the layer scan's inputs and
    outputs made XLA copy all of it at every decoded token, docs/performance.md)."""
    _, params = pair
    ids, mask, _, _ = _prompts("text")
    prefix = sampling.prefill(CFG, params, ids, mask, reserve=37)
    sampler, rng = sampling._sampler(5, 0.0, 0, 1.0, (), 0, None)
    hlo = (
        sampling.decode_jit.lower(
            CFG, prefix.cache, params, dataclasses.replace(prefix, cache=None), rng, sampler=sampler
        )
        .compile()
        .as_text()
    )
    whole = "f32[" + ",".join(map(str, prefix.cache["k"].shape)) + "]"
    assert f"= {whole}" in hlo  # the cache is in the program (as the loop's state)
    ops = (" copy(", " broadcast(", " concatenate(")
    copies = [
        line for line in hlo.splitlines() if f"= {whole}" in line and any(o in line for o in ops)
    ]
    assert copies == []


def test_shared_prompt_attention_equals_attention_over_the_repeated_cache():
    """Grouped-query attention over a prompt cache kept once per group of N rows, then each row's
    own slots, against jax.nn.dot_product_attention over the prompt cache repeated N times and
    joined to the rows' slots (left-padded prompts, masked own slots, 2 query heads per kv head)."""
    rng = np.random.default_rng(5)
    prompts, n, t, heads, kv_heads, h, length, own = 2, 3, 2, 4, 2, 8, 7, 5
    rows = prompts * n
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    q, k, v = (
        normal(rows, t, heads, h),
        normal(rows, own, kv_heads, h),
        normal(rows, own, kv_heads, h),
    )
    pk, pv = normal(prompts, length, kv_heads, h), normal(prompts, length, kv_heads, h)
    prompt_valid = jnp.asarray(np.arange(length)[None] >= np.array([[0], [3]]))  # left padding
    own_valid = jnp.asarray(rng.random((rows, own)) < 0.7).at[:, 3:].set(True)
    mask = qwen3_vl.attention_mask_4d(own_valid, t, 3)  # queries at own slots 3, 4
    got = text_model.shared_prompt_attention(q, k, v, mask, pk, pv, prompt_valid, 0.3)

    repeat = lambda x: jnp.repeat(x, n, axis=0)
    full_mask = jnp.concatenate(
        [jnp.broadcast_to(repeat(prompt_valid)[:, None, None, :], (rows, 1, t, length)), mask], -1
    )
    expected = jax.nn.dot_product_attention(
        q,
        jnp.concatenate([repeat(pk), k], 1),
        jnp.concatenate([repeat(pv), v], 1),
        mask=full_mask,
        scale=0.3,
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-6, rtol=1e-6)


def test_shared_prompt_cache_holds_each_prompt_once_and_decodes_the_same(pair):
    """cfg.shared_prompt_cache: the prefill keeps B prompts' cache once ([layers, B, L, ...]) and
    each of the B*N rows only its reserved slots; repeated into the rows (unshare_prefix) it is the
    copied layout's cache, and sampling from it draws the same tokens for the same key."""
    _, params = pair
    ids, mask, pixels, grid = _prompts("left_padded_batch")
    n, reserve = 4, 12
    shared_cfg = CFG.replace(shared_prompt_cache=True)
    copied = sampling.prefill(CFG, params, ids, mask, pixels, grid, reserve=reserve, num_samples=n)
    shared = sampling.prefill(
        shared_cfg, params, ids, mask, pixels, grid, reserve=reserve, num_samples=n
    )
    layers, rows, slots = copied.cache["k"].shape[:3]
    length = slots - reserve
    assert shared.cache["k"].shape[:3] == (layers, rows, reserve) and shared.next_slot == 0
    assert shared.shared_cache["k"].shape[:3] == (layers, rows // n, length)
    unshared = sampling_core.unshare_prefix(shared_cfg, shared)
    assert unshared.next_slot == copied.next_slot == length
    np.testing.assert_array_equal(np.asarray(unshared.key_valid), np.asarray(copied.key_valid))
    valid = np.asarray(copied.key_valid)  # a padding slot's k/v is never read: not compared
    for name in "kv":
        np.testing.assert_allclose(
            np.asarray(unshared.cache[name])[:, valid],
            np.asarray(copied.cache[name])[:, valid],
            atol=1e-5,
        )
    kwargs = dict(max_new_tokens=reserve, temperature=1.0, rng=jax.random.key(9))
    a = sampling.decode(CFG, params, copied, **kwargs)
    b = sampling.decode(shared_cfg, params, shared, **kwargs)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=TOL)


def test_scoring_gradient_with_a_shared_prompt_cache():
    """The RL update's scorer (prefill + extend, differentiated) with the prompt's cache kept once:
    the same logprobs and gradient as with the cache copied to each of the N completions."""
    cfg = model.tiny(num_layers=3, num_heads=4, num_kv_heads=2)
    params = model.init_params(cfg, 0)
    rng = np.random.default_rng(4)
    ids, mask = left_pad([rng.integers(0, 240, 12), rng.integers(0, 240, 9)])
    prompt = sampling.prepare_prompt(cfg, ids, mask, reserve=8)
    completion = jnp.asarray(rng.integers(0, 240, (6, 8)), jnp.int32)
    completion_mask = jnp.asarray(np.arange(8)[None] < rng.integers(1, 9, (6, 1)))

    def score(c, p):
        return sampling.completion_logprobs(
            c, p, prompt, completion, completion_mask, num_samples=3
        )

    results = [
        jax.value_and_grad(lambda p, c=c: score(c, p).sum())(params)
        for c in (cfg, cfg.replace(shared_prompt_cache=True))
    ]
    (value_a, grad_a), (value_b, grad_b) = results
    np.testing.assert_allclose(float(value_a), float(value_b), rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(score(cfg, params)),
        np.asarray(score(cfg.replace(shared_prompt_cache=True), params)),
        atol=1e-6,
    )
    for a, b in zip(jax.tree.leaves(grad_a), jax.tree.leaves(grad_b)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


def test_scoring_gradient_with_remat_saves_no_whole_cache_per_layer():
    """The RL update differentiates the scorer (prefill + extend) with remat at scale: each layer
    must see its own cache slice, not carry every layer's cache, which remat would save whole at
    every layer (a [layers, layers, ...] buffer; 3.4x the temporary memory on 12 layers)."""
    cfg = dataclasses.replace(model.tiny(num_layers=5, deepstack=()), remat=True)
    params = model.init_params(cfg, 0)
    rng = np.random.default_rng(3)
    prompt = sampling.prepare_prompt(cfg, rng.integers(0, 240, (2, 12)), None, reserve=8)
    completion = jnp.asarray(rng.integers(0, 240, (4, 8)), jnp.int32)

    def loss(p):
        return sampling.completion_logprobs(
            cfg, p, prompt, completion, jnp.ones((4, 8), bool), num_samples=2
        ).sum()

    hlo = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
    layers = cfg.text.num_hidden_layers
    assert f"f32[{layers},2," in hlo or f"f32[{layers},4," in hlo  # per-layer stacks exist
    assert f"f32[{layers},{layers}," not in hlo


def test_prompt_buckets_bound_the_compiled_programs(pair):
    """Prompts of 9..16 tokens share one bucket: after the first call nothing recompiles."""
    _, params = pair
    rng = np.random.default_rng(17)
    sampling.generate(CFG, params, rng.integers(0, 240, (2, 9)), None, max_new_tokens=8)
    before = sampling.program_counts()
    for width in (10, 13, 16):
        ids, mask = left_pad([rng.integers(0, 240, width), rng.integers(0, 240, width - 3)])
        sampling.generate(CFG, params, ids, mask, max_new_tokens=8)
    assert sampling.program_counts() == before
    assert (
        sampling.bucket(9) == 16
        and sampling.bucket(70, minimum=64) == 128
        and sampling.bucket(1024) == 1024
    )
    # Above 1024, four sizes per octave (by hand: steps of 2048 / 8 = 256, 4096 / 8 = 512, 8192 / 8 = 1024).
    longer = [1025, 1090, 1280, 1281, 1500, 2048, 2049, 3000, 4097]
    assert [sampling.bucket(n) for n in longer] == [
        1280,
        1280,
        1280,
        1536,
        1536,
        2048,
        2560,
        3072,
        5120,
    ]


def test_clear_errors(pair):
    _, params = pair
    ids = np.ones((1, 9), np.int64)
    limit = CFG.text.max_position_embeddings
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        sampling.generate(CFG, params, ids, None, max_new_tokens=limit - 8)
    with pytest.raises(ValueError, match="left-padded"):
        sampling.generate(CFG, params, ids, np.array([[1] * 8 + [0]]), max_new_tokens=4)
    with pytest.raises(ValueError, match="needs an rng"):
        sampling.generate(CFG, params, ids, None, max_new_tokens=4, temperature=1.0)
    prefix = sampling.prefill(CFG, params, ids, None, reserve=4)
    with pytest.raises(ValueError, match="free slots"):
        sampling.decode(CFG, params, prefix, max_new_tokens=5)
