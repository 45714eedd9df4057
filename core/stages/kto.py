"""Stage kto: single replies tagged desirable or not, trained with TRL's KTOTrainer against a
reference model (`kto_chosen_weight` and `kto_rejected_weight` weigh the two kinds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneline.core.config import FinetuningConfig, StageConfig
from tuneline.core.errors import ConfigError
from tuneline.core.stages.causal_lm import load_policy
from tuneline.core.stages.kind import StageKind, TrainerRequest
from tuneline.core.stages.preference import pissa_problems, preference_problems, raise_problems, with_reference
from tuneline.core.stages.stage_keys import (
    CHECKPOINT_KEYS,
    PER_DATASET_EVALUATION_KEYS,
    REFERENCE_KEYS,
    TRAINER_KEYS,
    TRAINER_LOOP_KEYS,
    TRAINER_SAMPLER_KEYS,
)

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase, Trainer

KTO_KEYS = ("kto_chosen_weight", "kto_rejected_weight")


def kto_problems(finetuning: FinetuningConfig) -> list[str]:
    """Preference settings that stage kto could not train with, or would ignore, one line each."""
    ft = finetuning
    problems = preference_problems(ft) + pissa_problems(ft, uses_reference=True)
    if ft.pref_ftx:
        problems.append("'pref_ftx' is not supported with 'stage: kto' (TRL's KTO trainer has no SFT term); remove it.")
    for key, asked in (("dpo_label_smoothing", bool(ft.dpo_label_smoothing)), ("pref_bco_weight", bool(ft.pref_bco_weight)),
                       ("ld_alpha", ft.ld_alpha is not None)):
        if asked:
            problems.append(f"'{key}' applies to stage dpo, not kto; remove it.")
    for key, weight in (("kto_chosen_weight", ft.kto_chosen_weight), ("kto_rejected_weight", ft.kto_rejected_weight)):
        if weight <= 0:
            problems.append(f"'{key}' must be positive, got {weight}.")
    return problems


def build_kto_trainer(request: TrainerRequest) -> Trainer:
    """TRL's KTOTrainer for stage kto, ready to train on tuneline's tokenized feedback rows."""
    finetuning, args = request.finetuning, request.args
    raise_problems(kto_problems(finetuning))
    from trl import KTOConfig

    from tuneline.core.data.preference_columns import kto_examples
    from tuneline.core.stages.preference_trainers import TokenizedKTOTrainer
    from tuneline.core.training.trl_args import trl_config

    config = trl_config(KTOConfig, args, beta=finetuning.pref_beta, desirable_weight=finetuning.kto_chosen_weight,
                        undesirable_weight=finetuning.kto_rejected_weight, max_length=None,
                        train_sampling_strategy="sequential")  # TRL insists; the trainer shuffles (see its sampler)
    media = request.media_rows
    if media is not None and media.media.plugin == "mllama":
        raise ConfigError("stage kto cannot train Llama 3.2 Vision on image rows yet: its cross-attention mask follows "
                          "each sequence's image tokens, and TRL's KTO trainer feeds the KL sequence the main one's; "
                          "train it with sft or dpo.")
    extra = {"media_rows": media} if media is not None else {}
    trainer = with_reference(TokenizedKTOTrainer, request, config=config, convert=kto_examples, **extra)
    trainer.shuffle = not finetuning.disable_shuffling
    return trainer


def _config_problems(config: StageConfig) -> list[str]:
    return kto_problems(config.finetuning)


def _trainer_metrics(trainer: Trainer, tokenizer: PreTrainedTokenizerBase, validation: Dataset,
                     finetuning: FinetuningConfig, *, prefix: str = "eval") -> dict[str, float]:
    return dict(trainer.evaluate(metric_key_prefix=prefix))


KTO = StageKind(
    name="kto",
    summary="Kahneman-Tversky optimisation on replies tagged desirable or undesirable, against a reference model",
    examples="feedback",
    plotted_keys=("rewards/chosen", "eval_loss"),
    references=frozenset({"ref_model"}),
    config_problems=_config_problems,
    # of the preference keys only pref_beta: kto_problems refuses dpo's other terms
    reads=frozenset({*TRAINER_KEYS, *TRAINER_LOOP_KEYS, *CHECKPOINT_KEYS, *TRAINER_SAMPLER_KEYS, *PER_DATASET_EVALUATION_KEYS,
                     "pref_beta", *KTO_KEYS, *REFERENCE_KEYS}),
    own_keys=KTO_KEYS,
    load_model=load_policy,
    build_trainer=build_kto_trainer,
    held_out_metrics=_trainer_metrics,
    trainer_modules=("trl", "tuneline.core.stages.preference_trainers"),
    trains_images=True,
)
