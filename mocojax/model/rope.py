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
    inv_freq = 1.0 / (
        text.rope_theta ** (np.arange(0, text.head_dim, 2, dtype=np.float32) / text.head_dim)
    )
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

    Long because it is one nested walk: per row, runs of text tokens and runs of image tokens, each
    image run consuming grids from one iterator shared by all rows, so the grid-mismatch errors are
    raised where the grids are consumed.
    """
    input_ids = np.asarray(input_ids)
    batch, length = input_ids.shape
    mask = (
        np.ones_like(input_ids, bool)
        if attention_mask is None
        else np.asarray(attention_mask).astype(bool)
    )
    types = (
        image_token_mask(cfg, input_ids)
        if mm_token_type_ids is None
        else np.asarray(mm_token_type_ids) == 1
    )
    merge = cfg.vision.spatial_merge_size
    grids = (
        iter(np.asarray(image_grid_thw).reshape(-1, 3).tolist())
        if image_grid_thw is not None
        else iter(())
    )
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
                    tt, hh, ww = np.meshgrid(
                        np.arange(gt), np.arange(gh), np.arange(gw), indexing="ij"
                    )
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
    """Host-computed, per-patch inputs of the vision tower (all numpy; P patches).

    rot_pos [P, 2] (row, col) for the 2-D rope; interp_idx / interp_w [P, 4] taps and weights of
    the bilinear resampling of the learned position grid. Attention is block-diagonal per image
    and temporal frame; instead of a dense [P, P] mask, frames are packed in order into `rows`
    attention rows of R slots (next-fit, a frame never straddles two rows):
    segment [P] the frame of each patch (-1 for padding patches), slot [P] its flat index
    row * R + column in the packed layout, packed_patch [rows, R] the patch in each slot (0 in
    empty slots), packed_segment [rows, R] the frame of each slot (-2 for empty slots).
    Attention then costs rows x R² instead of P².
    """

    rot_pos: np.ndarray
    interp_idx: np.ndarray
    interp_w: np.ndarray
    segment: np.ndarray
    slot: np.ndarray
    packed_patch: np.ndarray
    packed_segment: np.ndarray

    @property
    def row_len(self) -> int:
        return int(self.packed_patch.shape[-1])


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


def default_row_len(image_grid_thw) -> int:
    """Returns the packed attention row length for these images: the next power of two >= the
    largest frame (h * w patches), at least 16."""
    grid = np.asarray(image_grid_thw).reshape(-1, 3)
    largest = int((grid[:, 1] * grid[:, 2]).max()) if len(grid) else 1
    return max(16, 1 << (largest - 1).bit_length())


def _pack(segment: np.ndarray, row_len: int, num_rows: int | None):
    """Returns (slot [P], packed_patch [rows, R], packed_segment [rows, R]) packing runs of equal
    segment ids into rows of row_len slots, next-fit; padding patches (-1) fill rows in chunks."""
    runs, start = [], 0
    for i in range(1, len(segment) + 1):
        if (
            i == len(segment)
            or segment[i] != segment[start]
            or (segment[start] < 0 and i - start == row_len)
        ):
            runs.append((start, i))
            start = i
    slot = np.zeros(len(segment), np.int64)
    row, fill = 0, 0
    for a, b in runs:
        n = b - a
        if n > row_len:
            raise ValueError(
                f"an image frame of {n} patches does not fit attention rows of {row_len} slots"
            )
        if fill + n > row_len:
            row, fill = row + 1, 0
        slot[a:b] = row * row_len + fill + np.arange(n)
        fill += n
    used = row + 1 if runs else 0
    rows = used if num_rows is None else num_rows
    if rows < used:
        raise ValueError(f"{used} attention rows needed, only {rows} allowed")
    packed_patch = np.zeros(rows * row_len, np.int32)
    packed_segment = np.full(rows * row_len, -2, np.int32)
    packed_patch[slot] = np.arange(len(segment))
    packed_segment[slot] = segment
    return (
        slot.astype(np.int32),
        packed_patch.reshape(rows, row_len),
        packed_segment.reshape(rows, row_len),
    )


def vision_metadata(
    vision: VisionConfig,
    image_grid_thw: np.ndarray,
    pad_to: int | None = None,
    row_len: int | None = None,
) -> VisionMeta:
    """Returns the VisionMeta of images with grids [I, 3], patches in the processor's merge-block order.

    pad_to adds inert padding patches (a bucketed patch count); row_len fixes the packed
    attention row length (default `default_row_len`), so metadata of different batches stack.
    """
    merge, side = vision.spatial_merge_size, vision.num_grid_per_side
    grid = np.asarray(image_grid_thw).reshape(-1, 3)
    rows, cols, heights, widths, segment = [], [], [], [], []
    seg_id = 0
    for t, h, w in grid.tolist():
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
    cat = lambda xs, dtype: np.concatenate(xs).astype(dtype) if xs else np.zeros((0,), dtype)
    row, col = cat(rows, np.int64), cat(cols, np.int64)
    h_taps, h_w = _axis_taps(row, cat(heights, np.int64), side)
    w_taps, w_w = _axis_taps(col, cat(widths, np.int64), side)
    idx = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
    wts = (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4)
    return _finish(
        np.stack([row, col], -1).astype(np.int32),
        idx.astype(np.int32),
        wts.astype(np.float32),
        cat(segment, np.int32),
        row_len or default_row_len(grid),
        pad_to,
    )


def _finish(rot_pos, interp_idx, interp_w, segment, row_len, pad_to) -> VisionMeta:
    n = segment.shape[0]
    num_rows = None
    if pad_to is not None:
        if pad_to < n:
            raise ValueError(f"cannot pad {n} patches down to {pad_to}")
        extra = pad_to - n
        rot_pos = np.pad(rot_pos, ((0, extra), (0, 0)))
        interp_idx = np.pad(interp_idx, ((0, extra), (0, 0)))
        interp_w = np.pad(interp_w, ((0, extra), (0, 0)))
        segment = np.pad(segment, (0, extra), constant_values=-1)
        # Next-fit fills more than half of every row but the last, so 2 * ceil(P / R) rows always
        # suffice: a fixed count for a given (P, R), whatever the images, keeps shapes static.
        num_rows = 2 * -(-pad_to // row_len)
    slot, packed_patch, packed_segment = _pack(segment, row_len, num_rows)
    return VisionMeta(rot_pos, interp_idx, interp_w, segment, slot, packed_patch, packed_segment)


def pad_vision_metadata(
    meta: VisionMeta, num_patches: int, row_len: int | None = None
) -> VisionMeta:
    """Returns `meta` padded to `num_patches` with inert patches (segment -1, zero weights) and
    packed into 2 * ceil(num_patches / R) rows of R = row_len (default: meta's) slots."""
    real = meta.segment >= 0
    return _finish(
        meta.rot_pos[real],
        meta.interp_idx[real],
        meta.interp_w[real],
        meta.segment[real],
        row_len or meta.row_len,
        num_patches,
    )
