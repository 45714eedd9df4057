"""Which parameters LLaMA-Factory 0.9.5 trains, and which modules get LoRA, on tiny Qwen2-VL and Qwen2.5-VL
models (the shapes of tuneline's own, core/models/tiny/vision.py) under the freeze_vision_tower,
freeze_multi_modal_projector and freeze_language_model settings: the data of
tests/core/models/test_vision_parts.py (vision_parts_llamafactory.json). Run with LLaMA-Factory's Python:

    /work/lfvenv/bin/python tests/data/make_vision_parts_reference.py tests/data/vision_parts_llamafactory.json
"""
import json
import sys

from llamafactory.hparams import FinetuningArguments, ModelArguments
from llamafactory.model.adapter import init_adapter
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig, Qwen2VLForConditionalGeneration

TEXT = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rope_scaling={"type": "mrope", "mrope_section": [4, 2, 2]}, tie_word_embeddings=True)
VISION = dict(patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3, depth=1, num_heads=2)
FAMILIES = {
    "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration, dict(VISION, embed_dim=32, hidden_size=64, mlp_ratio=2)),
    "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                   dict(VISION, hidden_size=32, out_hidden_size=64, intermediate_size=64, window_size=56, fullatt_block_indexes=[0])),
}
SETTINGS = [
    {"finetuning_type": "full"},
    {"finetuning_type": "full", "freeze_vision_tower": False},
    {"finetuning_type": "full", "freeze_multi_modal_projector": False},
    {"finetuning_type": "full", "freeze_vision_tower": False, "freeze_language_model": True},
    {"finetuning_type": "freeze", "freeze_trainable_layers": 1},
    {"finetuning_type": "freeze", "freeze_trainable_layers": 1, "freeze_multi_modal_projector": False},
    {"finetuning_type": "freeze", "freeze_trainable_layers": -1, "freeze_extra_modules": "norm", "freeze_vision_tower": False},
    {"finetuning_type": "lora", "lora_target": "all"},
    {"finetuning_type": "lora", "lora_target": "all", "freeze_vision_tower": False},
    {"finetuning_type": "lora", "lora_target": "all", "freeze_multi_modal_projector": False},
    {"finetuning_type": "lora", "lora_target": "q_proj,v_proj"},
    {"finetuning_type": "lora", "lora_target": "qkv,q_proj", "freeze_vision_tower": False},
    {"finetuning_type": "lora", "lora_target": "all", "freeze_vision_tower": False, "freeze_language_model": True},
]
TOKENS = dict(image_token_id=300, video_token_id=301, vision_start_token_id=302, vision_end_token_id=303)
cases, configs = [], {}
for family, (config_class, model_class, vision) in FAMILIES.items():
    configs[family] = {"text_config": TEXT, "vision_config": vision, "tie_word_embeddings": True, **TOKENS}
    config = config_class(**configs[family])
    for settings in SETTINGS:
        model = model_class(config)
        model = init_adapter(config, model, ModelArguments(model_name_or_path="tiny"), FinetuningArguments(**settings),
                             is_trainable=True)
        trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
        adapted = sorted({n.split(".lora_A")[0].removeprefix("base_model.model.") for n, _ in model.named_modules() if ".lora_A" in n})
        cases.append({"family": family, "settings": settings, "trainable": trainable, "lora_modules": adapted})
with open(sys.argv[1], "w", encoding="utf-8") as handle:
    json.dump({"llamafactory_version": "0.9.5", "command": "/work/lfvenv/bin/python tests/data/make_vision_parts_reference.py "
               "tests/data/vision_parts_llamafactory.json (llamafactory.model.adapter.init_adapter)", "configs": configs,
               "cases": cases},
              handle, indent=1)
    handle.write("\n")
