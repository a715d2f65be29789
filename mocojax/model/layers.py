"""Small NNX building blocks shared by the vision tower and the text decoder.

Every parameter carries logical axis names (`out_sharding`, not eagerly applied) so
`mocojax.sharding` can place it on any mesh; names used: embed, vocab, heads, kv_heads,
head_dim, mlp, patch, vision_embed, vision_mlp, layers.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx


def param(
    rngs: nnx.Rngs | None, shape, axes, dtype, *, init: str = "normal", std: float = 0.02
) -> nnx.Param:
    """Returns an nnx.Param of `shape` with logical axes `axes` (normal(std), zeros or ones init)."""
    if len(axes) != len(shape):
        raise ValueError(f"axes {axes} do not match shape {shape}")
    if init == "normal":
        value = std * jax.random.normal(rngs.params(), shape, jnp.float32)
    elif init == "zeros":
        value = jnp.zeros(shape, jnp.float32)
    elif init == "ones":
        value = jnp.ones(shape, jnp.float32)
    else:
        raise ValueError(f"unknown init {init!r}")
    return nnx.Param(value.astype(dtype), out_sharding=tuple(axes), eager_sharding=False)


def activation(name: str):
    """Returns the activation function called `name` in HF configs."""
    if name == "silu":
        return jax.nn.silu
    if name == "gelu_pytorch_tanh":
        return lambda x: jax.nn.gelu(x, approximate=True)
    if name == "gelu":
        return lambda x: jax.nn.gelu(x, approximate=False)
    raise ValueError(f"unsupported activation {name!r}")


class Dense(nnx.Module):
    """y = x @ kernel (+ bias); kernel [in, out] with logical axes `axes`."""

    def __init__(self, din, dout, axes, *, bias: bool, param_dtype, dtype, std, rngs):
        self.kernel = param(rngs, (din, dout), axes, param_dtype, std=std)
        self.bias = param(None, (dout,), axes[1:], param_dtype, init="zeros") if bias else None
        self.dtype = dtype

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        y = x.astype(self.dtype) @ self.kernel[...].astype(self.dtype)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


class LayerNorm(nnx.Module):
    """LayerNorm with scale and bias, statistics in float32 (eps 1e-6 as Qwen3-VL's vision tower)."""

    def __init__(self, dim, axis_name, *, param_dtype, dtype, eps: float = 1e-6):
        self.scale = param(None, (dim,), (axis_name,), param_dtype, init="ones")
        self.bias = param(None, (dim,), (axis_name,), param_dtype, init="zeros")
        self.eps, self.dtype = eps, dtype

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        xf = x.astype(jnp.float32)
        mean = xf.mean(-1, keepdims=True)
        var = jnp.square(xf - mean).mean(-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + self.eps)
        y = y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y.astype(self.dtype)


class RMSNorm(nnx.Module):
    """RMSNorm: normalise in float32, cast back, then scale (the order transformers uses)."""

    def __init__(self, dim, axis_name, *, param_dtype, dtype, eps: float):
        self.scale = param(None, (dim,), (axis_name,), param_dtype, init="ones")
        self.eps, self.dtype = eps, dtype

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.square(xf).mean(-1, keepdims=True) + self.eps)
        return self.scale[...].astype(self.dtype) * y.astype(self.dtype)


def scan_layers(
    layers: nnx.Module,
    carry,
    fn,
    xs=None,
    start: int = 0,
    stop: int | None = None,
    remat: bool = False,
):
    """Runs `fn(layer, carry, x) -> (carry, y)` over stacked layers[start:stop] with lax.scan.

    Layers are built with nnx.vmap (parameters stacked on a leading `layers` axis); one scan
    keeps the compiled program the size of one layer whatever the depth. remat recomputes each
    layer in the backward pass (prevent_cse=False is safe, and faster, inside a scan).
    """
    graphdef, state = nnx.split(layers)
    if start or stop is not None:
        state = jax.tree.map(lambda a: a[start:stop], state)

    def body(c, inputs):
        layer_state, x = inputs
        return fn(nnx.merge(graphdef, layer_state), c, x)

    if remat:
        body = jax.checkpoint(body, prevent_cse=False)
    return jax.lax.scan(body, carry, (state, xs))


def stacked(n: int, make):
    """Returns `make(rngs)` built n times with parameters stacked on a leading `layers` axis."""

    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def build(rngs):
        return make(rngs)

    return build


def constrain_rows(x, activation_sharding):
    """Returns activations x [rows, ...] pinned to rows as activation_sharding (a NamedSharding of
    [B, L, D], `ModelConfig.activation_sharding`) splits B; other dims unconstrained.

    x is returned as is without a sharding, or when the data axes do not divide its rows (a
    sampler call of 3 prompts on 8 devices): those are left to XLA's propagation.
    """
    if activation_sharding is None:
        return x
    axes = activation_sharding.spec[0] if len(activation_sharding.spec) else None
    names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    if x.shape[0] % math.prod(activation_sharding.mesh.shape[a] for a in names):
        return x
    spec = jax.sharding.PartitionSpec(axes, *([None] * (x.ndim - 1)))
    return jax.lax.with_sharding_constraint(
        x, jax.sharding.NamedSharding(activation_sharding.mesh, spec)
    )
