"""Hugging Face checkpoint import/export for Qwen3-VL (safetensors only, no torch).

One table, `_TABLE`, maps every mocojax parameter to its transformers tensor name and the
layout change between them; `load_pretrained` and `save_pretrained` both read it.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from mocojax.model import ModelConfig, abstract_params
from mocojax.model.qwen3_vl import Params

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "generation_config.json",
    "tokenizer.model",
)


# Layout changes: (to_hf(ours, cfg) -> hf array, from_hf(hf, ours_shape) -> ours array).
def _identity():
    return (lambda a: a), (lambda a, shape: a)


def _linear():
    # ours [in, out]; torch nn.Linear stores [out, in].
    return (lambda a: a.T), (lambda a, shape: a.T)


def _heads_in():
    # ours [D, N, H]; torch [N*H, D].
    return (lambda a: a.reshape(a.shape[0], -1).T), (lambda a, shape: a.T.reshape(shape))


def _heads_out():
    # ours [N, H, D]; torch [D, N*H].
    return (lambda a: a.reshape(-1, a.shape[-1]).T), (lambda a, shape: a.T.reshape(shape))


def _patch(cfg: ModelConfig):
    v = cfg.vision
    conv = (v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    # ours [C*T*P*P, D]; torch Conv3d weight [D, C, T, P, P] (kernel = stride = patch).
    return (lambda a: a.T.reshape(conv)), (lambda a, shape: a.reshape(conv[0], -1).T)


def _table(cfg: ModelConfig) -> list[tuple[str, str, tuple]]:
    """Returns rows (our dotted path, HF name with {i} for stacked layers, layout transforms).

    Long because it is the checkpoint's name map written out as data: rows for the patch embedding,
    the vision blocks, the merger(s) and the text layers, plus the optional rows (DeepStack mergers,
    attention biases, an untied lm_head); it reads best as one list.
    """
    rows = [
        ("visual.patch_embed.kernel", "model.visual.patch_embed.proj.weight", _patch(cfg)),
        ("visual.patch_embed.bias", "model.visual.patch_embed.proj.bias", _identity()),
        ("visual.pos_embed", "model.visual.pos_embed.weight", _identity()),
        ("text.embed", "model.language_model.embed_tokens.weight", _identity()),
        ("text.norm.scale", "model.language_model.norm.weight", _identity()),
    ]
    vb, tl = "model.visual.blocks.{i}", "model.language_model.layers.{i}"
    for ours, hf in (("norm1", "norm1"), ("norm2", "norm2")):
        rows += [
            (f"visual.blocks.{ours}.scale", f"{vb}.{hf}.weight", _identity()),
            (f"visual.blocks.{ours}.bias", f"{vb}.{hf}.bias", _identity()),
        ]
    for ours, hf in (
        ("attn.qkv", "attn.qkv"),
        ("attn.proj", "attn.proj"),
        ("fc1", "mlp.linear_fc1"),
        ("fc2", "mlp.linear_fc2"),
    ):
        rows += [
            (f"visual.blocks.{ours}.kernel", f"{vb}.{hf}.weight", _linear()),
            (f"visual.blocks.{ours}.bias", f"{vb}.{hf}.bias", _identity()),
        ]
    mergers = [("visual.merger", "model.visual.merger")]
    if cfg.vision.deepstack_visual_indexes:
        mergers.append(("visual.deepstack_mergers", "model.visual.deepstack_merger_list.{i}"))
    for ours, hf in mergers:
        rows += [
            (f"{ours}.norm.scale", f"{hf}.norm.weight", _identity()),
            (f"{ours}.norm.bias", f"{hf}.norm.bias", _identity()),
        ]
        for lin in ("fc1", "fc2"):
            rows += [
                (f"{ours}.{lin}.kernel", f"{hf}.linear_{lin}.weight", _linear()),
                (f"{ours}.{lin}.bias", f"{hf}.linear_{lin}.bias", _identity()),
            ]
    rows += [
        ("text.layers.input_norm.scale", f"{tl}.input_layernorm.weight", _identity()),
        (
            "text.layers.post_attention_norm.scale",
            f"{tl}.post_attention_layernorm.weight",
            _identity(),
        ),
        ("text.layers.attn.q_norm.scale", f"{tl}.self_attn.q_norm.weight", _identity()),
        ("text.layers.attn.k_norm.scale", f"{tl}.self_attn.k_norm.weight", _identity()),
        ("text.layers.attn.q_proj", f"{tl}.self_attn.q_proj.weight", _heads_in()),
        ("text.layers.attn.k_proj", f"{tl}.self_attn.k_proj.weight", _heads_in()),
        ("text.layers.attn.v_proj", f"{tl}.self_attn.v_proj.weight", _heads_in()),
        ("text.layers.attn.o_proj", f"{tl}.self_attn.o_proj.weight", _heads_out()),
        ("text.layers.mlp.gate_proj", f"{tl}.mlp.gate_proj.weight", _linear()),
        ("text.layers.mlp.up_proj", f"{tl}.mlp.up_proj.weight", _linear()),
        ("text.layers.mlp.down_proj", f"{tl}.mlp.down_proj.weight", _linear()),
    ]
    if cfg.text.attention_bias:
        for p in "qkv":
            rows.append(
                (
                    f"text.layers.attn.{p}_bias",
                    f"{tl}.self_attn.{p}_proj.bias",
                    (lambda a: a.reshape(-1), lambda a, shape: a.reshape(shape)),
                )
            )
        rows.append(("text.layers.attn.o_bias", f"{tl}.self_attn.o_proj.bias", _identity()))
    if not cfg.tie_word_embeddings:
        rows.append(("text.lm_head", "lm_head.weight", _linear()))
    return rows


def _get(tree, path: str):
    for key in path.split("."):
        tree = tree[key]
    return tree


def _set(tree, path: str, value) -> None:
    keys = path.split(".")
    for key in keys[:-1]:
        tree = tree.setdefault(key, {})
    tree[keys[-1]] = value


def hf_tensors(cfg: ModelConfig, params: Params) -> Iterator[tuple[str, np.ndarray]]:
    """Yields (HF tensor name, numpy array) for every parameter, stacked layers unrolled."""
    for ours, hf, (to_hf, _) in _table(cfg):
        value = np.asarray(jax.device_get(_get(params, ours)))
        if "{i}" in hf:
            for i in range(value.shape[0]):
                yield hf.format(i=i), np.ascontiguousarray(to_hf(value[i]))
        else:
            yield hf, np.ascontiguousarray(to_hf(value))


def expected_hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Returns {HF tensor name: shape} that a checkpoint of `cfg` must hold."""
    abstract = abstract_params(cfg)
    shapes = {}
    for ours, hf, (to_hf, _) in _table(cfg):
        spec = _get(abstract, ours)
        one = spec.shape[1:] if "{i}" in hf else spec.shape
        hf_shape = jax.eval_shape(
            lambda a: jnp.asarray(to_hf(a)), jax.ShapeDtypeStruct(one, spec.dtype)
        ).shape
        for i in range(spec.shape[0]) if "{i}" in hf else [None]:
            shapes[hf if i is None else hf.format(i=i)] = tuple(hf_shape)
    return shapes


def _inside(path: str, name: str, index: str) -> str:
    """Returns name if it stays inside the checkpoint directory; raises ValueError naming the index.
    The check is on the normalised path: symlinks inside (the HF cache's snapshots) still work."""
    root = os.path.abspath(path)
    if (
        not isinstance(name, str)
        or os.path.isabs(name)
        or os.path.commonpath([root, os.path.abspath(os.path.join(root, name))]) != root
    ):
        raise ValueError(
            f"{index}: weight file {name!r} is outside the checkpoint directory {root}; refused"
        )
    return name


def _checkpoint_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted({_inside(path, name, index) for name in weight_map.values()})
    else:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        bins = [f for f in os.listdir(path) if f.endswith((".bin", ".pt", ".pth", ".ckpt"))]
        hint = (
            f" (found {bins}: pickle checkpoints are never loaded; convert them to safetensors)"
            if bins
            else ""
        )
        raise FileNotFoundError(f"{path}: no *.safetensors files{hint}")
    missing = [f for f in files if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise FileNotFoundError(f"{path}: the index names files that are missing: {missing}")
    return [os.path.join(path, f) for f in files]


_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


def _open_safetensors(file: str):
    """Returns safe_open(file); a truncated or malformed file raises ValueError naming it."""
    try:
        return safe_open(file, framework="numpy")
    except Exception as error:  # safetensors raises its own SafetensorError (and OSError)
        raise ValueError(
            f"{file}: not a readable safetensors file ({type(error).__name__}: {error}); "
            "it may be truncated: download it again"
        ) from None


def _check_size(cfg: ModelConfig, path: str, where: dict) -> None:
    """Refuses a config that needs more than twice the tensors or elements the files hold, before
    any per-layer work: a config.json with num_hidden_layers=10**7 would otherwise spend minutes and
    all memory listing tensor names."""
    abstract = abstract_params(cfg)  # shapes only
    count = elements = 0
    for ours, hf, _ in _table(cfg):
        spec = _get(abstract, ours)
        count += spec.shape[0] if "{i}" in hf else 1
        elements += int(np.prod(spec.shape, dtype=np.float64))
    held = sum(int(np.prod(h.get_slice(n).get_shape(), dtype=np.float64)) for n, h in where.items())
    # Twice the weights: far off, so listing names is pointless (smaller gaps get the exact
    # missing / mis-shaped tensor names below).
    if count > 2 * len(where) or elements > 2 * held:
        raise ValueError(
            f"{path}/config.json describes {count} tensors of {elements:.4g} elements in all (e.g. "
            f"num_hidden_layers={cfg.text.num_hidden_layers}, hidden_size={cfg.text.hidden_size}), but the "
            f"safetensors hold {len(where)} tensors of {held:.4g} elements; config.json does not match the weights"
        )


def _finite_tensor(where: dict, name: str, path: str) -> np.ndarray:
    """Returns tensor `name`; raises ValueError naming it if any value is NaN or infinite."""
    value = where[name].get_tensor(name)
    finite = np.isfinite(value.astype(np.float32) if value.dtype.kind not in "f" else value)
    if not finite.all():
        raise ValueError(
            f"{path}: tensor {name} holds {int(finite.size - finite.sum())} non-finite values "
            f"(NaN or inf) of {finite.size}; the checkpoint is damaged"
        )
    return value


def load_pretrained(
    path: str | os.PathLike,
    dtype=jnp.float32,
    *,
    compute_dtype=None,
    place: Callable[[str, np.ndarray], jax.Array] | None = None,
) -> tuple[ModelConfig, Params]:
    """Returns (cfg, params) read from an HF Qwen3-VL directory (config.json + safetensors).

    dtype is the parameter dtype (compute dtype defaults to it). `place(our_path, array)` puts
    each assembled parameter on its device(s) (e.g. straight onto its sharding); the default
    is `jnp.asarray`. Raises with the tensor names on missing, unexpected or mis-shaped tensors,
    non-float or non-finite weights; with the file name on a truncated safetensors file; and
    refuses an index that points outside the directory or a config larger than the weights.

    Long because the structural checks (size against the config, missing and unexpected names,
    shapes, dtypes) share `where` and `expected` and all run before the first tensor's values are
    read; the loop after them reads, checks finiteness, converts and places each parameter.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is not a directory")
    dtype_name = jnp.dtype(dtype).name
    cfg = ModelConfig.from_pretrained(
        path, param_dtype=dtype_name, dtype=jnp.dtype(compute_dtype or dtype).name
    )
    handles = [_open_safetensors(f) for f in _checkpoint_files(path)]
    where = {name: h for h in handles for name in h.keys()}
    _check_size(cfg, path, where)  # before expected_hf_shapes builds one name per stacked layer
    expected = expected_hf_shapes(cfg)
    # Tied checkpoints sometimes still carry lm_head.weight: it is the embedding, so skip it.
    ignorable = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    missing = sorted(set(expected) - set(where))
    unexpected = sorted(set(where) - set(expected) - ignorable)
    if missing or unexpected:
        raise ValueError(
            f"{path}: checkpoint does not match its config: missing {len(missing)} tensors {missing[:8]}"
            f"{'...' if len(missing) > 8 else ''}; unexpected {len(unexpected)} tensors {unexpected[:8]}"
            f"{'...' if len(unexpected) > 8 else ''}"
        )
    for name, shape in expected.items():
        tensor = where[name].get_slice(name)
        got = tuple(tensor.get_shape())
        if got != shape:
            raise ValueError(
                f"{path}: tensor {name} has shape {got}, expected {shape} for this config"
            )
        if tensor.get_dtype() not in _FLOAT_DTYPES:
            raise ValueError(
                f"{path}: tensor {name} has dtype {tensor.get_dtype()}; the weights must be floating point "
                f"({', '.join(_FLOAT_DTYPES)}); quantised checkpoints are not supported"
            )
    place = place or (lambda _, a: jnp.asarray(a))
    abstract = abstract_params(cfg)
    params: Params = {}
    for ours, hf, (_, from_hf) in _table(cfg):
        spec = _get(abstract, ours)
        if "{i}" in hf:
            one = spec.shape[1:]
            value = np.stack(
                [
                    from_hf(_finite_tensor(where, n, path), one)
                    for n in (hf.format(i=i) for i in range(spec.shape[0]))
                ]
            )
        else:
            value = from_hf(_finite_tensor(where, hf, path), spec.shape)
        _set(params, ours, place(ours, np.asarray(value).astype(dtype)))
    return cfg, params


def save_pretrained(
    path: str | os.PathLike,
    cfg: ModelConfig,
    params: Params,
    tokenizer_path: str | os.PathLike | None = None,
    *,
    max_shard_bytes: int = 2 * 1024**3,
) -> None:
    """Writes an HF directory (sharded safetensors + index + config.json) that transformers loads.

    Tensors keep the parameters' dtype. Tokenizer / processor files found in tokenizer_path are
    copied beside the weights.
    """
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, value in hf_tensors(cfg, params):
        if size and size + value.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = value
        size += value.nbytes
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        fname = (
            "model.safetensors"
            if len(shards) == 1
            else f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        )
        save_file(shard, os.path.join(path, fname), metadata={"format": "pt"})
        for name, value in shard.items():
            weight_map[name] = fname
            total += value.nbytes
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
            f,
            indent=2,
        )
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg.to_hf_dict(), f, indent=2)
    if tokenizer_path is not None:
        copied = [n for n in _TOKENIZER_FILES if os.path.isfile(os.path.join(tokenizer_path, n))]
        if not copied:
            raise FileNotFoundError(
                f"{tokenizer_path} holds no tokenizer files ({', '.join(_TOKENIZER_FILES[:3])}, ...)"
            )
        for name in copied:
            shutil.copy2(os.path.join(tokenizer_path, name), os.path.join(path, name))
