"""Golden rows of Qwen2-VL's image placeholder expansion, written by LLaMA-Factory 0.9.5's own
`qwen2_vl` template and mm_plugin (with transformers' Qwen2VLImageProcessor at its defaults) into
tests/data/media/, in the format tests/core/data/test_media_tokens.py reads. The images are drawn
here and again by the test (their sizes and colours are in the file). Run with LLaMA-Factory's Python
from the repository root:

    /work/lfvenv/bin/python tests/data/make_media_golden.py tests/data/media/qwen2_vl_images.json
"""
import json
import sys
import tempfile
import types
from pathlib import Path
from PIL import Image, ImageDraw
from transformers import AutoTokenizer, Qwen2VLImageProcessor
from llamafactory.data.template import TEMPLATES
from llamafactory.data.mm_plugin import get_mm_plugin

out = Path(sys.argv[1])
images_dir = Path(tempfile.mkdtemp())
SHARED = Path(__file__).resolve().parents[3] / "shared"
SIZES = {"small": (20, 16), "square": (64, 64), "wide": (300, 120), "tall": (40, 500), "large": (1200, 1000), "strip": (5000, 20)}

def make(name, size):
    """A red image with a blue box in its middle."""
    w, h = size
    img = Image.new("RGB", size, (200, 40, 40))
    ImageDraw.Draw(img).rectangle([w // 4, h // 4, 3 * w // 4, 3 * h // 4], fill=(30, 90, 220))
    p = images_dir / f"{name}.png"; img.save(p); return str(p)

paths = {n: make(n, s) for n, s in SIZES.items()}
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5")
image_processor = Qwen2VLImageProcessor()
template = TEMPLATES["qwen2_vl"]
processor = types.SimpleNamespace(image_processor=image_processor, image_max_pixels=768 * 768, image_min_pixels=32 * 32,
                                  model_input_names=["input_ids", "attention_mask", "pixel_values", "image_grid_thw"])
rows = [
    {"name": "one small image", "images": ["small"], "messages": [{"role": "user", "content": "<image>What colour is the box?"}, {"role": "assistant", "content": "Blue."}]},
    {"name": "two images", "images": ["square", "wide"], "messages": [{"role": "user", "content": "Compare <image> and <image>."}, {"role": "assistant", "content": "The second is wider."}]},
    {"name": "tall then large", "images": ["tall", "large"], "messages": [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "Tall."}, {"role": "user", "content": "And <image>?"}, {"role": "assistant", "content": "Large."}]},
    {"name": "extreme aspect", "images": ["strip"], "messages": [{"role": "user", "content": "<image>Describe."}, {"role": "assistant", "content": "A strip."}]},
]
golden = []
for row in rows:
    images = [paths[n] for n in row["images"]]
    expanded = template.mm_plugin.process_messages(row["messages"], images, [], [], processor)
    pairs = template.encode_multiturn(tokenizer, expanded, system=None, tools=None)
    mm = template.mm_plugin._get_mm_inputs(images, [], [], processor)
    golden.append({"name": row["name"], "images": row["images"], "messages": row["messages"],
                   "expanded": [m["content"] for m in expanded], "pairs": [[list(a), list(b)] for a, b in pairs],
                   "image_grid_thw": mm["image_grid_thw"].tolist(), "pixel_values_shape": list(mm["pixel_values"].shape)})
from llamafactory.data.processor.supervised import SupervisedDatasetProcessor

supervised = {}
for cutoff_len in (1024, 96):
    data_args = types.SimpleNamespace(cutoff_len=cutoff_len, train_on_prompt=False, mask_history=False)
    processor_lf = SupervisedDatasetProcessor(template=template, tokenizer=tokenizer, processor=processor, data_args=data_args)
    batch = {"_prompt": [r["messages"][:-1] for r in rows], "_response": [r["messages"][-1:] for r in rows],
             "_system": [""] * len(rows), "_tools": [""] * len(rows),
             "_images": [[paths[n] for n in r["images"]] for r in rows], "_videos": [None] * len(rows), "_audios": [None] * len(rows)}
    encoded = processor_lf.preprocess_dataset(batch)
    supervised[str(cutoff_len)] = [{"input_ids": ids, "labels": labels} for ids, labels in zip(encoded["input_ids"], encoded["labels"])]

json.dump({"llamafactory_version": "0.9.5", "template": "qwen2_vl", "tokenizer": "qwen2.5",
           "image_processor": "Qwen2VLImageProcessor() defaults", "image_max_pixels": 768 * 768, "image_min_pixels": 32 * 32,
           "sizes": SIZES, "image": "RGB (200, 40, 40) with a (30, 90, 220) rectangle from w/4,h/4 to 3w/4,3h/4, PNG",
           "rows": golden, "supervised_by_cutoff_len": supervised}, out.open("w"), indent=1)
print("wrote", out, [g["image_grid_thw"] for g in golden])
