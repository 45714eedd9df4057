"""`pure_bf16`: the policy loads in bfloat16 and trains in it, its trained parameters never upcast,
the trainer without mixed precision, and the optimizer stepping the bfloat16 weights themselves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tuneline.core.stages.registry import build_stage_config

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread(one_torch_thread):
    yield


@pytest.mark.slow
@pytest.mark.parametrize("finetuning_type", ["full", "lora"])
def test_pure_bf16_trains_bfloat16_weights_without_mixed_precision(finetuning_type: str, tiny_base: Path,
                                                                   tmp_path: Path) -> None:
    from datasets import load_from_disk
    from transformers import set_seed

    from tuneline.core.models.loading import load_tokenizer
    from tuneline.core.stages.causal_lm import build_language_model_trainer, load_policy
    from tuneline.core.stages.kind import ModelRequest, TrainerRequest
    from tuneline.core.stages.registry import tokenize_stage_data
    from tuneline.core.training.arguments import training_arguments

    config = build_stage_config({"stage": "sft", "model_name_or_path": str(tiny_base), "dataset_dir": str(REPO_ROOT / "data"),
                                 "dataset": "demo_alpaca", "template": "chatml", "cutoff_len": 64, "max_samples": 8,
                                 "finetuning_type": finetuning_type, "pure_bf16": True})
    tokenize_stage_data(config, tokenizer_path=tiny_base, output_dir=tmp_path / "rows")
    rows, tokenizer = load_from_disk(str(tmp_path / "rows"))["train"], load_tokenizer(tmp_path / "rows" / "tokenizer")
    set_seed(1)
    model = load_policy(ModelRequest(model_path=str(tiny_base), tokenizer=tokenizer, finetuning=config.finetuning,
                                     model_config=config.model, training=config.training))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # trained ones too: no float32 master weights
    args = training_arguments(str(tmp_path / "run"), {"per_device_train_batch_size": 8, "learning_rate": 1e-2,
                                                      "lr_scheduler_type": "constant", "max_steps": 8, "logging_steps": 1,
                                                      "report_to": "none", "seed": 1})
    trainer = build_language_model_trainer(TrainerRequest(model=model, tokenizer=tokenizer, train_dataset=rows,
                                                          eval_dataset=None, finetuning=config.finetuning, args=args))
    start = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    trainer.train()
    assert trainer.accelerator.mixed_precision == "no" and not (args.bf16 or args.fp16)
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    assert trained and all(p.dtype == torch.bfloat16 for p in trained)
    assert all(state.dtype == torch.bfloat16 for group in trainer.optimizer.state.values()
               for state in group.values() if isinstance(state, torch.Tensor) and state.dim() > 0)
    assert any(not torch.equal(p, start[name]) for name, p in trainer.model.named_parameters() if name in start)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < losses[0]
