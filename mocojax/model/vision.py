"""Qwen3-VL vision tower in Flax NNX: patch embedding, interpolated learned positions, 2-D rope,
block-diagonal attention per image, patch merger and DeepStack mergers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mocojax.model.config import VisionConfig
from mocojax.model.layers import Dense, LayerNorm, activation, param, scan_layers, stacked
from mocojax.model.rope import VisionMeta, apply_rotary, vision_rope


class VisionAttention(nnx.Module):
    def __init__(self, v: VisionConfig, *, param_dtype, dtype, rngs):
        d, std = v.hidden_size, v.initializer_range
        self.qkv = Dense(d, 3 * d, ("vision_embed", "vision_qkv"), bias=True, param_dtype=param_dtype, dtype=dtype, std=std, rngs=rngs)
        self.proj = Dense(d, d, ("vision_qkv", "vision_embed"), bias=True, param_dtype=param_dtype, dtype=dtype, std=std, rngs=rngs)
        self.num_heads, self.head_dim, self.dtype = v.num_heads, v.head_dim, dtype

    def __call__(self, x, cos, sin, packing):
        """Returns [P, D] attention output, attending only within each image frame.

        packing = (slot [P], packed_patch [rows, R], mask [rows, 1, R, R]): patches are gathered
        into packed rows, attend there, and are scattered back (see rope.VisionMeta).
        """
        slot, packed_patch, mask = packing
        p = x.shape[0]
        qkv = self.qkv(x).reshape(p, 3, self.num_heads, self.head_dim)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        # Rotary in float32 as transformers does, then back to the compute dtype.
        q = apply_rotary(q.astype(jnp.float32), cos, sin).astype(self.dtype)
        k = apply_rotary(k.astype(jnp.float32), cos, sin).astype(self.dtype)
        q, k, v = (a[packed_patch] for a in (q, k, v))  # [rows, R, N, H]
        out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=self.head_dim**-0.5)
        out = out.reshape(-1, self.num_heads * self.head_dim)[slot]
        return self.proj(out)


class VisionBlock(nnx.Module):
    def __init__(self, v: VisionConfig, *, param_dtype, dtype, rngs):
        d, std = v.hidden_size, v.initializer_range
        kw = dict(param_dtype=param_dtype, dtype=dtype)
        self.norm1 = LayerNorm(d, "vision_embed", **kw)
        self.norm2 = LayerNorm(d, "vision_embed", **kw)
        self.attn = VisionAttention(v, rngs=rngs, **kw)
        self.fc1 = Dense(d, v.intermediate_size, ("vision_embed", "vision_mlp"), bias=True, std=std, rngs=rngs, **kw)
        self.fc2 = Dense(v.intermediate_size, d, ("vision_mlp", "vision_embed"), bias=True, std=std, rngs=rngs, **kw)
        self.act = activation(v.hidden_act)

    def __call__(self, x, cos, sin, packing):
        x = x + self.attn(self.norm1(x), cos, sin, packing)
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class PatchMerger(nnx.Module):
    """Merges each merge x merge block of patches into one token of the text width."""

    def __init__(self, v: VisionConfig, *, postshuffle_norm: bool, param_dtype, dtype, rngs):
        d, std = v.hidden_size * v.spatial_merge_size**2, v.initializer_range
        kw = dict(param_dtype=param_dtype, dtype=dtype)
        self.postshuffle_norm = postshuffle_norm
        self.norm = LayerNorm(d if postshuffle_norm else v.hidden_size, "vision_merged" if postshuffle_norm else "vision_embed", **kw)
        self.fc1 = Dense(d, d, ("vision_merged", "vision_merged_out"), bias=True, std=std, rngs=rngs, **kw)
        self.fc2 = Dense(d, v.out_hidden_size, ("vision_merged_out", "embed"), bias=True, std=std, rngs=rngs, **kw)
        self.merged_dim = d

    def __call__(self, x):
        """Returns [P / merge², out_hidden] tokens from patches [P, D] in merge-block order."""
        x = self.norm(x.reshape(-1, self.merged_dim)) if self.postshuffle_norm else self.norm(x).reshape(-1, self.merged_dim)
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


class VisionModel(nnx.Module):
    def __init__(self, v: VisionConfig, *, param_dtype, dtype, rngs):
        kw = dict(param_dtype=param_dtype, dtype=dtype)
        self.config, self.dtype = v, dtype
        self.patch_embed = Dense(v.patch_dim, v.hidden_size, ("patch", "vision_embed"), bias=True, std=v.initializer_range, rngs=rngs, **kw)
        self.pos_embed = param(rngs, (v.num_position_embeddings, v.hidden_size), ("vision_pos", "vision_embed"), param_dtype, std=v.initializer_range)
        self.blocks = stacked(v.depth, lambda r: VisionBlock(v, rngs=r, **kw))(rngs)
        self.merger = PatchMerger(v, postshuffle_norm=False, rngs=rngs, **kw)
        num_ds = len(v.deepstack_visual_indexes)
        self.deepstack_mergers = stacked(num_ds, lambda r: PatchMerger(v, postshuffle_norm=True, rngs=r, **kw))(rngs) if num_ds else None

    def __call__(self, pixel_values, meta: VisionMeta):
        """Returns (tokens [P/m², D_text], deepstack [n_ds, P/m², D_text]) for patches [P, patch_dim].

        Layers run as one lax.scan per stretch between DeepStack taps, so depth costs no
        extra compile time.
        """
        v = self.config
        x = self.patch_embed(pixel_values)
        pos = (self.pos_embed[...][meta.interp_idx].astype(jnp.float32) * meta.interp_w[..., None]).sum(1)
        x = x + pos.astype(self.dtype)
        cos, sin = vision_rope(v, meta.rot_pos)
        same_frame = meta.packed_segment[:, :, None] == meta.packed_segment[:, None, :]
        packing = (meta.slot, meta.packed_patch, same_frame[:, None])

        def block(layer, h, _):
            return layer(h, cos, sin, packing), None

        features, start = [], 0
        for tap in v.deepstack_visual_indexes:
            x, _ = scan_layers(self.blocks, x, block, start=start, stop=tap + 1)
            features.append(x)
            start = tap + 1
        if start < v.depth:
            x, _ = scan_layers(self.blocks, x, block, start=start)
        tokens = self.merger(x)
        if not features:
            return tokens, jnp.zeros((0,) + tokens.shape, tokens.dtype)
        _, deepstack = scan_layers(self.deepstack_mergers, None, lambda m, c, f: (c, m(f)), xs=jnp.stack(features))
        return tokens, deepstack
