"""OFT through peft on the tiny model: it trains only its rotations, saves like a LoRA adapter, and
merges into the base; its keys are checked when the config is read."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError
from tuneline.core.models.loading import apply_finetuning, load_model
from tuneline.core.stages.registry import build_stage_config

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def batch(tiny_base: Path, tmp_path_factory) -> dict[str, torch.Tensor]:
    """8 demo alpaca examples tokenized by the project with the default template, padded into one batch."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq

    from tuneline.core.stages.registry import tokenize_stage_data

    config = build_stage_config({"stage": "sft", "dataset": "demo_alpaca", "dataset_dir": str(REPO_ROOT / "data"),
                                 "template": "default", "cutoff_len": 48, "max_samples": 8})
    output = tmp_path_factory.mktemp("tokenized") / "data"
    tokenize_stage_data(config, tokenizer_path=tiny_base, output_dir=output)
    rows = load_from_disk(str(output))["train"]
    collate = DataCollatorForSeq2Seq(AutoTokenizer.from_pretrained(output / "tokenizer"), padding=True, label_pad_token_id=-100)
    return dict(collate([rows[i] for i in range(len(rows))]))


def snapshot(model) -> dict[str, torch.Tensor]:
    named = itertools.chain(model.named_parameters(remove_duplicate=False), model.named_buffers())
    return {name: tensor.detach().clone() for name, tensor in named}


def train_steps(model, batch, *, steps: int = 4, lr: float = 1e-2) -> tuple[float, float]:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    model.train()
    with torch.no_grad():
        first = model(**batch).loss.item()
    for _ in range(steps):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    with torch.no_grad():
        return first, model(**batch).loss.item()


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "blocks"), [({}, 64 // 32), ({"oft_rank": 4, "oft_block_size": 0}, 4)])
def test_oft_trains_only_its_rotations_and_merges_into_the_base(tiny_base: Path, batch, one_torch_thread, tmp_path: Path,
                                                               shape: dict, blocks: int):
    from peft.tuners.oft.layer import Linear as OFTLinear
    from transformers import AutoTokenizer

    from tuneline.core.models.export import merge_adapter

    finetuning = FinetuningConfig(finetuning_type="oft", oft_target="q_proj,v_proj", **shape)
    torch.manual_seed(0)
    model = apply_finetuning(load_model(tiny_base), finetuning, model_config=ModelConfig())
    attention = model.base_model.model.model.layers[0].self_attn
    assert isinstance(attention.q_proj, OFTLinear) and isinstance(attention.v_proj, OFTLinear)
    assert isinstance(attention.k_proj, torch.nn.Linear) and not isinstance(attention.k_proj, OFTLinear)
    assert attention.q_proj.r["default"] == blocks  # oft_rank 0: 64 input features in blocks of 32
    before = snapshot(model)
    first, last = train_steps(model, batch)
    moved = {name for name, value in snapshot(model).items() if not torch.equal(before[name], value)}
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert last < first
    assert moved == trainable and trainable
    assert all(".oft_R." in name and (".q_proj." in name or ".v_proj." in name) for name in trainable)

    model.save_pretrained(tmp_path / "adapter")
    model.eval()
    with torch.no_grad():
        adapted = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    AutoTokenizer.from_pretrained(tiny_base).save_pretrained(tmp_path / "adapter")  # as the stage saves it
    merge_adapter(tiny_base, tmp_path / "adapter", tmp_path / "merged")
    merged = load_model(tmp_path / "merged").eval()
    with torch.no_grad():
        folded = merged(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.allclose(folded, adapted, atol=1e-4)
    assert not any("oft" in name for name, _ in merged.named_parameters())


def test_oft_keys_are_checked_when_the_config_is_read():
    with pytest.raises(ConfigError) as error:
        build_stage_config({"stage": "sft", "finetuning_type": "oft", "oft_rank": 4, "module_dropout": 1.5})
    message = str(error.value)
    assert "'oft_rank' (blocks per layer) or 'oft_block_size'" in message and "got 4 and 32" in message
    assert "'module_dropout' must be in [0, 1), got 1.5" in message
    with pytest.raises(ConfigError, match=r"'lora_target: q_proj' does not choose OFT's modules here, 'oft_target' does"):
        build_stage_config({"stage": "sft", "finetuning_type": "oft", "lora_target": "q_proj"})
    assert build_stage_config({"stage": "sft", "finetuning_type": "oft", "oft_block_size": 16}).finetuning.oft_block_size == 16


def test_oft_block_size_that_does_not_divide_a_layer_is_a_config_error(tiny_base: Path):
    finetuning = FinetuningConfig(finetuning_type="oft", oft_block_size=24)
    with pytest.raises(ConfigError, match=r"'oft_block_size: 24' does not divide the input width of every targeted layer"):
        apply_finetuning(load_model(tiny_base), finetuning, model_config=ModelConfig())
