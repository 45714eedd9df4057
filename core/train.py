"""Training one stage (pt or sft) from a job description, inside the worker process.

The job names only paths and plain values: a tokenized dataset (with its fixed tokenizer), the
model to start from, the method and the trainer arguments. Preprocessing is finished before the
worker starts (DESIGN.md §4), so this module never tokenizes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.data.dataset import TOKENIZER_DIR
from tuneline.core.errors import ConfigError

LOG_FILE = "trainer_log.jsonl"
LOSS_PLOT = "training_loss.png"


@dataclass(frozen=True)
class TrainJob:
    """Everything a worker needs, written as JSON to the stage directory."""

    model_path: str
    dataset_path: str
    output_dir: str
    finetuning: dict[str, Any]
    training: dict[str, Any]
    model: dict[str, Any] = field(default_factory=dict)
    tracking_uri: str | None = None
    run_id: str | None = None
    keep_checkpoints: bool = True

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2), encoding="utf-8")
        return path

    @classmethod
    def read(cls, path: str | Path) -> TrainJob:
        return cls(**json.loads(Path(path).read_text(encoding="utf-8")))


def run_training(job: TrainJob) -> dict[str, float]:
    """Train, save (adapter or full weights, tokenizer, trainer state, metrics) and return metrics."""
    from datasets import load_from_disk
    from transformers import Trainer
    from transformers.trainer_utils import get_last_checkpoint

    from tuneline.core.callbacks import LogCallback, plot_loss
    from tuneline.core.model import apply_finetuning, load_model, load_tokenizer, trainable_summary

    finetuning = FinetuningConfig(**job.finetuning)
    model_config = ModelConfig(**job.model)
    tokenizer = load_tokenizer(Path(job.dataset_path) / TOKENIZER_DIR)
    datasets = load_from_disk(job.dataset_path)
    model = load_model(job.model_path, model=model_config, vocab_size=len(tokenizer))
    model = apply_finetuning(model, finetuning)
    print(trainable_summary(model), flush=True)

    args = training_arguments(job.output_dir, job.training)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=datasets["train"],
        eval_dataset=datasets["validation"] if "validation" in datasets else None,
        data_collator=build_collator(datasets["train"], tokenizer=tokenizer, model=model),
        processing_class=tokenizer,
        callbacks=[LogCallback(job.output_dir, tracking_uri=job.tracking_uri, run_id=job.run_id)],
    )
    checkpoint = get_last_checkpoint(job.output_dir) if Path(job.output_dir).is_dir() else None
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(job.output_dir)
    tokenizer.save_pretrained(job.output_dir)
    trainer.save_state()
    metrics = dict(result.metrics)
    trainer.save_metrics("train", metrics)
    if trainer.eval_dataset is not None:
        eval_metrics = trainer.evaluate()
        eval_metrics["eval_perplexity"] = math.exp(min(eval_metrics["eval_loss"], 50.0))
        trainer.save_metrics("eval", eval_metrics)
        metrics.update(eval_metrics)
    plot_loss(job.output_dir)
    if not job.keep_checkpoints:
        for stale in Path(job.output_dir).glob("checkpoint-*"):
            shutil.rmtree(stale)
    return metrics


def build_collator(train_dataset, *, tokenizer, model):
    """Packed datasets (they carry position_ids) keep their examples apart; others pad per batch."""
    from transformers import DataCollatorForSeq2Seq

    from tuneline.core.collator import PackedCollator

    if "position_ids" in train_dataset.column_names:
        return PackedCollator(tokenizer.pad_token_id, attn_implementation=model.config._attn_implementation)
    return DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)


def training_arguments(output_dir: str, training: Mapping[str, Any]):
    """Seq2SeqTrainingArguments from LLaMA-Factory keys; the project does its own reporting."""
    import sys

    import torch
    from transformers import Seq2SeqTrainingArguments

    values = {
        "dataloader_pin_memory": torch.cuda.is_available(),
        "report_to": [],
        "disable_tqdm": not sys.stdout.isatty(),
        "logging_steps": 10,
        "save_strategy": "no",
        "include_num_input_tokens_seen": "non_padding",
        **training,
        "output_dir": output_dir,
    }
    if values.get("report_to") in ("none", None):
        values["report_to"] = []
    if values.get("save_steps") and "save_strategy" not in training:
        values["save_strategy"] = "steps"
    try:
        return Seq2SeqTrainingArguments(**values)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"the trainer arguments are inconsistent: {e}") from e
