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
import tempfile
import types
from pathlib import Path
from PIL import Image, ImageDraw
from transformers import AutoTokenizer, Glm4vImageProcessor
from llamafactory.data.template import TEMPLATES
from llamafactory.data.processor.supervised import SupervisedDatasetProcessor

out = Path(sys.argv[1])
images_dir = Path(tempfile.mkdtemp())
SHARED = Path(__file__).resolve().parents[3] / "shared"
QWEN = json.loads((Path(__file__).parent / "media/qwen2_vl_images.json").read_text())
SIZES = QWEN["sizes"]
GLM_TOKENS = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_image|>",
              "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|video|>"]


def make(name, size):
    w, h = size
    img = Image.new("RGB", tuple(size), (200, 40, 40))
    ImageDraw.Draw(img).rectangle([w // 4, h // 4, 3 * w // 4, 3 * h // 4], fill=(30, 90, 220))
    p = images_dir / f"{name}.png"; img.save(p); return str(p)


paths = {n: make(n, s) for n, s in SIZES.items()}
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
    data_args = types.SimpleNamespace(cutoff_len=cutoff_len, train_on_prompt=False, mask_history=False)
    encoder = SupervisedDatasetProcessor(template=template, tokenizer=tokenizer, processor=processor, data_args=data_args)
    rows = QWEN["rows"]
    batch = {"_prompt": [r["messages"][:-1] for r in rows], "_response": [r["messages"][-1:] for r in rows],
             "_system": [""] * len(rows), "_tools": [""] * len(rows),
             "_images": [[paths[n] for n in r["images"]] for r in rows], "_videos": [None] * len(rows), "_audios": [None] * len(rows)}
    encoded = encoder.preprocess_dataset(batch)
    supervised[str(cutoff_len)] = [{"input_ids": ids, "labels": labels} for ids, labels in zip(encoded["input_ids"], encoded["labels"])]

json.dump({"llamafactory_version": "0.9.5", "template": "glm4v", "tokenizer": "qwen2.5 with GLM's control and image tokens added",
           "added_tokens": GLM_TOKENS, "image_processor": "Glm4vImageProcessor() defaults",
           "image_max_pixels": 768 * 768, "image_min_pixels": 32 * 32,
           "rows": golden, "supervised_by_cutoff_len": supervised}, out.open("w"), indent=None)
print("wrote", out, [g["image_tokens"] for g in golden], [g["image_grid_thw"] for g in golden],
      [len(s["input_ids"]) for s in supervised["4096"]])
