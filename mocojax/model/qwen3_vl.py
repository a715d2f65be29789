"""The whole Qwen3-VL model and its pure functional API.

Parameters live as a nested dict of arrays (`nnx.to_pure_dict` of the model's Params); every
function here is a pure function of (cfg, params, arrays). The NNX module graph is rebuilt
from an abstract model inside each trace (`nnx.merge`), which costs nothing at run time.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mocojax import losses
from mocojax.model.config import ModelConfig
from mocojax.model.rope import VisionMeta, get_rope_index, text_rope, vision_metadata
from mocojax.model.text import TextModel
from mocojax.model.vision import VisionModel

Params = dict[str, Any]


class Qwen3VL(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        kw = dict(param_dtype=jnp.dtype(cfg.param_dtype), dtype=jnp.dtype(cfg.dtype))
        self.visual = VisionModel(
            cfg.vision,
            rngs=rngs,
            remat=cfg.remat,
            activation_sharding=cfg.activation_sharding,
            **kw,
        )
        self.text = TextModel(
            cfg.text,
            tie_word_embeddings=cfg.tie_word_embeddings,
            remat=cfg.remat,
            attention_chunk=cfg.attention_chunk,
            activation_sharding=cfg.activation_sharding,
            rngs=rngs,
            **kw,
        )


@functools.lru_cache(maxsize=32)
def _abstract(cfg: ModelConfig):
    model = nnx.eval_shape(lambda: Qwen3VL(cfg, nnx.Rngs(0)))
    return nnx.split(model, nnx.Param)


def _merge(cfg: ModelConfig, params: Params) -> Qwen3VL:
    graphdef, state = _abstract(cfg)
    state = jax.tree.map(lambda x: x, state)  # a fresh copy: replace_by_pure_dict mutates it
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)


def init_params(cfg: ModelConfig, rng: jax.Array | int = 0) -> Params:
    """Returns freshly initialised parameters (nested dict of arrays in cfg.param_dtype)."""
    key = jax.random.key(rng) if isinstance(rng, int) else rng

    @jax.jit
    def init(key):
        model = Qwen3VL(cfg, nnx.Rngs(params=key))
        return nnx.to_pure_dict(nnx.state(model, nnx.Param))

    return init(key)


def abstract_params(cfg: ModelConfig) -> Params:
    """Returns the parameter tree as jax.ShapeDtypeStruct leaves (no memory allocated)."""
    return nnx.to_pure_dict(_abstract(cfg)[1])


def param_axes(cfg: ModelConfig) -> Params:
    """Returns the parameter tree with each leaf replaced by its tuple of logical axis names."""
    state = _abstract(cfg)[1]
    axes = jax.tree.map(
        lambda v: tuple(v.out_sharding), state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )
    return nnx.to_pure_dict(axes)


def count_params(params: Params) -> int:
    """Returns the number of scalars in a parameter (or abstract parameter) tree."""
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


@dataclasses.dataclass(frozen=True)
class ModelInputs:
    """Host-prepared inputs of `apply` (numpy): 3-D positions, rope deltas and vision metadata."""

    positions: np.ndarray  # [3, B, L]
    rope_deltas: np.ndarray  # [B]
    vision: VisionMeta | None


def check_ids_and_mask(input_ids, attention_mask) -> tuple[np.ndarray, np.ndarray]:
    """Returns (input_ids, attention_mask) as numpy [B, L] (mask all ones when None); raises on bad shapes."""
    input_ids = np.asarray(input_ids)
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [B, L], got shape {input_ids.shape}")
    attention_mask = (
        np.ones_like(input_ids) if attention_mask is None else np.asarray(attention_mask)
    )
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {attention_mask.shape} != input_ids shape {input_ids.shape}"
        )
    return input_ids, attention_mask


def prepare_inputs(
    cfg: ModelConfig,
    input_ids,
    attention_mask,
    image_grid_thw=None,
    mm_token_type_ids=None,
    *,
    pad_patches_to: int | None = None,
) -> ModelInputs:
    """Returns the host-side ModelInputs of a batch, with clear errors for inconsistent image inputs."""
    input_ids, attention_mask = check_ids_and_mask(input_ids, attention_mask)
    is_image = (input_ids == cfg.image_token_id) & (attention_mask > 0)
    vision = None
    if image_grid_thw is not None:
        grid = np.asarray(image_grid_thw).reshape(-1, 3)
        expected = int((grid.prod(-1) // cfg.vision.spatial_merge_size**2).sum())
        if int(is_image.sum()) != expected:
            raise ValueError(
                f"image tokens and images do not match: input_ids hold {int(is_image.sum())} image tokens "
                f"(id {cfg.image_token_id}), image_grid_thw {grid.tolist()} needs {expected}"
            )
        vision = vision_metadata(cfg.vision, grid, pad_to=pad_patches_to)
    elif is_image.any():
        raise ValueError(
            f"input_ids hold {int(is_image.sum())} image tokens but no image_grid_thw was given"
        )
    positions, deltas = get_rope_index(
        cfg, input_ids, attention_mask, image_grid_thw, mm_token_type_ids
    )
    return ModelInputs(positions=positions, rope_deltas=deltas, vision=vision)


def encode_images(cfg: ModelConfig, params: Params, pixel_values, vision: VisionMeta):
    """Returns (image tokens [I_tok, D], DeepStack features [n_ds, I_tok, D]) of the vision tower."""
    model = _merge(cfg, params)
    return model.visual(jnp.asarray(pixel_values), jax.tree.map(jnp.asarray, vision))


def scatter_image_tokens(
    is_image: jnp.ndarray, tokens: jnp.ndarray, base: jnp.ndarray
) -> jnp.ndarray:
    """Returns base [B, L, D] with the rows of tokens [N, D] written, in order, at is_image [B, L]."""
    flat = is_image.reshape(-1)
    index = jnp.clip(jnp.cumsum(flat) - 1, 0, tokens.shape[0] - 1)
    gathered = tokens[index].reshape(base.shape)
    return jnp.where(is_image[..., None], gathered.astype(base.dtype), base)


def attention_mask_4d(key_valid: jnp.ndarray, query_len: int, write_index) -> jnp.ndarray:
    """Returns the [B, 1, T, S] causal & padding mask for queries at slots write_index + [0, T)."""
    s = key_valid.shape[1]
    q_slot = write_index + jnp.arange(query_len)
    causal = jnp.arange(s)[None, :] <= q_slot[:, None]
    return (causal[None] & key_valid[:, None, :].astype(bool))[:, None]


def segment_mask(segment_ids: jnp.ndarray) -> jnp.ndarray:
    """Returns the [B, 1, T, T] causal mask of rows whose attention_mask holds segment ids.

    segment_ids [B, T]: 0 at padding, else the segment (packed record) of each token; a 0/1
    mask is one segment per row. A token attends to the earlier real tokens of its own segment,
    so no attention crosses a segment boundary; a padding query attends to every earlier real
    token (its output is never used), which makes a 0/1 mask give `attention_mask_4d`'s mask.
    """
    segment_ids = segment_ids.astype(jnp.int32)
    t = segment_ids.shape[1]
    causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
    query, key = segment_ids[:, :, None], segment_ids[:, None, :]
    same = (query == key) | (query == 0)
    return (causal[None] & same & (key > 0))[:, None]


def apply(
    cfg: ModelConfig,
    params: Params,
    input_ids: jnp.ndarray,
    attention_mask: jnp.ndarray,
    positions: jnp.ndarray,
    pixel_values: jnp.ndarray | None = None,
    vision: VisionMeta | None = None,
    *,
    cache: dict | None = None,
    key_valid: jnp.ndarray | None = None,
    write_index=0,
    output_hidden_states: bool = False,
    return_hidden: bool = False,
    shared: tuple | None = None,
):
    """Jittable forward: returns (logits [B, T, V] float32, aux dict).

    input_ids/attention_mask [B, T]; positions [3, B, T]. Without a cache the sequence attends
    to itself (causal, padding masked); there attention_mask may hold segment ids of packed
    records (`segment_mask`: no attention across records). With `cache` ({"k","v"} [layers, B, S, K, H]) the T new
    tokens are written at slots write_index..write_index+T-1 and attend to every valid slot;
    key_valid [B, S] says which slots are real. aux holds "cache", "hidden_states" (per-layer
    outputs when asked) and "hidden" (final normed hidden, when return_hidden). shared
    ({"k","v"} [layers, P, L, K, H], valid [P, L]), with a cache: a prompt cache that each B/P
    consecutive rows attend to before their own cache (sampling's shared prompt cache).
    """
    model = _merge(cfg, params)
    dtype = jnp.dtype(cfg.dtype)
    x = model.text.embed_tokens(input_ids)
    deepstack = None
    if pixel_values is not None:
        tokens, ds = model.visual(pixel_values, vision)
        is_image = (input_ids == cfg.image_token_id) & (attention_mask > 0)
        x = scatter_image_tokens(is_image, tokens, x)
        if ds.shape[0]:
            zeros = jnp.zeros_like(x)
            deepstack = jnp.stack([scatter_image_tokens(is_image, f, zeros) for f in ds])
    cos, sin = text_rope(cfg.text, positions, dtype)
    if cache is None:
        mask = segment_mask(attention_mask)
    else:
        mask = attention_mask_4d(key_valid, input_ids.shape[1], write_index)
    hidden, new_cache, hidden_states = model.text.decode(
        x,
        cos,
        sin,
        mask,
        deepstack=deepstack,
        cache=cache,
        write_index=write_index,
        output_hidden_states=output_hidden_states,
        shared=shared,
    )
    aux = {"cache": new_cache, "hidden_states": hidden_states}
    if return_hidden:
        aux["hidden"] = hidden
    return model.text.logits(hidden), aux


def lm_logits(cfg: ModelConfig, params: Params, hidden: jnp.ndarray) -> jnp.ndarray:
    """Returns float32 logits [B, T, V] of final normed hidden states [B, T, D] (aux["hidden"])."""
    return _merge(cfg, params).text.logits(hidden)


def target_logprobs(
    cfg: ModelConfig, params: Params, hidden: jnp.ndarray, targets: jnp.ndarray
) -> jnp.ndarray:
    """Returns float32 [B, T] log p(targets | hidden) under the unscaled softmax of lm_logits, for
    final normed hidden states [B, T, D]; chunked over positions by cfg.logits_chunk."""
    return losses.chunked_token_logprobs(
        hidden, targets, lambda h: lm_logits(cfg, params, h), cfg.logits_chunk
    )


@functools.partial(jax.jit, static_argnums=(0,))
def _forward_jit(cfg, params, input_ids, attention_mask, positions, pixel_values, vision):
    return apply(cfg, params, input_ids, attention_mask, positions, pixel_values, vision)[0]


def forward(
    cfg: ModelConfig,
    params: Params,
    input_ids,
    attention_mask,
    pixel_values=None,
    image_grid_thw=None,
    mm_token_type_ids=None,
):
    """Returns logits [B, L, V] (float32) of Qwen3-VL with HF tensor conventions (DESIGN contract).

    Positions come from `get_rope_index` on the host, so left padding (attention_mask 0)
    never shifts them. pixel_values / image_grid_thw are what the Qwen3-VL image processor returns.
    """
    input_ids, attention_mask = check_ids_and_mask(input_ids, attention_mask)
    inputs = prepare_inputs(cfg, input_ids, attention_mask, image_grid_thw, mm_token_type_ids)
    if (pixel_values is None) != (image_grid_thw is None):
        raise ValueError("pixel_values and image_grid_thw must be given together")
    if pixel_values is not None:
        pixel_values = jnp.asarray(pixel_values, jnp.dtype(cfg.dtype))
        if pixel_values.shape != (inputs.vision.segment.shape[0], cfg.vision.patch_dim):
            raise ValueError(
                f"pixel_values shape {pixel_values.shape} does not match image_grid_thw "
                f"({inputs.vision.segment.shape[0]} patches of {cfg.vision.patch_dim})"
            )
    vision = None if inputs.vision is None else jax.tree.map(jnp.asarray, inputs.vision)
    return _forward_jit(
        cfg,
        params,
        jnp.asarray(input_ids, jnp.int32),
        jnp.asarray(attention_mask, jnp.int32),
        jnp.asarray(inputs.positions),
        pixel_values,
        vision,
    )
