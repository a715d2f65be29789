"""Qwen3-VL model configuration: a frozen dataclass, HF `config.json` in/out, presets, tiny configs."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """Shapes of the Qwen3-VL vision tower (HF `vision_config`)."""

    depth: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    out_hidden_size: int = 4096
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0
    initializer_range: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Length of one flattened patch row of `pixel_values`."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def num_grid_per_side(self) -> int:
        return int(self.num_position_embeddings**0.5)


@dataclasses.dataclass(frozen=True)
class TextConfig:
    """Shapes of the Qwen3-VL text decoder (HF `text_config`)."""

    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 5_000_000.0
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    max_position_embeddings: int = 262144
    hidden_act: str = "silu"
    attention_bias: bool = False
    initializer_range: float = 0.02


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A whole Qwen3-VL model: text decoder, vision tower, special token ids and dtypes.

    `param_dtype` is the storage dtype of the parameters; `dtype` is the compute dtype of
    activations (fp32/fp32 for parity tests, fp32/bf16 or bf16/bf16 for speed). `remat`
    recomputes each decoder layer and vision block in the backward pass (jax.checkpoint), so
    training keeps one input per layer instead of every intermediate; it changes no result.
    `logits_chunk` > 0 makes training and scoring (`model.target_logprobs`) compute the
    float32 log-softmax over the vocabulary `logits_chunk` positions at a time, recomputed in
    the backward pass, so no [B, L, V] tensor is held (0: all positions at once).
    `attention_chunk` > 0 makes the decoder's self-attention without a KV cache (training,
    scoring, prefill) run `attention_chunk` queries at a time against only the keys up to the
    chunk's end: causal masking makes the skipped scores zero, so the result is unchanged and
    about half the [T, T] scores are never computed (0: all queries at once).
    `shared_prompt_cache` makes sampling keep one KV cache per prompt for its N samples (and the
    RL update's scoring of N completions per prompt) instead of N copies: each row's own cache
    holds only the slots after the prompt and attention reads the prompt's slots once per group
    (`mocojax.model.text.shared_prompt_attention`); the same attention up to float rounding, N
    times less cache memory for the prompt, and no N-fold copy read at every decoded token.
    `activation_sharding` (a jax.sharding.Sharding of [B, L, D] hidden states, set by
    `mocojax.sharding.model_config`) pins the decoder's hidden states to it at every layer, so
    a mesh shards activations by rows instead of by the embed dim the weights are split on.
    """

    text: TextConfig = TextConfig()
    vision: VisionConfig = VisionConfig()
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    tie_word_embeddings: bool = False
    param_dtype: str = "float32"
    dtype: str = "float32"
    remat: bool = False
    logits_chunk: int = 0
    attention_chunk: int = 0
    shared_prompt_cache: bool = False
    activation_sharding: Any = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the field when the configuration is inconsistent."""
        t, v = self.text, self.vision
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(
                    f"ModelConfig.{name}={getattr(self, name)!r}; expected one of {_DTYPES}"
                )
        if t.num_attention_heads % t.num_key_value_heads:
            raise ValueError(
                f"text.num_attention_heads={t.num_attention_heads} is not a multiple of "
                f"text.num_key_value_heads={t.num_key_value_heads}"
            )
        if t.head_dim % 2 or sum(t.mrope_section) != t.head_dim // 2:
            raise ValueError(
                f"text.mrope_section={t.mrope_section} must sum to head_dim/2={t.head_dim // 2}"
            )
        if v.hidden_size % v.num_heads or (v.hidden_size // v.num_heads) % 4:
            raise ValueError(
                f"vision.hidden_size={v.hidden_size} must split into num_heads={v.num_heads} heads of a multiple of 4"
            )
        if v.num_grid_per_side**2 != v.num_position_embeddings:
            raise ValueError(
                f"vision.num_position_embeddings={v.num_position_embeddings} must be a square"
            )
        if v.out_hidden_size != t.hidden_size:
            raise ValueError(
                f"vision.out_hidden_size={v.out_hidden_size} != text.hidden_size={t.hidden_size}"
            )
        if any(i < 0 or i >= v.depth for i in v.deepstack_visual_indexes) or list(
            v.deepstack_visual_indexes
        ) != sorted(set(v.deepstack_visual_indexes)):
            raise ValueError(
                f"vision.deepstack_visual_indexes={v.deepstack_visual_indexes} must be increasing layer indices < depth={v.depth}"
            )
        if len(v.deepstack_visual_indexes) > t.num_hidden_layers:
            raise ValueError("more DeepStack features than decoder layers")

    def replace(self, **kwargs) -> "ModelConfig":
        """Returns a copy with the given top-level fields replaced."""
        return dataclasses.replace(self, **kwargs)

    # ---------------------------------------------------------------- HF config.json
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], **overrides) -> "ModelConfig":
        """Returns the config of an HF Qwen3-VL `config.json` dict (raises on another model type).

        Long because it is the field-by-field map from HF's text_config / vision_config keys to
        ours, each with its default when the key is absent, plus the checks for unsupported rope
        types and activations; as one table it can be read against a config.json.
        """
        if d.get("model_type") != "qwen3_vl":
            raise ValueError(
                f"not a Qwen3-VL config: model_type={d.get('model_type')!r} (expected 'qwen3_vl'; "
                "MoE variants 'qwen3_vl_moe' are not supported)"
            )
        td, vd = d.get("text_config") or {}, d.get("vision_config") or {}
        trope = td.get("rope_parameters") or td.get("rope_scaling") or {}
        if trope.get("rope_type", trope.get("type", "default")) != "default":
            raise ValueError(
                f"unsupported text rope_type {trope.get('rope_type')!r}: only 'default' (MRoPE) is ported"
            )
        theta = trope.get("rope_theta", td.get("rope_theta", 5_000_000.0))
        vrope = vd.get("rope_parameters") or {}
        num_heads = td.get("num_attention_heads", 32)
        text = TextConfig(
            vocab_size=td.get("vocab_size", 151936),
            hidden_size=td.get("hidden_size", 4096),
            intermediate_size=td.get("intermediate_size", 22016),
            num_hidden_layers=td.get("num_hidden_layers", 32),
            num_attention_heads=num_heads,
            num_key_value_heads=td.get("num_key_value_heads") or num_heads,
            head_dim=td.get("head_dim") or td.get("hidden_size", 4096) // num_heads,
            rms_norm_eps=td.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            mrope_section=tuple(trope.get("mrope_section", (24, 20, 20))),
            max_position_embeddings=td.get("max_position_embeddings", 128000),
            hidden_act=td.get("hidden_act", "silu"),
            attention_bias=bool(td.get("attention_bias", False)),
            initializer_range=td.get("initializer_range", 0.02),
        )
        vision = VisionConfig(
            depth=vd.get("depth", 27),
            hidden_size=vd.get("hidden_size", 1152),
            intermediate_size=vd.get("intermediate_size", 4304),
            num_heads=vd.get("num_heads", 16),
            out_hidden_size=vd.get("out_hidden_size", 3584),
            in_channels=vd.get("in_channels", 3),
            patch_size=vd.get("patch_size", 16),
            temporal_patch_size=vd.get("temporal_patch_size", 2),
            spatial_merge_size=vd.get("spatial_merge_size", 2),
            num_position_embeddings=vd.get("num_position_embeddings", 2304),
            deepstack_visual_indexes=tuple(vd.get("deepstack_visual_indexes", (8, 16, 24))),
            hidden_act=vd.get("hidden_act", "gelu_pytorch_tanh"),
            rope_theta=float(vrope.get("rope_theta", 10000.0)),
            initializer_range=vd.get("initializer_range", 0.02),
        )
        for name, act in (("text", text.hidden_act), ("vision", vision.hidden_act)):
            if act not in _ACTIVATIONS:
                raise ValueError(
                    f"unsupported {name} hidden_act {act!r}; supported: {sorted(_ACTIVATIONS)}"
                )
        # The tie flag sits at the top level in transformers 5 and inside text_config in some
        # published checkpoints; either one set means tied.
        tie = bool(d.get("tie_word_embeddings", False) or td.get("tie_word_embeddings", False))
        fields = dict(
            text=text,
            vision=vision,
            image_token_id=d.get("image_token_id", 151655),
            video_token_id=d.get("video_token_id", 151656),
            vision_start_token_id=d.get("vision_start_token_id", 151652),
            vision_end_token_id=d.get("vision_end_token_id", 151653),
            tie_word_embeddings=tie,
        )
        fields.update(overrides)
        return cls(**fields)

    def to_hf_dict(self) -> dict[str, Any]:
        """Returns an HF `config.json` dict that transformers' Qwen3VLConfig reads back to this config."""
        t, v = self.text, self.vision
        return {
            "architectures": ["Qwen3VLForConditionalGeneration"],
            "model_type": "qwen3_vl",
            "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id,
            "vision_start_token_id": self.vision_start_token_id,
            "vision_end_token_id": self.vision_end_token_id,
            "tie_word_embeddings": self.tie_word_embeddings,
            "dtype": self.param_dtype,
            "text_config": {
                "model_type": "qwen3_vl_text",
                "vocab_size": t.vocab_size,
                "hidden_size": t.hidden_size,
                "intermediate_size": t.intermediate_size,
                "num_hidden_layers": t.num_hidden_layers,
                "num_attention_heads": t.num_attention_heads,
                "num_key_value_heads": t.num_key_value_heads,
                "head_dim": t.head_dim,
                "hidden_act": t.hidden_act,
                "max_position_embeddings": t.max_position_embeddings,
                "initializer_range": t.initializer_range,
                "rms_norm_eps": t.rms_norm_eps,
                "attention_bias": t.attention_bias,
                "attention_dropout": 0.0,
                "tie_word_embeddings": self.tie_word_embeddings,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": t.rope_theta,
                    "mrope_section": list(t.mrope_section),
                    "mrope_interleaved": True,
                },
            },
            "vision_config": {
                "model_type": "qwen3_vl_vision",
                "depth": v.depth,
                "hidden_size": v.hidden_size,
                "intermediate_size": v.intermediate_size,
                "num_heads": v.num_heads,
                "out_hidden_size": v.out_hidden_size,
                "in_channels": v.in_channels,
                "patch_size": v.patch_size,
                "temporal_patch_size": v.temporal_patch_size,
                "spatial_merge_size": v.spatial_merge_size,
                "num_position_embeddings": v.num_position_embeddings,
                "deepstack_visual_indexes": list(v.deepstack_visual_indexes),
                "hidden_act": v.hidden_act,
                "initializer_range": v.initializer_range,
                "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta},
            },
        }

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides) -> "ModelConfig":
        """Returns the config read from `path/config.json` (clear error when missing or not Qwen3-VL)."""
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise FileNotFoundError(f"{path} is not an HF checkpoint directory: no config.json")
        with open(cfg_path) as f:
            d = json.load(f)
        try:
            return cls.from_hf_dict(d, **overrides)
        except ValueError as e:
            raise ValueError(f"{cfg_path}: {e}") from None


_ACTIVATIONS = {"silu", "gelu_pytorch_tanh", "gelu"}


def _preset(text: TextConfig, vision: VisionConfig, tie: bool) -> ModelConfig:
    return ModelConfig(text=text, vision=vision, tie_word_embeddings=tie)


_VISION_SMALL = dict(
    depth=24,
    hidden_size=1024,
    intermediate_size=4096,
    num_heads=16,
    deepstack_visual_indexes=(5, 11, 17),
)
_VISION_LARGE = dict(
    depth=27,
    hidden_size=1152,
    intermediate_size=4304,
    num_heads=16,
    deepstack_visual_indexes=(8, 16, 24),
)


def _text(hidden, inter, layers, heads, kv=8) -> TextConfig:
    return TextConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=128,
    )


PRESETS: dict[str, ModelConfig] = {
    # Published shapes of the Qwen/Qwen3-VL-*-Instruct checkpoints (config.json on the hub).
    "2b": _preset(
        _text(2048, 6144, 28, 16), VisionConfig(out_hidden_size=2048, **_VISION_SMALL), True
    ),
    "4b": _preset(
        _text(2560, 9728, 36, 32), VisionConfig(out_hidden_size=2560, **_VISION_SMALL), True
    ),
    "8b": _preset(
        _text(4096, 12288, 36, 32), VisionConfig(out_hidden_size=4096, **_VISION_LARGE), False
    ),
    "32b": _preset(
        _text(5120, 25600, 64, 64), VisionConfig(out_hidden_size=5120, **_VISION_LARGE), False
    ),
}


def preset(name: str, **overrides) -> ModelConfig:
    """Returns the preset config `name` in {2b, 4b, 8b, 32b} (case-insensitive)."""
    key = name.lower().removeprefix("qwen3-vl-").removesuffix("-instruct")
    if key not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return PRESETS[key].replace(**overrides)


def tiny(
    *,
    vocab_size: int = 256,
    hidden_size: int = 64,
    num_layers: int = 3,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    vision_depth: int = 3,
    vision_hidden: int = 32,
    deepstack=(0, 1),
    tie_word_embeddings: bool = False,
    image_token_id: int = 250,
    video_token_id: int = 251,
    vision_start_token_id: int = 248,
    vision_end_token_id: int = 249,
    num_position_embeddings: int = 16,
    **overrides,
) -> ModelConfig:
    """Returns a tiny Qwen3-VL-shaped config for tests and the toy world (every feature on)."""
    half = head_dim // 2
    h = w = half // 4
    section = (half - h - w, h, w)
    text = TextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        rope_theta=10000.0,
        mrope_section=section,
        max_position_embeddings=4096,
    )
    vision = VisionConfig(
        depth=vision_depth,
        hidden_size=vision_hidden,
        intermediate_size=2 * vision_hidden,
        num_heads=2,
        out_hidden_size=hidden_size,
        num_position_embeddings=num_position_embeddings,
        deepstack_visual_indexes=tuple(deepstack),
    )
    return ModelConfig(
        text=text,
        vision=vision,
        tie_word_embeddings=tie_word_embeddings,
        image_token_id=image_token_id,
        video_token_id=video_token_id,
        vision_start_token_id=vision_start_token_id,
        vision_end_token_id=vision_end_token_id,
        **overrides,
    )
