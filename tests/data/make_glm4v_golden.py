"""Golden rows of GLM-4V's image placeholder expansion (GLM-4.1V-Thinking), written by LLaMA-Factory 0.9.5's
own `glm4v` template and mm_plugin with transformers' Glm4vImageProcessor at its defaults into
tests/data/media/, in the format tests/core/data/test_media_tokens.py reads. The tokenizer is Qwen2.5's
with GLM's control and image tokens added. The images are the Qwen2-VL golden's (drawn again by the
test).

transformers' Glm4vProcessor needs a video processor, which needs torchvision (not importable beside the
CPU build of torch); LLaMA-Factory's image path reads only the processor's image processor and pixel
limits, so this script hands it an object holding just those. Run with LLaMA-Factory's Python from the
repository root:

    /work/lfvenv/bin/python tests/data/make_glm4v_golden.py tests/data/media/glm4v_images.json
"""
import sys
import types
from pathlib import Path

from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, Glm4vImageProcessor

from golden_rows import (
    GLM_TOKENS,
    PIXEL_LIMITS,
    QWEN_GOLDEN,
    SHARED,
    drawn_images,
    expanded_row,
    media_inputs,
    supervised_examples,
    write_golden,
)

out = Path(sys.argv[1])
paths = drawn_images(QWEN_GOLDEN["sizes"])
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5")
tokenizer.add_special_tokens({"additional_special_tokens": GLM_TOKENS})
processor = types.SimpleNamespace(image_processor=Glm4vImageProcessor(), **PIXEL_LIMITS)
template = TEMPLATES["glm4v"]
template.fix_special_tokens(tokenizer)
golden = []
for row in QWEN_GOLDEN["rows"]:
    images = [paths[n] for n in row["images"]]
    expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images)
    mm = media_inputs(template, processor, images)
    golden.append({"name": row["name"], "images": row["images"], "messages": row["messages"],
                   "image_tokens": [m["content"].count("<|image|>") for m in expanded],
                   "pairs": pairs, "pixel_values_shape": list(mm["pixel_values"].shape),
                   "image_grid_thw": mm["image_grid_thw"].tolist()})
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, QWEN_GOLDEN["rows"], paths, cutoff_len)
              for cutoff_len in (4096, 200)}

write_golden(out, {"template": "glm4v", "tokenizer": "qwen2.5 with GLM's control and image tokens added",
                   "added_tokens": GLM_TOKENS, "image_processor": "Glm4vImageProcessor() defaults", **PIXEL_LIMITS,
                   "rows": golden, "supervised_by_cutoff_len": supervised})
print("wrote", out, [g["image_tokens"] for g in golden], [g["image_grid_thw"] for g in golden],
      [len(s["input_ids"]) for s in supervised["4096"]])
