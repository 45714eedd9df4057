"""Which unit runs which step of a pipeline: `build_unit(pipeline, fingerprints, address)`.

The pipeline flow, a work pool's one-stage flow and a Ray node all build a stage's unit here, from the
pipeline spec, the run's dataset fingerprints and the unit's address (its artifact kind and the stage,
or the `evaluate`/`export` section's stage). A machine the unit was sent to builds it with
`rebuild_sent_unit`, which refuses a unit it keys differently from the machine that sent it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from tuneline.core.config import InferenceConfig
from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.keys import PipelineFingerprints
from tuneline.core.pipeline.references import ArtifactRef, ExternalModel, ModelInput
from tuneline.core.pipeline.shipped_datasets import with_dataset_dirs
from tuneline.core.pipeline.spec import BaseStage, Pipeline, TrainingStage
from tuneline.core.pipeline.stage_runs import TOKENIZED_KIND, export_template
from tuneline.core.pipeline.stage_unit import StageUnit, unit_key
from tuneline.core.pipeline.stores import open_store
from tuneline.core.pipeline.train_unit import TrainUnit
from tuneline.core.pipeline.units import BaseUnit, EvaluateUnit, ExportUnit, MergeUnit, TokenizeUnit
from tuneline.core.store.fingerprints import code_digest, package_version


@dataclass(frozen=True)
class UnitAddress:
    """A unit by its artifact kind and the stage it belongs to: plain values a flow run's parameters carry."""

    kind: str
    stage: str


def build_unit(pipeline: Pipeline, fingerprints: PipelineFingerprints, address: UnitAddress) -> StageUnit:
    stage = pipeline.stage(address.stage)
    if address.kind == BaseUnit.kind:
        assert isinstance(stage, BaseStage)
        return BaseUnit(stage, fingerprints=fingerprints.stages[stage.name])
    if address.kind == TOKENIZED_KIND:
        assert isinstance(stage, TrainingStage)
        return TokenizeUnit(stage, fingerprints=fingerprints.stages[stage.name])
    if address.kind == TrainUnit.kind:
        assert isinstance(stage, TrainingStage)
        return TrainUnit(stage)
    if address.kind == MergeUnit.kind:
        rope = {"rope_scaling": stage.config.model.rope_scaling, "model_max_length": stage.config.data.cutoff_len} \
            if isinstance(stage, TrainingStage) and stage.config.model.rope_scaling else {}
        return MergeUnit(stage.name, **rope)
    if address.kind == EvaluateUnit.kind:
        assert pipeline.evaluate is not None
        return EvaluateUnit(pipeline.evaluate, stage, heldout=fingerprints.heldout)
    if address.kind == ExportUnit.kind:
        assert pipeline.export is not None
        config = stage.config if isinstance(stage, TrainingStage) else None
        inference = config.inference if config is not None else InferenceConfig()
        return ExportUnit(pipeline.export, template=export_template(config), inference=inference, config=config)
    raise ValueError(f"no unit stores artifacts of kind '{address.kind}'")


def rebuild_sent_unit(pipeline: Pipeline, fingerprints: PipelineFingerprints, address: UnitAddress,
                      inputs: Mapping[str, ModelInput], *, key: str, datasets: Mapping[str, str], workspace: str,
                      machine: str) -> StageUnit:
    """The unit another machine keyed as `key` and sent here (`machine` names this one in the refusal):
    built with that machine's dataset folders as the copies it shipped through the store (`datasets`),
    and refused unless it keys the same here (the key holds the package's version and code digest)."""
    if datasets:
        pipeline = with_dataset_dirs(pipeline, datasets, open_store(workspace))
    unit = build_unit(pipeline, fingerprints, address)
    if (own_key := unit_key(unit, inputs)) != key:
        raise ConfigError(f"{unit.label}: {machine} keys the stage {own_key}, the pipeline that sent it {key}: the two "
                          f"machines run different tuneline code (version {package_version()}, code digest "
                          f"{code_digest()} here); install the same tuneline on the launching machine and on every "
                          "machine that runs stages.")
    return unit


def encode_inputs(inputs: Mapping[str, ModelInput]) -> dict[str, dict]:
    """A unit's input references as JSON values (a flow run's parameters)."""
    return {name: {"external": isinstance(ref, ExternalModel), **asdict(ref)} for name, ref in inputs.items()}


def decode_inputs(encoded: Mapping[str, Mapping]) -> dict[str, ModelInput]:
    decoded: dict[str, ModelInput] = {}
    for name, values in encoded.items():
        fields = {k: v for k, v in values.items() if k != "external"}
        decoded[name] = ExternalModel(**fields) if values["external"] else ArtifactRef(**fields)
    return decoded
