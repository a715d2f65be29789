"""Device mesh, logical-axis rules, and the shardings of parameters, train state, batches and KV cache.

Sharding lives outside the model. The model names every parameter dim with a logical axis
(`model.param_axes`); a list of (logical_name, mesh_axes) rules maps those names to mesh axes;
optimizer state, momentum, batches and the KV cache derive their shardings from the same rules.
The rules are `DEFAULT_RULES`, fixed in this module (every function takes `rules=` to override
them); a config chooses only the mesh (`config.mesh`, e.g. "fsdp=4,tensor=2").

How a rule applies to one dim (the contract tests rely on):
- rule None, or a mesh axis the mesh does not have: the dim is replicated;
- a mesh axis already used by an earlier dim of the same array: replicated (an axis may
  shard only one dim);
- a dim the mesh axis size does not divide: replicated, with one warning per (name, size);
  batch dims raise instead, since a replicated batch silently repeats every example;
- a logical name with no rule at all: ValueError, so a typo cannot silently replicate.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from mocojax import model, momentum

MeshAxes = Sequence[tuple[str, int]]
Rules = Sequence[tuple[str, Any]]

# data: pure data parallel (params replicated); fsdp: data parallel with params, grads and
# optimizer state sharded (ZeRO-3); tensor: Megatron-style heads / mlp / vocab split.
DEFAULT_MESH: MeshAxes = (("data", 1), ("fsdp", -1), ("tensor", 1))
DATA_AXES = ("data", "fsdp")
DEFAULT_RULES: Rules = (
    ("batch", DATA_AXES),
    ("length", None),
    ("kv_length", None),
    ("layers", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("patch", None),
    ("vision_pos", None),
    ("vision_embed", "fsdp"),
    ("vision_qkv", "tensor"),
    ("vision_mlp", "tensor"),
    ("vision_merged", "fsdp"),
    ("vision_merged_out", "tensor"),
)
# Logical axes of the KV cache {"k", "v"} [layers, B, S, K, H] that model.apply reads and writes.
KV_CACHE_AXES = ("layers", "batch", "kv_length", "kv_heads", "head_dim")

_warned: set = set()


def parse_mesh(spec: str | Mapping[str, int] | MeshAxes | None) -> MeshAxes:
    """Returns mesh axes as ((name, size), ...) from "fsdp=4,tensor=2", a dict or pairs (None: default)."""
    if spec is None:
        return tuple(DEFAULT_MESH)
    if isinstance(spec, str):
        pairs = []
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, _, size = item.partition("=")
            if not size:
                raise ValueError(
                    f"mesh item {item!r} must look like name=size (e.g. 'fsdp=4,tensor=2')"
                )
            pairs.append((name.strip(), int(size)))
        return tuple(pairs)
    if isinstance(spec, Mapping) or hasattr(spec, "items"):
        return tuple((str(k), int(v)) for k, v in spec.items())
    return tuple((str(k), int(v)) for k, v in spec)


def resolve_mesh_shape(axes: MeshAxes, num_devices: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Returns (names, sizes) with the one size -1 (if any) set to the devices left over."""
    names = tuple(n for n, _ in axes)
    sizes = [s for _, s in axes]
    if len(set(names)) != len(names):
        raise ValueError(f"mesh axis names repeat: {names}")
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {dict(axes)}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise ValueError(
                f"mesh {dict(axes)}: {num_devices} devices do not split into the fixed axes ({known})"
            )
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(
            f"mesh {dict(zip(names, sizes))} needs {math.prod(sizes)} devices, have {num_devices}"
        )
    return names, tuple(sizes)


def make_mesh(axes: str | Mapping[str, int] | MeshAxes | None = None, devices=None) -> Mesh:
    """Returns a Mesh over `devices` (default: all, every process) with the config's axes."""
    devices = jax.devices() if devices is None else list(devices)
    names, sizes = resolve_mesh_shape(parse_mesh(axes), len(devices))
    return jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(names), devices=devices)


def logical_spec(
    axes: Sequence[str | None],
    shape: Sequence[int],
    mesh: Mesh,
    rules: Rules = DEFAULT_RULES,
    *,
    strict: Sequence[str] = ("batch",),
) -> P:
    """Returns the PartitionSpec of an array with logical `axes` and `shape` under `rules` (see module doc)."""
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for name, size in zip(axes, shape, strict=True):
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise ValueError(
                f"no sharding rule for logical axis {name!r}; rules cover {sorted(table)}"
            )
        rule = table[name]
        mesh_axes = () if rule is None else (rule,) if isinstance(rule, str) else tuple(rule)
        mesh_axes = tuple(a for a in mesh_axes if a in mesh.shape and a not in used)
        ways = math.prod(mesh.shape[a] for a in mesh_axes)
        if ways > 1 and size % ways:
            if name in strict:
                raise ValueError(
                    f"{name} dim of size {size} does not divide over mesh axes {mesh_axes} ({ways} ways)"
                )
            if (name, size, mesh_axes) not in _warned:
                _warned.add((name, size, mesh_axes))
                logging.warning(
                    "sharding: %s dim of size %d does not divide over %s (%d ways); replicated",
                    name,
                    size,
                    mesh_axes,
                    ways,
                )
            mesh_axes = ()
        used.update(mesh_axes)
        spec.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return P(*spec)


def logical_sharding(mesh: Mesh, axes, shape, rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """Returns the NamedSharding of an array with logical `axes` and `shape` on `mesh`."""
    return NamedSharding(mesh, logical_spec(axes, shape, mesh, rules))


def replicated(mesh: Mesh) -> NamedSharding:
    """Returns the fully replicated sharding on `mesh` (scalars, rng, metrics)."""
    return NamedSharding(mesh, P())


def batch_axes(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> tuple[str, ...]:
    """Returns the mesh axes the rules' "batch" rule splits rows over, of those `mesh` has."""
    rule = dict(rules).get("batch")
    rule = () if rule is None else (rule,) if isinstance(rule, str) else tuple(rule)
    return tuple(a for a in rule if a in mesh.shape)


def batch_ways(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> int:
    """Returns how many ways the data axes split a batch dim on `mesh` (1: no data parallelism)."""
    return math.prod(mesh.shape[a] for a in batch_axes(mesh, rules))


def model_config(
    cfg: model.ModelConfig, mesh: Mesh, rules: Rules = DEFAULT_RULES
) -> model.ModelConfig:
    """Returns cfg whose decoder pins hidden states [B, L, D] to rows over the data axes (B must divide them).

    Without it XLA follows the weights, split on embed by fsdp, and shards activations by
    embed with the full batch on every device: at 8B, 2048 tokens, 4x the memory per row.
    """
    return cfg.replace(
        activation_sharding=NamedSharding(mesh, P(batch_axes(mesh, rules) or None, None, None))
    )


def param_shardings(cfg: model.ModelConfig, mesh: Mesh, rules: Rules = DEFAULT_RULES):
    """Returns the params tree of NamedShardings for `cfg` on `mesh` under `rules`."""
    axes = model.param_axes(cfg)
    shapes = model.abstract_params(cfg)
    return jax.tree.map(
        lambda a, s: logical_sharding(mesh, a, s.shape, rules),
        axes,
        shapes,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def optimizer_shardings(
    optimizer: optax.GradientTransformation, params_abstract, params_shardings, mesh: Mesh
):
    """Returns shardings of optimizer.init(params): param-shaped leaves (Adam mu, nu) mirror the params, the rest replicated."""
    state = jax.eval_shape(optimizer.init, params_abstract)
    return optax.tree_map_params(
        optimizer,
        lambda _, s: s,
        state,
        params_shardings,
        transform_non_params=lambda _: replicated(mesh),
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )


def train_state_shardings(
    cfg: model.ModelConfig,
    mesh: Mesh,
    optimizer,
    rules: Rules = DEFAULT_RULES,
    *,
    with_momentum: bool = True,
):
    """Returns shardings of the train state {"params", "opt_state", "momentum"?, "step", "rng"}."""
    params = param_shardings(cfg, mesh, rules)
    out = {
        "params": params,
        "opt_state": optimizer_shardings(optimizer, model.abstract_params(cfg), params, mesh),
        "step": replicated(mesh),
        "rng": replicated(mesh),
    }
    if with_momentum:
        out["momentum"] = params
    return out


def init_train_state(
    cfg: model.ModelConfig,
    mesh: Mesh,
    optimizer,
    rng,
    rules: Rules = DEFAULT_RULES,
    *,
    params=None,
    with_momentum: bool = True,
):
    """Returns (train state, its shardings), every leaf born on its sharding.

    Fresh parameters come from model.init_params(cfg, rng) inside one jit whose
    out_shardings place them, so no device ever holds the whole model; with `params`
    (e.g. from hf.load_pretrained with `placer`) only opt_state and momentum are built.
    `rng` is stored as given (a key for the trainer's sampling and dropout).
    """
    shardings = train_state_shardings(cfg, mesh, optimizer, rules, with_momentum=with_momentum)

    def build(params, rng):
        state = {
            "params": params,
            "opt_state": optimizer.init(params),
            "step": jnp.zeros((), jnp.int32),
            "rng": rng,
        }
        if with_momentum:
            state["momentum"] = momentum.init_momentum(params)
        return state

    if params is None:
        init = jax.jit(
            lambda rng: build(model.init_params(cfg, jax.random.fold_in(rng, 0)), rng),
            out_shardings=shardings,
        )
        return init(rng), shardings
    init = jax.jit(
        build, in_shardings=(shardings["params"], replicated(mesh)), out_shardings=shardings
    )
    return init(params, rng), shardings


def placer(
    cfg: model.ModelConfig, mesh: Mesh, rules: Rules = DEFAULT_RULES
) -> Callable[[str, np.ndarray], jax.Array]:
    """Returns place(dotted_path, host_array) -> jax.Array on its sharding, for hf.load_pretrained.

    Every process reads the full tensor and hands each of its devices only that device's slice,
    so this works unchanged on many hosts.
    """
    flat = {
        ".".join(str(k.key) for k in path): s
        for path, s in jax.tree_util.tree_flatten_with_path(param_shardings(cfg, mesh, rules))[0]
    }

    def place(path: str, array: np.ndarray) -> jax.Array:
        return jax.make_array_from_callback(array.shape, flat[path], lambda index: array[index])

    return place


def batch_sharding(
    mesh: Mesh,
    shape,
    batch_dim: int | None = 0,
    rules: Rules = DEFAULT_RULES,
    *,
    strict: bool = True,
) -> NamedSharding:
    """Returns the sharding of one batch array: dim `batch_dim` along the data axes (None: replicated).

    A batch dim the data axes do not divide raises, or with strict=False is replicated (with
    one warning): the sampler's and the RL update's row counts follow the data, not the mesh.
    """
    axes = [None] * len(shape)
    if batch_dim is not None:
        axes[batch_dim] = "batch"
    return NamedSharding(
        mesh, logical_spec(axes, shape, mesh, rules, strict=("batch",) if strict else ())
    )


def mesh_of(tree) -> Mesh | None:
    """Returns the Mesh a tree's arrays are sharded over (its first leaf's), or None for host
    arrays and single-device arrays: the sampler places its inputs on the params' mesh."""
    for leaf in jax.tree.leaves(tree):
        s = getattr(leaf, "sharding", None)
        return s.mesh if isinstance(s, NamedSharding) and s.mesh.size > 1 else None
    return None


def kv_cache_shardings(mesh: Mesh, shape, rules: Rules = DEFAULT_RULES) -> dict:
    """Returns {"k", "v"} shardings of a KV cache [layers, B, S, K, H]: rows on the data axes, kv heads on tensor."""
    sharding = logical_sharding(mesh, KV_CACHE_AXES, shape, rules)
    return {"k": sharding, "v": sharding}


def per_device_bytes(abstract_tree, shardings) -> int:
    """Returns the bytes one device holds of a tree of arrays/ShapeDtypeStructs under `shardings`."""
    sizes = jax.tree.map(
        lambda x, s: math.prod(s.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize,
        abstract_tree,
        shardings,
    )
    return int(sum(jax.tree.leaves(sizes)))
