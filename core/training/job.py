"""Training one stage (pt, sft, rm, dpo, kto or ppo) from a job description, inside the worker process.

The job names only paths and plain values: a tokenized dataset (with its fixed tokenizer), the
model to start from, the method and the trainer arguments. Preprocessing is finished before the
worker starts (DESIGN.md §4), so this module never tokenizes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.data.tokenization import TOKENIZER_DIR
from tuneline.core.errors import ConfigError

LOG_FILE = "trainer_log.jsonl"
LOSS_PLOT = "training_loss.png"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
TRACKING_URI_FROM_ENV = "$MLFLOW_TRACKING_URI"  # what job.json holds instead of a URI taken from the environment


@dataclass(frozen=True)
class TrainJob:
    """Everything a worker needs, written as JSON to the stage directory."""

    model_path: str
    dataset_path: str
    output_dir: str
    finetuning: dict[str, Any]
    training: dict[str, Any]
    model: dict[str, Any] = field(default_factory=dict)
    generating: dict[str, Any] = field(default_factory=dict)  # GeneratingConfig for do_predict
    tracking_uri: str | None = None
    run_id: str | None = None
    keep_checkpoints: bool = True
    world_size: int = 1  # processes the launcher starts (NPROC_PER_NODE x NNODES); the worker checks it
    overwrite_output_dir: bool = False  # start over instead of resuming from output_dir's checkpoints

    def write(self, path: str | Path) -> Path:
        """A tracking URI taken from MLFLOW_TRACKING_URI (it may hold a password) is written as a
        reference to that variable, which the worker inherits, so it never lands in the workspace."""
        values = dataclasses.asdict(self)
        if values["tracking_uri"] and values["tracking_uri"] == os.environ.get(TRACKING_URI_ENV):
            values["tracking_uri"] = TRACKING_URI_FROM_ENV
        path = Path(path)
        path.write_text(json.dumps(values, indent=2), encoding="utf-8")
        return path

    @classmethod
    def read(cls, path: str | Path) -> TrainJob:
        values = json.loads(Path(path).read_text(encoding="utf-8"))
        if values.get("tracking_uri") == TRACKING_URI_FROM_ENV:
            values["tracking_uri"] = os.environ.get(TRACKING_URI_ENV)
        return cls(**values)


def run_training(job: TrainJob) -> dict[str, float]:
    """Train, save (adapter or full weights, tokenizer, trainer state, metrics) and return metrics."""
    from datasets import load_from_disk
    from transformers import set_seed

    from tuneline.core.training.callbacks import LogCallback
    from tuneline.core.training.checkpoint_record import CheckpointRecord
    from tuneline.core.models.loading import load_tokenizer, trainable_summary
    from tuneline.core.stages.registry import build_stage_trainer, held_out_metrics, load_stage_model

    args = training_arguments(job.output_dir, job.training)
    checkpoint = prepare_run(job, args)
    set_seed(args.seed)  # before the adapter's random init, so equal seeds give equal runs
    finetuning = FinetuningConfig(**job.finetuning)
    model_config = ModelConfig(**job.model)
    stage = finetuning.stage
    tokenizer = load_tokenizer(Path(job.dataset_path) / TOKENIZER_DIR)
    datasets = load_from_disk(job.dataset_path)
    if stage == "ppo":  # its own loop: rollouts and updates do not fit the trainer's one
        from tuneline.core.stages.ppo.trainer import train_ppo

        metrics = train_ppo(job, args, tokenizer=tokenizer, datasets=datasets, checkpoint=checkpoint, finetuning=finetuning,
                            model_config=model_config)
        finish_outputs(job, main=args.process_index == 0)
        return metrics
    model = load_stage_model(stage, job.model_path, tokenizer=tokenizer, finetuning=finetuning, model_config=model_config,
                             training=job.training)
    print(trainable_summary(model), flush=True)

    callbacks = [LogCallback(job.output_dir, tracking_uri=job.tracking_uri, run_id=job.run_id), CheckpointRecord()]
    trainer = build_stage_trainer(stage, model, tokenizer, datasets, finetuning=finetuning, model_config=model_config,
                                  args=args, callbacks=callbacks)
    LogCallback.replace_printer(trainer)
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(job.output_dir)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(job.output_dir)
    trainer.save_state()
    metrics = {**result.metrics, "global_batch_size": global_batch_size(args)}
    trainer.save_metrics("train", metrics)
    if "validation" in datasets:
        eval_metrics = held_out_metrics(stage, trainer, tokenizer, datasets["validation"], finetuning=finetuning)
        trainer.save_metrics("eval", eval_metrics)
        metrics.update(eval_metrics)
    if args.do_predict:
        from tuneline.core.evaluation.predict import predict_after_training

        metrics.update(predict_after_training(trainer, datasets, generating=job.generating))
    finish_outputs(job, main=trainer.is_world_process_zero())
    return metrics


def finish_outputs(job: TrainJob, *, main: bool) -> None:
    """The loss curve, and no checkpoints left when the job says so; rank 0 alone writes the stage's files."""
    from tuneline.core.training.callbacks import plot_loss

    if main:
        plot_loss(job.output_dir)
        if not job.keep_checkpoints:
            for stale in Path(job.output_dir).glob("checkpoint-*"):
                shutil.rmtree(stale)


def prepare_run(job: TrainJob, args) -> str | None:
    """Check that the processes asked for met, report the global batch, pick the checkpoint to resume from.

    Rank 0 tidies the output folder first (incomplete checkpoints, log lines past the resumed step);
    the other processes wait for it, then pick the same checkpoint.
    """
    from transformers.training_args import ParallelMode

    from tuneline.core.training.checkpoints import resume_point
    from tuneline.core.training.distributed import check_world_size

    check_world_size(job.world_size, seen=args.world_size if args.parallel_mode == ParallelMode.DISTRIBUTED else 1)
    if args.process_index == 0:
        print(f"global batch size {global_batch_size(args)} = {args.per_device_train_batch_size} per device x "
              f"{args.world_size} process(es) x {args.gradient_accumulation_steps} accumulation step(s)", flush=True)
    with args.main_process_first(local=False, desc="choosing the checkpoint to resume from"):
        return resume_point(job.output_dir, requested=job.training.get("resume_from_checkpoint"),
                            fresh=job.overwrite_output_dir, tidy=args.process_index == 0, log_file=LOG_FILE)


def global_batch_size(args) -> int:
    """Examples per optimizer step across all processes."""
    return args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps


def build_collator(train_dataset, *, tokenizer, model):
    """Packed datasets (they carry position_ids) keep their examples apart; others pad per batch."""
    from transformers import DataCollatorForSeq2Seq

    from tuneline.core.training.collators import PackedCollator

    if "position_ids" in train_dataset.column_names:
        return PackedCollator(tokenizer.pad_token_id, attn_implementation=model.config._attn_implementation)
    return DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)


def training_arguments(output_dir: str, training: Mapping[str, Any]):
    """Seq2SeqTrainingArguments from LLaMA-Factory keys; the project does its own reporting."""
    import os
    import sys

    import torch
    from transformers import Seq2SeqTrainingArguments

    from tuneline.core.training.distributed import process_group_settings

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
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    accelerator = torch.accelerator.is_available()
    values.update(process_group_settings(training, world_size=world_size, accelerator=accelerator))
    if not accelerator and values.get("bf16") and "use_cpu" not in training:
        values["use_cpu"] = True  # transformers allows bf16 without a GPU only when told it is on the CPU
    if values.get("report_to") in ("none", None):
        values["report_to"] = []
    if values.get("save_steps") and "save_strategy" not in training:
        values["save_strategy"] = "steps"
    try:
        return Seq2SeqTrainingArguments(**values)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"the trainer arguments are inconsistent: {e}") from e
