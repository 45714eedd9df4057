"""Golden rows of Llama 3.2 Vision's images, written by LLaMA-Factory 0.9.5's own `mllama` template and
mm_plugin with transformers' MllamaProcessor (its image processor in tiles of 28 pixels, at most 2 tiles an
image) into tests/data/media/, in the format tests/core/data/test_media_tokens.py reads.

Each `<image>` becomes one `<|image|>`; the model reads the pixels through cross-attention, so the batch's
inputs are per example: `pixel_values` (example, image, tile, ...), `aspect_ratio_ids`, `aspect_ratio_mask`
and `cross_attention_mask` (example, token, image, tile), here for the four rows as one batch. The
tokenizer is llama3's with `<|image|>` added (Llama 3.2 Vision's own tokenizer has it at the same id).
Run with LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_mllama_golden.py tests/data/media/mllama_images.json
"""
import sys
from pathlib import Path

from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, MllamaImageProcessor, MllamaProcessor

from golden_rows import PIXEL_LIMITS, QWEN_GOLDEN, SHARED, drawn_images, expanded_row, supervised_examples, with_settings, write_golden

out = Path(sys.argv[1])
SIZES = QWEN_GOLDEN["sizes"]
ROWS = QWEN_GOLDEN["rows"]
TILE, MAX_TILES = 28, 2

paths = drawn_images(SIZES)
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/llama3")
tokenizer.add_special_tokens({"additional_special_tokens": ["<|image|>"]})
processor = with_settings(MllamaProcessor(image_processor=MllamaImageProcessor(size={"height": TILE, "width": TILE},
                                                                             max_image_tiles=MAX_TILES),
                                          tokenizer=tokenizer), PIXEL_LIMITS)
template = TEMPLATES["mllama"]
template.fix_special_tokens(tokenizer)
rows, batch_ids, batch_images = [], [], []
for row in ROWS:
    images = [paths[n] for n in row["images"]]
    expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images)
    ids = [token for a, b in pairs for token in a + b]
    rows.append({"name": row["name"], "images": row["images"], "messages": row["messages"], "expanded": expanded, "pairs": pairs})
    batch_ids.append(ids)
    batch_images += images
mm = template.mm_plugin.get_mm_inputs(batch_images, [], [], [len(r["images"]) for r in ROWS], [0] * len(ROWS), [0] * len(ROWS),
                                      batch_ids, processor)
batch = {"input_ids": batch_ids, "pixel_values_shape": list(mm["pixel_values"].shape),
         "pixel_values_sum": round(float(mm["pixel_values"].double().sum()), 3),
         "aspect_ratio_ids": mm["aspect_ratio_ids"].tolist(), "aspect_ratio_mask": mm["aspect_ratio_mask"].tolist(),
         "cross_attention_mask": mm["cross_attention_mask"].tolist()}
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, ROWS, paths, cutoff_len)
              for cutoff_len in (2048, 30)}
write_golden(out, {"template": "mllama", "tokenizer": "llama3 with <|image|> added",
                   "image_token_id": tokenizer.convert_tokens_to_ids("<|image|>"),
                   "image_processor": {"class": "MllamaImageProcessor", "tile": TILE, "max_image_tiles": MAX_TILES},
                   **PIXEL_LIMITS, "sizes": SIZES, "rows": rows, "batch": batch, "supervised_by_cutoff_len": supervised})
print("wrote", out, batch["pixel_values_shape"], batch["aspect_ratio_ids"])
