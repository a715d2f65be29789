"""Rotary position embeddings of Qwen3-VL and the host-side position bookkeeping.

Two halves:
* jittable: interleaved MRoPE cos/sin for the text decoder, 2-D axial rope for the vision
  tower, and `apply_rotary`;
* host (numpy, run before `jit` because the shapes depend on the data): `get_rope_index`
  (3-D positions of every token and per-row rope deltas, as transformers computes them) and
  `vision_metadata` (per-patch rope positions, bilinear position-embedding taps and the
  block-diagonal attention segments of each image).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from mocojax.model.config import ModelConfig, TextConfig, VisionConfig


# ----------------------------------------------------------------------------- jittable
def mrope_axis_of_frequency(text: TextConfig) -> np.ndarray:
    """Returns [head_dim/2] ints in {0,1,2}: which of (T, H, W) positions drives each frequency.

    Qwen3-VL interleaves the sections T,H,W,T,H,W,... and leaves a T-only tail; Qwen2.5-VL's
    blocked layout (all T, then all H, then all W) is a different model.
    """
    half = text.head_dim // 2
    axis = np.zeros(half, np.int32)
    _, sec_h, sec_w = text.mrope_section
    axis[1 : 3 * sec_h : 3] = 1
    axis[2 : 3 * sec_w : 3] = 2
    return axis


def text_rope(text: TextConfig, positions: jnp.ndarray, dtype) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Returns (cos, sin), each [B, L, head_dim], for 3-D positions [3, B, L] (interleaved MRoPE)."""
    half = text.head_dim // 2
    inv_freq = 1.0 / (text.rope_theta ** (np.arange(0, text.head_dim, 2, dtype=np.float32) / text.head_dim))
    axis = mrope_axis_of_frequency(text)
    pos = positions.astype(jnp.float32)[axis]  # [half, B, L]: each frequency's driving axis
    freqs = jnp.moveaxis(pos, 0, -1) * jnp.asarray(inv_freq[:half])  # [B, L, half]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def vision_rope(vision: VisionConfig, rot_pos: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Returns float32 (cos, sin), each [P, head_dim], for patch (row, col) positions [P, 2]."""
    spatial = vision.head_dim // 2
    inv_freq = 1.0 / (vision.rope_theta ** (np.arange(0, spatial, 2, dtype=np.float32) / spatial))
    freqs = rot_pos.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [P, 2, head_dim/4]
    hw = jnp.concatenate([freqs[:, 0], freqs[:, 1]], axis=-1)
    emb = jnp.concatenate([hw, hw], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def rotate_half(x: jnp.ndarray) -> jnp.ndarray:
    """Returns [-x2, x1] for x = [x1, x2] split on the last axis."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rotary(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
    """Returns x [..., L, N, H] rotated by cos/sin [..., L, H] (broadcast over the heads axis N)."""
    return x * cos[..., None, :] + rotate_half(x) * sin[..., None, :]


# ----------------------------------------------------------------------------- host side
def image_token_mask(cfg: ModelConfig, input_ids: np.ndarray) -> np.ndarray:
    """Returns [B, L] bool: True at image-pad tokens (the `mm_token_type_ids == 1` positions)."""
    return np.asarray(input_ids) == cfg.image_token_id


def get_rope_index(
    cfg: ModelConfig,
    input_ids: np.ndarray,
    attention_mask: np.ndarray | None = None,
    image_grid_thw: np.ndarray | None = None,
    mm_token_type_ids: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (positions [3, B, L] int32, rope_deltas [B] int32) as transformers' get_rope_index.

    Text tokens advance all three axes together; an image's tokens take (t, h, w) grid
    coordinates offset by the running position, and the text after it resumes at
    offset + max(h, w) / merge. Padding (attention_mask == 0) gets position 0 and never shifts
    the others. `rope_deltas = max position + 1 - number of real tokens`: the decode position of
    a token at cache slot s is `s - pad_count + delta`.
    """
    input_ids = np.asarray(input_ids)
    batch, length = input_ids.shape
    mask = np.ones_like(input_ids, bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    types = image_token_mask(cfg, input_ids) if mm_token_type_ids is None else np.asarray(mm_token_type_ids) == 1
    merge = cfg.vision.spatial_merge_size
    grids = iter(np.asarray(image_grid_thw).reshape(-1, 3).tolist()) if image_grid_thw is not None else iter(())
    positions = np.zeros((3, batch, length), np.int32)
    deltas = np.zeros((batch,), np.int32)
    for b in range(batch):
        row_types = types[b][mask[b]]
        pieces, current, i, n = [], 0, 0, len(row_types)
        while i < n:
            j = i
            while j < n and row_types[j] == row_types[i]:
                j += 1
            if not row_types[i]:
                pieces.append(np.broadcast_to(np.arange(current, current + j - i), (3, j - i)))
                current += j - i
            else:
                # A run of image tokens can hold several adjacent images: consume grids until it is covered.
                k = i
                while k < j:
                    try:
                        t, h, w = next(grids)
                    except StopIteration:
                        raise ValueError(
                            f"row {b}: more image tokens than images in image_grid_thw"
                        ) from None
                    gt, gh, gw = t, h // merge, w // merge
                    count = gt * gh * gw
                    if k + count > j:
                        raise ValueError(
                            f"row {b}: an image run of {j - i} tokens does not match image_grid_thw "
                            f"({count} tokens for grid {(t, h, w)})"
                        )
                    tt, hh, ww = np.meshgrid(np.arange(gt), np.arange(gh), np.arange(gw), indexing="ij")
                    pieces.append(np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + current)
                    current += max(gh, gw)
                    k += count
            i = j
        row_pos = np.concatenate(pieces, axis=1) if pieces else np.zeros((3, 0), np.int64)
        positions[:, b, mask[b]] = row_pos
        deltas[b] = (row_pos.max() + 1 - n) if n else 0
    if next(grids, None) is not None:
        raise ValueError("image_grid_thw lists more images than the input_ids hold")
    return positions, deltas


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class VisionMeta:
    """Host-computed, per-patch inputs of the vision tower (all numpy, P patches).

    rot_pos [P, 2] (row, col) for the 2-D rope; interp_idx / interp_w [P, 4] taps and weights of
    the bilinear resampling of the learned position grid; segment [P] the attention block of each
    patch (one per image and temporal frame; -1 for padding patches).
    """

    rot_pos: np.ndarray
    interp_idx: np.ndarray
    interp_w: np.ndarray
    segment: np.ndarray


def _axis_taps(index: np.ndarray, size: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
    # align_corners=True: output index i maps to linspace(0, side-1, size)[i]. Computed in
    # float32 in the same order as transformers so the weights agree to the last bit.
    f32 = np.float32
    src = index.astype(f32) * f32(side - 1) / np.maximum(size - 1, 1).astype(f32)
    floor = np.floor(src)
    offsets = np.array([0, 1], f32)
    taps = floor.astype(np.int64)[:, None] + offsets.astype(np.int64)
    weights = np.clip(f32(1) - np.abs(src[:, None] - floor[:, None] - offsets), f32(0), None)
    return np.clip(taps, 0, side - 1), weights


def vision_metadata(vision: VisionConfig, image_grid_thw: np.ndarray, pad_to: int | None = None) -> VisionMeta:
    """Returns the VisionMeta of images with grids [I, 3], patches in the processor's merge-block order."""
    merge, side = vision.spatial_merge_size, vision.num_grid_per_side
    rows, cols, heights, widths, segment = [], [], [], [], []
    seg_id = 0
    for t, h, w in np.asarray(image_grid_thw).reshape(-1, 3).tolist():
        hh, ww = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        # Patches arrive grouped in merge x merge blocks: (block_row, block_col, in_row, in_col).
        block = (h // merge, merge, w // merge, merge)
        r = hh.reshape(block).transpose(0, 2, 1, 3).ravel()
        c = ww.reshape(block).transpose(0, 2, 1, 3).ravel()
        rows.append(np.tile(r, t))
        cols.append(np.tile(c, t))
        heights.append(np.full(t * h * w, h))
        widths.append(np.full(t * h * w, w))
        segment.append(np.repeat(np.arange(seg_id, seg_id + t), h * w))
        seg_id += t
    row, col = np.concatenate(rows), np.concatenate(cols)
    h_taps, h_w = _axis_taps(row, np.concatenate(heights), side)
    w_taps, w_w = _axis_taps(col, np.concatenate(widths), side)
    idx = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
    wts = (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4)
    meta = VisionMeta(
        rot_pos=np.stack([row, col], -1).astype(np.int32),
        interp_idx=idx.astype(np.int32),
        interp_w=wts.astype(np.float32),
        segment=np.concatenate(segment).astype(np.int32),
    )
    if pad_to is not None:
        meta = pad_vision_metadata(meta, pad_to)
    return meta


def pad_vision_metadata(meta: VisionMeta, num_patches: int) -> VisionMeta:
    """Returns `meta` padded to `num_patches` with inert patches (segment -1, zero weights)."""
    n = meta.segment.shape[0]
    if num_patches < n:
        raise ValueError(f"cannot pad {n} patches down to {num_patches}")
    extra = num_patches - n
    return VisionMeta(
        rot_pos=np.pad(meta.rot_pos, ((0, extra), (0, 0))),
        interp_idx=np.pad(meta.interp_idx, ((0, extra), (0, 0))),
        interp_w=np.pad(meta.interp_w, ((0, extra), (0, 0))),
        segment=np.pad(meta.segment, (0, extra), constant_values=-1),
    )
