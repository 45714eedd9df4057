"""Golden rows of Qwen3-VL's image placeholder expansion, written by LLaMA-Factory 0.9.5's own `qwen3_vl`
template (a reasoning template: an empty thought before each reply) and `qwen3_vl` mm_plugin, with
transformers' Qwen2VLImageProcessor as a Qwen3-VL folder configures it (patches of 16, merge 2, so one
image token per 32 x 32 pixels), into tests/data/media/, in the format tests/core/data/test_media_tokens.py
reads. The images and rows are the Qwen2-VL golden's. The plugin reads the video processor's merge_size
even for images; Qwen3-VL's video processor needs torchvision, so a namespace holding that one number
stands in for it. Run with LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_qwen3_vl_golden.py tests/data/media/qwen3_vl_images.json
"""
import sys
import types
from pathlib import Path

from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, Qwen2VLImageProcessor

from golden_rows import PIXEL_LIMITS, QWEN_GOLDEN, SHARED, drawn_images, expanded_row, media_inputs, supervised_examples, write_golden

out = Path(sys.argv[1])
paths = drawn_images(QWEN_GOLDEN["sizes"])
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5")
PROCESSOR = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
image_processor = Qwen2VLImageProcessor(**PROCESSOR)
template = TEMPLATES["qwen3_vl"]
processor = types.SimpleNamespace(image_processor=image_processor, video_processor=types.SimpleNamespace(merge_size=2),
                                  **PIXEL_LIMITS, model_input_names=["input_ids", "attention_mask", "pixel_values", "image_grid_thw"])
golden = []
for row in QWEN_GOLDEN["rows"]:
    images = [paths[n] for n in row["images"]]
    expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images)
    mm = media_inputs(template, processor, images)
    golden.append({"name": row["name"], "images": row["images"], "messages": row["messages"],
                   "expanded": [m["content"] for m in expanded], "pairs": pairs,
                   "image_grid_thw": mm["image_grid_thw"].tolist(), "pixel_values_shape": list(mm["pixel_values"].shape)})
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, QWEN_GOLDEN["rows"], paths, cutoff_len)
              for cutoff_len in (1024, 96)}

write_golden(out, {"template": "qwen3_vl", "tokenizer": "qwen2.5", "image_processor": {"class": "Qwen2VLImageProcessor", **PROCESSOR},
                   **PIXEL_LIMITS, "rows": golden, "supervised_by_cutoff_len": supervised})
print("wrote", out, [g["image_grid_thw"] for g in golden])
