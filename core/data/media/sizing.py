"""An image sized as LLaMA-Factory 0.9.5 sizes it before its processor sees it: scaled down to
`image_max_pixels` and up to `image_min_pixels` keeping its aspect, one resize each, in RGB; for the
Qwen-VL families also each side at least 28 pixels and an aspect ratio within 200:1 (narrowed to 180:1,
as LLaMA-Factory narrows it). MiniCPM-V 4.6's images go to its processor as they are. A video's frames
are sized the same way under the video limits.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tuneline.core.templates.spec import QWEN_PLUGINS

if TYPE_CHECKING:
    from PIL.Image import Image

QWEN_MIN_SIDE = 28  # Qwen2-VL's processor needs both sides of at least one merged patch
QWEN_MAX_ASPECT = 200  # beyond this the processor refuses an image; LLaMA-Factory narrows it to 180:1
MINICPM_V_4_6 = "minicpm_v_4_6"
UNSCALED_PLUGINS = (MINICPM_V_4_6,)
"""Families whose images LLaMA-Factory passes to the image processor unscaled (no image_max_pixels/min_pixels)."""


def sized_image(image: Image, *, max_pixels: int, min_pixels: int, plugin: str) -> Image:
    """`image` scaled into [min_pixels, max_pixels] keeping its aspect, then as `plugin` needs it, in RGB."""
    if plugin in UNSCALED_PLUGINS:  # as transformers' load_image opens the file LLaMA-Factory hands over
        from PIL import ImageOps

        return ImageOps.exif_transpose(image).convert("RGB")
    for size in _pixel_scaled(image.width, image.height, max_pixels=max_pixels, min_pixels=min_pixels):
        image = image.resize(size)
    if image.mode != "RGB":
        image = image.convert("RGB")
    if plugin in QWEN_PLUGINS:
        for size in _qwen_sized(image.width, image.height):
            image = image.resize(size)
    return image


def sized_dimensions(width: int, height: int, *, max_pixels: int, min_pixels: int, plugin: str) -> tuple[int, int]:
    """The (width, height) `sized_image` gives an image of `width` x `height`, without an image."""
    sizes = [(width, height), *_pixel_scaled(width, height, max_pixels=max_pixels, min_pixels=min_pixels)]
    if plugin in QWEN_PLUGINS:
        sizes += _qwen_sized(*sizes[-1])
    return sizes[-1]


def _pixel_scaled(width: int, height: int, *, max_pixels: int, min_pixels: int) -> list[tuple[int, int]]:
    """The sizes an image is resized through, one resize each (as LLaMA-Factory does, for the same pixels)."""
    sizes = []
    for limit, beyond in ((max_pixels, lambda pixels: pixels > max_pixels), (min_pixels, lambda pixels: pixels < min_pixels)):
        if beyond(width * height):
            factor = math.sqrt(limit / (width * height))
            width, height = int(width * factor), int(height * factor)
            sizes.append((width, height))
    return sizes


def _qwen_sized(width: int, height: int) -> list[tuple[int, int]]:
    sizes = []
    if min(width, height) < QWEN_MIN_SIDE:
        width, height = max(width, QWEN_MIN_SIDE), max(height, QWEN_MIN_SIDE)
        sizes.append((width, height))
    if width / height > QWEN_MAX_ASPECT:
        width = height * 180
        sizes.append((width, height))
    if height / width > QWEN_MAX_ASPECT:
        height = width * 180
        sizes.append((width, height))
    return sizes
