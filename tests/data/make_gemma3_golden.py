"""Golden rows of Gemma 3's image placeholder expansion, written by LLaMA-Factory 0.9.5's own `gemma3`
template and mm_plugin with transformers' Gemma3Processor (Gemma3ImageProcessor at 64 pixels, 16 tokens
an image) into tests/data/media/, in the format tests/core/data/test_media_tokens.py reads, once with
`image_do_pan_and_scan` off and once on (where a wide picture gains crops). The tokenizer is llama2's
with Gemma 3's three image tokens (named as Gemma's tokenizer names them) and its turn markers added.
The images are the Qwen2-VL golden's plus a panorama (drawn again by the test).

With pan and scan on, LLaMA-Factory 0.9.5 stops on transformers 5 (IndexError: it reads the image
processor's `num_crops` as nested by batch, `[0][i]`, and transformers 5 gives one flat count per image);
this script hands its expansion the counts nested as it reads them, which is the expansion it means.
Run with LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_gemma3_golden.py tests/data/media/gemma3_images.json
"""
import sys
from pathlib import Path

from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, Gemma3ImageProcessor, Gemma3Processor

from golden_rows import (
    PANORAMA_ROW,
    PANORAMA_SIZE,
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
SIZES = {**QWEN_GOLDEN["sizes"], "panorama": PANORAMA_SIZE}
ROWS = QWEN_GOLDEN["rows"] + [PANORAMA_ROW]
paths = drawn_images(SIZES)
TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/llama2", **TOKENS)
TURNS = ["<start_of_turn>", "<end_of_turn>"]  # Gemma's turn markers, single tokens in its own tokenizer
tokenizer.add_special_tokens({"additional_special_tokens": list(TOKENS.values()) + TURNS})
processor = with_settings(Gemma3Processor(image_processor=Gemma3ImageProcessor(size={"height": 64, "width": 64}),
                                          tokenizer=tokenizer, image_seq_length=16), PIXEL_LIMITS)
template = TEMPLATES["gemma3"]
template.fix_special_tokens(tokenizer)  # as LLaMA-Factory's loader does: <end_of_turn> becomes the eos token
own_inputs = type(template.mm_plugin)._get_mm_inputs


def batched_crops(self, *args, **kwargs):
    inputs = own_inputs(self, *args, **kwargs)
    if "num_crops" in inputs and inputs["num_crops"].dim() == 1:
        inputs["num_crops"] = inputs["num_crops"].unsqueeze(0)
    return inputs


type(template.mm_plugin)._get_mm_inputs = batched_crops
by_setting = {}
for pan_and_scan in (False, True):
    processor.image_do_pan_and_scan = pan_and_scan
    golden = []
    for row in ROWS:
        images = [paths[n] for n in row["images"]]
        expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images)
        mm = media_inputs(template, processor, images)
        ids = [token for a, b in pairs for token in a + b]
        types_ = template.mm_plugin.get_mm_inputs(images, [], [], [len(images)], [0], [0], [ids], processor)["token_type_ids"]
        golden.append({"name": row["name"], "images": row["images"], "messages": row["messages"],
                       "expanded": expanded, "pairs": pairs,
                       "pixel_values_shape": list(mm["pixel_values"].shape), "num_crops": mm["num_crops"].flatten().tolist(),
                       "token_type_ids": types_[0]})
    supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, ROWS, paths, cutoff_len)
                  for cutoff_len in (2048, 50)}
    by_setting["pan_and_scan" if pan_and_scan else "plain"] = {"rows": golden, "supervised_by_cutoff_len": supervised}

write_golden(out, {"template": "gemma3", "tokenizer": "llama2 with Gemma 3's image tokens and turn markers added",
                   "tokens": TOKENS, "turn_tokens": TURNS, "processor": {"class": "Gemma3Processor", "image_seq_length": 16},
                   "image_processor": "Gemma3ImageProcessor(size 64 x 64)", **PIXEL_LIMITS, "sizes": SIZES, "by_setting": by_setting})
print("wrote", out, {k: [(g["name"], g["num_crops"], g["pixel_values_shape"]) for g in v["rows"]] for k, v in by_setting.items()})
