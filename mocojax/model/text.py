"""Qwen3-VL text decoder in Flax NNX: GQA/MQA attention with q/k RMSNorm and interleaved MRoPE,
SwiGLU MLP, DeepStack additions, scanned layers, a KV cache for sampling."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mocojax.model.config import TextConfig
from mocojax.model.layers import RMSNorm, activation, constrain_rows, param, scan_layers, stacked
from mocojax.model.rope import apply_rotary


def causal_chunked_attention(q, k, v, mask, scale, chunk):
    """Returns jax.nn.dot_product_attention(q, k, v, mask) for a causal mask [B, 1, T, T],
    `chunk` queries at a time against only the keys up to the chunk's end (the later keys are
    masked for every query of the chunk, so skipping them changes nothing)."""
    length = q.shape[1]
    out = []
    for start in range(0, length, chunk):
        stop = min(start + chunk, length)
        out.append(
            jax.nn.dot_product_attention(
                q[:, start:stop],
                k[:, :stop],
                v[:, :stop],
                mask=mask[:, :, start:stop, :stop],
                scale=scale,
            )
        )
    return jnp.concatenate(out, axis=1)


def shared_prompt_attention(q, k, v, mask, prompt_k, prompt_v, prompt_valid, scale):
    """Returns the attention of q over a prompt cache shared by groups of rows and each row's own slots.

    q [R, T, n, h]; k/v [R, S, K, h] and mask [R, 1, T, S]: each row's own slots (what it
    generated or appended after the prompt); prompt_k/prompt_v [B, L, K, h] and prompt_valid
    [B, L]: the prompt's cache, read by its R/B consecutive rows (row b*N+j is sample j of
    prompt b). The same softmax over the prompt's slots followed by the row's as
    jax.nn.dot_product_attention over the prompt's cache repeated N times along the rows and
    joined to the rows' slots, without building (or reading N times) the repeated copy; query
    head n reads kv head n // (n_heads / K), as there. Logits and softmax in float32.
    """
    rows, t, n, h = q.shape
    prompts, length, kv_heads, _ = prompt_k.shape
    per, groups = rows // prompts, n // kv_heads
    qg = q.reshape(prompts, per, t, kv_heads, groups, h)
    own_k = k.reshape(prompts, per, -1, kv_heads, h)
    own_v = v.reshape(prompts, per, -1, kv_heads, h)
    f32 = jnp.float32
    big_negative = jnp.asarray(-0.7 * jnp.finfo(f32).max, f32)
    prompt_scores = jnp.einsum("bntkgh,blkh->bntkgl", qg, prompt_k, preferred_element_type=f32)
    own_scores = jnp.einsum("bntkgh,bnskh->bntkgs", qg, own_k, preferred_element_type=f32)
    prompt_scores = jnp.where(
        prompt_valid.astype(bool)[:, None, None, None, None, :],
        prompt_scores * jnp.asarray(scale, f32),
        big_negative,
    )
    own_mask = mask.reshape(prompts, per, t, 1, 1, -1)
    own_scores = jnp.where(own_mask, own_scores * jnp.asarray(scale, f32), big_negative)
    probs = jax.nn.softmax(jnp.concatenate([prompt_scores, own_scores], axis=-1), axis=-1)
    out = jnp.einsum(
        "bntkgl,blkh->bntkgh", probs[..., :length].astype(prompt_v.dtype), prompt_v
    ) + jnp.einsum("bntkgs,bnskh->bntkgh", probs[..., length:].astype(own_v.dtype), own_v)
    return out.reshape(rows, t, n, h).astype(q.dtype)


class Attention(nnx.Module):
    def __init__(self, t: TextConfig, *, param_dtype, dtype, rngs, attention_chunk=0):
        d, n, k, h, std = (
            t.hidden_size,
            t.num_attention_heads,
            t.num_key_value_heads,
            t.head_dim,
            t.initializer_range,
        )
        self.q_proj = param(rngs, (d, n, h), ("embed", "heads", "head_dim"), param_dtype, std=std)
        self.k_proj = param(
            rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), param_dtype, std=std
        )
        self.v_proj = param(
            rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), param_dtype, std=std
        )
        self.o_proj = param(rngs, (n, h, d), ("heads", "head_dim", "embed"), param_dtype, std=std)
        if t.attention_bias:
            self.q_bias = param(None, (n, h), ("heads", "head_dim"), param_dtype, init="zeros")
            self.k_bias = param(None, (k, h), ("kv_heads", "head_dim"), param_dtype, init="zeros")
            self.v_bias = param(None, (k, h), ("kv_heads", "head_dim"), param_dtype, init="zeros")
            self.o_bias = param(None, (d,), ("embed",), param_dtype, init="zeros")
        self.q_norm = RMSNorm(
            h, "head_dim", param_dtype=param_dtype, dtype=dtype, eps=t.rms_norm_eps
        )
        self.k_norm = RMSNorm(
            h, "head_dim", param_dtype=param_dtype, dtype=dtype, eps=t.rms_norm_eps
        )
        self.bias, self.head_dim, self.dtype = t.attention_bias, h, dtype
        self.attention_chunk = attention_chunk

    def _proj(self, x, name):
        y = jnp.einsum("btd,dnh->btnh", x, getattr(self, f"{name}_proj")[...].astype(self.dtype))
        return y + getattr(self, f"{name}_bias")[...].astype(self.dtype) if self.bias else y

    def __call__(self, x, cos, sin, mask, kv_cache, write_index, shared=None):
        """Returns (out [B, T, D], (k, v)): without kv_cache the new k/v [B, T, K, H]; with
        kv_cache (k, v) (this layer's cache [B, S, K, H]) that cache with the new k/v written at
        write_index; with kv_cache (k, v, layer) (every layer's cache [layers, B, S, K, H] and
        this layer's index) that cache with the new k/v written at (layer, write_index).
        shared (k, v, valid): this layer's prompt cache [P, L, K, H] and its valid slots [P, L],
        read by each P-th of the rows before their own cache (`shared_prompt_attention`)."""
        q = apply_rotary(self.q_norm(self._proj(x, "q")), cos, sin)
        k = apply_rotary(self.k_norm(self._proj(x, "k")), cos, sin)
        v = self._proj(x, "v")
        new_kv = (k, v)
        if kv_cache is not None and len(kv_cache) == 3:
            # A decode step (TextModel.decode): the every-layer cache is written in place and
            # this layer's slice read back.
            cache_k, cache_v, layer = kv_cache
            at = tuple(jnp.asarray(i, jnp.int32) for i in (layer, 0, write_index, 0, 0))
            cache_k = jax.lax.dynamic_update_slice(cache_k, k.astype(cache_k.dtype)[None], at)
            cache_v = jax.lax.dynamic_update_slice(cache_v, v.astype(cache_v.dtype)[None], at)
            new_kv = (cache_k, cache_v)
            k = jax.lax.dynamic_index_in_dim(cache_k, layer, 0, keepdims=False)
            v = jax.lax.dynamic_index_in_dim(cache_v, layer, 0, keepdims=False)
        elif kv_cache is not None:
            cache_k, cache_v = kv_cache
            k = jax.lax.dynamic_update_slice_in_dim(
                cache_k, k.astype(cache_k.dtype), write_index, axis=1
            )
            v = jax.lax.dynamic_update_slice_in_dim(
                cache_v, v.astype(cache_v.dtype), write_index, axis=1
            )
            new_kv = (k, v)
        k, v, scale = k.astype(self.dtype), v.astype(self.dtype), self.head_dim**-0.5
        if shared is not None:
            out = shared_prompt_attention(q, k, v, mask, *shared, scale)
        elif kv_cache is None and 0 < self.attention_chunk < q.shape[1]:
            # Without a cache the mask is causal (qwen3_vl.segment_mask).
            out = causal_chunked_attention(q, k, v, mask, scale, self.attention_chunk)
        else:
            out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale)
        y = jnp.einsum("btnh,nhd->btd", out, self.o_proj[...].astype(self.dtype))
        if self.bias:
            y = y + self.o_bias[...].astype(self.dtype)
        return y, new_kv


class MLP(nnx.Module):
    def __init__(self, t: TextConfig, *, param_dtype, dtype, rngs):
        d, f, std = t.hidden_size, t.intermediate_size, t.initializer_range
        self.gate_proj = param(rngs, (d, f), ("embed", "mlp"), param_dtype, std=std)
        self.up_proj = param(rngs, (d, f), ("embed", "mlp"), param_dtype, std=std)
        self.down_proj = param(rngs, (f, d), ("mlp", "embed"), param_dtype, std=std)
        self.act, self.dtype = activation(t.hidden_act), dtype

    def __call__(self, x):
        gate = x @ self.gate_proj[...].astype(self.dtype)
        up = x @ self.up_proj[...].astype(self.dtype)
        return (self.act(gate) * up) @ self.down_proj[...].astype(self.dtype)


class DecoderLayer(nnx.Module):
    def __init__(self, t: TextConfig, *, param_dtype, dtype, rngs, attention_chunk=0):
        kw = dict(param_dtype=param_dtype, dtype=dtype)
        self.input_norm = RMSNorm(t.hidden_size, "embed", eps=t.rms_norm_eps, **kw)
        self.attn = Attention(t, rngs=rngs, attention_chunk=attention_chunk, **kw)
        self.post_attention_norm = RMSNorm(t.hidden_size, "embed", eps=t.rms_norm_eps, **kw)
        self.mlp = MLP(t, rngs=rngs, **kw)

    def __call__(self, x, cos, sin, mask, kv_cache, write_index, shared=None):
        attn, new_kv = self.attn(
            self.input_norm(x), cos, sin, mask, kv_cache, write_index, shared=shared
        )
        x = x + attn
        return x + self.mlp(self.post_attention_norm(x)), new_kv


class TextModel(nnx.Module):
    def __init__(
        self,
        t: TextConfig,
        *,
        tie_word_embeddings: bool,
        param_dtype,
        dtype,
        rngs,
        remat: bool = False,
        activation_sharding=None,
        attention_chunk: int = 0,
    ):
        kw = dict(param_dtype=param_dtype, dtype=dtype)
        self.config, self.dtype, self.remat, self.activation_sharding = (
            t,
            dtype,
            remat,
            activation_sharding,
        )
        self.embed = param(
            rngs,
            (t.vocab_size, t.hidden_size),
            ("vocab", "embed"),
            param_dtype,
            std=t.initializer_range,
        )
        self.layers = stacked(
            t.num_hidden_layers,
            lambda r: DecoderLayer(t, rngs=r, attention_chunk=attention_chunk, **kw),
        )(rngs)
        self.norm = RMSNorm(t.hidden_size, "embed", eps=t.rms_norm_eps, **kw)
        self.lm_head = (
            None
            if tie_word_embeddings
            else param(
                rngs,
                (t.hidden_size, t.vocab_size),
                ("embed", "vocab"),
                param_dtype,
                std=t.initializer_range,
            )
        )

    def embed_tokens(self, input_ids):
        """Returns [B, L, D] token embeddings in the compute dtype."""
        return self.embed[...][input_ids].astype(self.dtype)

    def decode(
        self,
        x,
        cos,
        sin,
        mask,
        *,
        deepstack=None,
        cache=None,
        write_index=0,
        output_hidden_states=False,
        shared=None,
    ):
        """Runs every decoder layer and the final norm.

        x [B, T, D]; cos/sin [B, T, head_dim]; mask [B, 1, T, S]; deepstack [n_ds, B, T, D] added
        after the first n_ds layers; cache {"k", "v"} [layers, B, S, K, H] or None; shared
        ({"k", "v"} [layers, P, L, K, H], valid [P, L]) or None: a prompt cache that each B/P
        consecutive rows read before their own cache (Attention's `shared`).
        Returns (hidden [B, T, D], new cache or None, per-layer outputs [layers, B, T, D] or None).

        The cache of a one-token step (a decode step) rides in the scans' carry and each layer
        writes its token's k/v there in place: passed through the scans' inputs and outputs, XLA
        copied the whole cache at every decoded token. Longer inputs (prefill, extend, the RL
        update's scoring) pass each layer its slice as a scan input: differentiated with remat,
        a carried cache would be saved whole at every layer (3.4x the gradient's temporary
        memory measured on 12 layers, docs/performance.md).
        """
        n_layers = self.config.num_hidden_layers
        x = self._constrain(x)
        in_place = cache is not None and x.shape[1] == 1

        def layer_fn(layer, carry, xs):
            index, kv, ds, prompt_kv = xs
            if in_place:
                carry, kv = carry[0], (*carry[1], index)
            h = self._constrain(carry)
            layer_shared = None if prompt_kv is None else (*prompt_kv, shared[1])
            h, new_kv = layer(h, cos, sin, mask, kv, write_index, shared=layer_shared)
            out_h = h
            if ds is not None:
                h = h + ds
            ys = (
                None if in_place or cache is None else new_kv,
                out_h if output_hidden_states else None,
            )
            return ((h, new_kv) if in_place else h), ys

        n_ds = 0 if deepstack is None else deepstack.shape[0]
        # Two scans: the DeepStack stretch carries its features as scan inputs, the rest none.
        stretches = (
            [(0, n_ds, deepstack), (n_ds, n_layers, None)] if n_ds else [(0, n_layers, None)]
        )
        carry = (x, (cache["k"], cache["v"])) if in_place else x
        outputs = []
        for start, stop, ds in stretches:
            # in place: each layer's index into the carried cache; else: its slice as an input
            index = jnp.arange(start, stop, dtype=jnp.int32) if in_place else None
            kv = (
                jax.tree.map(lambda a: a[start:stop], (cache["k"], cache["v"]))
                if cache is not None and not in_place
                else None
            )
            # a shared prompt cache is read only: each layer's slice as an input
            prompt_kv = (
                None
                if shared is None
                else jax.tree.map(lambda a: a[start:stop], (shared[0]["k"], shared[0]["v"]))
            )
            carry, ys = scan_layers(
                self.layers,
                carry,
                layer_fn,
                xs=(index, kv, ds, prompt_kv),
                start=start,
                stop=stop,
                remat=self.remat,
            )
            outputs.append(ys)
        new_cache, hidden_states = None, None
        if in_place:
            carry, new_cache = carry[0], dict(zip("kv", carry[1]))
        elif cache is not None:
            ks, vs = zip(*(o[0] for o in outputs))
            new_cache = {
                "k": jnp.concatenate(ks) if len(ks) > 1 else ks[0],
                "v": jnp.concatenate(vs) if len(vs) > 1 else vs[0],
            }
        if output_hidden_states:
            hidden_states = jnp.concatenate([o[1] for o in outputs])
        x = carry
        return self.norm(x), new_cache, hidden_states

    def _constrain(self, h):
        return constrain_rows(h, self.activation_sharding)

    def logits(self, hidden):
        """Returns float32 logits [B, T, V] (lm_head, or the embedding when tied)."""
        w = self.embed[...].T if self.lm_head is None else self.lm_head[...]
        return jnp.einsum(
            "btd,dv->btv", hidden, w.astype(self.dtype), preferred_element_type=jnp.float32
        )
