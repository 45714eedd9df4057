"""What each kind of stage computes, as a unit `run_stage_unit` runs (`core/pipeline/stage_unit.py`).

A unit is a frozen value: the stage's spec (its settings, and the dataset digests the run took
once) without its inputs. Its inputs are references handed in at run time, by name: `tokenizer`;
`data` (tokenized), `model` (the full-weight start), `ref_model`, `reward_model`; `trained`;
`baseline`. From them it computes its key (`keys.py`), the parameters its MLflow run records, and
its work into the artifact's draft. The training unit is in `train_unit.py`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tuneline.core.config import InferenceConfig, ModelConfig, StageConfig
from tuneline.core.data.tokenization import PREVIEW_FILE
from tuneline.core.evaluation.heldout import score_model
from tuneline.core.pipeline.keys import base_key, evaluate_key, export_key, heldout_rows, merge_key, run_build_base, tokenize_key
from tuneline.core.pipeline.references import ArtifactRef, ModelInput
from tuneline.core.pipeline.spec import BaseStage, EvaluateSettings, ExportSettings, TrainingStage
from tuneline.core.pipeline.stage_runs import (
    TEMPLATE_WARNING,
    TOKENIZED_KIND,
    ParitySource,
    merge_into,
    tokenize_into,
    tokenize_params,
    write_export,
)
from tuneline.core.pipeline.stage_unit import StageInputs, StageKey, UnitRun
from tuneline.core.store.artifacts import Artifact, ArtifactDraft
from tuneline.core.tracking import runs as tracking
from tuneline.core.tracking.references import TEMPLATE_WARNING_TAG

_WARNING_CHARS = 5000  # MLflow keeps tag values up to 8000 characters; the paragraph is well under


def artifact_input(inputs: Mapping[str, ModelInput], name: str) -> ArtifactRef:
    """Input `name`, which a stage produced (not a model from outside the pipeline)."""
    found = inputs[name]
    assert isinstance(found, ArtifactRef), f"input '{name}' must be a stage's artifact"
    return found


@dataclass(frozen=True)
class BaseUnit:
    """The project's tiny base model (tokenizer and random weights), built from its corpus."""

    stage: BaseStage
    fingerprints: Mapping[str, str]
    """The run's digests of the corpus."""
    kind: ClassVar[str] = "base"
    action: ClassVar[str] = "build_base"
    keep_partial: ClassVar[bool] = False

    @property
    def label(self) -> str:
        return self.stage.name

    def stage_key(self, inputs: Mapping[str, ModelInput]) -> StageKey:
        key, digests = base_key(self.stage, fingerprints=self.fingerprints)
        return StageKey(key, digests, datasets=digests)

    def params(self, inputs: StageInputs) -> dict[str, Any]:
        return {**dataclasses.asdict(self.stage.build), "corpus": ",".join(self.stage.corpus)}

    def work(self, draft: ArtifactDraft, run: UnitRun) -> None:
        draft.metrics.update(run_build_base(self.stage, draft.path))

    def on_hit(self, artifact: Artifact, run: UnitRun) -> None:
        pass


@dataclass(frozen=True)
class TokenizeUnit:
    """A training stage's datasets tokenized to Arrow with its template, by input `tokenizer`."""

    stage: TrainingStage
    fingerprints: Mapping[str, str]
    """The run's digests of the stage's datasets."""
    kind: ClassVar[str] = TOKENIZED_KIND
    action: ClassVar[str] = "tokenize"
    keep_partial: ClassVar[bool] = False

    @property
    def label(self) -> str:
        return f"{self.stage.name}/tokenize"

    def stage_key(self, inputs: Mapping[str, ModelInput]) -> StageKey:
        key, digests = tokenize_key(self.stage, tokenizer_key=inputs["tokenizer"].key, fingerprints=self.fingerprints)
        return StageKey(key, digests, datasets=digests)

    def params(self, inputs: StageInputs) -> dict[str, Any]:
        return tokenize_params(self.stage.config)

    def work(self, draft: ArtifactDraft, run: UnitRun) -> None:
        tokenize_into(draft, self.stage.config, tokenizer_path=run.inputs.path("tokenizer"))
        tracking.log_artifact(run.context.tracking_uri, run.run_id, draft.path / PREVIEW_FILE)
        self._record_warning(draft.extra.get(TEMPLATE_WARNING), run)

    def on_hit(self, artifact: Artifact, run: UnitRun) -> None:
        # a hit's run carries the warning too, from the manifest, so every run of the stage shows it
        self._record_warning(artifact.manifest.get(TEMPLATE_WARNING), run)

    def _record_warning(self, warning: str | None, run: UnitRun) -> None:
        if warning:
            run.announcer.say(f"{self.label}: {warning}")
            tracking.set_tags(run.context.tracking_uri, run.run_id, {TEMPLATE_WARNING_TAG: warning[:_WARNING_CHARS]})


@dataclass(frozen=True)
class MergeUnit:
    """A LoRA stage's adapter (input `trained`) folded into the model it started from."""

    name: str
    """The stage whose adapter this is."""
    rope_scaling: str | None = None
    model_max_length: int | None = None
    """`rope_scaling` and `model_max_length` (the stage's cutoff_len): the RoPE the adapter trained with."""
    kind: ClassVar[str] = "merged"
    action: ClassVar[str] = "merge"
    keep_partial: ClassVar[bool] = False

    @property
    def label(self) -> str:
        return f"{self.name}/merge"

    def stage_key(self, inputs: Mapping[str, ModelInput]) -> StageKey:
        trained = inputs["trained"]
        return StageKey(merge_key(trained_key=trained.key), {"trained": trained.key})

    def params(self, inputs: StageInputs) -> dict[str, Any]:
        trained = artifact_input(inputs.references, "trained")
        return {"base_model": trained.start_model, "adapter": inputs.path("trained"),
                **({"rope_scaling": self.rope_scaling} if self.rope_scaling else {})}

    def work(self, draft: ArtifactDraft, run: UnitRun) -> None:
        trained = artifact_input(run.inputs.references, "trained")
        assert trained.start_model is not None  # a training stage's manifest names the model it started from
        draft.metrics.update(merge_into(draft.path, start_model=trained.start_model, adapter=run.inputs.path("trained"),
                                        model_config=ModelConfig(rope_scaling=self.rope_scaling),
                                        model_max_length=self.model_max_length))

    def on_hit(self, artifact: Artifact, run: UnitRun) -> None:
        pass


@dataclass(frozen=True)
class EvaluateUnit:
    """Validation loss and held-out answer quality of input `trained` (tokenized `data`) against `baseline`."""

    settings: EvaluateSettings
    stage: TrainingStage
    heldout: Mapping[str, str]
    """The run's digests of the held-out dataset and the benchmarks."""
    kind: ClassVar[str] = "evaluation"
    action: ClassVar[str] = "evaluate"
    keep_partial: ClassVar[bool] = False

    @property
    def label(self) -> str:
        return f"{self.stage.name}/evaluate"

    def stage_key(self, inputs: Mapping[str, ModelInput]) -> StageKey:
        trained, data, baseline = inputs["trained"], inputs["data"], inputs.get("baseline")
        key = evaluate_key(self.settings, stage_key_=trained.key, baseline_key=baseline and baseline.key,
                           tokenized_key=data.key, inputs=self.heldout)
        return StageKey(key, {"trained": trained.key, "data": data.key, **({"baseline": baseline.key} if baseline else {})})

    def params(self, inputs: StageInputs) -> dict[str, Any]:
        return dataclasses.asdict(self.settings)

    def work(self, draft: ArtifactDraft, run: UnitRun) -> None:
        settings, config, inputs = self.settings, self.stage.config, run.inputs
        trained, tokenized_path = artifact_input(inputs.references, "trained"), inputs.path("data")
        adapter = inputs.path("trained") if trained.is_adapter else None
        model_path = trained.start_model if adapter else inputs.path("trained")
        rows, plan = heldout_rows(settings, config), settings.benchmark_plan()
        result = score_model(model_path, adapter_path=adapter, config=config, tokenized_path=tokenized_path, rows=rows,
                             max_new_tokens=settings.max_new_tokens, plan=plan)
        draft.metrics.update(result.metrics)
        _write_predictions(draft.path / "generated_predictions.jsonl", result.predictions)
        if inputs.get("baseline") is not None:
            baseline = score_model(inputs.path("baseline"), adapter_path=None, config=config, tokenized_path=tokenized_path,
                                   rows=rows, max_new_tokens=settings.max_new_tokens, plan=plan)
            draft.metrics.update({f"baseline_{k}": v for k, v in baseline.metrics.items()})

    def on_hit(self, artifact: Artifact, run: UnitRun) -> None:
        pass


def _write_predictions(path: Path, predictions: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions), encoding="utf-8")


@dataclass(frozen=True)
class ExportUnit:
    """The full-weight input `model` as a standalone Hugging Face folder, checked by the parity gate
    against the stage's training (input `trained`: its tokenizer and, for a LoRA stage, its adapter)."""

    settings: ExportSettings
    template: str
    inference: InferenceConfig
    """The exported stage's infer_dtype (the weights' dtype) and use_kv_cache (the config's use_cache)."""
    config: StageConfig | None
    """The exported stage's config; None for a model no training stage produced."""
    kind: ClassVar[str] = "export"
    action: ClassVar[str] = "export"
    keep_partial: ClassVar[bool] = False

    @property
    def label(self) -> str:
        return f"{self.settings.stage}/export"

    def stage_key(self, inputs: Mapping[str, ModelInput]) -> StageKey:
        model = inputs["model"]
        return StageKey(export_key(self.settings, model_key=model.key, template=self.template, inference=self.inference),
                        {"model": model.key})

    def params(self, inputs: StageInputs) -> dict[str, Any]:
        settings, inference = self.settings, self.inference
        return {"stage": settings.stage, "export_size": settings.export_size, "template": self.template,
                "infer_dtype": inference.infer_dtype, "use_kv_cache": inference.use_kv_cache,
                "parity_probes": settings.parity_probes}

    def work(self, draft: ArtifactDraft, run: UnitRun) -> None:
        report = write_export(draft.path, model=run.inputs.path("model"), template=self.template,
                              export_size_gb=self.settings.export_size, infer_dtype=self.inference.infer_dtype,
                              use_kv_cache=self.inference.use_kv_cache, parity=self.parity_source(run.inputs))
        draft.metrics.update(report.metrics)
        if report.modelfile_obstacle is not None:  # the manifest says why the folder has no Ollama Modelfile
            draft.extra["ollama_modelfile_obstacle"] = report.modelfile_obstacle

    def parity_source(self, inputs: StageInputs) -> ParitySource:
        """The parity gate compares with the tokenizer the stage trained with (saved with its
        artifact) and, for a LoRA stage, with its adapter on the model it started from."""
        probes = self.settings.parity_probes
        if self.config is None:
            return ParitySource(None, tokenizer_path=inputs.path("model"), probes=probes)
        trained, trained_path = artifact_input(inputs.references, "trained"), inputs.path("trained")
        adapter = (trained.start_model, trained_path) if trained.is_adapter and trained.start_model else None
        return ParitySource(self.config, tokenizer_path=trained_path, adapter=adapter, probes=probes)

    def on_hit(self, artifact: Artifact, run: UnitRun) -> None:
        pass
