"""Training one stage from its job, inside the worker process: the same steps for every kind.

The kind (looked up in `core.stages.registry`) loads its model and builds its trainer, or runs its
own loop; everything around that (arguments, resume point, seeds, logs, checkpoints, saving, the
results files, the loss curve) is shared, so every kind writes LLaMA-Factory's output layout.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tuneline.core.config import DataConfig, FinetuningConfig, GeneratingConfig, ModelConfig, OptimizerConfig, RuntimeConfig, trains
from tuneline.core.data.eval_splits import VALIDATION, per_dataset_splits
from tuneline.core.data.media.columns import MEDIA_COLUMNS
from tuneline.core.models.vocabulary import NewTokens
from tuneline.core.stages.kind import LoopRequest, ModelRequest, StageKind, TrainerRequest
from tuneline.core.stages.registry import stage_kind
from tuneline.core.training.arguments import global_batch_size, prepare_run, training_arguments
from tuneline.core.training.checkpoints import CHECKPOINT_PREFIX
from tuneline.core.training.job import TrainJob
from tuneline.core.training.outputs import save_results


def run_training(job: TrainJob) -> dict[str, float]:
    """Train, save (adapter or full weights, tokenizer, trainer state, metrics) and return metrics."""
    from datasets import load_from_disk
    from transformers import set_seed

    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.models.loading import load_tokenizer

    finetuning = FinetuningConfig(**job.finetuning)
    model_config = ModelConfig(**job.model)
    args = training_arguments(job.output_dir, job.training, sequential=finetuning.disable_shuffling,
                              use_reentrant_gc=model_config.use_reentrant_gc)
    if not trains(job.training):
        return run_prediction(job, args)
    checkpoint = prepare_run(job, args)
    set_seed(args.seed)  # before the adapter's random init (and a from-scratch model's), so equal seeds give equal runs
    kind = stage_kind(finetuning.stage)
    tokenizer = load_tokenizer(Path(job.dataset_path) / TOKENIZER_DIR)
    new_tokens = NewTokens.read(job.dataset_path)
    datasets = load_from_disk(job.dataset_path)
    if kind.train_loop is not None:
        metrics = kind.train_loop(LoopRequest(job=job, args=args, tokenizer=tokenizer, datasets=datasets, checkpoint=checkpoint,
                                              finetuning=finetuning, model_config=model_config, new_tokens=new_tokens))
        finish_outputs(job, kind, main=args.process_index == 0)
        return metrics
    return _train_with_trainer(kind, job, args, checkpoint=checkpoint, tokenizer=tokenizer, datasets=datasets,
                               finetuning=finetuning, model_config=model_config, new_tokens=new_tokens)


def _train_with_trainer(kind: StageKind, job: TrainJob, args, *, checkpoint, tokenizer, datasets, finetuning: FinetuningConfig,
                        model_config: ModelConfig, new_tokens: NewTokens | None) -> dict[str, float]:
    from tuneline.core.models.loading import trainable_summary
    from tuneline.core.training.callbacks import LogCallback, loop_callbacks
    from tuneline.core.training.checkpoint_record import CheckpointRecord
    from tuneline.core.training.method_record import MethodRecordCallback, trainer_loss
    from tuneline.core.training.profiler import profiler_callbacks
    from tuneline.core.training.throughput import effective_tokens_per_second

    optimizer = OptimizerConfig(**job.optimizer)
    data = DataConfig(**job.data)
    model = kind.load_model(ModelRequest(model_path=job.model_path, tokenizer=tokenizer, finetuning=finetuning,
                                         model_config=model_config, training=job.training, optimizer=optimizer,
                                         model_max_length=job.model_max_length, new_tokens=new_tokens))
    print(trainable_summary(model), flush=True)
    callbacks = [LogCallback(job.output_dir, tracking_uri=job.tracking_uri, run_id=job.run_id, log_keys=kind.log_keys),
                 CheckpointRecord(limit=job.training.get("save_total_limit")), *loop_callbacks(finetuning),
                 *profiler_callbacks(RuntimeConfig(**job.runtime), output_dir=job.output_dir, tracking_uri=job.tracking_uri,
                                     run_id=job.run_id)]
    media_rows = None
    if set(MEDIA_COLUMNS) & set(datasets["train"].column_names):  # the collator opens them, so the trainer must pass them on
        from tuneline.core.data.media.rows import MediaRows
        from tuneline.core.data.tokenization import TOKENIZER_DIR

        media_rows = MediaRows.read(Path(job.dataset_path) / TOKENIZER_DIR)
        args.remove_unused_columns = False
        reentrant = args.gradient_checkpointing and (args.gradient_checkpointing_kwargs or {}).get("use_reentrant", True)
        if args.ddp_find_unused_parameters is None and not reentrant:  # which fails with it
            args.ddp_find_unused_parameters = True  # a batch of text rows leaves the vision tower without gradients
    trainer = kind.build_trainer(TrainerRequest(
        model=model, tokenizer=tokenizer, train_dataset=datasets["train"],
        eval_dataset=eval_datasets(datasets),
        finetuning=finetuning, model_config=model_config, args=args, callbacks=callbacks,
        optimizer=optimizer, model_max_length=job.model_max_length,
        ignore_pad_token_for_loss=data.ignore_pad_token_for_loss, media_rows=media_rows,
        generating=GeneratingConfig(**job.generating)))
    LogCallback.replace_printer(trainer)
    trainer.add_callback(MethodRecordCallback(loss=trainer_loss(trainer), tracking_uri=job.tracking_uri, run_id=job.run_id))
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(job.output_dir)
    main = trainer.is_world_process_zero()
    if main:
        tokenizer.save_pretrained(job.output_dir)
        if media_rows is not None:  # beside the model, as its folder came: merge, export and the next stage read it
            media_rows.save_processor(job.output_dir)
    trainer.save_state()
    metrics = {**result.metrics, "global_batch_size": global_batch_size(args)}
    if finetuning.include_effective_tokens_per_second:
        metrics["effective_tokens_per_sec"] = effective_tokens_per_second(datasets["train"], metrics, world_size=args.world_size)
    results = {"train": dict(metrics)}
    if eval_datasets(datasets) is not None:
        results["eval"] = held_out_results(kind, trainer, tokenizer, datasets, finetuning)
        metrics.update(results["eval"])
    if args.do_predict:
        from tuneline.core.data.media.batching import row_media
        from tuneline.core.evaluation.predict import predict_after_training

        metrics.update(predict_after_training(trainer, datasets, generating=prediction_generating(job.generating, data),
                                              media=row_media(trainer)))
    for split, values in results.items() if main else ():
        save_results(job.output_dir, split, values)
    if main:
        from tuneline.core.training.completions_log import log_completions_table

        log_completions_table(job.output_dir, tracking_uri=job.tracking_uri, run_id=job.run_id)
    finish_outputs(job, kind, main=main)
    return metrics


def run_prediction(job: TrainJob, args) -> dict[str, float]:
    """`do_predict` without training: the base with `adapter_name_or_path` merged answers the predict
    set (LLaMA-Factory's prediction configs); rank 0 writes generated_predictions.jsonl and
    predict_results.json."""
    from datasets import load_from_disk
    from transformers import set_seed

    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.evaluation.predict import do_predict, predict_set
    from tuneline.core.models.adapters import with_adapters
    from tuneline.core.models.loading import load_model, load_tokenizer

    if args.process_index != 0:
        return {}
    set_seed(args.seed)  # sampling (do_sample) draws the same answers on a rerun
    model_config = ModelConfig(**job.model)
    tokenizer = load_tokenizer(Path(job.dataset_path) / TOKENIZER_DIR)
    datasets = load_from_disk(job.dataset_path)
    model = load_model(job.model_path, model=model_config, vocab_size=len(tokenizer), training=job.training,
                       pure_bf16=job.finetuning.get("pure_bf16", False), model_max_length=job.model_max_length)
    quantized = getattr(model, "hf_quantizer", None) is not None  # placed on its device already
    model = with_adapters(model, model_config)
    if not quantized:
        model = model.to(args.device)
    metrics = do_predict(model, tokenizer, predict_set(datasets), output_dir=job.output_dir,
                         generating=GeneratingConfig(**prediction_generating(job.generating, DataConfig(**job.data))),
                         batch_size=args.per_device_eval_batch_size)
    save_results(job.output_dir, "predict", metrics)
    return metrics


def prediction_generating(generating: dict, data: DataConfig) -> dict:
    """The generation settings of `predict_with_generate`: `eval_num_beams`, when set, is its
    number of beams (LLaMA-Factory's `generation_num_beams`)."""
    return {**generating, "num_beams": data.eval_num_beams} if data.eval_num_beams else generating


def eval_datasets(datasets):
    """What the trainer evaluates: the `validation` split, or {dataset name: split} with
    `eval_on_each_dataset` (the Trainer then names each one's metrics `eval_<name>_*`), or None."""
    if VALIDATION in datasets:
        return datasets[VALIDATION]
    splits = per_dataset_splits(datasets)
    return {name: datasets[split] for name, split in splits.items()} or None


def held_out_results(kind: StageKind, trainer, tokenizer, datasets, finetuning: FinetuningConfig) -> dict[str, float]:
    """The kind's held-out metrics: of `validation`, or of each evaluation dataset, named
    `eval_<name>_*` as the Trainer names a mapping's metrics (its own evaluation included)."""
    if VALIDATION in datasets:
        return kind.held_out_metrics(trainer, tokenizer, datasets[VALIDATION], finetuning)
    prepared = trainer.eval_dataset  # as the trainer prepared each dataset (TRL's trainers tokenize theirs)
    metrics: dict[str, float] = {}
    try:
        for name, split in per_dataset_splits(datasets).items():
            trainer.eval_dataset = prepared[name]
            metrics.update(kind.held_out_metrics(trainer, tokenizer, datasets[split], finetuning, prefix=f"eval_{name}"))
    finally:
        trainer.eval_dataset = prepared
    return metrics


def finish_outputs(job: TrainJob, kind: StageKind, *, main: bool) -> None:
    """The loss curve, and no checkpoints left when the job says so; rank 0 alone writes the stage's files."""
    from tuneline.core.training.callbacks import plot_loss

    if main:
        plot_loss(job.output_dir, kind.plotted_keys)
        if not job.keep_checkpoints:
            for stale in Path(job.output_dir).glob(f"{CHECKPOINT_PREFIX}*"):
                shutil.rmtree(stale)
