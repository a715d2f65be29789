"""Builders of tiny random transformers Qwen3-VL reference models and matching inputs (tests only)."""

from __future__ import annotations

import numpy as np
import torch
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from mocojax.model import ModelConfig


def hf_config(cfg: ModelConfig) -> Qwen3VLConfig:
    """Returns the transformers config of a mocojax config (through config.json's dict)."""
    d = {
        k: v
        for k, v in cfg.to_hf_dict().items()
        if k not in ("architectures", "model_type", "dtype")
    }
    return Qwen3VLConfig(**d)


def random_hf_model(
    cfg: ModelConfig, seed: int = 0, std: float = 0.15
) -> Qwen3VLForConditionalGeneration:
    """Returns an fp32 eager-attention HF model with weights large enough that attention is not uniform.

    Every matrix ~ N(0, std²), biases ~ N(0, 0.05²), norm weights ~ 1 + N(0, 0.3²): a position or
    layout bug then moves the logits far beyond the test tolerance.
    """
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(hf_config(cfg)).float().eval()
    model.config._attn_implementation = "eager"
    for sub in (model.config.text_config, model.config.vision_config):
        sub._attn_implementation = "eager"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_(std * torch.randn_like(p))
    return model


def image_prompt(cfg: ModelConfig, grids, rng: np.random.Generator, text_len: int = 5):
    """Returns (ids [L], pixel_values [P, patch_dim], grid [I, 3]): text, then each image wrapped in
    vision_start/end with its image-pad tokens, then more text."""
    merge = cfg.vision.spatial_merge_size
    special = {
        cfg.image_token_id,
        cfg.video_token_id,
        cfg.vision_start_token_id,
        cfg.vision_end_token_id,
    }
    vocab = [i for i in range(cfg.text.vocab_size) if i not in special]

    def text(n):
        return list(rng.choice(vocab, n))

    ids = text(text_len)
    for t, h, w in grids:
        ids += (
            [cfg.vision_start_token_id]
            + [cfg.image_token_id] * (t * h * w // merge**2)
            + [cfg.vision_end_token_id]
        )
        ids += text(3)
    patches = sum(t * h * w for t, h, w in grids)
    pixels = rng.standard_normal((patches, cfg.vision.patch_dim)).astype(np.float32)
    return np.array(ids, np.int64), pixels, np.array(grids, np.int64)


def left_pad(rows, pad_id: int = 0):
    """Returns (ids [B, L], mask [B, L]) with the rows left-padded to the longest."""
    length = max(len(r) for r in rows)
    ids = np.full((len(rows), length), pad_id, np.int64)
    mask = np.zeros((len(rows), length), np.int64)
    for b, r in enumerate(rows):
        ids[b, length - len(r) :] = r
        mask[b, length - len(r) :] = 1
    return ids, mask


def hf_logits(model, cfg: ModelConfig, ids, mask, pixels=None, grid=None, **kw):
    """Returns the HF model's output (logits and optional hidden states) as numpy."""
    inputs = dict(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
    if pixels is not None:
        inputs.update(
            pixel_values=torch.as_tensor(pixels),
            image_grid_thw=torch.as_tensor(grid),
            mm_token_type_ids=torch.as_tensor(
                (np.asarray(ids) == cfg.image_token_id).astype(np.int64)
            ),
        )
    with torch.no_grad():
        return model(**inputs, **kw)
