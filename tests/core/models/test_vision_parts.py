"""A vision-language model's parts train as LLaMA-Factory 0.9.5 trains them: which parameters full and
freeze tuning leave trainable, and which modules LoRA adapts, under freeze_vision_tower,
freeze_multi_modal_projector and freeze_language_model (tests/data/vision_parts_llamafactory.json,
written by tests/data/make_vision_parts_reference.py with LLaMA-Factory's own functions)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REFERENCE = json.loads((Path(__file__).resolve().parents[2] / "data/vision_parts_llamafactory.json").read_text())


def tiny_model(family: str):
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    config_class, model_class = {"qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration),
                                 "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration)}[family]
    torch.manual_seed(0)
    return model_class(config_class(**REFERENCE["configs"][family]))


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda case: f"{case['family']}-" + "-".join(
    f"{key}={value}" for key, value in case["settings"].items()))
def test_parts_train_as_in_llamafactory(case: dict):
    from tuneline.core.config import FinetuningConfig
    from tuneline.core.models.loading import apply_finetuning

    model = apply_finetuning(tiny_model(case["family"]), FinetuningConfig(**case["settings"]))
    if case["settings"]["finetuning_type"] == "lora":
        adapted = sorted({name.split(".lora_A")[0].removeprefix("base_model.model.")
                          for name, _ in model.named_modules() if ".lora_A" in name})
        assert adapted == case["lora_modules"]
    trainable = {name.removeprefix("base_model.model.") for name, p in model.named_parameters() if p.requires_grad}
    expected = {name.removeprefix("base_model.model.") for name in case["trainable"]}
    if case["settings"]["finetuning_type"] == "freeze":
        # LLaMA-Factory's layer pattern `.<i>.` also catches the vision blocks numbered like the chosen decoder
        # layers when the tower is not frozen; tuneline reads the decoder's layers only (core/models/freeze.py)
        caught = {name for name in expected - trainable if re.match(r"model\.visual\.blocks\.\d+\.", name)}
        expected -= caught
        assert bool(caught) == (case["settings"].get("freeze_vision_tower") is False)
    assert sorted(trainable) == sorted(expected)


def test_freeze_counts_the_language_models_layers_not_the_vision_blocks():
    from tuneline.core.models.freeze import decoder_layers

    model = tiny_model("qwen2_vl")
    model.model.visual.blocks.append(model.model.visual.blocks[0])  # as many vision blocks as decoder layers
    assert decoder_layers(model) == ("model.language_model.layers", 2)


def test_an_adapter_on_frozen_parts_only_is_refused():
    from tuneline.core.config import FinetuningConfig
    from tuneline.core.errors import ConfigError
    from tuneline.core.models.loading import apply_finetuning

    with pytest.raises(ConfigError, match="'lora_target: qkv' names no layer outside the parts kept frozen"):
        apply_finetuning(tiny_model("qwen2_vl"), FinetuningConfig(finetuning_type="lora", lora_target="qkv"))
