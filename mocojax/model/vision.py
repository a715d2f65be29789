"""Qwen3-VL vision tower in Flax NNX: patch embedding, interpolated learned positions, 2-D rope,
block-diagonal attention per image, patch merger and DeepStack mergers.

The tower runs in the packed layout of `rope.VisionMeta`: patches are gathered once into
attention rows [rows, R] (frames whole, in order), every block works on [rows, R, D], and only
the merged tokens are gathered back to processor order at the end. Attention is then local to
a row, so under a mesh the rows split over the data axes (the activation sharding) with no
communication inside the tower; frames hold a multiple of merge² patches, so each merge group
stays inside a row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mocojax.model.config import VisionConfig
from mocojax.model.layers import (
    Dense,
    LayerNorm,
    activation,
    constrain_rows,
    param,
    scan_layers,
    stacked,
)
from mocojax.model.rope import VisionMeta, apply_rotary, vision_rope


class VisionAttention(nnx.Module):
    def __init__(self, v: VisionConfig, *, param_dtype, dtype, rngs):
        d, std = v.hidden_size, v.initializer_range
        self.qkv = Dense(
            d,
            3 * d,
            ("vision_embed", "vision_qkv"),
            bias=True,
            param_dtype=param_dtype,
            dtype=dtype,
            std=std,
            rngs=rngs,
        )
        self.proj = Dense(
            d,
            d,
            ("vision_qkv", "vision_embed"),
            bias=True,
            param_dtype=param_dtype,
            dtype=dtype,
            std=std,
            rngs=rngs,
        )
        self.num_heads, self.head_dim, self.dtype = v.num_heads, v.head_dim, dtype

    def __call__(self, x, cos, sin, mask):
        """Returns [rows, R, D] attention output of packed patches x [rows, R, D], attending only
        within each image frame (mask [rows, 1, R, R]); cos / sin [rows, R, head_dim]."""
        rows, r = x.shape[:2]
        qkv = self.qkv(x).reshape(rows, r, 3, self.num_heads, self.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        # Rotary in float32 as transformers does, then back to the compute dtype.
        q = apply_rotary(q.astype(jnp.float32), cos, sin).astype(self.dtype)
        k = apply_rotary(k.astype(jnp.float32), cos, sin).astype(self.dtype)
        out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=self.head_dim**-0.5)
        return self.proj(out.reshape(rows, r, self.num_heads * self.head_dim))


class VisionBlock(nnx.Module):
    def __init__(self, v: VisionConfig, *, param_dtype, dtype, rngs):
        d, std = v.hidden_size, v.initializer_range
        kw = dict(param_dtype=param_dtype, dtype=dtype)
        self.norm1 = LayerNorm(d, "vision_embed", **kw)
        self.norm2 = LayerNorm(d, "vision_embed", **kw)
        self.attn = VisionAttention(v, rngs=rngs, **kw)
        self.fc1 = Dense(
            d,
            v.intermediate_size,
            ("vision_embed", "vision_mlp"),
            bias=True,
            std=std,
            rngs=rngs,
            **kw,
        )
        self.fc2 = Dense(
            v.intermediate_size,
            d,
            ("vision_mlp", "vision_embed"),
            bias=True,
            std=std,
            rngs=rngs,
            **kw,
        )
        self.act = activation(v.hidden_act)

    def __call__(self, x, cos, sin, mask):
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class PatchMerger(nnx.Module):
    """Merges each merge x merge block of patches into one token of the text width."""

    def __init__(self, v: VisionConfig, *, postshuffle_norm: bool, param_dtype, dtype, rngs):
        d, std = v.hidden_size * v.spatial_merge_size**2, v.initializer_range
        kw = dict(param_dtype=param_dtype, dtype=dtype)
        self.postshuffle_norm = postshuffle_norm
        self.norm = LayerNorm(
            d if postshuffle_norm else v.hidden_size,
            "vision_merged" if postshuffle_norm else "vision_embed",
            **kw,
        )
        self.fc1 = Dense(
            d, d, ("vision_merged", "vision_merged_out"), bias=True, std=std, rngs=rngs, **kw
        )
        self.fc2 = Dense(
            d,
            v.out_hidden_size,
            ("vision_merged_out", "embed"),
            bias=True,
            std=std,
            rngs=rngs,
            **kw,
        )
        self.merged_dim = d

    def __call__(self, x):
        """Returns [P / merge², out_hidden] tokens from patches [P, D] in merge-block order."""
        x = (
            self.norm(x.reshape(-1, self.merged_dim))
            if self.postshuffle_norm
            else self.norm(x).reshape(-1, self.merged_dim)
        )
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


class VisionModel(nnx.Module):
    def __init__(
        self,
        v: VisionConfig,
        *,
        param_dtype,
        dtype,
        rngs,
        remat: bool = False,
        activation_sharding=None,
    ):
        kw = dict(param_dtype=param_dtype, dtype=dtype)
        self.config, self.dtype, self.remat, self.activation_sharding = (
            v,
            dtype,
            remat,
            activation_sharding,
        )
        self.patch_embed = Dense(
            v.patch_dim,
            v.hidden_size,
            ("patch", "vision_embed"),
            bias=True,
            std=v.initializer_range,
            rngs=rngs,
            **kw,
        )
        self.pos_embed = param(
            rngs,
            (v.num_position_embeddings, v.hidden_size),
            ("vision_pos", "vision_embed"),
            param_dtype,
            std=v.initializer_range,
        )
        self.blocks = stacked(v.depth, lambda r: VisionBlock(v, rngs=r, **kw))(rngs)
        self.merger = PatchMerger(v, postshuffle_norm=False, rngs=rngs, **kw)
        num_ds = len(v.deepstack_visual_indexes)
        self.deepstack_mergers = (
            stacked(num_ds, lambda r: PatchMerger(v, postshuffle_norm=True, rngs=r, **kw))(rngs)
            if num_ds
            else None
        )

    def _constrain(self, x):
        """Pins packed activations [rows, R, ...] to rows over the data axes (where they divide)."""
        return constrain_rows(x, self.activation_sharding)

    def __call__(self, pixel_values, meta: VisionMeta):
        """Returns (tokens [P/m², D_text], deepstack [n_ds, P/m², D_text]) for patches [P, patch_dim].

        Layers run as one lax.scan per stretch between DeepStack taps, so depth costs no
        extra compile time.
        """
        v = self.config
        packed = meta.packed_patch  # [rows, R]: the patch in each slot
        # Per-patch inputs gathered into the packed layout (a local gather of replicated inputs).
        x = self._constrain(self.patch_embed(pixel_values[packed]))
        pos = (
            self.pos_embed[...][meta.interp_idx[packed]].astype(jnp.float32)
            * meta.interp_w[packed][..., None]
        ).sum(-2)
        x = x + pos.astype(self.dtype)
        cos, sin = (self._constrain(a[packed]) for a in vision_rope(v, meta.rot_pos))
        same_frame = meta.packed_segment[:, :, None] == meta.packed_segment[:, None, :]
        mask = self._constrain(same_frame[:, None])

        def block(layer, h, _):
            return self._constrain(layer(h, cos, sin, mask)), None

        features, start = [], 0
        for tap in v.deepstack_visual_indexes:
            x, _ = scan_layers(self.blocks, x, block, start=start, stop=tap + 1, remat=self.remat)
            features.append(x)
            start = tap + 1
        if start < v.depth:
            x, _ = scan_layers(self.blocks, x, block, start=start, remat=self.remat)
        # Merge groups of m² consecutive slots (a frame starts at a multiple of m² in its row),
        # then keep the groups that start at each patch group of processor order, in that order.
        merge = v.spatial_merge_size**2
        group = meta.slot[::merge] // merge  # [P / m²]
        flat = lambda h: h.reshape(-1, h.shape[-1])
        tokens = self.merger(flat(x))[group]
        if not features:
            return tokens, jnp.zeros((0,) + tokens.shape, tokens.dtype)
        _, deepstack = scan_layers(
            self.deepstack_mergers,
            None,
            lambda m, c, f: (c, m(flat(f))[group]),
            xs=jnp.stack(features),
        )
        return tokens, deepstack
