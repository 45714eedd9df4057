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
import json
import sys
import types
from pathlib import Path
from transformers import AutoTokenizer, Glm4vImageProcessor
from llamafactory.data.template import TEMPLATES
from golden_rows import QWEN_GOLDEN, SHARED, drawn_images, supervised_examples

out = Path(sys.argv[1])
QWEN = QWEN_GOLDEN
SIZES = QWEN["sizes"]
GLM_TOKENS = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_image|>",
              "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|video|>"]




paths = drawn_images(SIZES)
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5")
tokenizer.add_special_tokens({"additional_special_tokens": GLM_TOKENS})
processor = types.SimpleNamespace(image_processor=Glm4vImageProcessor(), image_max_pixels=768 * 768, image_min_pixels=32 * 32)
template = TEMPLATES["glm4v"]
template.fix_special_tokens(tokenizer)
golden = []
for row in QWEN["rows"]:
    images = [paths[n] for n in row["images"]]
    expanded = template.mm_plugin.process_messages(row["messages"], images, [], [], processor)
    pairs = template.encode_multiturn(tokenizer, expanded, system=None, tools=None)
    mm = template.mm_plugin._get_mm_inputs(images, [], [], processor)
    golden.append({"name": row["name"], "images": row["images"], "messages": row["messages"],
                   "image_tokens": [m["content"].count("<|image|>") for m in expanded],
                   "pairs": [[list(a), list(b)] for a, b in pairs], "pixel_values_shape": list(mm["pixel_values"].shape),
                   "image_grid_thw": mm["image_grid_thw"].tolist()})
supervised = {}
for cutoff_len in (4096, 200):
    supervised[str(cutoff_len)] = supervised_examples(template, tokenizer, processor, QWEN["rows"], paths, cutoff_len)

json.dump({"llamafactory_version": "0.9.5", "template": "glm4v", "tokenizer": "qwen2.5 with GLM's control and image tokens added",
           "added_tokens": GLM_TOKENS, "image_processor": "Glm4vImageProcessor() defaults",
           "image_max_pixels": 768 * 768, "image_min_pixels": 32 * 32,
           "rows": golden, "supervised_by_cutoff_len": supervised}, out.open("w"), indent=None)
print("wrote", out, [g["image_tokens"] for g in golden], [g["image_grid_thw"] for g in golden],
      [len(s["input_ids"]) for s in supervised["4096"]])
