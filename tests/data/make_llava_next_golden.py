"""Golden rows of LLaVA-NeXT's image placeholder expansion, written by LLaMA-Factory 0.9.5's own
`llava_next` template and mm_plugin with transformers' LlavaNextProcessor (LLaVA-v1.6's numbers: images
resized to 336 and cut into 336-pixel tiles on the best of five grids, patch 14, the `default` feature
strategy, one class token) into tests/data/media/, in the format tests/core/data/test_media_tokens.py
reads. The tokenizer is llama2's with `<image>` added; the images are the Qwen2-VL golden's (drawn again
by the test). Run with LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_llava_next_golden.py tests/data/media/llava_next_images.json
"""
import sys
from pathlib import Path

from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, LlavaNextImageProcessor, LlavaNextProcessor

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
IMAGE_PROCESSOR = {"size": {"shortest_edge": 336}, "crop_size": {"height": 336, "width": 336},
                   "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]}
SETTINGS = {"patch_size": 14, "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1}
processor = with_settings(LlavaNextProcessor(image_processor=LlavaNextImageProcessor(**IMAGE_PROCESSOR), tokenizer=tokenizer,
                                              **SETTINGS), PIXEL_LIMITS)
template = TEMPLATES["llava_next"]
template.fix_special_tokens(tokenizer)
golden = []
for row in QWEN_GOLDEN["rows"]:
    images = [paths[n] for n in row["images"]]
    expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images)
    mm = media_inputs(template, processor, images)
    golden.append({"name": row["name"], "images": row["images"], "messages": row["messages"],
                   "image_tokens": [m["content"].count("<image>") for m in expanded],
                   "pairs": pairs, "pixel_values_shape": list(mm["pixel_values"].shape),
                   "image_sizes": mm["image_sizes"].tolist()})
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, QWEN_GOLDEN["rows"], paths, cutoff_len)
              for cutoff_len in (4096, 1400)}

write_golden(out, {"template": "llava_next", "tokenizer": "llama2 with <image> added",
                   "processor": {"class": "LlavaNextProcessor", **SETTINGS}, "image_processor": IMAGE_PROCESSOR,
                   **PIXEL_LIMITS, "rows": golden, "supervised_by_cutoff_len": supervised})
print("wrote", out, [g["image_tokens"] for g in golden], [g["pixel_values_shape"] for g in golden],
      [len(s["input_ids"]) for s in supervised["4096"]])
