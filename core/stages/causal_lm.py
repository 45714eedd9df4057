"""What the language-modelling kinds (pt, sft) share: a causal LM with its method applied,
transformers' Trainer on it (with sft's loss variants and the token-accuracy metric when asked),
and perplexity on the validation split."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from tuneline.core.config import FinetuningConfig
from tuneline.core.evaluation.heldout import perplexity
from tuneline.core.stages.kind import ModelRequest, TrainerRequest

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer

    from tuneline.core.training.losses import LogitsLoss


def load_policy(request: ModelRequest) -> PreTrainedModel:
    """The causal LM at `model_path`, its embeddings grown to the tokenizer, with the method (LoRA,
    freeze, full, QLoRA) applied."""
    from tuneline.core.models.loading import apply_finetuning, load_model
    from tuneline.core.models.vocabulary import grow_vocabulary, rows_that_train

    model = load_model(request.model_path, model=request.model_config, training=request.training, trainable=True,
                       model_max_length=request.model_max_length, pure_bf16=request.finetuning.pure_bf16)
    rows = grow_vocabulary(model, vocab_size=len(request.tokenizer), new_tokens=request.new_tokens,
                           init=request.model_config.init_special_tokens)
    return apply_finetuning(model, request.finetuning, model_config=request.model_config, training=request.training,
                            upcast=request.upcasts_trainable,
                            new_token_rows=rows_that_train(rows, request.model_config))


def uses_loss_variant(finetuning: FinetuningConfig) -> bool:
    return finetuning.use_dft_loss or finetuning.use_eaft_loss or finetuning.use_asft_loss


def loss_function(finetuning: FinetuningConfig) -> LogitsLoss | None:
    """transformers' `compute_loss_func` for DFT or EAFT (None: the model's own cross-entropy, or ASFT,
    which needs the batch's inputs and so is `sft_trainers.AnchoredSFTTrainer`)."""
    from tuneline.core.training.losses import LogitsLoss, dft_loss, eaft_loss

    if finetuning.use_dft_loss:
        return LogitsLoss(dft_loss)
    if finetuning.use_eaft_loss:
        return LogitsLoss(partial(eaft_loss, alpha=finetuning.eaft_alpha))
    return None


def build_language_model_trainer(request: TrainerRequest) -> Trainer:
    from transformers import Trainer

    from tuneline.core.models.loading import loraplus_optimizer
    from tuneline.core.training.collators import build_collator
    from tuneline.core.training.optimizers import use_stage_optimizer

    model, finetuning = request.model, request.finetuning
    shared: dict[str, Any] = dict(
        model=model, args=request.args, train_dataset=request.train_dataset, eval_dataset=request.eval_dataset,
        data_collator=build_collator(request.train_dataset, tokenizer=request.tokenizer, model=model,
                                     ignore_pad_token_for_loss=request.ignore_pad_token_for_loss,
                                     media_rows=request.media_rows),
        processing_class=request.tokenizer, callbacks=list(request.callbacks),
        optimizers=(loraplus_optimizer(model, finetuning=finetuning, args=request.args), None),
    )
    if finetuning.compute_accuracy:
        from tuneline.core.evaluation.accuracy import likeliest_tokens, token_accuracy_metrics

        shared.update(compute_metrics=token_accuracy_metrics, preprocess_logits_for_metrics=likeliest_tokens)
    if finetuning.use_asft_loss:
        from tuneline.core.stages.preference import dtype_keys, reference_model
        from tuneline.core.stages.sft_trainers import AnchoredSFTTrainer

        reference = reference_model(model, finetuning, model_config=request.model_config, vocab_size=len(request.tokenizer),
                                    training=dtype_keys(request.args), model_max_length=request.model_max_length)
        trainer = AnchoredSFTTrainer(reference=reference, asft_alpha=finetuning.asft_alpha, **shared)
    else:
        trainer = Trainer(compute_loss_func=loss_function(finetuning), **shared)
    return use_stage_optimizer(trainer, request.optimizer)


def perplexity_metrics(trainer: Trainer, tokenizer: PreTrainedTokenizerBase, validation: Dataset,
                       finetuning: FinetuningConfig, *, prefix: str = "eval") -> dict[str, float]:
    """The trainer's evaluation of the validation split, with the perplexity of its loss (left out for
    the loss variants, whose weighted loss is not a log-likelihood)."""
    metrics = dict(trainer.evaluate(metric_key_prefix=prefix))
    if not uses_loss_variant(finetuning):
        metrics[f"{prefix}_perplexity"] = perplexity(metrics[f"{prefix}_loss"])
    return metrics
