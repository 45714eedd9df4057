"""LLaMA Pro on the tiny model: block expansion keeps the model's outputs, and with `use_llama_pro`
freeze and LoRA training change only the added blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import train_steps
from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError
from tuneline.core.models.expansion import expand_blocks
from tuneline.core.models.loading import apply_finetuning, load_model
from tuneline.core.stages.registry import build_stage_config

# The tiny model has 2 layers; expanded by 2 it has 4, the copies at 1 and 3.
ADDED = (1, 3)


@pytest.fixture(scope="module")
def expanded(tiny_base: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("expanded")
    assert expand_blocks(tiny_base, out, num_expand=2) == {"layers": 4, "added": 2}
    return out


@pytest.fixture(scope="module")
def token_batch(tiny_base: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    texts = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France, and a large city."]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return {**batch, "labels": labels}


def layer_index(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[parts.index("layers") + 1]) if "layers" in parts else None


def test_expanded_model_computes_what_the_original_did(tiny_base: Path, expanded: Path, token_batch):
    original, grown = load_model(tiny_base).eval(), load_model(expanded).eval()
    assert grown.config.num_hidden_layers == 4 and len(grown.model.layers) == 4
    assert [layer.self_attn.layer_idx for layer in grown.model.layers] == [0, 1, 2, 3]
    for added in ADDED:
        attention = grown.model.layers[added].self_attn
        assert torch.equal(attention.o_proj.weight, torch.zeros_like(attention.o_proj.weight))
        assert torch.equal(attention.q_proj.weight, original.model.layers[added // 2].self_attn.q_proj.weight)
    inputs = {key: token_batch[key] for key in ("input_ids", "attention_mask")}
    with torch.no_grad():
        assert torch.allclose(grown(**inputs).logits, original(**inputs).logits, atol=1e-5)
        generated = grown.generate(**inputs, max_new_tokens=5, do_sample=False)  # the KV cache has a slot per layer
        assert torch.equal(generated, original.generate(**inputs, max_new_tokens=5, do_sample=False))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["freeze", "lora"])
def test_llama_pro_trains_only_the_added_blocks(expanded: Path, token_batch, one_torch_thread, method: str):
    finetuning = FinetuningConfig(finetuning_type=method, use_llama_pro=True, freeze_trainable_layers=2, lora_rank=4)
    torch.manual_seed(0)
    model = apply_finetuning(load_model(expanded), finetuning, model_config=ModelConfig())
    losses, moved = train_steps(model, token_batch)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert losses[-1] < losses[0]
    assert moved == trainable and trainable
    assert {layer_index(name) for name in moved} == set(ADDED)
    if method == "lora":
        assert all(".lora_" in name for name in moved)
    else:  # the whole of each added block trains
        assert len(moved) == 2 * len(dict(model.model.layers[1].named_parameters()))


def test_llama_pro_settings_that_cannot_train_are_config_errors(expanded: Path):
    with pytest.raises(ConfigError, match="'use_llama_pro: true' trains only the blocks added by expansion"):
        build_stage_config({"stage": "sft", "finetuning_type": "full", "use_llama_pro": True})
    with pytest.raises(ConfigError, match=r"'freeze_trainable_layers: 3' equal groups, and the model's 4 layers"):
        apply_finetuning(load_model(expanded), FinetuningConfig(finetuning_type="freeze", use_llama_pro=True,
                                                                freeze_trainable_layers=3), model_config=ModelConfig())
    with pytest.raises(ConfigError, match=r"'num_expand: 3' must be a positive divisor of the model's 4 layers"):
        expand_blocks(expanded, expanded.parent / "never", num_expand=3)


def test_the_command_expands_or_exits_2_naming_the_problem(tiny_base: Path, tmp_path: Path, capsys):
    from tuneline.core.models.expansion import main

    main([str(tiny_base), str(tmp_path / "one"), "--num-expand", "1"])
    assert "3 layers, 1 added" in capsys.readouterr().out
    assert load_model(tmp_path / "one").config.num_hidden_layers == 3
    with pytest.raises(SystemExit) as exit_:
        main([str(tiny_base), str(tmp_path / "never"), "--num-expand", "4"])
    assert exit_.value.code == 2 and "'num_expand: 4' must be a positive divisor" in capsys.readouterr().err
