"""One stage's whole configuration: a frozen value per concern, plus transformers' trainer arguments."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuneline.core.config.data import DataConfig
from tuneline.core.config.generation import GeneratingConfig, InferenceConfig
from tuneline.core.config.media import MediaConfig
from tuneline.core.config.method import FinetuningConfig
from tuneline.core.config.model import ModelConfig
from tuneline.core.config.optimizer import OptimizerConfig
from tuneline.core.config.output import ExportConfig, OutputConfig, RuntimeConfig
from tuneline.core.config.ray import RayConfig


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
    ray: RayConfig = RayConfig()

    def flat(self) -> dict[str, Any]:
        """All keys in LLaMA-Factory's flat form (what the YAML would say, defaults included)."""
        merged: dict[str, Any] = {}
        for name in GROUPS:
            merged.update(dataclasses.asdict(getattr(self, name)))
        merged.update(self.training)
        return merged


def trains(training: Mapping[str, Any]) -> bool:
    """Whether a stage with these trainer settings trains: `do_train` when it is set. Left out, it is
    true, as tuneline's configs expect, except beside `do_predict: true`: there it is false, as in
    LLaMA-Factory (whose default is false), so a prediction config (an adapter, `eval_dataset`,
    `do_predict`) only predicts."""
    if "do_train" in training:
        return bool(training["do_train"])
    return not training.get("do_predict")


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
    "ray": RayConfig,
}
