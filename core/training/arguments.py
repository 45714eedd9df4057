"""Trainer arguments from LLaMA-Factory keys, and what a run settles before its first step.

`training_arguments` turns a stage's trainer keys into transformers' `Seq2SeqTrainingArguments`
(the project does its own reporting); `prepare_run` checks the processes and picks the checkpoint
to resume from, the same way for every stage kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tuneline.core.errors import ConfigError
from tuneline.core.training.job import LOG_FILE, TrainJob

if TYPE_CHECKING:
    from transformers import Seq2SeqTrainingArguments, TrainingArguments


def training_arguments(output_dir: str, training: Mapping[str, Any], *, sequential: bool = False,
                       use_reentrant_gc: bool = True) -> Seq2SeqTrainingArguments:
    """Seq2SeqTrainingArguments from LLaMA-Factory keys; the project does its own reporting.
    `sequential` (`disable_shuffling`) reads the training rows in order: transformers' sequential sampler.
    Gradient checkpointing, when asked for, is reentrant or not as `use_reentrant_gc` says."""
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
    if sequential:
        strategy = training.get("train_sampling_strategy", "sequential")
        if strategy != "sequential":
            raise ConfigError(f"'disable_shuffling: true' reads the rows in order, but 'train_sampling_strategy: {strategy}' "
                              "orders them otherwise; remove one of the two.")
        values["train_sampling_strategy"] = "sequential"
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    accelerator = torch.accelerator.is_available()
    values.update(process_group_settings(training, world_size=world_size, accelerator=accelerator))
    if not accelerator and values.get("bf16") and "use_cpu" not in training:
        values["use_cpu"] = True  # transformers allows bf16 without a GPU only when told it is on the CPU
    if values.get("report_to") in ("none", None):
        values["report_to"] = []
    # Checkpoints are rotated by tuneline once complete (`CheckpointRecord`), the same way for every kind.
    values.pop("save_total_limit", None)
    if values.get("save_steps") and "save_strategy" not in training:
        values["save_strategy"] = "steps"
    # The trainer pickles its arguments into every checkpoint and output folder (training_args.bin),
    # so the hub token goes to huggingface_hub through the environment of this process instead.
    hub_token = values.pop("hub_token", None)
    if hub_token and values.get("push_to_hub"):
        os.environ["HF_TOKEN"] = hub_token
    if values.get("gradient_checkpointing"):
        values["gradient_checkpointing_kwargs"] = {"use_reentrant": use_reentrant_gc,
                                                   **(values.get("gradient_checkpointing_kwargs") or {})}
    try:
        return Seq2SeqTrainingArguments(**values)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"the trainer arguments are inconsistent: {e}") from e


def prepare_run(job: TrainJob, args: TrainingArguments) -> str | None:
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


def global_batch_size(args: TrainingArguments) -> int:
    """Examples per optimizer step across all processes."""
    return args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps
