"""Qwen2-VL's `<image>` expansion against LLaMA-Factory 0.9.5's own output (tests/data/media/, written
by tests/data/make_media_golden.py): the same sizing, grids, expanded messages and token ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.core.data.media_tokens import expand_images, image_features, image_token_counts, placeholder_counts, sized_image
from tuneline.core.templates.catalog import TEMPLATES

GOLDEN = json.loads((Path(__file__).resolve().parents[2] / "data/media/qwen2_vl_images.json").read_text())


def drawn(size: list[int]):
    """The golden file's image of `size`: red, with a blue box in its middle."""
    from PIL import Image, ImageDraw

    width, height = size
    image = Image.new("RGB", (width, height), (200, 40, 40))
    ImageDraw.Draw(image).rectangle([width // 4, height // 4, 3 * width // 4, 3 * height // 4], fill=(30, 90, 220))
    return image


@pytest.fixture(scope="module")
def image_processor():
    from transformers import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor()  # the class AutoImageProcessor picks for a Qwen2-VL folder


@pytest.mark.parametrize("row", GOLDEN["rows"], ids=[row["name"] for row in GOLDEN["rows"]])
def test_images_expand_to_llamafactorys_tokens(row: dict, image_processor, shared_dir: Path):
    from transformers import AutoTokenizer

    from tuneline.core.templates.conversation import Conversation, encode_turns, fix_tokenizer

    template = TEMPLATES["qwen2_vl"]
    images = [sized_image(drawn(GOLDEN["sizes"][name]), max_pixels=GOLDEN["image_max_pixels"],
                          min_pixels=GOLDEN["image_min_pixels"], plugin="qwen2_vl") for name in row["images"]]
    features = image_features(images, image_processor)
    assert features["image_grid_thw"].tolist() == row["image_grid_thw"]
    assert list(features["pixel_values"].shape) == row["pixel_values_shape"]
    assert placeholder_counts(row["messages"])["images"] == len(images)

    expanded = expand_images(row["messages"], image_token_counts(features, image_processor), template.media)
    assert [message["content"] for message in expanded] == row["expanded"]
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/qwen2.5")
    fix_tokenizer(template, tokenizer)
    conversation = Conversation(prompt=expanded[:-1], response=expanded[-1:])
    assert [[list(source), list(target)] for source, target in encode_turns(template, tokenizer, conversation)] == row["pairs"]


def test_sizing_keeps_qwens_limits():
    from PIL import Image

    # scaled up to min_pixels; a side below 28 widened to 28; an aspect beyond 200:1 narrowed to 180:1
    for size, expected in [((10, 10), (32, 32)), ((5000, 20), (5000, 28)), ((6000, 20), (5040, 28)), ((20, 6000), (28, 5040))]:
        sized = sized_image(Image.new("L", size), max_pixels=768 * 768, min_pixels=32 * 32, plugin="qwen2_vl")
        assert sized.mode == "RGB" and sized.size == expected, (size, sized.size)
