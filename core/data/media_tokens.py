"""A multimodal row's `<image>` placeholders expanded into the tokens its model family reads.

With LLaMA-Factory 0.9.5's `mm_plugin` semantics, each image is first sized as LLaMA-Factory sizes it
(scaled down to `image_max_pixels`, up to `image_min_pixels`, RGB), then by family:

- Qwen2-VL, Qwen2.5-VL (`qwen2_vl` plugin) and Qwen3-VL (`qwen3_vl`, in patches of 16): each side
  at least 28 pixels and an aspect ratio within 200:1; the model's image processor cuts the image
  into patches, and the placeholder becomes `<|vision_start|>`, one `<|image_pad|>` per merged patch
  (t x h x w of its grid / merge_size^2) and `<|vision_end|>`.
- LLaVA-1.5 (`llava` plugin): the processor resizes and crops every image to one size, and the
  placeholder becomes one `<image>` per vision patch of that size, plus the processor's
  `num_additional_image_tokens` (the class token), less one under the `default` feature strategy
  (which drops it): 576 for 336 pixels in patches of 14.

The model's own image processor (transformers' class, loaded from the model folder) makes the
pixels from the same sizing in training, so the tokens and the features always agree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tuneline.core.templates.spec import QWEN_PLUGINS, MediaTokens

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
    if plugin in QWEN_PLUGINS:
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


def patch_token_counts(images: Sequence[Image], image_processor: Any, *, plugin: str = "qwen2_vl",
                       processor_settings: Mapping[str, Any] | None = None) -> list[int]:
    """How many image tokens each sized image takes, from its size alone where the processor's own patch
    arithmetic allows: tokenizing needs the counts, not the pixels, which the training collator cuts later.
    `processor_settings`: the multimodal processor's own numbers (LLaVA's patch_size and the rest)."""
    if plugin == "llava":
        return [llava_token_count(images[0], image_processor, processor_settings or {})] * len(images) if images else []
    merge = int(image_processor.merge_size) ** 2
    return [int(image_processor.get_number_of_image_patches(image.height, image.width, {})) // merge for image in images]


LLAVA_SETTINGS = ("patch_size", "vision_feature_select_strategy", "num_additional_image_tokens")
"""LlavaProcessor's numbers that count an image's tokens (processor_config.json)."""


def llava_token_count(image: Image, image_processor: Any, settings: Mapping[str, Any]) -> int:
    """LLaVA's tokens for an image: patches of the processed size, plus the additional (class) tokens,
    less one under the `default` strategy. The processed size is the crop, or the fixed resize, or
    (neither being fixed) what the processor makes of `image`: LLaMA-Factory reads it off the row's first
    image and uses it for all, which the fixed sizes make the same."""
    height, width = _processed_size(image, image_processor)
    patch = int(settings["patch_size"])
    count = (height // patch) * (width // patch) + int(settings.get("num_additional_image_tokens") or 0)
    return count - 1 if settings.get("vision_feature_select_strategy") == "default" else count


def _processed_size(image: Image, image_processor: Any) -> tuple[int, int]:
    crop, size = getattr(image_processor, "crop_size", None), getattr(image_processor, "size", None)
    if getattr(image_processor, "do_center_crop", False) and crop:
        return int(crop["height"]), int(crop["width"])
    if size and "height" in size and "width" in size:
        return int(size["height"]), int(size["width"])
    pixels = image_processor([image], return_tensors="np")["pixel_values"]
    return int(pixels.shape[-2]), int(pixels.shape[-1])


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
