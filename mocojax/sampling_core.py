"""The pure parts of sampling: the pytrees (Prompt, Prefix, SampleOutput, Sampler), token choice
(filter_logits, choose_tokens) and the jittable cores (prefill_core, extend_core, decode_core,
completion_logprobs) that mocojax/sampling.py jits. Split from mocojax/sampling.py, which re-exports
these names (its module docstring describes the design)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from mocojax import model, sharding
from mocojax.losses import (
    token_logprobs,  # log_softmax at the sampled token, float32, temperature 1
)
from mocojax.model import ModelConfig, VisionMeta


# ----------------------------------------------------------------------------- pytrees
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prompt:
    """A left-padded, bucketed prompt batch ready for the device (host arrays until jit moves them)."""

    input_ids: np.ndarray  # [B, L] int32
    attention_mask: np.ndarray  # [B, L] int32
    positions: np.ndarray  # [3, B, L] int32
    next_position: np.ndarray  # [B] int32: rope position of the first token after the prompt
    pixel_values: np.ndarray | None  # [P, patch_dim], P bucketed (zero rows pad)
    vision: VisionMeta | None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prefix:
    """A filled KV cache with what decoding it needs; R rows (B*N after a shared prefill).

    With a shared prompt cache (cfg.shared_prompt_cache, N > 1) the B prompts' cache is kept once
    in shared_cache / shared_valid and `cache` holds only each row's slots after its prompt; row
    b*N+j attends to prompt b's slots, then to its own."""

    cache: dict  # {"k", "v"} [layers, R, S, K, H]
    key_valid: jax.Array  # [R, S] bool: slots holding real tokens
    next_position: jax.Array  # [R] int32: rope position of the next token
    last_logits: jax.Array  # [R, V] float32: logits predicting the next token
    next_slot: int = dataclasses.field(metadata=dict(static=True))  # first free cache slot
    shared_cache: dict | None = None  # {"k", "v"} [layers, B, L, K, H]: the prompts' cache
    shared_valid: jax.Array | None = None  # [B, L] bool: the prompts' real slots

    @property
    def shared(self) -> tuple | None:
        """Returns model.apply's `shared` argument: (shared_cache, shared_valid), or None."""
        return None if self.shared_cache is None else (self.shared_cache, self.shared_valid)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SampleOutput:
    """Generated tokens: row b*N+j is sample j of prompt b."""

    tokens: jax.Array  # [R, T] int32, pad_id after the end
    logprobs: jax.Array  # [R, T] float32, unscaled-softmax logprob; 0 after the end
    lengths: jax.Array  # [R] int32, generated tokens including the EOS

    @property
    def mask(self) -> jax.Array:
        """Returns [R, T] bool: True at generated (non-padding) tokens."""
        return jnp.arange(self.tokens.shape[1])[None, :] < self.lengths[:, None]


@dataclasses.dataclass(frozen=True)
class Sampler:
    """Static decoding settings (hashable: one compiled decode program per distinct value)."""

    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    eos_token_ids: tuple[int, ...] = ()
    pad_id: int = 0


# ----------------------------------------------------------------------------- token choice
def filter_logits(
    logits: jax.Array, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> jax.Array:
    """Returns logits [R, V] / temperature with -inf outside the top-k, then the top-p nucleus."""
    x = logits.astype(jnp.float32) / temperature
    if top_k <= 0 and top_p >= 1.0:
        return x
    if top_k > 0:
        ranked = jax.lax.top_k(x, min(top_k, x.shape[-1]))[0]  # [R, k] descending
    else:
        ranked = -jnp.sort(-x, axis=-1)  # [R, V] descending
    if top_p < 1.0:
        probs = jax.nn.softmax(ranked, axis=-1)
        # Keep the smallest head whose mass reaches top_p: a token stays if the mass before it < top_p.
        keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p
        threshold = jnp.min(jnp.where(keep, ranked, jnp.inf), axis=-1, keepdims=True)
    else:
        threshold = ranked[:, -1:]
    return jnp.where(x < threshold, -jnp.inf, x)


def choose_tokens(logits: jax.Array, keys: jax.Array, sampler: Sampler) -> jax.Array:
    """Returns tokens [R]: argmax at temperature 0, else a draw per row (keys [R]) from the filtered softmax."""
    if sampler.temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    filtered = filter_logits(logits, sampler.temperature, sampler.top_k, sampler.top_p)
    return jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)


# ----------------------------------------------------------------------------- jittable cores
def prefill_core(
    cfg: ModelConfig, params, prompt: Prompt, *, reserve: int, num_samples: int
) -> Prefix:
    """Returns the Prefix of B prompts, encoded once and repeated to B*num_samples rows (row b*N+j).

    With cfg.shared_prompt_cache and num_samples > 1 the prompts' cache is not repeated: it is
    the Prefix's shared_cache, and each row's cache holds only its `reserve` free slots."""
    batch, length = prompt.input_ids.shape
    shared = cfg.shared_prompt_cache and num_samples > 1
    t = cfg.text
    slots = length if shared else length + reserve
    shape = (t.num_hidden_layers, batch, slots, t.num_key_value_heads, t.head_dim)
    cache = {"k": jnp.zeros(shape, cfg.dtype), "v": jnp.zeros(shape, cfg.dtype)}
    key_valid = jnp.pad(prompt.attention_mask.astype(bool), ((0, 0), (0, slots - length)))
    _, aux = model.apply(
        cfg,
        params,
        prompt.input_ids,
        prompt.attention_mask,
        prompt.positions,
        prompt.pixel_values,
        prompt.vision,
        cache=cache,
        key_valid=key_valid,
        write_index=0,
        return_hidden=True,
    )
    last_logits = model.lm_logits(cfg, params, aux["hidden"][:, -1:])[:, 0]  # [B, V]
    repeat = functools.partial(
        jnp.repeat, repeats=num_samples, total_repeat_length=batch * num_samples
    )
    rows = dict(
        next_position=repeat(prompt.next_position, axis=0),
        last_logits=repeat(last_logits, axis=0),
    )
    if shared:
        own = (t.num_hidden_layers, batch * num_samples, reserve) + shape[3:]
        return Prefix(
            cache=_constrain_cache(cfg, {name: jnp.zeros(own, cfg.dtype) for name in "kv"}),
            key_valid=jnp.zeros(own[1:3], bool),
            next_slot=0,
            shared_cache=_constrain_cache(cfg, aux["cache"]),
            shared_valid=key_valid,
            **rows,
        )
    return Prefix(
        cache=_constrain_cache(cfg, jax.tree.map(lambda c: repeat(c, axis=1), aux["cache"])),
        key_valid=repeat(key_valid, axis=0),
        next_slot=length,
        **rows,
    )


def _constrain_cache(cfg: ModelConfig, cache: dict) -> dict:
    """Returns the KV cache pinned to sharding.KV_CACHE_AXES on the mesh of cfg.activation_sharding
    (rows over the data axes, kv heads over tensor, where they divide); unchanged without a mesh."""
    if cfg.activation_sharding is None:
        return cache
    mesh = cfg.activation_sharding.mesh
    spec = sharding.logical_spec(sharding.KV_CACHE_AXES, cache["k"].shape, mesh, strict=())
    return jax.tree.map(
        lambda c: jax.lax.with_sharding_constraint(c, jax.sharding.NamedSharding(mesh, spec)), cache
    )


def unshare_prefix(cfg: ModelConfig, prefix: Prefix) -> Prefix:
    """Returns prefix with its shared prompt cache repeated into every row's cache (prefix when
    it has none): the layout of a prefill without cfg.shared_prompt_cache."""
    if prefix.shared_cache is None:
        return prefix
    prompts, length = prefix.shared_valid.shape
    rows = prefix.key_valid.shape[0]
    per = rows // prompts

    def join(shared, own, axis):
        return jnp.concatenate(
            [jnp.repeat(shared, per, axis=axis, total_repeat_length=rows), own], axis=axis + 1
        )

    cache = {name: join(prefix.shared_cache[name], prefix.cache[name], 1) for name in "kv"}
    return Prefix(
        cache=_constrain_cache(cfg, cache),
        key_valid=join(prefix.shared_valid, prefix.key_valid, 0),
        next_position=prefix.next_position,
        last_logits=prefix.last_logits,
        next_slot=length + prefix.next_slot,
    )


def gather_prefix_core(cfg: ModelConfig, prefix: Prefix, rows: jax.Array) -> Prefix:
    """Returns the Prefix whose row r is row rows[r] of prefix (rows [R] int32): prompts that
    share a prefix in uneven numbers (the per-item Judge's items of one caption) copy its cache."""
    prefix = unshare_prefix(cfg, prefix)
    take = lambda x, axis: jnp.take(x, rows, axis=axis)
    return Prefix(
        cache=_constrain_cache(cfg, jax.tree.map(lambda c: take(c, 1), prefix.cache)),
        key_valid=take(prefix.key_valid, 0),
        next_position=take(prefix.next_position, 0),
        last_logits=take(prefix.last_logits, 0),
        next_slot=prefix.next_slot,
    )


def extend_core(
    cfg: ModelConfig,
    params,
    prefix: Prefix,
    tokens: jax.Array,
    mask: jax.Array,
    *,
    with_logprobs: bool,
):
    """Returns (Prefix after the right-padded continuations tokens/mask [R, C], their logprobs [R, C] or None)."""
    rows, width = tokens.shape
    slot = prefix.next_slot
    mask = mask.astype(jnp.int32)
    offsets = jnp.cumsum(mask, axis=1) - 1  # [R, C]
    positions = jnp.broadcast_to(
        prefix.next_position[:, None] + jnp.maximum(offsets, 0), (3, rows, width)
    )
    key_valid = jax.lax.dynamic_update_slice_in_dim(
        prefix.key_valid, mask.astype(bool), slot, axis=1
    )
    _, aux = model.apply(
        cfg,
        params,
        tokens,
        mask,
        positions,
        cache=prefix.cache,
        key_valid=key_valid,
        write_index=slot,
        return_hidden=True,
        shared=prefix.shared,
    )
    lengths = mask.sum(1)  # [R]
    last_hidden = jnp.take_along_axis(
        aux["hidden"], jnp.maximum(lengths - 1, 0)[:, None, None], axis=1
    )
    last_logits = jnp.where(
        lengths[:, None] > 0, model.lm_logits(cfg, params, last_hidden)[:, 0], prefix.last_logits
    )
    logprobs = None
    if with_logprobs:
        # Token i is predicted by the hidden state after token i-1 (cfg.logits_chunk positions at
        # a time); token 0 by the prefix's last logits.
        first = token_logprobs(prefix.last_logits[:, None], tokens[:, :1])
        rest = model.target_logprobs(cfg, params, aux["hidden"][:, :-1], tokens[:, 1:])  # [R, C-1]
        logprobs = jnp.where(mask > 0, jnp.concatenate([first, rest], axis=1), 0.0)
    new_prefix = dataclasses.replace(
        prefix,
        cache=aux["cache"],
        key_valid=key_valid,
        next_position=prefix.next_position + lengths,
        last_logits=last_logits,
        next_slot=slot + width,
    )
    return new_prefix, logprobs


def decode_core(
    cfg: ModelConfig, params, prefix: Prefix, rng: jax.Array, *, sampler: Sampler
) -> tuple[SampleOutput, dict]:
    """Returns (up to sampler.max_new_tokens tokens per row decoded from prefix in one lax.while_loop,
    the final cache, which holds every generated token but the last)."""
    rows = prefix.last_logits.shape[0]
    steps = sampler.max_new_tokens
    row_keys = jax.random.split(rng, rows)
    eos = jnp.asarray(sampler.eos_token_ids or (-1,), jnp.int32)
    # Every reserved slot is valid from here on: the causal mask hides the ones not yet written.
    key_valid = prefix.key_valid.at[:, prefix.next_slot :].set(True)

    def record(state, logits):
        t, done = state["t"], state["done"]
        keys = jax.vmap(jax.random.fold_in, (0, None))(row_keys, t)
        token = jnp.where(done, sampler.pad_id, choose_tokens(logits, keys, sampler))  # [R]
        logprob = jnp.where(done, 0.0, token_logprobs(logits, token))
        return dict(
            state,
            t=t + 1,
            tokens=state["tokens"].at[:, t].set(token),
            logprobs=state["logprobs"].at[:, t].set(logprob),
            lengths=state["lengths"] + (~done).astype(jnp.int32),
            done=done | (token[:, None] == eos[None]).any(-1),
        )

    def body(state):
        t = state["t"]
        token = jax.lax.dynamic_index_in_dim(state["tokens"], t - 1, axis=1)  # [R, 1]
        positions = jnp.broadcast_to(prefix.next_position[:, None] + t - 1, (3, rows, 1))
        logits, aux = model.apply(
            cfg,
            params,
            token,
            jnp.ones_like(token),
            positions,
            cache=state["cache"],
            key_valid=key_valid,
            write_index=prefix.next_slot + t - 1,
            shared=prefix.shared,
        )
        return record(dict(state, cache=aux["cache"]), logits[:, 0])

    def cond(state):
        return (state["t"] < steps) & ~state["done"].all()

    state = dict(
        t=jnp.int32(0),
        tokens=jnp.full((rows, steps), sampler.pad_id, jnp.int32),
        logprobs=jnp.zeros((rows, steps), jnp.float32),
        lengths=jnp.zeros((rows,), jnp.int32),
        done=jnp.zeros((rows,), bool),
        cache=prefix.cache,
    )
    state = jax.lax.while_loop(cond, body, record(state, prefix.last_logits))
    return SampleOutput(state["tokens"], state["logprobs"], state["lengths"]), state["cache"]


def completion_logprobs(
    cfg: ModelConfig, params, prompt: Prompt, completion, completion_mask, *, num_samples: int = 1
):
    """Returns logprobs [B*N, T] float32 of right-padded completions [B*N, T] after prompts [B] (0 at padding).

    Pure and differentiable (use it inside a jitted loss): each prompt is encoded once for its
    N completions, then the completions are appended in one pass.
    """
    prefix = prefill_core(cfg, params, prompt, reserve=completion.shape[1], num_samples=num_samples)
    return extend_core(cfg, params, prefix, completion, completion_mask, with_logprobs=True)[1]
