"""Golden rows of InternVL's image placeholder expansion (InternVL3 in transformers' format), written by
LLaMA-Factory 0.9.5's own `intern_vl` template and mm_plugin with transformers' GotOcr2ImageProcessor at
448 pixels and 256 tokens a tile into tests/data/media/, in the format
tests/core/data/test_media_tokens.py reads, once with `crop_to_patches` off and once on (an image then
becomes up to 12 tiles and a thumbnail; those rows keep their counts and a cut example, not their
thousands of ids twice). The tokenizer is Qwen2.5's with InternVL's `<img>`, `</img>` and
`<IMG_CONTEXT>` added. The images are the Qwen2-VL golden's plus a panorama (drawn again by the test).

transformers' InternVLProcessor needs a video processor, which needs torchvision (not importable
beside the CPU build of torch); LLaMA-Factory's image path reads only the processor's image processor,
image_seq_length, crop_to_patches and pixel limits, so this script hands it an object holding just
those. Run with LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_internvl_golden.py tests/data/media/internvl_images.json
"""
import sys
import types
from pathlib import Path

from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, GotOcr2ImageProcessor

from golden_rows import (
    INTERN_TOKENS,
    PANORAMA_ROW,
    PANORAMA_SIZE,
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
SIZES = {**QWEN_GOLDEN["sizes"], "panorama": PANORAMA_SIZE}
ROWS = QWEN_GOLDEN["rows"] + [PANORAMA_ROW]
IMAGE_PROCESSOR = {"size": {"height": 448, "width": 448}, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}

paths = drawn_images(SIZES)
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5")
tokenizer.add_special_tokens({"additional_special_tokens": INTERN_TOKENS})
template = TEMPLATES["intern_vl"]
template.fix_special_tokens(tokenizer)
by_setting = {}
for crop in (False, True):
    processor = types.SimpleNamespace(image_processor=GotOcr2ImageProcessor(**IMAGE_PROCESSOR), image_seq_length=256,
                                      crop_to_patches=crop, **PIXEL_LIMITS)
    golden = []
    for row in ROWS:
        images = [paths[n] for n in row["images"]]
        expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images)
        mm = media_inputs(template, processor, images)
        golden.append({"name": row["name"], "images": row["images"], "messages": row["messages"],
                       "image_tokens": [m["content"].count("<IMG_CONTEXT>") for m in expanded],
                       "pairs": None if crop else pairs,
                       "pixel_values_shape": list(mm["pixel_values"].shape),
                       "num_patches": [int(n) for n in mm["image_num_patches"]]})
    # a cropped row's whole example is thousands of tokens: those keep one cut example only
    supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, ROWS, paths, cutoff_len)
                  for cutoff_len in ((1500,) if crop else (8192, 400))}
    by_setting["crop_to_patches" if crop else "plain"] = {"rows": golden, "supervised_by_cutoff_len": supervised}

write_golden(out, {"template": "intern_vl", "tokenizer": "qwen2.5 with InternVL's image tokens added",
                   "added_tokens": INTERN_TOKENS, "image_processor": IMAGE_PROCESSOR, "image_seq_length": 256,
                   **PIXEL_LIMITS, "sizes": SIZES, "by_setting": by_setting})
print("wrote", out, {k: [(g["name"], g["num_patches"], g["image_tokens"]) for g in v["rows"]] for k, v in by_setting.items()},
      {k: {c: [len(s["input_ids"]) for s in e] for c, e in v["supervised_by_cutoff_len"].items()} for k, v in by_setting.items()})
