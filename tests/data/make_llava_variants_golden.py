"""Golden supervised examples of LLaMA-Factory 0.9.5's multimodal copies of text formats: `llava_next_llama3`,
`llava_next_mistral`, `llava_next_qwen`, `llava_next_yi` (LLaVA-NeXT's images in Llama 3's, Mistral's, Qwen's
and Yi's formats) and `yi_vl` (LLaVA's images in Yi-VL's own format), each on a real tokenizer of its base
family with `<image>` added, with small processors (56-pixel tiles, patch 14), into tests/data/media/, in
the format tests/core/data/test_media_tokens.py reads. Run with LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_llava_variants_golden.py tests/data/media/llava_variants.json
"""
import sys
from pathlib import Path

from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, CLIPImageProcessor, LlavaNextImageProcessor, LlavaNextProcessor, LlavaProcessor

from golden_rows import PIXEL_LIMITS, QWEN_GOLDEN, SHARED, drawn_images, supervised_examples, with_settings, write_golden

out = Path(sys.argv[1])
ROWS = QWEN_GOLDEN["rows"]
VARIANTS = {"llava_next_llama3": "llama3", "llava_next_mistral": "mistral-v0.3", "llava_next_qwen": "qwen2.5",
            "llava_next_yi": "qwen2.5", "yi_vl": "llama2"}  # Yi's own tokenizer is not in shared/: its format is ChatML's
NEXT_PROCESSOR = {"size": {"shortest_edge": 56}, "crop_size": {"height": 56, "width": 56},
                  "image_grid_pinpoints": [[56, 112], [112, 56], [112, 112]]}
PLAIN_PROCESSOR = {"size": {"shortest_edge": 56}, "crop_size": {"height": 56, "width": 56}}
SETTINGS = {"patch_size": 14, "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1}

paths = drawn_images(QWEN_GOLDEN["sizes"])
golden = {}
for name, tokenizer_name in VARIANTS.items():
    tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers" / tokenizer_name)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    if name == "yi_vl":
        processor = LlavaProcessor(image_processor=CLIPImageProcessor(**PLAIN_PROCESSOR), tokenizer=tokenizer, **SETTINGS)
    else:
        processor = LlavaNextProcessor(image_processor=LlavaNextImageProcessor(**NEXT_PROCESSOR), tokenizer=tokenizer, **SETTINGS)
    with_settings(processor, PIXEL_LIMITS)
    template = TEMPLATES[name]
    template.fix_special_tokens(tokenizer)
    golden[name] = {"tokenizer": tokenizer_name, "image_token_id": tokenizer.convert_tokens_to_ids("<image>"),
                    "supervised": supervised_examples(template, tokenizer, processor, ROWS, paths, 4096)}
write_golden(out, {"rows": "the Qwen2-VL golden's", "next_image_processor": NEXT_PROCESSOR, "plain_image_processor": PLAIN_PROCESSOR,
                   "processor": SETTINGS, **PIXEL_LIMITS, "variants": golden})
print("wrote", out, {name: [len(e["input_ids"]) for e in g["supervised"]] for name, g in golden.items()})
