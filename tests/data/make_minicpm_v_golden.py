"""Golden rows of MiniCPM-V 4.6's image placeholder expansion, written by LLaMA-Factory 0.9.5's own
`minicpm_v_4_6` template and MiniCPMV4_6Plugin into tests/data/media/, in the format
tests/core/data/test_minicpm_v_tokens.py reads: each row's expanded messages and ids, a batch of the four
rows' model inputs (pixel_values, target_sizes, downsample_mode) and the supervised examples at two cutoffs.
The images are the Qwen2-VL golden's; the processor keeps LLaMA-Factory's default image_max_pixels
(768 x 768), which this plugin never applies (the 1200 x 1000 image reaches the processor whole).

The tokenizer is Qwen2.5's (the closest at hand to Qwen3.5's) with the markers MiniCPM-V's tokenizers
declare as special tokens added: `<image>`, `</image>`, `<slice>`, `</slice>`, `<image_id>`, `</image_id>`
(each written as one token between and around the image tokens); the image token is Qwen's own
`<|image_pad|>`, already in the vocabulary, which MiniCPM-V 4.6's tokenizer names as its `image_token`.
MiniCPMV4_6Processor reads these names from the tokenizer's attributes, and LLaMA-Factory from the
processor's, so the processor handed over here carries them, with the image processor's slice_mode and
use_image_id as MiniCPMV4_6Processor copies them.

LLaMA-Factory's Python carries transformers 5.6, which predates MiniCPM-V 4.6; its plugin only calls the
processor's `image_processor` on the image files. So the image processor here is transformers 5.25's
MiniCPMV4_6ImageProcessorPil (the checkpoint's settings: 448 pixels, at most 9 slices, "16x") running in
tuneline's own Python (.venv), one process for the whole script, its outputs read back as arrays. Run with
LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_minicpm_v_golden.py tests/data/media/minicpm_v_images.json
"""
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch
from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer

from golden_rows import PIXEL_LIMITS, QWEN_GOLDEN, SHARED, drawn_images, expanded_row, supervised_examples, write_golden

out = Path(sys.argv[1])
ROOT = Path(__file__).resolve().parents[2]
SIZES = QWEN_GOLDEN["sizes"]
ROWS = QWEN_GOLDEN["rows"]
ADDED_TOKENS = ["<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>"]
TOKEN_NAMES = {"image_token": "<|image_pad|>", "image_start_token": "<image>", "image_end_token": "</image>",
               "slice_start_token": "<slice>", "slice_end_token": "</slice>", "image_id_start_token": "<image_id>",
               "image_id_end_token": "</image_id>"}
IMAGE_PROCESSOR = {"scale_resolution": 448, "max_slice_nums": 9, "patch_size": 14, "slice_mode": True,
                   "downsample_mode": "16x", "use_image_id": True}
SERVE = """
import json, sys
import numpy as np
from transformers import MiniCPMV4_6ImageProcessorPil
processor = MiniCPMV4_6ImageProcessorPil(**json.loads(sys.argv[1]))
for line in sys.stdin:
    request = json.loads(line)
    cut = processor(request["paths"], return_tensors="np")
    np.savez(request["file"], pixel_values=cut["pixel_values"], target_sizes=cut["target_sizes"],
             grids=np.array(cut["grids"]).reshape(-1, 2), num_patches_per_image=np.array(cut["num_patches_per_image"]))
    print("done", flush=True)
"""


class ImageProcessorInTunelinesPython:
    """MiniCPMV4_6ImageProcessorPil called as LLaMA-Factory calls it (files in, tensors out), run by tuneline's Python."""

    def __init__(self, settings: dict):
        vars(self).update(settings)
        self.server = subprocess.Popen([str(ROOT / ".venv/bin/python"), "-c", SERVE, json.dumps(settings)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.folder = Path(tempfile.mkdtemp())

    def __call__(self, images, return_tensors="pt"):
        file = self.folder / "cut.npz"
        self.server.stdin.write(json.dumps({"paths": [str(image) for image in images], "file": str(file)}) + "\n")
        self.server.stdin.flush()
        assert self.server.stdout.readline().strip() == "done"
        cut = np.load(file)
        return {"pixel_values": torch.from_numpy(cut["pixel_values"]), "target_sizes": torch.from_numpy(cut["target_sizes"]),
                "grids": cut["grids"].tolist(), "num_patches_per_image": cut["num_patches_per_image"].tolist()}


paths = drawn_images(SIZES)
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5")
tokenizer.add_special_tokens({"additional_special_tokens": ADDED_TOKENS})
image_processor = ImageProcessorInTunelinesPython(IMAGE_PROCESSOR)
processor = types.SimpleNamespace(image_processor=image_processor, tokenizer=tokenizer, slice_mode=image_processor.slice_mode,
                                  default_use_image_id=image_processor.use_image_id, **PIXEL_LIMITS, **TOKEN_NAMES)
template = TEMPLATES["minicpm_v_4_6"]
template.fix_special_tokens(tokenizer)
rows, batch_ids, batch_images = [], [], []
for row in ROWS:
    images = [paths[n] for n in row["images"]]
    expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images)
    rows.append({"name": row["name"], "images": row["images"], "messages": row["messages"], "expanded": expanded, "pairs": pairs})
    batch_ids.append([token for a, b in pairs for token in a + b])
    batch_images += images
mm = template.mm_plugin.get_mm_inputs(batch_images, [], [], [len(r["images"]) for r in ROWS], [0] * len(ROWS), [0] * len(ROWS),
                                      batch_ids, processor)
batch = {"input_ids": batch_ids, "pixel_values_shape": list(mm["pixel_values"].shape),
         "pixel_values_sum": round(float(mm["pixel_values"].double().sum()), 3), "target_sizes": mm["target_sizes"].tolist(),
         "downsample_mode": mm["downsample_mode"], "inputs": sorted(mm)}
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, ROWS, paths, cutoff_len)
              for cutoff_len in (4096, 300)}
image_processor.server.stdin.close()
image_processor.server.wait()
write_golden(out, {"template": "minicpm_v_4_6", "tokenizer": "qwen2.5 with MiniCPM-V's image markers added",
                   "added_tokens": ADDED_TOKENS, "token_names": TOKEN_NAMES,
                   "image_processor": {"class": "MiniCPMV4_6ImageProcessorPil", **IMAGE_PROCESSOR}, **PIXEL_LIMITS,
                   "sizes": SIZES, "rows": rows, "batch": batch, "supervised_by_cutoff_len": supervised})
print("wrote", out, batch["pixel_values_shape"], batch["target_sizes"], [len(ids) for ids in batch_ids],
      {c: [len(e["input_ids"]) for e in s] for c, s in supervised.items()})
