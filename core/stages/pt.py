"""Stage pt: continued pre-training on plain text, every token trained."""

from __future__ import annotations

from tuneline.core.stages.causal_lm import build_language_model_trainer, load_policy, perplexity_metrics
from tuneline.core.stages.kind import StageKind
from tuneline.core.stages.stage_keys import (
                                               CHECKPOINT_KEYS,
                                               LABEL_SMOOTHING_KEYS,
                                               LANGUAGE_MODEL_KEYS,
                                               PACKING_KEYS,
                                               PER_DATASET_EVALUATION_KEYS,
                                               TRAINER_KEYS,
                                               TRAINER_LOOP_KEYS,
                                               TRAINER_SAMPLER_KEYS,
)

PT = StageKind(
    name="pt",
    summary="pre-training: next-token prediction on plain text (packed by default)",
    examples="pretrain",
    plotted_keys=("eval_loss",),
    reads=frozenset({*PACKING_KEYS, *TRAINER_KEYS, *TRAINER_LOOP_KEYS, *CHECKPOINT_KEYS, *TRAINER_SAMPLER_KEYS, *LABEL_SMOOTHING_KEYS,
                     *PER_DATASET_EVALUATION_KEYS, *LANGUAGE_MODEL_KEYS}),
    exclusive_keys=frozenset(LANGUAGE_MODEL_KEYS),
    load_model=load_policy,
    build_trainer=build_language_model_trainer,
    held_out_metrics=perplexity_metrics,
)
