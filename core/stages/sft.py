"""Stage sft: supervised fine-tuning on conversations, the replies trained (the prompt masked)."""

from __future__ import annotations

from tuneline.core.stages.causal_lm import build_language_model_trainer, load_policy, perplexity_metrics
from tuneline.core.stages.kind import StageKind

SFT = StageKind(
    name="sft",
    summary="supervised fine-tuning: replies of conversations trained, prompts masked",
    examples="supervised",
    predicts=True,
    load_model=load_policy,
    build_trainer=build_language_model_trainer,
    held_out_metrics=perplexity_metrics,
)
