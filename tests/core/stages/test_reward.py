"""Reward modelling (stage rm) on the demo preference pairs, with the session's tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tuneline.core.errors import ConfigError
from tuneline.core.models.loading import apply_finetuning, load_model
from tuneline.core.stages.kind import TrainerRequest
from tuneline.core.stages.registry import build_stage_config

REPO_ROOT = Path(__file__).resolve().parents[3]



@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread(one_torch_thread):
    yield

def finetuning(**keys):
    return build_stage_config({"stage": "rm", **keys}).finetuning


@pytest.fixture(scope="module")
def pairs(tiny_base: Path, tmp_path_factory) -> Path:
    """demo_preference (train) and demo_preference_heldout (validation), tokenized for stage rm."""
    from tuneline.core.stages.registry import tokenize_stage_data

    config = build_stage_config({
        "model_name_or_path": str(tiny_base), "stage": "rm", "dataset": "demo_preference",
        "eval_dataset": "demo_preference_heldout", "dataset_dir": str(REPO_ROOT / "data"), "template": "chatml",
        "cutoff_len": 64,
    })
    output = tmp_path_factory.mktemp("rm_pairs")
    tokenize_stage_data(config, tokenizer_path=tiny_base, output_dir=output)
    return output


def load_pairs(path: Path):
    from datasets import load_from_disk

    from tuneline.core.models.loading import load_tokenizer

    return load_from_disk(str(path)), load_tokenizer(path / "tokenizer")


def test_lora_reward_model_adapts_the_backbone_and_saves_the_head(tiny_base: Path) -> None:
    from peft import PeftModelForSequenceClassification

    model = apply_finetuning(load_model(tiny_base, head="score"), finetuning(finetuning_type="lora", lora_rank=4), head="score")
    assert isinstance(model, PeftModelForSequenceClassification)
    lora = model.peft_config["default"]
    assert "score" in lora.modules_to_save and "score" not in lora.target_modules
    assert {"q_proj", "down_proj"} <= set(lora.target_modules)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert any("score.modules_to_save" in name for name in trainable)
    assert all("lora_" in name or "score" in name for name in trainable)


def test_freeze_and_full_tuning_train_the_head(tiny_base: Path) -> None:
    frozen = apply_finetuning(load_model(tiny_base, head="score"),
                              finetuning(finetuning_type="freeze", freeze_trainable_layers=1), head="score")
    trainable = {name for name, p in frozen.named_parameters() if p.requires_grad}
    assert "score.weight" in trainable
    assert any(name.startswith("model.layers.1.") for name in trainable)
    assert not any(name.startswith("model.layers.0.") for name in trainable)
    full = apply_finetuning(load_model(tiny_base, head="score"), finetuning(finetuning_type="full"), head="score")
    assert all(p.requires_grad for p in full.parameters())


def test_score_reads_each_text_alone_whatever_the_padding(tiny_base: Path, pairs: Path) -> None:
    from tuneline.core.evaluation.reward import score

    data, tokenizer = load_pairs(pairs)
    model = load_model(tiny_base, vocab_size=len(tokenizer), head="score")
    model.config.pad_token_id = tokenizer.pad_token_id
    texts = data["validation"]["chosen_input_ids"][:6] + data["validation"]["rejected_input_ids"][:6]
    together = score(model, tokenizer, texts)
    alone = torch.cat([score(model, tokenizer, [ids]) for ids in texts])
    assert together.shape == (12,)
    assert torch.allclose(together, alone, atol=1e-5)
    padded = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids) for ids in texts], batch_first=True,
                                             padding_value=tokenizer.pad_token_id)
    assert torch.allclose(score(model, tokenizer, padded), alone, atol=1e-5)


def test_reward_trainer_refuses_data_without_pairs(tiny_base: Path, pairs: Path, tmp_path: Path) -> None:
    from datasets import Dataset

    from tuneline.core.stages.rm import build_reward_trainer
    from tuneline.core.training.arguments import training_arguments

    _, tokenizer = load_pairs(pairs)
    sft_rows = Dataset.from_dict({"input_ids": [[1, 2]], "attention_mask": [[1, 1]], "labels": [[-100, 2]]})
    with pytest.raises(ConfigError, match="chosen_input_ids.*ranking"):
        build_reward_trainer(TrainerRequest(model=load_model(tiny_base, head="score"), tokenizer=tokenizer, train_dataset=sft_rows,
                             finetuning=finetuning(finetuning_type="full"),
                             args=training_arguments(str(tmp_path), {"report_to": "none"})))


@pytest.mark.slow
def test_reward_model_learns_to_prefer_heldout_chosen_replies(tiny_base: Path, pairs: Path, tmp_path: Path) -> None:
    """LoRA reward model from the untrained tiny base: held-out pair accuracy rises to 0.75 or more,
    and the saved adapter (score head inside) loads back scoring the same."""
    from safetensors import safe_open
    from transformers import set_seed

    from tuneline.core.evaluation.reward import evaluate_reward_model, score
    from tuneline.core.models.loading import load_reward_model
    from tuneline.core.stages.rm import build_reward_trainer
    from tuneline.core.training.arguments import training_arguments

    data, tokenizer = load_pairs(pairs)
    method = finetuning(finetuning_type="lora", lora_rank=8)
    set_seed(1)  # the new head and adapter start the same whatever ran before
    model = apply_finetuning(load_model(tiny_base, vocab_size=len(tokenizer), head="score"), method, head="score")
    args = training_arguments(str(tmp_path / "rm"), {"learning_rate": 1e-3, "max_steps": 60, "seed": 1, "report_to": "none",
                                                     "per_device_train_batch_size": 16, "lr_scheduler_type": "constant"})
    trainer = build_reward_trainer(TrainerRequest(model=model, tokenizer=tokenizer, train_dataset=data["train"],
                                                  eval_dataset=data["validation"], finetuning=method, args=args))
    before = evaluate_reward_model(trainer.model, tokenizer, data["validation"])
    trainer.train()
    after = evaluate_reward_model(trainer.model, tokenizer, data["validation"])
    print(f"\nheld-out RM accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}, "
          f"margin {before['margin']:.3f} -> {after['margin']:.3f} ({after['pairs']:.0f} pairs)")
    # Spreads measured on the frozen code of c4e177d with these seeds (2 or 1 threads, AVX-512 or AVX2 kernels:
    # 0.900, margin 4.18, TRL 0.906 each time) and with the base and training seeded 2-7 and 13 instead.
    # Held-out accuracy 0.850-0.967 (60 pairs) from 0.200-0.733 before; 0.75 leaves 0.10.
    assert after["accuracy"] >= 0.75 and after["accuracy"] > before["accuracy"]
    assert after["margin"] > 1.0  # measured 4.18-4.79
    assert trainer.evaluate()["eval_accuracy"] >= 0.75  # TRL's own metric agrees; measured 0.859-0.969, 0.75 leaves 0.11

    trainer.save_model(str(tmp_path / "rm"))
    tokenizer.save_pretrained(str(tmp_path / "rm"))
    with safe_open(str(tmp_path / "rm" / "adapter_model.safetensors"), "pt") as weights:
        assert any("score" in key for key in weights.keys())
    loaded, loaded_tokenizer = load_reward_model(tmp_path / "rm")
    texts = data["validation"]["chosen_input_ids"][:8]
    assert torch.allclose(score(loaded, loaded_tokenizer, texts), score(trainer.model, tokenizer, texts), atol=1e-4)


@pytest.mark.slow
def test_rm_starts_from_an_sft_lora_adapter(tiny_base: Path, pairs: Path, tmp_path: Path) -> None:
    """`stage: rm` with an SFT LoRA `adapter_name_or_path`: the causal-LM adapter merges into the
    scoring model's backbone (it failed with "no attribute 'prepare_inputs_for_generation'"), a new
    adapter trains the head, and a step of training moves only that adapter."""
    from tuneline.core.config import ModelConfig
    from tuneline.core.stages.rm import build_reward_trainer
    from tuneline.core.training.arguments import training_arguments

    data, tokenizer = load_pairs(pairs)
    sft = apply_finetuning(load_model(tiny_base), build_stage_config({"stage": "sft", "lora_rank": 4}).finetuning)
    with torch.no_grad():
        for name, parameter in sft.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.05)  # a trained adapter's B is not zero, so merging changes the weights
    sft.save_pretrained(str(tmp_path / "sft"))
    merged_sft = sft.merge_and_unload().model.layers[0].self_attn.q_proj.weight.detach().clone()

    model_config = ModelConfig(adapter_name_or_path=str(tmp_path / "sft"))
    method = finetuning(finetuning_type="lora", lora_rank=4, adapter_name_or_path=str(tmp_path / "sft"))
    model = apply_finetuning(load_model(tiny_base, head="score"), method, model_config=model_config, head="score")
    backbone = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight
    base = load_model(tiny_base).model.layers[0].self_attn.q_proj.weight
    assert torch.allclose(backbone, merged_sft) and not torch.allclose(backbone, base)
    assert "score" in model.peft_config["default"].modules_to_save
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    args = training_arguments(str(tmp_path / "rm"), {"learning_rate": 1e-2, "max_steps": 1, "report_to": "none",
                                                     "per_device_train_batch_size": 4})
    build_reward_trainer(TrainerRequest(model=model, tokenizer=tokenizer, train_dataset=data["train"], finetuning=method,
                                        args=args)).train()
    moved = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert moved and all("lora_" in name or "score" in name for name in moved)
