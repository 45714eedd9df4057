"""Golden rows of PaliGemma's images, written by LLaMA-Factory 0.9.5's own `paligemma` and `paligemma_chat`
templates and mm_plugin with transformers' PaliGemmaProcessor (SigLIP's image processor at 64 pixels, 16
image tokens an image) into tests/data/media/, in the format tests/core/data/test_media_tokens.py reads.

PaliGemma writes every image's tokens before the whole conversation (its BOS included) and drops the
`<image>` placeholders from the text; its token types are 0 on the image tokens and 1 after them. The
supervised examples (two cutoffs) and the pairwise examples of preference rows show where the prefix
sits and how it counts against cutoff_len. The tokenizer is llama2's with `<image>` (and the location
and segmentation tokens PaliGemmaProcessor adds) and, for `paligemma_chat`, Gemma's turn markers.
Run with LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_paligemma_golden.py tests/data/media/paligemma_images.json
"""
import sys
import types
from pathlib import Path

from llamafactory.data.processor.pairwise import PairwiseDatasetProcessor
from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, PaliGemmaProcessor, SiglipImageProcessor

from golden_rows import PIXEL_LIMITS, QWEN_GOLDEN, SHARED, drawn_images, expanded_row, supervised_examples, with_settings, write_golden

out = Path(sys.argv[1])
SIZES = QWEN_GOLDEN["sizes"]
ROWS = QWEN_GOLDEN["rows"]
PAIRS = [{"name": "one image, two replies", "images": ["square"],
          "messages": [{"role": "user", "content": "<image>Which colour is the box?"}],
          "replies": [{"role": "assistant", "content": "Blue."}, {"role": "assistant", "content": "Green, surely."}]},
         {"name": "two images, two replies", "images": ["wide", "tall"],
          "messages": [{"role": "user", "content": "<image>and<image>: which is taller?"}],
          "replies": [{"role": "assistant", "content": "The second."}, {"role": "assistant", "content": "The first one is."}]}]
TURNS = ["<start_of_turn>", "<end_of_turn>"]
SEQ_LEN = 16

paths = drawn_images(SIZES)
golden = {}
for name in ("paligemma", "paligemma_chat"):
    tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/llama2")
    if name == "paligemma_chat":
        tokenizer.add_special_tokens({"additional_special_tokens": TURNS})
    processor = with_settings(PaliGemmaProcessor(image_processor=SiglipImageProcessor(size={"height": 64, "width": 64},
                                                                                      image_seq_length=SEQ_LEN),
                                                 tokenizer=tokenizer), PIXEL_LIMITS)
    template = TEMPLATES[name]
    template.fix_special_tokens(tokenizer)  # as LLaMA-Factory's loader does
    rows = []
    for row in ROWS:
        images = [paths[n] for n in row["images"]]
        expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images)
        prefix, _ = template.mm_plugin.process_token_ids([], None, images, [], [], tokenizer, processor)
        ids = prefix + [token for a, b in pairs for token in a + b]
        mm = template.mm_plugin.get_mm_inputs(images, [], [], [len(images)], [0], [0], [ids], processor)
        rows.append({"name": row["name"], "images": row["images"], "messages": row["messages"], "expanded": expanded,
                     "prefix": prefix, "pairs": pairs,
                     "pixel_values_shape": list(mm["pixel_values"].shape),
                     "pixel_values_sum": round(float(mm["pixel_values"].double().sum()), 3),
                     "token_type_ids": mm["token_type_ids"][0]})
    supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, ROWS, paths, cutoff_len)
                  for cutoff_len in (2048, 40)}
    data_args = types.SimpleNamespace(cutoff_len=60)
    pairwise = PairwiseDatasetProcessor(template=template, tokenizer=tokenizer, processor=processor, data_args=data_args)
    encoded = pairwise.preprocess_dataset({
        "_prompt": [p["messages"] for p in PAIRS], "_response": [p["replies"] for p in PAIRS], "_system": [""] * len(PAIRS),
        "_tools": [""] * len(PAIRS), "_images": [[paths[n] for n in p["images"]] for p in PAIRS],
        "_videos": [None] * len(PAIRS), "_audios": [None] * len(PAIRS)})
    keys = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")
    golden[name] = {"image_token_id": tokenizer.convert_tokens_to_ids("<image>"), "vocabulary": len(tokenizer), "rows": rows,
                    "supervised_by_cutoff_len": supervised,
                    "pairwise_cutoff_len_60": [{key: encoded[key][i] for key in keys} for i in range(len(PAIRS))]}

write_golden(out, {"tokenizer": "llama2 with <image> and PaliGemmaProcessor's location and segmentation tokens added "
                                "(paligemma_chat: and Gemma's turn markers first)", "turn_tokens": TURNS,
                   "image_processor": {"class": "SiglipImageProcessor", "size": 64, "image_seq_length": SEQ_LEN},
                   **PIXEL_LIMITS, "sizes": SIZES, "pairs": PAIRS, "templates": golden})
print("wrote", out, {name: [(r["name"], len(r["prefix"]), r["pixel_values_shape"]) for r in g["rows"]] for name, g in golden.items()})
