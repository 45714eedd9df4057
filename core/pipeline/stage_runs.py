"""The jobs that `tuneline train`, `data preview` and `export` share with the pipeline's tasks.

One builder of a stage's TrainJob, one tokenized-data step with its cache, one merge and export
path. The Prefect tasks (`tasks/`) and the commands without Prefect (`flows/single.py`) both call
these, so a setting means the same in both and their artifacts are alike.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tuneline.core.config import StageConfig
from tuneline.core.data.tokenization import DEFAULT_TEMPLATE, TEMPLATE_WARNING_FILE
from tuneline.core.models.export import merge_adapter, write_hf_folder
from tuneline.core.pipeline.keys import tokenize_key
from tuneline.core.pipeline.spec import TrainingStage
from tuneline.core.store.artifacts import Artifact, ArtifactDraft, find_artifact, write_artifact
from tuneline.core.stages.registry import tokenize_stage_data
from tuneline.core.store.cache import Damage, serve_or_compute
from tuneline.core.store.recency import note_use
from tuneline.core.store.user_folders import check_user_folder, write_user_folder
from tuneline.core.training.job import TrainJob

TOKENIZED_KIND = "tokenized"
TEMPLATE_WARNING = "template_warning"
"""The manifest entry of a tokenized artifact whose template renders differently from the
tokenizer's own chat template: the paragraph naming the first differing tokens."""

# A pipeline stage checkpoints unless its settings name `save_steps` or `save_strategy`, so that a
# killed chain resumes the stage it interrupted (`tuneline train` keeps transformers' "no"). Every 50
# steps bounds what a kill loses to a few minutes of GPU work while a LoRA checkpoint costs
# megabytes; full-weight stages that save slowly name their own `save_steps`. The newest two are kept:
# if a kill cuts the newest short, the one before is whole. The final artifact holds none
# (keep_checkpoints=False), and the save keys are not part of the stage key.
DEFAULT_CHECKPOINTING = {"save_strategy": "steps", "save_steps": 50, "save_total_limit": 2}

# The settings a tokenized artifact's manifest records (the ones its key hashes, by name).
_DATA_PARAMS = ("dataset", "eval_dataset", "dataset_dir", "template", "cutoff_len", "train_on_prompt", "mask_history",
                "max_samples", "val_size", "packing", "stage", "split_special_tokens", "add_tokens", "add_special_tokens",
                "new_special_tokens_config")


def with_checkpointing(training: Mapping[str, Any]) -> dict[str, Any]:
    """The stage's trainer settings, with DEFAULT_CHECKPOINTING unless they name a save policy."""
    if "save_steps" in training or "save_strategy" in training:
        return dict(training)
    return {**DEFAULT_CHECKPOINTING, **training}


# -- train -------------------------------------------------------------------------------------

def train_job(
    config: StageConfig,
    *,
    start_model: str,
    dataset_path: str,
    output_dir: str,
    training: Mapping[str, Any],
    references: Mapping[str, str] | None = None,
    tracking_uri: str | None = None,
    run_id: str | None = None,
    keep_checkpoints: bool = True,
    overwrite_output_dir: bool = False,
) -> TrainJob:
    """The worker's job for one stage: `config`'s method, model and generation settings, starting
    from `start_model`, on tokenized data `dataset_path`, writing to `output_dir`. `references`
    are the resolved `ref_model`/`reward_model` paths; `training` the trainer arguments as the
    caller settles them (a pipeline adds its checkpointing)."""
    return TrainJob(
        model_path=start_model,
        dataset_path=dataset_path,
        output_dir=output_dir,
        finetuning={**dataclasses.asdict(config.finetuning), **(references or {})},
        training={k: v for k, v in training.items() if k != "output_dir"},  # the job names its own
        model={**dataclasses.asdict(config.model), "model_name_or_path": start_model},
        generating=dataclasses.asdict(config.generating),
        optimizer=dataclasses.asdict(config.optimizer),
        tracking_uri=tracking_uri,
        run_id=run_id,
        keep_checkpoints=keep_checkpoints,
        overwrite_output_dir=overwrite_output_dir,
        model_max_length=config.data.cutoff_len,
    )


# -- tokenize ----------------------------------------------------------------------------------

def tokenize_params(config: StageConfig) -> dict[str, Any]:
    """The data settings a tokenized artifact records in its manifest (and its MLflow run)."""
    return {k: v for k, v in config.flat().items() if k in _DATA_PARAMS}


def tokenize_into(draft: ArtifactDraft, config: StageConfig, *, tokenizer_path: str) -> None:
    """Tokenize `config`'s datasets into the draft, the counters into its metrics, and the template
    warning (if any) into its manifest as `template_warning`."""
    draft.metrics.update(tokenize_stage_data(config, tokenizer_path=tokenizer_path, output_dir=draft.path))
    warning = draft.path / TEMPLATE_WARNING_FILE
    if warning.is_file():
        draft.extra[TEMPLATE_WARNING] = warning.read_text(encoding="utf-8").strip()


def cached_tokenized_data(
    store: str | Path,
    stage: TrainingStage,
    *,
    tokenizer_path: str,
    tokenizer_key: str,
    fingerprints: Mapping[str, str] | None = None,
    on_damaged: Callable[[Damage], None] | None = None,
    on_hit: Callable[[Artifact], None] | None = None,
) -> Artifact:
    """The stage's tokenized data in the artifact store `store`, tokenized unless it is there
    sound (then noted as used, for `tuneline gc`, and passed to `on_hit`); the same key, work and
    manifest as the pipeline's tokenize stage, without MLflow."""
    key, inputs = tokenize_key(stage, tokenizer_key=tokenizer_key, fingerprints=fingerprints)

    def compute(damage: Damage | None) -> Artifact:
        with write_artifact(store, TOKENIZED_KIND, key, config=tokenize_params(stage.config), inputs=inputs) as draft:
            tokenize_into(draft, stage.config, tokenizer_path=tokenizer_path)
        artifact = find_artifact(store, TOKENIZED_KIND, key)
        assert artifact is not None  # just written, under the lock
        return artifact

    def serve(artifact: Artifact) -> Artifact:
        note_use(artifact)
        if on_hit is not None:
            on_hit(artifact)
        return artifact

    return serve_or_compute(store, TOKENIZED_KIND, key, serve=serve, compute=compute, on_damaged=on_damaged)


# -- merge and export --------------------------------------------------------------------------

def export_template(config: StageConfig | None) -> str:
    """The chat template an export's generation config stops on: the stage's, else the default."""
    return (config.data.template if config is not None else None) or DEFAULT_TEMPLATE


def merge_into(output_dir: str | Path, *, start_model: str, adapter: str) -> dict[str, int]:
    """Fold a LoRA adapter into the model it was trained from, written to `output_dir`."""
    return merge_adapter(start_model, adapter, output_dir)


def write_export(output_dir: str | Path, *, model: str, template: str, export_size_gb: int, infer_dtype: str = "auto",
                 use_kv_cache: bool = True, rope_scaling: str | None = None, model_max_length: int | None = None) -> None:
    """A standalone Hugging Face folder of the full-weight `model` in `output_dir`."""
    write_hf_folder(model, output_dir, template=template, export_size_gb=export_size_gb, infer_dtype=infer_dtype,
                    use_kv_cache=use_kv_cache, rope_scaling=rope_scaling, model_max_length=model_max_length)


def export_folder(model: str, export_dir: str | Path, *, adapter: str | None, template: str, export_size_gb: int,
                  overwrite: bool = False, infer_dtype: str = "auto", use_kv_cache: bool = True,
                  rope_scaling: str | None = None, model_max_length: int | None = None) -> Path:
    """`tuneline export`: merge `adapter` (if any) into `model` beside `export_dir`, as the pipeline's
    merge stage does, then export the result as its export stage does, through a draft moved into
    place. An older export in `export_dir` is replaced; a folder of other files is refused unless
    `overwrite`, and keeps them even then (`core.store.user_folders`). The weights are written in
    `infer_dtype`, the config's KV cache as `use_kv_cache` says, RoPE scaled by `rope_scaling`."""
    check_user_folder(Path(export_dir), key="export_dir", overwrite=overwrite)  # before the merge's work

    def export_into(draft: Path, model: str) -> None:
        write_export(draft, model=model, template=template, export_size_gb=export_size_gb, infer_dtype=infer_dtype,
                     use_kv_cache=use_kv_cache, rope_scaling=rope_scaling, model_max_length=model_max_length)

    if adapter is None:
        return write_user_folder(export_dir, lambda draft: export_into(draft, model), key="export_dir", overwrite=overwrite)
    export_dir = Path(export_dir)
    merged = export_dir.with_name(f".{export_dir.name}.merged")
    shutil.rmtree(merged, ignore_errors=True)  # our own scratch folder, left by a killed run
    try:
        merge_into(merged, start_model=model, adapter=adapter)
        return write_user_folder(export_dir, lambda draft: export_into(draft, str(merged)), key="export_dir",
                                 overwrite=overwrite)
    finally:
        shutil.rmtree(merged, ignore_errors=True)
