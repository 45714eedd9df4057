"""One stage's whole configuration: a frozen value per concern, plus transformers' trainer arguments."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tuneline.core.config.data import DataConfig
from tuneline.core.config.generation import GeneratingConfig, InferenceConfig
from tuneline.core.config.media import MediaConfig
from tuneline.core.config.method import FinetuningConfig
from tuneline.core.config.model import ModelConfig
from tuneline.core.config.optimizer import OptimizerConfig
from tuneline.core.config.output import ExportConfig, OutputConfig, RuntimeConfig


@dataclass(frozen=True)
class StageConfig:
    """One stage, resolved and validated; `training` holds Seq2SeqTrainingArguments keys.

    `training` is a plain dict so the config stays JSON-serialisable; treat it as read-only.
    """

    model: ModelConfig
    data: DataConfig
    finetuning: FinetuningConfig
    optimizer: OptimizerConfig
    generating: GeneratingConfig
    inference: InferenceConfig
    media: MediaConfig
    export: ExportConfig
    output: OutputConfig
    runtime: RuntimeConfig
    training: dict[str, Any]

    def flat(self) -> dict[str, Any]:
        """All keys in LLaMA-Factory's flat form (what the YAML would say, defaults included)."""
        merged: dict[str, Any] = {}
        for name in GROUPS:
            merged.update(dataclasses.asdict(getattr(self, name)))
        merged.update(self.training)
        return merged


# StageConfig's attribute -> the dataclass of its keys
GROUPS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "finetuning": FinetuningConfig,
    "optimizer": OptimizerConfig,
    "generating": GeneratingConfig,
    "inference": InferenceConfig,
    "media": MediaConfig,
    "export": ExportConfig,
    "output": OutputConfig,
    "runtime": RuntimeConfig,
}
