"""Qwen3-VL image preprocessing (what transformers' ``Qwen2VLImageProcessorPil`` does with
Qwen3-VL's preprocessor settings, in numpy and Pillow): the patch and pixel constants,
`smart_resize`, `preprocess_images` (pixel_values and image_grid_thw), `num_image_tokens` and
`load_image` with its checks (ImageError). Split from mocojax/processing.py, which re-exports these
names."""

from __future__ import annotations

import io
import math
import os

import numpy as np
from PIL import Image, ImageOps

# Qwen3-VL's preprocessor_config.json: 16-pixel patches, 2 frames per temporal patch, 2x2 patches
# merged into one LLM token, mean = std = 0.5, size = {shortest_edge: 65536, longest_edge: 16777216}.
PATCH_SIZE = 16
TEMPORAL_PATCH_SIZE = 2
MERGE_SIZE = 2
IMAGE_MEAN = 0.5
IMAGE_STD = 0.5
MIN_PIXELS = 65536
MAX_PIXELS = 16777216
PATCH_DIM = 3 * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE  # 1536 values per row of pixel_values
MAX_ASPECT_RATIO = 200  # transformers' smart_resize refuses anything more elongated
MAX_IMAGE_PIXELS = 89_478_485  # Pillow's decompression-bomb threshold: decoded width * height


# uint8 -> normalised float32, computed the way transformers does (float64 rescale by 1/255, cast
# to float32, then (x - mean) / std in float32), so pixel_values match it bit for bit.
_PIXEL_LUT = (
    (np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32) - np.float32(IMAGE_MEAN)
) / np.float32(IMAGE_STD)


class ImageError(ValueError):
    """An image that cannot be used; the message names the file (or the image's place in a batch)."""


# ----------------------------------------------------------------------------------------------
# Images
# ----------------------------------------------------------------------------------------------


def smart_resize(
    height: int,
    width: int,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
    factor: int = PATCH_SIZE * MERGE_SIZE,
) -> tuple[int, int]:
    """Returns (height, width) that transformers resizes an image to: multiples of factor, area in range."""
    if height <= 0 or width <= 0:
        raise ImageError(f"image has zero size ({width}x{height})")
    aspect_ratio = max(height, width) / min(height, width)
    if aspect_ratio > MAX_ASPECT_RATIO:
        raise ImageError(
            f"aspect ratio {aspect_ratio:.1f} of a {width}x{height} image exceeds {MAX_ASPECT_RATIO}"
        )
    # Python's round (half to even) on purpose: transformers uses it, and 48/32 = 1.5 must give 2.
    resized_height = round(height / factor) * factor
    resized_width = round(width / factor) * factor
    if resized_height * resized_width > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        resized_height = max(factor, math.floor(height / scale / factor) * factor)
        resized_width = max(factor, math.floor(width / scale / factor) * factor)
    elif resized_height * resized_width < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        resized_height = math.ceil(height * scale / factor) * factor
        resized_width = math.ceil(width * scale / factor) * factor
    return resized_height, resized_width


def to_rgb(image: Image.Image) -> Image.Image:
    """Returns the image in RGB mode; transparency is composited onto white as transformers does."""
    has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    if not has_alpha:
        return image if image.mode == "RGB" else image.convert("RGB")
    rgba = image.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def _patchify(pixels: np.ndarray) -> np.ndarray:
    """Returns the [grid_h * grid_w, PATCH_DIM] rows of one normalised [H, W, 3] image."""
    height, width, channels = pixels.shape
    grid_h, grid_w = height // PATCH_SIZE, width // PATCH_SIZE
    patches = pixels.reshape(
        grid_h // MERGE_SIZE,
        MERGE_SIZE,
        PATCH_SIZE,
        grid_w // MERGE_SIZE,
        MERGE_SIZE,
        PATCH_SIZE,
        channels,
    )
    # Row order: merge blocks row-major, then the 2x2 patches inside a block (the order the vision
    # merger expects); inside a row: channel, temporal copy, patch row, patch column.
    patches = patches.transpose(0, 3, 1, 4, 6, 2, 5)  # [gh/m, gw/m, m, m, C, p, p]
    patches = np.broadcast_to(
        patches[:, :, :, :, :, None],
        (*patches.shape[:5], TEMPORAL_PATCH_SIZE, PATCH_SIZE, PATCH_SIZE),
    )
    return patches.reshape(grid_h * grid_w, PATCH_DIM)


def preprocess_images(
    images: list[Image.Image], min_pixels: int | None = None, max_pixels: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Returns pixel_values float32 [num_patches, 1536] and image_grid_thw int64 [num_images, 3]."""
    min_pixels = MIN_PIXELS if min_pixels is None else int(min_pixels)
    max_pixels = MAX_PIXELS if max_pixels is None else int(max_pixels)
    if not 0 < min_pixels <= max_pixels:
        raise ValueError(
            f"need 0 < min_pixels <= max_pixels, got min_pixels={min_pixels}, max_pixels={max_pixels}"
        )
    if not images:
        raise ValueError("preprocess_images needs at least one image")
    all_patches, grids = [], []
    for index, image in enumerate(images):
        if not isinstance(image, Image.Image):
            raise TypeError(
                f"image {index} is a {type(image).__name__}, expected a PIL.Image.Image"
            )
        width, height = image.size
        try:
            resized_height, resized_width = smart_resize(height, width, min_pixels, max_pixels)
        except ImageError as error:
            raise ImageError(f"image {index}{_describe(image)}: {error}") from None
        rgb = to_rgb(image)
        if rgb.size != (resized_width, resized_height):
            rgb = rgb.resize((resized_width, resized_height), Image.Resampling.BICUBIC)
        all_patches.append(_patchify(_PIXEL_LUT[np.asarray(rgb)]))
        grids.append((1, resized_height // PATCH_SIZE, resized_width // PATCH_SIZE))
    return np.concatenate(all_patches, axis=0), np.asarray(grids, dtype=np.int64)


def num_image_tokens(image_grid_thw: np.ndarray) -> np.ndarray:
    """Returns int64 [num_images]: <|image_pad|> tokens per image, grid_t * grid_h * grid_w / merge**2."""
    return np.prod(np.asarray(image_grid_thw, dtype=np.int64), axis=-1) // MERGE_SIZE**2


def _describe(image: Image.Image) -> str:
    """Returns ' (file NAME)' for an image Pillow read from a file, else ''."""
    filename = getattr(image, "filename", "")
    return f" (file {filename})" if filename else ""


def load_image(
    source: str | os.PathLike | bytes, max_image_pixels: int = MAX_IMAGE_PIXELS
) -> Image.Image:
    """Returns the decoded, EXIF-rotated RGB image at source (a path or encoded bytes); raises ImageError."""
    if isinstance(source, (bytes, bytearray)):
        name, opened = f"<{len(source)} bytes>", io.BytesIO(source)
        size = len(source)
    else:
        name = opened = os.fspath(source)
        try:
            size = os.path.getsize(name)
        except OSError as error:
            raise ImageError(f"{name}: cannot read image file: {error}") from None
    if size == 0:
        raise ImageError(f"{name}: image file is empty (0 bytes)")
    try:
        with Image.open(opened) as image:
            # The header alone gives the size: refuse bombs before decoding them.
            if image.width * image.height > max_image_pixels:
                raise ImageError(
                    f"{name}: {image.width}x{image.height} image has more than {max_image_pixels} pixels "
                    "(possible decompression bomb)"
                )
            image.load()
            # EXIF orientation is applied as transformers.image_utils.load_image does.
            upright = ImageOps.exif_transpose(image)
            rgb = to_rgb(upright)
    except ImageError:  # ours, raised above; ImageError is a ValueError, so let it pass unchanged
        raise
    except Image.DecompressionBombError as error:
        raise ImageError(f"{name}: {error}") from None
    except (OSError, SyntaxError, ValueError, EOFError) as error:
        raise ImageError(f"{name}: cannot decode image: {error}") from None
    width, height = rgb.size
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise ImageError(
            f"{name}: aspect ratio of the {width}x{height} image exceeds {MAX_ASPECT_RATIO}"
        )
    return rgb
