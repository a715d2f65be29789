"""Qwen3-VL model inputs: image preprocessing, tokenizer loading, chat template and batching.

Everything here reproduces what transformers does for Qwen3-VL (``Qwen2VLImageProcessorPil`` with
Qwen3-VL's preprocessor settings, Qwen3-VL's chat template, ``Qwen3VLProcessor``) with numpy and
Pillow only, so the data pipeline needs neither torch nor a hub download.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

# Split out (move only, #14); re-exported so `processing.<name>` keeps working.
from mocojax.processing_images import (  # noqa: F401
    _PIXEL_LUT,
    IMAGE_MEAN,
    IMAGE_STD,
    MAX_ASPECT_RATIO,
    MAX_IMAGE_PIXELS,
    MAX_PIXELS,
    MERGE_SIZE,
    MIN_PIXELS,
    PATCH_DIM,
    PATCH_SIZE,
    TEMPORAL_PATCH_SIZE,
    ImageError,
    _describe,
    _patchify,
    load_image,
    num_image_tokens,
    preprocess_images,
    smart_resize,
    to_rgb,
)

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def load_tokenizer(path: str | os.PathLike):
    """Returns the transformers tokenizer stored in the local directory path (never downloads)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"tokenizer directory {path!r} does not exist; load_tokenizer reads local "
            "directories only, never hub ids"
        )
    if not any(os.path.isfile(os.path.join(path, name)) for name in _TOKENIZER_FILES):
        raise FileNotFoundError(f"{path!r} holds none of {', '.join(_TOKENIZER_FILES)}")
    # Imported here: transformers takes seconds to import and only this function needs it.
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


# ----------------------------------------------------------------------------------------------
# Chat template
# ----------------------------------------------------------------------------------------------


class _Piece(NamedTuple):
    """One stretch of a rendered conversation: plain text, a special token, or a run of image pads."""

    kind: str  # "text" | "special" | "image"
    value: Any  # str for text and special; number of <|image_pad|> tokens for image
    target: bool  # part of an assistant reply (SFT loss)


def _content_items(content, role: str, index: int) -> list[tuple[str, Any]]:
    """Returns a message's content as ("text", str) and ("image", image or path or bytes) items."""
    if isinstance(content, str):
        return [("text", content)]
    if not isinstance(content, (list, tuple)):
        raise TypeError(
            f"message {index} ({role}): content must be a str or a list, got {type(content).__name__}"
        )
    items = []
    for item in content:
        # Like the template, an item without "type" is an image if it has an "image" key.
        kind = item.get("type") or (
            "image" if "image" in item else "text" if "text" in item else None
        )
        if kind not in ("text", "image"):
            raise ValueError(
                f"message {index} ({role}): unsupported content item of type {kind!r}; "
                "only text and image are supported"
            )
        if kind == "image" and role != "user":
            # Qwen3-VL's template drops such images silently, which would desync pixel_values.
            raise ValueError(f"message {index} ({role}): images are only allowed in user messages")
        items.append((kind, item[kind]))
    return items


def _conversation_pieces(
    messages: list[dict], image_counts: list[int] | None, add_generation_prompt: bool
) -> list[_Piece]:
    """Returns the Qwen3-VL chat template of messages as pieces; image_counts None means one pad each."""
    pieces: list[_Piece] = []
    images_seen = 0
    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in ("system", "user", "assistant"):
            raise ValueError(f"message {index}: unsupported role {role!r}")
        if role == "system" and index != 0:
            # The template only renders a system message in first place and drops any other.
            raise ValueError(f"message {index}: a system message must come first")
        is_reply = role == "assistant"
        pieces += [_Piece("special", IM_START, False), _Piece("text", role + "\n", False)]
        for kind, value in _content_items(message.get("content", ""), role, index):
            if kind == "image":
                count = 1 if image_counts is None else int(image_counts[images_seen])
                images_seen += 1
                pieces += [
                    _Piece("special", VISION_START, False),
                    _Piece("image", count, False),
                    _Piece("special", VISION_END, False),
                ]
            else:
                pieces.append(_Piece("text", value, is_reply))
        pieces += [_Piece("special", IM_END, is_reply), _Piece("text", "\n", False)]
    if image_counts is not None and images_seen != len(image_counts):
        raise ValueError(
            f"conversation has {images_seen} images but {len(image_counts)} image grids were given"
        )
    if add_generation_prompt:
        pieces += [_Piece("special", IM_START, False), _Piece("text", "assistant\n", False)]
    return pieces


def render_chat_text(
    messages: list[dict],
    image_grid_thw: np.ndarray | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """Returns the Qwen3-VL chat-template string; with image_grid_thw, image pads are expanded per image."""
    counts = None if image_grid_thw is None else num_image_tokens(image_grid_thw).tolist()
    parts = []
    for piece in _conversation_pieces(messages, counts, add_generation_prompt):
        parts.append(IMAGE_PAD * piece.value if piece.kind == "image" else piece.value)
    return "".join(parts)


def conversation_images(messages: list[dict]) -> list[Image.Image]:
    """Returns the images of a conversation in template order (paths and bytes are loaded)."""
    images = []
    for index, message in enumerate(messages):
        for kind, value in _content_items(message.get("content", ""), message.get("role"), index):
            if kind == "image":
                images.append(value if isinstance(value, Image.Image) else load_image(value))
    return images


# ----------------------------------------------------------------------------------------------
# Processor
# ----------------------------------------------------------------------------------------------


def _reply_start(targets: list[int]) -> int:
    """Returns where the final reply starts: after the last non-target token that precedes a target token."""
    return max(
        (i for i in range(1, len(targets)) if targets[i] and not targets[i - 1]),
        default=len(targets),
    )


class Processor:
    """Turns batches of conversations into Qwen3-VL model inputs, as transformers' Qwen3VLProcessor does."""

    def __init__(
        self,
        tokenizer,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
    ):
        self.tokenizer = tokenizer
        self.min_pixels = min_pixels
        self.max_pixels = max_pixels
        self.max_length = max_length
        self.pad_to_multiple_of = pad_to_multiple_of
        self._special_ids = {
            token: self.token_id(token)
            for token in (
                IM_START,
                IM_END,
                END_OF_TEXT,
                VISION_START,
                VISION_END,
                IMAGE_PAD,
                VIDEO_PAD,
            )
        }
        self.image_token_id = self._special_ids[IMAGE_PAD]
        self.video_token_id = self._special_ids[VIDEO_PAD]
        self.vision_start_token_id = self._special_ids[VISION_START]
        self.vision_end_token_id = self._special_ids[VISION_END]
        self.im_start_token_id = self._special_ids[IM_START]
        self.im_end_token_id = self._special_ids[IM_END]
        self.pad_token_id = self.token_id(getattr(tokenizer, "pad_token", None) or END_OF_TEXT)
        # Qwen3-VL's generation_config stops on <|im_end|> and <|endoftext|>.
        self.eos_token_ids = (self.im_end_token_id, self._special_ids[END_OF_TEXT])
        self._vision_ids = {
            self.image_token_id,
            self.video_token_id,
            self.vision_start_token_id,
            self.vision_end_token_id,
        }

    def token_id(self, token: str) -> int:
        """Returns the id of a token string; raises if the tokenizer does not know it."""
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        # Unknown tokens come back as None or as the unk id, so check the round trip.
        if token_id is None or self.tokenizer.convert_ids_to_tokens(token_id) != token:
            raise ValueError(f"tokenizer has no token {token!r}")
        return int(token_id)

    def _encode(self, pieces: list[_Piece], where: str) -> tuple[list[int], list[int], list[int]]:
        """Returns ids, target flags and image flags of pieces, tokenizing text stretches between specials."""
        ids, targets, image_flags = [], [], []
        merged: list[_Piece] = []
        for piece in pieces:
            # Adjacent text of the same kind is one string to the tokenizer, as in the rendered template.
            if (
                merged
                and piece.kind == "text"
                and merged[-1].kind == "text"
                and merged[-1].target == piece.target
            ):
                merged[-1] = merged[-1]._replace(value=merged[-1].value + piece.value)
            else:
                merged.append(piece)
        for piece in merged:
            if piece.kind == "image":
                piece_ids, is_image = [self.image_token_id] * piece.value, 1
            elif piece.kind == "special":
                piece_ids, is_image = [self._special_ids[piece.value]], 0
            else:
                piece_ids, is_image = (
                    list(self.tokenizer(piece.value, add_special_tokens=False)["input_ids"]),
                    0,
                )
                if self._vision_ids.intersection(piece_ids):
                    raise ValueError(
                        f"{where}: text contains a vision special token ({piece.value[:80]!r})"
                    )
            ids += piece_ids
            targets += [int(piece.target)] * len(piece_ids)
            image_flags += [is_image] * len(piece_ids)
        return ids, targets, image_flags

    def _fit(self, ids: list[int], targets: list[int], mode: str, where: str) -> int:
        """Returns how many trailing tokens to drop so the sequence fits max_length; raises if none may go."""
        if self.max_length is None or len(ids) <= self.max_length:
            return 0
        excess = len(ids) - self.max_length
        if mode == "sft":
            reply_start = _reply_start(targets)
            if len(ids) - excess > reply_start:
                return excess
            prompt_note = f"; its prompt alone is {reply_start} tokens"
        else:
            prompt_note = ""
        raise ValueError(
            f"{where} is {len(ids)} tokens, more than max_length={self.max_length}{prompt_note}; "
            "image tokens and prompts are never cut"
        )

    def sequence_length(
        self, messages: list[dict], image_sizes: list[tuple[int, int]]
    ) -> tuple[int, int]:
        """Returns (tokens, prompt tokens before the final reply) of an SFT conversation, before any
        max_length cut; image_sizes are the (width, height) of its images, which are not decoded."""
        low = MIN_PIXELS if self.min_pixels is None else self.min_pixels
        high = MAX_PIXELS if self.max_pixels is None else self.max_pixels
        counts = [smart_resize(h, w, low, high) for w, h in image_sizes]
        counts = [rh * rw // (PATCH_SIZE * MERGE_SIZE) ** 2 for rh, rw in counts]
        ids, targets, _ = self._encode(
            _conversation_pieces(messages, counts, add_generation_prompt=False), "row"
        )
        return len(ids), _reply_start(targets)

    def __call__(
        self, conversations: list[list[dict]], mode: str = "generate"
    ) -> dict[str, np.ndarray | None]:
        """Returns numpy model inputs [B, L] (and pixel_values [P, 1536], image_grid_thw [I, 3])
        for conversations.

        Long because it is three passes over the batch that share the per-conversation image lists
        and token counts: check each conversation and collect its images, preprocess all images at
        once, then encode, fit and pad every row into the batch arrays.
        """
        if mode not in ("generate", "sft"):
            raise ValueError(f"mode must be 'generate' or 'sft', got {mode!r}")
        if not conversations:
            raise ValueError("no conversations given")
        images = []
        for index, messages in enumerate(conversations):
            if not messages:
                raise ValueError(f"conversation {index} is empty")
            last_role = messages[-1].get("role")
            if mode == "generate" and last_role == "assistant":
                raise ValueError(
                    f"conversation {index} ends with an assistant message; a generation prompt must "
                    "end with a user (or system) message"
                )
            if mode == "sft" and last_role != "assistant":
                raise ValueError(
                    f"conversation {index} must end with the assistant reply to train on"
                )
            images.append(conversation_images(messages))
        flat_images = [image for per_conversation in images for image in per_conversation]
        if flat_images:
            pixel_values, image_grid_thw = preprocess_images(
                flat_images, self.min_pixels, self.max_pixels
            )
            counts = num_image_tokens(image_grid_thw).tolist()
        else:
            pixel_values, image_grid_thw, counts = None, None, []

        rows, truncated, start = [], [], 0
        for index, messages in enumerate(conversations):
            where = f"conversation {index}"
            own_counts = counts[start : start + len(images[index])]
            start += len(images[index])
            pieces = _conversation_pieces(
                messages, own_counts, add_generation_prompt=mode == "generate"
            )
            ids, targets, image_flags = self._encode(pieces, where)
            drop = self._fit(ids, targets, mode, where)
            keep = len(ids) - drop
            rows.append((ids[:keep], targets[:keep], image_flags[:keep]))
            truncated.append(drop > 0)

        length = max(len(row[0]) for row in rows)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
            if self.max_length is not None:
                length = min(length, self.max_length)  # every row already fits max_length
        batch_size = len(rows)
        input_ids = np.full((batch_size, length), self.pad_token_id, dtype=np.int32)
        attention_mask = np.zeros((batch_size, length), dtype=np.int32)
        mm_token_type_ids = np.zeros((batch_size, length), dtype=np.int32)
        loss_mask = np.zeros((batch_size, length), dtype=np.int32)
        for row, (ids, targets, image_flags) in enumerate(rows):
            # Generation prompts are left padded so every row's next token lands in the same column.
            span = slice(length - len(ids), length) if mode == "generate" else slice(0, len(ids))
            input_ids[row, span] = ids
            attention_mask[row, span] = 1
            mm_token_type_ids[row, span] = image_flags
            loss_mask[row, span] = targets
        batch = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "pixel_values": pixel_values,
            "image_grid_thw": image_grid_thw,
            "mm_token_type_ids": mm_token_type_ids,
        }
        if mode == "sft":
            batch["loss_mask"] = loss_mask
            batch["truncated"] = np.asarray(truncated, dtype=bool)
        return batch
