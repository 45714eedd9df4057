"""Golden rows of LLaVA-1.5's image placeholder expansion, written by LLaMA-Factory 0.9.5's own `llava`
template and mm_plugin with transformers' LlavaProcessor (CLIPImageProcessor at LLaVA-1.5's 336 pixels,
patch 14, the `default` feature strategy, one class token) into tests/data/media/, in the format
tests/core/data/test_media_tokens.py reads. The images are the Qwen2-VL golden's (drawn again by the
test). Run with LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_llava_golden.py tests/data/media/llava_images.json
"""
import sys
from pathlib import Path

from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, CLIPImageProcessor, LlavaProcessor

from golden_rows import (
    PIXEL_LIMITS,
    QWEN_GOLDEN,
    SHARED,
    drawn_images,
    expanded_row,
    media_inputs,
    supervised_examples,
    with_settings,
    write_golden,
)

out = Path(sys.argv[1])
paths = drawn_images(QWEN_GOLDEN["sizes"])
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/llama2")
tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
SETTINGS = {"patch_size": 14, "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1}
processor = with_settings(LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 336},
                                                                           crop_size={"height": 336, "width": 336}),
                                          tokenizer=tokenizer, **SETTINGS), PIXEL_LIMITS)
template = TEMPLATES["llava"]
golden = []
for row in QWEN_GOLDEN["rows"]:
    images = [paths[n] for n in row["images"]]
    expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images)
    mm = media_inputs(template, processor, images)
    golden.append({"name": row["name"], "images": row["images"], "messages": row["messages"],
                   "image_tokens": [m["content"].count("<image>") for m in expanded],
                   "pairs": pairs, "pixel_values_shape": list(mm["pixel_values"].shape)})
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, QWEN_GOLDEN["rows"], paths, cutoff_len)
              for cutoff_len in (2048, 700)}

write_golden(out, {"template": "llava", "tokenizer": "llama2 with <image> added",
                   "processor": {"class": "LlavaProcessor", **SETTINGS}, "image_processor": "CLIPImageProcessor(size 336, crop 336)",
                   **PIXEL_LIMITS, "rows": golden, "supervised_by_cutoff_len": supervised})
print("wrote", out, [g["image_tokens"] for g in golden], [g["pixel_values_shape"] for g in golden])
