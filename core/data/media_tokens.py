"""A multimodal row's `<image>` placeholders expanded into the tokens its model family reads.

Qwen2-VL and Qwen2.5-VL (`template: qwen2_vl`), with LLaMA-Factory 0.9.5's `mm_plugin` semantics:
each image is first sized as LLaMA-Factory sizes it (scaled down to `image_max_pixels`, up to
`image_min_pixels`, each side at least 28 pixels, an aspect ratio kept within 200:1, RGB); the
model's own image processor (transformers' class, loaded from the model folder) then cuts it into
patches, and the placeholder becomes `<|vision_start|>`, one `<|image_pad|>` per merged patch
(t x h x w of its grid / merge_size^2) and `<|vision_end|>`. The same sizing feeds the pixels to the
model in training, so the tokens and the features always agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuneline.core.templates.spec import MediaTokens

if TYPE_CHECKING:
    from PIL.Image import Image

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"
AUDIO_PLACEHOLDER = "<audio>"
PLACEHOLDERS = {"images": IMAGE_PLACEHOLDER, "videos": VIDEO_PLACEHOLDER, "audios": AUDIO_PLACEHOLDER}
"""Each media column's placeholder in the messages."""
QWEN_MIN_SIDE = 28  # Qwen2-VL's processor needs both sides of at least one merged patch
QWEN_MAX_ASPECT = 200  # beyond this the processor refuses an image; LLaMA-Factory narrows it to 180:1


def sized_image(image: Image, *, max_pixels: int, min_pixels: int, plugin: str) -> Image:
    """`image` scaled into [min_pixels, max_pixels] keeping its aspect, then as `plugin` needs it, in RGB."""
    if image.width * image.height > max_pixels:
        image = _scaled(image, math.sqrt(max_pixels / (image.width * image.height)))
    if image.width * image.height < min_pixels:
        image = _scaled(image, math.sqrt(min_pixels / (image.width * image.height)))
    if image.mode != "RGB":
        image = image.convert("RGB")
    if plugin == "qwen2_vl":
        image = _qwen_sized(image)
    return image


def _scaled(image: Image, factor: float) -> Image:
    return image.resize((int(image.width * factor), int(image.height * factor)))


def _qwen_sized(image: Image) -> Image:
    if min(image.width, image.height) < QWEN_MIN_SIDE:
        image = image.resize((max(image.width, QWEN_MIN_SIDE), max(image.height, QWEN_MIN_SIDE)))
    if image.width / image.height > QWEN_MAX_ASPECT:
        image = image.resize((image.height * 180, image.height))
    if image.height / image.width > QWEN_MAX_ASPECT:
        image = image.resize((image.width, image.width * 180))
    return image


def image_features(images: Sequence[Image], image_processor: Any) -> dict[str, Any]:
    """The image processor's model inputs for sized `images` (pixel_values, image_grid_thw), as numpy arrays."""
    return dict(image_processor(list(images), return_tensors="np"))


def image_token_counts(features: dict[str, Any], image_processor: Any) -> list[int]:
    """How many image tokens each image's features take: its grid's t x h x w over merge_size^2."""
    merge = int(image_processor.merge_size) ** 2
    return [int(grid.prod()) // merge for grid in features["image_grid_thw"]]


def patch_token_counts(images: Sequence[Image], image_processor: Any) -> list[int]:
    """`image_token_counts` from the sized images' sizes alone, by the processor's own patch arithmetic:
    tokenizing needs the counts, not the pixels, which the training collator cuts later."""
    merge = int(image_processor.merge_size) ** 2
    return [int(image_processor.get_number_of_image_patches(image.height, image.width, {})) // merge for image in images]


def expand_images(messages: Sequence[dict[str, str]], counts: Sequence[int], media: MediaTokens) -> list[dict[str, str]]:
    """`messages` with the n-th `<image>` (across the messages, in order) written as `counts[n]` image
    tokens between the template's vision markers. The caller has checked that the counts match."""
    pending = iter(counts)
    expanded = []
    for message in messages:
        pieces = message["content"].split(IMAGE_PLACEHOLDER)
        content = pieces[0] + "".join(f"{media.vision_bos}{media.image_token * next(pending)}{media.vision_eos}{piece}"
                                      for piece in pieces[1:])
        expanded.append({**message, "content": content})
    return expanded


def placeholder_counts(messages: Sequence[dict[str, str]]) -> dict[str, int]:
    """How many `<image>`, `<video>` and `<audio>` placeholders the messages hold, by media column."""
    text = "".join(message["content"] for message in messages)
    return {key: text.count(placeholder) for key, placeholder in PLACEHOLDERS.items()}
