"""Qwen3-VL in Flax NNX, used functionally: `forward(cfg, params, ...)` and friends."""

from mocojax.model.config import PRESETS, ModelConfig, TextConfig, VisionConfig, preset, tiny
from mocojax.model.qwen3_vl import (
    ModelInputs,
    Qwen3VL,
    abstract_params,
    apply,
    check_ids_and_mask,
    count_params,
    encode_images,
    forward,
    init_params,
    lm_logits,
    param_axes,
    prepare_inputs,
    target_logprobs,
)
from mocojax.model.rope import VisionMeta, get_rope_index, vision_metadata

__all__ = [
    "ModelConfig",
    "TextConfig",
    "VisionConfig",
    "preset",
    "tiny",
    "PRESETS",
    "ModelInputs",
    "Qwen3VL",
    "abstract_params",
    "apply",
    "check_ids_and_mask",
    "count_params",
    "encode_images",
    "forward",
    "init_params",
    "lm_logits",
    "param_axes",
    "target_logprobs",
    "prepare_inputs",
    "VisionMeta",
    "get_rope_index",
    "vision_metadata",
]
