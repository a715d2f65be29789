"""Sampling from Qwen3-VL: a bucketed prefill, a KV cache shared by each group's samples, a
jitted `lax.while_loop` decoder, and the scorer that RL uses for old/ref/new logprobs.

Three jitted programs do everything, each compiled once per bucketed shape:
* prefill: runs the model once on B left-padded prompts (images included), fills a KV cache of
  prompt + `reserve` slots and repeats it N times, so sample j of prompt b (row b*N+j) starts
  from its prompt's cache without re-encoding it;
* extend: appends right-padded continuations [B*N, C] to such a cache (the Judge's captions
  after a shared rubric prefix) and, when scoring, returns their token logprobs; a small gather
  program first copies each prefix's cache to its rows when prefixes are shared by uneven
  numbers of rows (`generate_with_prefix_index`: the per-item Judge's items of one caption);
* decode: samples up to T tokens per row in one `lax.while_loop` over a donated state and stops
  as soon as every row has emitted an EOS id.

Sharded params (a NamedSharding over several devices, e.g. a trainer's FSDP state) put the
sampler on their mesh: prompts, continuations and keys become global arrays with rows over the
data axes, so every jitted program runs on the whole mesh, and on every process of a
multi-host run (each must call with the same inputs; read the outputs with
`distributed.fetch`). generate, generate_with_shared_prefix and sequence_logprobs add filler
rows up to a multiple of the data-parallel size and drop them from the result.

Logprobs are always under the model's unscaled softmax, log_softmax(logits) at temperature 1,
whatever temperature / top-k / top-p drew the token: that is the probability GRPO's importance
ratio and KL need. Slots after a row's end hold `pad_id` and logprob 0; `lengths` counts the
generated tokens including the EOS.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from mocojax import distributed, model, sharding
from mocojax.model import ModelConfig

# Split out (move only, #14); re-exported so `sampling.<name>` keeps working.
from mocojax.sampling_core import (  # noqa: F401
    Prefix,
    Prompt,
    SampleOutput,
    Sampler,
    _constrain_cache,
    choose_tokens,
    completion_logprobs,
    decode_core,
    extend_core,
    filter_logits,
    gather_prefix_core,
    prefill_core,
)


def bucket(n: int, minimum: int = 16) -> int:
    """Returns the padded size of n: a power of two >= minimum up to 1024, then four sizes per octave.

    Above 1024 the step is an eighth of the next power of two (256 up to 2048, 512 up to 4096, ...),
    so a long prompt pads by at most a quarter of its length (1090 -> 1280, not 2048) while the
    number of compiled shapes still grows only with the logarithm of the longest prompt.
    """
    if n <= 1024:
        return max(minimum, 1 << max(n - 1, 0).bit_length())
    step = (1 << (n - 1).bit_length()) // 8
    return -(-n // step) * step


# ----------------------------------------------------------------------------- host preparation
def prepare_prompt(
    cfg: ModelConfig,
    input_ids,
    attention_mask=None,
    pixel_values=None,
    image_grid_thw=None,
    *,
    reserve: int,
) -> Prompt:
    """Returns the bucketed Prompt of a left-padded batch; raises ValueError on bad or too long input."""
    ids, mask = model.check_ids_and_mask(input_ids, attention_mask)
    if (np.diff(mask.astype(np.int8), axis=1) < 0).any() or not mask[:, -1].all():
        raise ValueError(
            "prompts must be left-padded: attention_mask must be 0...0 1...1 on every row"
        )
    if (pixel_values is None) != (image_grid_thw is None):
        raise ValueError("pixel_values and image_grid_thw must be given together")
    longest = int(mask.sum(1).max())
    limit = cfg.text.max_position_embeddings
    if longest + reserve > limit:
        raise ValueError(
            f"prompt of {longest} tokens + {reserve} new tokens exceeds max_position_embeddings={limit}"
        )
    width = max(longest, min(bucket(longest), limit - reserve))
    ids, mask = ids[:, -longest:], mask[:, -longest:]
    ids = np.pad(ids, ((0, 0), (width - longest, 0))).astype(np.int32)
    mask = np.pad(mask, ((0, 0), (width - longest, 0))).astype(np.int32)
    pad_patches = None
    if pixel_values is not None:
        pixel_values = np.asarray(pixel_values, jnp.dtype(cfg.dtype))
        pad_patches = bucket(pixel_values.shape[0], minimum=64)
        pixel_values = np.pad(pixel_values, ((0, pad_patches - pixel_values.shape[0]), (0, 0)))
    inputs = model.prepare_inputs(cfg, ids, mask, image_grid_thw, pad_patches_to=pad_patches)
    next_position = (mask.sum(1) + inputs.rope_deltas).astype(np.int32)
    return Prompt(
        ids, mask, inputs.positions.astype(np.int32), next_position, pixel_values, inputs.vision
    )


# The jitted programs `prefill` / `extend` / `decode` / `sequence_logprobs` run (the memory plan
# lowers prefill_jit and decode_jit ahead of time).
prefill_jit = jax.jit(prefill_core, static_argnames=("cfg", "reserve", "num_samples"))
_extend_jit = jax.jit(
    extend_core, static_argnames=("cfg", "with_logprobs"), donate_argnames=("prefix",)
)


def _decode_in_place(cfg, cache, params, prefix, rng, sampler):
    # The cache goes in as its own argument so that donating it lets the loop write it in place.
    return decode_core(cfg, params, dataclasses.replace(prefix, cache=cache), rng, sampler=sampler)


decode_jit = jax.jit(
    _decode_in_place, static_argnames=("cfg", "sampler"), donate_argnames=("cache",)
)
_score_jit = jax.jit(completion_logprobs, static_argnames=("cfg", "num_samples"))
_gather_jit = jax.jit(gather_prefix_core, static_argnames=("cfg",))


def program_counts() -> dict[str, int]:
    """Returns how many programs prefill / extend / decode / score hold compiled in this process."""
    jitted = {
        "prefill": prefill_jit,
        "extend": _extend_jit,
        "decode": decode_jit,
        "score": _score_jit,
        "gather": _gather_jit,
    }
    return {name: fn._cache_size() for name, fn in jitted.items()}


# ----------------------------------------------------------------------------- public API
def _sampler(
    max_new_tokens, temperature, top_k, top_p, eos_token_ids, pad_id, rng
) -> tuple[Sampler, jax.Array]:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise ValueError(
            f"need temperature >= 0, 0 < top_p <= 1, top_k >= 0; got {temperature}, {top_p}, {top_k}"
        )
    if temperature > 0 and rng is None:
        raise ValueError("sampling (temperature > 0) needs an rng")
    rng = jax.random.key(0) if rng is None else jax.random.key(rng) if isinstance(rng, int) else rng
    eos = () if eos_token_ids is None else tuple(int(i) for i in np.atleast_1d(eos_token_ids))
    return Sampler(
        max_new_tokens, float(temperature), int(top_k), float(top_p), eos, int(pad_id)
    ), rng


def _check_room(prefix: Prefix, needed: int) -> None:
    size = prefix.key_valid.shape[1]
    if prefix.next_slot + needed > size:
        raise ValueError(f"the cache has {size - prefix.next_slot} free slots, {needed} are needed")


# ----------------------------------------------------------------------------- mesh placement
def _rows(mesh, x, dim=0):
    """Returns host array x on `mesh` with dim `dim` over the data axes where they divide (as is without a mesh)."""
    x = np.asarray(x)
    if mesh is None:
        return jnp.asarray(x)
    return distributed.global_from_full(
        x, sharding.batch_sharding(mesh, x.shape, dim, strict=False)
    )


def place_prompt(mesh, prompt: Prompt, *, stacked: bool = False) -> Prompt:
    """Returns the Prompt as global arrays on `mesh`: rows over the data axes (replicated where they
    do not divide), image patches and metadata replicated; unchanged when mesh is None.

    stacked: the prompt carries a leading micro-batch axis [A, ...] (the RL update's batch).
    """
    if mesh is None:
        return prompt
    lead = int(stacked)
    whole = lambda tree: jax.tree.map(
        lambda x: distributed.global_from_full(x, sharding.replicated(mesh)), tree
    )
    return dataclasses.replace(
        prompt,
        input_ids=_rows(mesh, prompt.input_ids, lead),
        attention_mask=_rows(mesh, prompt.attention_mask, lead),
        positions=_rows(mesh, prompt.positions, lead + 1),
        next_position=_rows(mesh, prompt.next_position, lead),
        pixel_values=None if prompt.pixel_values is None else whole(prompt.pixel_values),
        vision=None if prompt.vision is None else whole(prompt.vision),
    )


def _place_key(mesh, rng):
    """Returns the key replicated on `mesh` (unless it already lives there)."""
    if mesh is None or (
        isinstance(rng.sharding, jax.sharding.NamedSharding) and rng.sharding.mesh == mesh
    ):
        return rng
    data = distributed.global_from_full(
        np.asarray(jax.random.key_data(rng)), sharding.replicated(mesh)
    )
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(rng))


def _filler_rows(cfg: ModelConfig, input_ids, attention_mask, multiple: int):
    """Returns (ids, mask, extra): left-padded prompts with `extra` one-token text rows appended so
    the row count is a multiple of `multiple` (their outputs are dropped)."""
    ids, mask = model.check_ids_and_mask(input_ids, attention_mask)
    extra = -ids.shape[0] % multiple
    if not extra:
        return ids, mask, 0
    vision_ids = {
        cfg.image_token_id,
        cfg.video_token_id,
        cfg.vision_start_token_id,
        cfg.vision_end_token_id,
    }
    filler = next(t for t in (int(ids[0, -1]), 0, 1, 2) if t not in vision_ids)
    pad_ids = np.zeros((extra, ids.shape[1]), ids.dtype)
    pad_ids[:, -1] = filler
    pad_mask = np.zeros((extra, ids.shape[1]), mask.dtype)
    pad_mask[:, -1] = 1
    return np.concatenate([ids, pad_ids]), np.concatenate([mask, pad_mask]), extra


def _row_multiple(params) -> tuple:
    """Returns (mesh of the params or None, rows a sampler batch should be a multiple of)."""
    mesh = sharding.mesh_of(params)
    return mesh, (1 if mesh is None else sharding.batch_ways(mesh))


def _append_rows(x, extra: int, fill=0):
    """Returns host array x [R, ...] with `extra` rows of `fill` appended."""
    x = np.asarray(x)
    return np.concatenate([x, np.full((extra, *x.shape[1:]), fill, x.dtype)]) if extra else x


def _first_rows(out: SampleOutput, rows: int) -> SampleOutput:
    if out.tokens.shape[0] == rows:
        return out
    return SampleOutput(out.tokens[:rows], out.logprobs[:rows], out.lengths[:rows])


def prefill(
    cfg: ModelConfig,
    params,
    input_ids,
    attention_mask=None,
    pixel_values=None,
    image_grid_thw=None,
    *,
    reserve: int,
    num_samples: int = 1,
) -> Prefix:
    """Returns the Prefix [B*N rows] of B left-padded prompts, each encoded once, with `reserve` free slots."""
    prompt = prepare_prompt(
        cfg, input_ids, attention_mask, pixel_values, image_grid_thw, reserve=reserve
    )
    prompt = place_prompt(sharding.mesh_of(params), prompt)
    return prefill_jit(cfg, params, prompt, reserve=reserve, num_samples=num_samples)


def extend(cfg: ModelConfig, params, prefix: Prefix, tokens, mask) -> Prefix:
    """Returns prefix (consumed) extended by right-padded text continuations tokens/mask [R, C]."""
    _check_room(prefix, np.shape(tokens)[1])
    mesh = sharding.mesh_of(params)
    tokens, mask = (_rows(mesh, np.asarray(x, np.int32)) for x in (tokens, mask))
    return _extend_jit(cfg, params, prefix, tokens, mask, with_logprobs=False)[0]


def decode(
    cfg: ModelConfig,
    params,
    prefix: Prefix,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_ids=None,
    rng=None,
    pad_id: int = 0,
) -> SampleOutput:
    """Returns up to max_new_tokens tokens per row of prefix (consumed; donated to the decode loop)."""
    sampler, rng = _sampler(max_new_tokens, temperature, top_k, top_p, eos_token_ids, pad_id, rng)
    _check_room(prefix, max_new_tokens)
    rng = _place_key(sharding.mesh_of(params), rng)
    out, _ = decode_jit(
        cfg, prefix.cache, params, dataclasses.replace(prefix, cache=None), rng, sampler=sampler
    )
    return out


def generate(
    cfg: ModelConfig,
    params,
    input_ids,
    attention_mask,
    pixel_values=None,
    image_grid_thw=None,
    *,
    max_new_tokens: int,
    num_samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_ids=None,
    rng=None,
    pad_id: int = 0,
) -> SampleOutput:
    """Returns num_samples continuations of each prompt: tokens / logprobs [B*N, T], lengths [B*N] (DESIGN contract)."""
    _, multiple = _row_multiple(params)
    input_ids, attention_mask, extra = _filler_rows(cfg, input_ids, attention_mask, multiple)
    prefix = prefill(
        cfg,
        params,
        input_ids,
        attention_mask,
        pixel_values,
        image_grid_thw,
        reserve=max_new_tokens,
        num_samples=num_samples,
    )
    out = decode(
        cfg,
        params,
        prefix,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        eos_token_ids=eos_token_ids,
        rng=rng,
        pad_id=pad_id,
    )
    return _first_rows(out, (input_ids.shape[0] - extra) * num_samples)


def generate_with_shared_prefix(
    cfg: ModelConfig,
    params,
    input_ids,
    attention_mask,
    pixel_values=None,
    image_grid_thw=None,
    *,
    continuations,
    continuation_mask,
    max_new_tokens: int,
    num_samples: int,
    **decode_kwargs,
) -> SampleOutput:
    """Returns generations [B*N, T] after prefix b followed by continuation b*N+j ([B*N, C], right-padded).

    The Judge's case: the prefix (image, rubric) is encoded once per group, each of the N
    captions is appended to its own copy of the cache, then all rows decode together.
    decode_kwargs are decode's settings (temperature, top_p, top_k, eos_token_ids, rng, pad_id).
    """
    _, multiple = _row_multiple(params)
    input_ids, attention_mask, extra = _filler_rows(cfg, input_ids, attention_mask, multiple)
    # A filler prompt's continuations are one token each.
    continuations = _append_rows(continuations, extra * num_samples, int(input_ids[-1, -1]))
    continuation_mask = np.asarray(continuation_mask)
    continuation_mask = np.concatenate(
        [
            continuation_mask,
            np.eye(1, continuation_mask.shape[1], dtype=continuation_mask.dtype).repeat(
                extra * num_samples, 0
            ),
        ]
    )
    width = bucket(continuations.shape[1], minimum=8)
    prefix = prefill(
        cfg,
        params,
        input_ids,
        attention_mask,
        pixel_values,
        image_grid_thw,
        reserve=width + max_new_tokens,
        num_samples=num_samples,
    )
    out = _continue_and_decode(
        cfg, params, prefix, continuations, continuation_mask, width, max_new_tokens, decode_kwargs
    )
    return _first_rows(out, (input_ids.shape[0] - extra) * num_samples)


def _continue_and_decode(
    cfg, params, prefix, continuations, continuation_mask, width, max_new_tokens, decode_kwargs
):
    """Returns the decode of prefix (consumed) after the continuations [R, C], padded to width."""
    pad = ((0, 0), (0, width - continuations.shape[1]))
    prefix = extend(cfg, params, prefix, np.pad(continuations, pad), np.pad(continuation_mask, pad))
    return decode(cfg, params, prefix, max_new_tokens=max_new_tokens, **decode_kwargs)


def generate_with_prefix_index(
    cfg: ModelConfig,
    params,
    input_ids,
    attention_mask,
    *,
    prefix_index,
    continuations,
    continuation_mask,
    max_new_tokens: int,
    **decode_kwargs,
) -> SampleOutput:
    """Returns generations [R, T] after text prefix prefix_index[r] followed by continuation r
    ([R, C], right-padded; every row needs at least one token).

    generate_with_shared_prefix for prefixes shared by uneven numbers of rows: the per-item
    Judge's questions about one caption share the caption and differ in the item that ends
    them. The B prefixes are encoded once, row r copies the cache of its prefix, appends its
    continuation, then all rows decode together. decode_kwargs are decode's settings.
    """
    mesh, multiple = _row_multiple(params)
    input_ids, attention_mask, _ = _filler_rows(cfg, input_ids, attention_mask, multiple)
    index = np.asarray(prefix_index, np.int32)
    continuations, continuation_mask = np.asarray(continuations), np.asarray(continuation_mask)
    rows = index.shape[0]
    if continuations.shape[0] != rows or continuation_mask.shape != continuations.shape:
        raise ValueError(
            f"continuations {continuations.shape} / mask {continuation_mask.shape} need one row "
            f"per prefix_index entry ({rows})"
        )
    if rows and (index.min() < 0 or index.max() >= input_ids.shape[0]):
        raise ValueError(f"prefix_index must name prefixes 0..{input_ids.shape[0] - 1}")
    if rows and not continuation_mask.any(axis=1).all():
        raise ValueError("every continuation needs at least one token")
    extra = -rows % multiple  # filler rows: prefix 0 and one token
    index = _append_rows(index, extra)
    continuations = _append_rows(continuations, extra, int(input_ids[0, -1]))
    continuation_mask = _append_rows(continuation_mask, extra)
    continuation_mask[rows:, 0] = 1
    width = bucket(continuations.shape[1], minimum=8)
    prefix = prefill(cfg, params, input_ids, attention_mask, reserve=width + max_new_tokens)
    prefix = _gather_jit(cfg, prefix, _rows(mesh, index))
    out = _continue_and_decode(
        cfg, params, prefix, continuations, continuation_mask, width, max_new_tokens, decode_kwargs
    )
    return _first_rows(out, rows)


def sequence_logprobs(
    cfg: ModelConfig,
    params,
    input_ids,
    attention_mask,
    pixel_values=None,
    image_grid_thw=None,
    *,
    completion,
    completion_mask,
    num_samples: int = 1,
) -> jax.Array:
    """Returns logprobs [B*N, T] float32 of completions [B*N, T] (right-padded) after B prompts; 0 at padding."""
    mesh, multiple = _row_multiple(params)
    input_ids, attention_mask, extra = _filler_rows(cfg, input_ids, attention_mask, multiple)
    rows = completion.shape[0] if hasattr(completion, "shape") else len(completion)
    completion = _append_rows(np.asarray(completion, np.int32), extra * num_samples)
    completion_mask = _append_rows(
        np.asarray(completion_mask, np.int32), extra * num_samples
    )  # scores nothing
    width = bucket(completion.shape[1], minimum=8)
    pad = ((0, 0), (0, width - completion.shape[1]))
    prompt = place_prompt(
        mesh,
        prepare_prompt(cfg, input_ids, attention_mask, pixel_values, image_grid_thw, reserve=width),
    )
    logprobs = _score_jit(
        cfg,
        params,
        prompt,
        _rows(mesh, np.pad(completion, pad)),
        _rows(mesh, np.pad(completion_mask, pad)),
        num_samples=num_samples,
    )
    return logprobs[:rows, : completion.shape[1]]
