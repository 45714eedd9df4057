"""Golden rows of Qwen2-VL's image placeholder expansion, written by LLaMA-Factory 0.9.5's own
`qwen2_vl` template and mm_plugin (with transformers' Qwen2VLImageProcessor at its defaults) into
tests/data/media/, in the format tests/core/data/test_media_tokens.py reads. The images are drawn
here and again by the test (their sizes and colours are in the file). Run with LLaMA-Factory's Python
from the repository root:

    /work/lfvenv/bin/python tests/data/make_media_golden.py tests/data/media/qwen2_vl_images.json
"""
import sys
import types
from pathlib import Path

from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, Qwen2VLImageProcessor

from golden_rows import PIXEL_LIMITS, SHARED, drawn_images, expanded_row, media_inputs, supervised_examples, write_golden

out = Path(sys.argv[1])
SIZES = {"small": (20, 16), "square": (64, 64), "wide": (300, 120), "tall": (40, 500), "large": (1200, 1000), "strip": (5000, 20)}

paths = drawn_images(SIZES)
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5")
image_processor = Qwen2VLImageProcessor()
template = TEMPLATES["qwen2_vl"]
processor = types.SimpleNamespace(image_processor=image_processor, **PIXEL_LIMITS,
                                  model_input_names=["input_ids", "attention_mask", "pixel_values", "image_grid_thw"])
rows = [
    {"name": "one small image", "images": ["small"],
     "messages": [{"role": "user", "content": "<image>What colour is the box?"}, {"role": "assistant", "content": "Blue."}]},
    {"name": "two images", "images": ["square", "wide"],
     "messages": [{"role": "user", "content": "Compare <image> and <image>."}, {"role": "assistant", "content": "The second is wider."}]},
    {"name": "tall then large", "images": ["tall", "large"],
     "messages": [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "Tall."},
                  {"role": "user", "content": "And <image>?"}, {"role": "assistant", "content": "Large."}]},
    {"name": "extreme aspect", "images": ["strip"],
     "messages": [{"role": "user", "content": "<image>Describe."}, {"role": "assistant", "content": "A strip."}]},
]
golden = []
for row in rows:
    images = [paths[n] for n in row["images"]]
    expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images)
    mm = media_inputs(template, processor, images)
    golden.append({"name": row["name"], "images": row["images"], "messages": row["messages"],
                   "expanded": [m["content"] for m in expanded], "pairs": pairs,
                   "image_grid_thw": mm["image_grid_thw"].tolist(), "pixel_values_shape": list(mm["pixel_values"].shape)})
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, rows, paths, cutoff_len) for cutoff_len in (1024, 96)}

write_golden(out, {"template": "qwen2_vl", "tokenizer": "qwen2.5", "image_processor": "Qwen2VLImageProcessor() defaults",
                   **PIXEL_LIMITS, "sizes": SIZES,
                   "image": "RGB (200, 40, 40) with a (30, 90, 220) rectangle from w/4,h/4 to 3w/4,3h/4, PNG",
                   "rows": golden, "supervised_by_cutoff_len": supervised}, indent=1)
print("wrote", out, [g["image_grid_thw"] for g in golden])
