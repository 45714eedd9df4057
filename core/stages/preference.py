"""Preference optimisation (stages dpo and kto) with TRL's trainers, set up from LLaMA-Factory's keys.

Stage dpo trains on pairs; `pref_loss` picks the objective as LLaMA-Factory does:
- `sigmoid` (DPO), `hinge`, `ipo`: TRL's DPOTrainer, against a reference model, with `pref_beta`
  as beta. `dpo_label_smoothing` > 0 turns sigmoid into TRL's robust DPO: the older TRL that
  LLaMA-Factory builds on made it conservative DPO, which TRL 1.16 no longer offers.
  `pref_ftx` adds TRL's `sft` term (mean negative log-likelihood of the chosen replies' tokens)
  with that weight; LLaMA-Factory averages per reply first, which weighs short replies more.
- `orpo`: TRL's ORPOTrainer (loss = NLL of chosen + beta x odds-ratio loss). TRL takes the NLL
  over prompt and reply where LLaMA-Factory takes it over the reply.
- `simpo`: TRL's CPOTrainer with its SimPO loss (length-normalised log-probabilities, margin
  `simpo_gamma`); `pref_ftx` weighs its NLL term (`cpo_alpha`).
Stage kto trains on single replies tagged desirable or not with TRL's KTOTrainer
(`kto_chosen_weight` and `kto_rejected_weight` weigh the two kinds).

The reference model (sigmoid, hinge, ipo, kto) is `ref_model` with `ref_model_adapters` merged
when set; otherwise, for a LoRA policy, the policy with its adapter switched off (no second model
in memory); otherwise a frozen copy of the policy as it starts.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainerCallback, TrainingArguments

REFERENCE_FREE = ("orpo", "simpo")
REF_ADAPTER = "ref"  # the name TRL gives its frozen copy of a LoRA policy's adapter


def preference_problems(finetuning: FinetuningConfig) -> list[str]:
    """Preference settings that could not train, or would be ignored, one line each."""
    ft = finetuning
    problems = []
    if ft.pref_beta <= 0:
        problems.append(f"'pref_beta' must be positive, got {ft.pref_beta}.")
    if ft.pref_ftx < 0:
        problems.append(f"'pref_ftx' must be 0 or more, got {ft.pref_ftx}.")
    if not 0 <= ft.dpo_label_smoothing < 0.5:
        problems.append(f"'dpo_label_smoothing' must be in [0, 0.5), got {ft.dpo_label_smoothing}.")
    if ft.stage == "kto":
        return problems + _kto_problems(ft)
    if ft.pref_loss == "kto_pair":
        problems.append("'pref_loss: kto_pair' is no longer offered by TRL; train 'stage: kto' on rows with a kto_tag, "
                        "or choose pref_loss sigmoid, hinge, ipo, orpo or simpo.")
    if ft.dpo_label_smoothing and ft.pref_loss not in ("sigmoid", "simpo"):
        problems.append(f"'dpo_label_smoothing' applies to pref_loss sigmoid or simpo, not '{ft.pref_loss}'; remove it.")
    if ft.pref_loss == "orpo" and ft.pref_ftx:
        problems.append("'pref_ftx' does not apply to 'pref_loss: orpo', whose loss already holds the SFT term; "
                        "remove it.")
    if ft.pref_loss in REFERENCE_FREE and (ft.ref_model or ft.ref_model_adapters):
        problems.append(f"'pref_loss: {ft.pref_loss}' needs no reference model; "
                        "remove 'ref_model' and 'ref_model_adapters'.")
    return problems


def _kto_problems(ft: FinetuningConfig) -> list[str]:
    problems = []
    if ft.pref_ftx:
        problems.append("'pref_ftx' is not supported with 'stage: kto' (TRL's KTO trainer has no SFT term); remove it.")
    if ft.dpo_label_smoothing:
        problems.append("'dpo_label_smoothing' applies to stage dpo, not kto; remove it.")
    for key, weight in (("kto_chosen_weight", ft.kto_chosen_weight), ("kto_rejected_weight", ft.kto_rejected_weight)):
        if weight <= 0:
            problems.append(f"'{key}' must be positive, got {weight}.")
    return problems


def dpo_loss_terms(finetuning: FinetuningConfig) -> tuple[list[str], list[float]]:
    """TRL DPOTrainer `loss_type` list and `loss_weights` for pref_loss sigmoid, hinge or ipo."""
    main = "robust" if finetuning.pref_loss == "sigmoid" and finetuning.dpo_label_smoothing else finetuning.pref_loss
    if finetuning.pref_ftx:
        return [main, "sft"], [1.0, finetuning.pref_ftx]
    return [main], [1.0]


def reference_model(
    model: PreTrainedModel,
    finetuning: FinetuningConfig,
    *,
    model_config: ModelConfig | None = None,
    vocab_size: int | None = None,
    training: dict[str, Any] | None = None,
) -> PreTrainedModel | None:
    """The frozen model the policy is compared with, or None where the trainer needs no model of its
    own: reference-free losses, and LoRA policies (TRL switches the adapter off instead)."""
    from peft import PeftModel

    if finetuning.stage == "dpo" and finetuning.pref_loss in REFERENCE_FREE:
        return None
    if finetuning.ref_model:
        return _load_reference(finetuning, model_config=model_config or ModelConfig(), vocab_size=vocab_size,
                               training=training)
    if isinstance(model, PeftModel):
        return None
    return _frozen(copy.deepcopy(model))


def _load_reference(
    finetuning: FinetuningConfig, *, model_config: ModelConfig, vocab_size: int | None, training: dict[str, Any] | None
) -> PreTrainedModel:
    from tuneline.core.models.adapters import adapter_paths, load_adapter
    from tuneline.core.models.loading import load_model

    config = dataclasses.replace(model_config, model_name_or_path=finetuning.ref_model,
                                 adapter_name_or_path=finetuning.ref_model_adapters)
    reference = load_model(finetuning.ref_model, model=config, vocab_size=vocab_size, training=training)
    for path in adapter_paths(config):
        reference = load_adapter(reference, path, model_config=config, trainable=False).merge_and_unload()
    return _frozen(reference)


def _frozen(model: PreTrainedModel) -> PreTrainedModel:
    model.requires_grad_(False)
    return model.eval()


def build_dpo_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    train_dataset: Dataset,
    eval_dataset: Dataset | None = None,
    finetuning: FinetuningConfig,
    args: TrainingArguments,
    callbacks: Sequence[TrainerCallback] = (),
    model_config: ModelConfig | None = None,
) -> Trainer:
    """A TRL trainer for stage dpo and `pref_loss`, ready to train on tuneline's tokenized pairs."""
    _check(finetuning)
    if finetuning.pref_loss in REFERENCE_FREE:
        return _reference_free_trainer(model, tokenizer, train_dataset=train_dataset, eval_dataset=eval_dataset,
                                       finetuning=finetuning, args=args, callbacks=callbacks)
    from trl import DPOConfig

    from tuneline.core.data.preference_columns import dpo_pairs
    from tuneline.core.stages.preference_trainers import TokenizedDPOTrainer
    from tuneline.core.training.trl_args import trl_config

    loss_types, loss_weights = dpo_loss_terms(finetuning)
    config = trl_config(DPOConfig, args, beta=finetuning.pref_beta, loss_type=loss_types, loss_weights=loss_weights,
                        label_smoothing=finetuning.dpo_label_smoothing, max_length=None)
    return _with_reference(TokenizedDPOTrainer, model, tokenizer, config=config, convert=dpo_pairs, train_dataset=train_dataset,
                           eval_dataset=eval_dataset, finetuning=finetuning, callbacks=callbacks, model_config=model_config)


def _with_reference(trainer_class: Any, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, config: Any,
                    convert: Any, train_dataset: Dataset, eval_dataset: Dataset | None, finetuning: FinetuningConfig,
                    callbacks: Sequence[TrainerCallback], model_config: ModelConfig | None) -> Trainer:
    """A TRL trainer that scores against a reference model (DPO, KTO), its data converted by `convert`."""
    trainer = trainer_class(
        model=model,
        ref_model=reference_model(model, finetuning, model_config=model_config, vocab_size=len(tokenizer),
                                  training=_dtype_keys(config)),
        args=config,
        train_dataset=convert(train_dataset),
        eval_dataset=convert(eval_dataset) if eval_dataset is not None else None,
        processing_class=tokenizer,
        callbacks=list(callbacks),
        optimizers=(_optimizer(model, finetuning, config), None),
    )
    drop_unneeded_ref_adapter(trainer.model)
    return trainer


def _reference_free_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    train_dataset: Dataset,
    eval_dataset: Dataset | None,
    finetuning: FinetuningConfig,
    args: TrainingArguments,
    callbacks: Sequence[TrainerCallback],
) -> Trainer:
    """ORPO or SimPO (through TRL's CPO trainer): the policy alone, no reference."""
    from trl.experimental.cpo import CPOConfig
    from trl.experimental.orpo import ORPOConfig

    from tuneline.core.data.preference_columns import odds_ratio_pairs
    from tuneline.core.stages.preference_trainers import TokenizedCPOTrainer, TokenizedORPOTrainer
    from tuneline.core.training.trl_args import trl_config

    # Their batches hold no `input_ids` (chosen and rejected are concatenated inside), so transformers
    # cannot count the tokens seen and would warn at every step.
    untracked = {"include_num_input_tokens_seen": "no"}
    if finetuning.pref_loss == "orpo":
        trainer_class: Any = TokenizedORPOTrainer
        config: Any = trl_config(ORPOConfig, args, beta=finetuning.pref_beta, **untracked)
    else:
        trainer_class = TokenizedCPOTrainer
        config = trl_config(CPOConfig, args, loss_type="simpo", beta=finetuning.pref_beta,
                            cpo_alpha=finetuning.pref_ftx, simpo_gamma=finetuning.simpo_gamma,
                            label_smoothing=finetuning.dpo_label_smoothing, **untracked)
    return trainer_class(
        model=model,
        args=config,
        train_dataset=odds_ratio_pairs(train_dataset),
        eval_dataset=odds_ratio_pairs(eval_dataset) if eval_dataset is not None else None,
        processing_class=tokenizer,
        callbacks=list(callbacks),
        optimizers=(_optimizer(model, finetuning, config), None),
    )


def build_kto_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    train_dataset: Dataset,
    eval_dataset: Dataset | None = None,
    finetuning: FinetuningConfig,
    args: TrainingArguments,
    callbacks: Sequence[TrainerCallback] = (),
    model_config: ModelConfig | None = None,
) -> Trainer:
    """TRL's KTOTrainer for stage kto, ready to train on tuneline's tokenized feedback rows."""
    _check(finetuning)
    if args.per_device_train_batch_size < 2:
        raise ConfigError(f"'per_device_train_batch_size: {args.per_device_train_batch_size}' is too small for stage "
                          "kto, which estimates its KL term from the other rows of a batch; set it to 2 or more.")
    from trl import KTOConfig

    from tuneline.core.data.preference_columns import kto_examples
    from tuneline.core.stages.preference_trainers import TokenizedKTOTrainer
    from tuneline.core.training.trl_args import trl_config

    config = trl_config(KTOConfig, args, beta=finetuning.pref_beta, desirable_weight=finetuning.kto_chosen_weight,
                        undesirable_weight=finetuning.kto_rejected_weight, max_length=None,
                        train_sampling_strategy="sequential")  # TRL insists; the trainer shuffles (see its sampler)
    return _with_reference(TokenizedKTOTrainer, model, tokenizer, config=config, convert=kto_examples, train_dataset=train_dataset,
                           eval_dataset=eval_dataset, finetuning=finetuning, callbacks=callbacks, model_config=model_config)


def drop_unneeded_ref_adapter(model: PreTrainedModel) -> bool:
    """Remove TRL's frozen copy of a LoRA policy's adapter when it equals the adapter switched off.

    TRL computes the reference of a LoRA policy with a copy of its starting adapter. A new adapter
    changes nothing yet (its B matrices are zero), so switching it off gives the same reference,
    which TRL does when there is no copy; dropping it keeps it out of memory and out of every saved
    adapter folder (as `ref/`). A continued adapter keeps its copy. True when the copy was removed.
    """
    from peft import PeftModel

    if not isinstance(model, PeftModel) or REF_ADAPTER not in model.peft_config:
        return False
    starts_at_zero = all(not parameter.any() for name, parameter in model.named_parameters()
                         if _is_b_matrix(name, model.active_adapter))
    if starts_at_zero:
        model.delete_adapter(REF_ADAPTER)
    return starts_at_zero


def _is_b_matrix(name: str, adapter: str) -> bool:
    """Whether parameter `name` is a LoRA B matrix (lora_B, lora_embedding_B) of `adapter`."""
    parts = name.split(".")
    return any(part in ("lora_B", "lora_embedding_B") and parts[i + 1 : i + 2] == [adapter]
               for i, part in enumerate(parts))


def _check(finetuning: FinetuningConfig) -> None:
    problems = preference_problems(finetuning)
    if problems:
        raise ConfigError(problems)


def _optimizer(model: PreTrainedModel, finetuning: FinetuningConfig, config: TrainingArguments) -> Any:
    from tuneline.core.models.loading import loraplus_optimizer

    return loraplus_optimizer(model, finetuning=finetuning, args=config)


def _dtype_keys(args: TrainingArguments) -> dict[str, Any]:
    """The trainer keys that choose the dtype a reference model loads in."""
    return {"bf16": args.bf16, "fp16": args.fp16}
