"""Stage sft: supervised fine-tuning on conversations, the replies trained (the prompt masked).

Its loss is the replies' cross-entropy, or one of LLaMA-Factory's variants (`use_dft_loss`,
`use_eaft_loss`, `use_asft_loss`, see `core.training.losses`).
"""

from __future__ import annotations

from tuneline.core.config import FinetuningConfig, StageConfig
from tuneline.core.stages.causal_lm import build_language_model_trainer, load_policy, perplexity_metrics
from tuneline.core.stages.kind import StageKind
from tuneline.core.stages.stage_keys import (
    CHECKPOINT_KEYS,
    LABEL_SMOOTHING_KEYS,
    LANGUAGE_MODEL_KEYS,
    PACKING_KEYS,
    PER_DATASET_EVALUATION_KEYS,
    PREDICTION_KEYS,
    REFERENCE_KEYS,
    SUPERVISED_LABEL_KEYS,
    TRAINER_KEYS,
    TRAINER_LOOP_KEYS,
    TRAINER_SAMPLER_KEYS,
)

LOSS_VARIANTS = ("use_dft_loss", "use_eaft_loss", "use_asft_loss")
SFT_LOSS_KEYS = (*LOSS_VARIANTS, "asft_alpha", "eaft_alpha")
"""The keys of sft's loss variants: which one, and the weights they read."""


def loss_variant_problems(finetuning: FinetuningConfig) -> list[str]:
    """Loss-variant settings that contradict each other or would be ignored, one line each."""
    ft = finetuning
    defaults = FinetuningConfig()
    asked = [key for key in LOSS_VARIANTS if getattr(ft, key)]
    problems = []
    if len(asked) > 1:
        problems.append(f"{' and '.join(f'{key}: true' for key in asked)} ask for different losses; keep one of them.")
    for key, switch in (("asft_alpha", "use_asft_loss"), ("eaft_alpha", "use_eaft_loss")):
        value = getattr(ft, key)
        if value < 0:
            problems.append(f"'{key}' must be 0 or more, got {value}.")
        elif value != getattr(defaults, key) and not getattr(ft, switch):
            problems.append(f"'{key}: {value}' weighs the loss of '{switch}: true', which is not set; set it or remove {key}.")
    if (ft.ref_model or ft.ref_model_adapters) and not ft.use_asft_loss:
        problems.append("stage sft reads 'ref_model' and 'ref_model_adapters' only for 'use_asft_loss: true'; "
                        "set it or remove them.")
    return problems


def _config_problems(config: StageConfig) -> list[str]:
    return loss_variant_problems(config.finetuning)


def _unread_keys(config: StageConfig) -> dict[str, str]:
    """The generation keys answer held-out prompts after training, which only `do_predict` asks for;
    a loss variant computes its own loss, without transformers' label smoothing."""
    unread = {}
    variant = next((key for key in LOSS_VARIANTS if getattr(config.finetuning, key)), None)
    if variant:
        unread.update(dict.fromkeys(LABEL_SMOOTHING_KEYS, f"'{variant}: true' computes its own loss, which does not "
                                                          "smooth the labels"))
    if not (config.training.get("do_predict") and config.training.get("predict_with_generate")):
        unread.update(dict.fromkeys(PREDICTION_KEYS, "stage sft generates only to predict ('do_predict: true' with "
                                                     "'predict_with_generate: true'), which this run does not ask for"))
    return unread


SFT = StageKind(
    name="sft",
    summary="supervised fine-tuning: replies of conversations trained, prompts masked",
    examples="supervised",
    plotted_keys=("eval_loss", "eval_accuracy"),
    predicts=True,
    trains_images=True,
    config_problems=_config_problems,
    reads=frozenset({*PACKING_KEYS, *SUPERVISED_LABEL_KEYS, *TRAINER_KEYS, *TRAINER_LOOP_KEYS, *CHECKPOINT_KEYS,
                     *TRAINER_SAMPLER_KEYS, *LABEL_SMOOTHING_KEYS, *PER_DATASET_EVALUATION_KEYS, *LANGUAGE_MODEL_KEYS,
                     *SFT_LOSS_KEYS, *REFERENCE_KEYS, *PREDICTION_KEYS}),
    unread_keys=_unread_keys,
    own_keys=SFT_LOSS_KEYS,
    exclusive_keys=frozenset({*LOSS_VARIANTS, *LANGUAGE_MODEL_KEYS}),  # a loss or metric asked for, never dropped silently
    load_model=load_policy,
    build_trainer=build_language_model_trainer,
    held_out_metrics=perplexity_metrics,
)
