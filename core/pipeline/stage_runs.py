"""The jobs that `tuneline train`, `data preview` and `export` share with the pipeline's tasks.

One builder of a stage's TrainJob, one tokenized-data step with its cache, one merge and export
path. The Prefect tasks (`tasks/`) and the commands without Prefect (`flows/single.py`) both call
these, so a setting means the same in both and their artifacts are alike.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneline.core.config import DataConfig, ExportConfig, ModelConfig, StageConfig
from tuneline.core.data.tokenization import DEFAULT_TEMPLATE, TEMPLATE_WARNING_FILE, prepare_tokenizer, stage_template
from tuneline.core.evaluation.export_parity import PROBE_COUNT, check_export
from tuneline.core.models.export import merge_adapter, write_hf_folder
from tuneline.core.models.hub_push import push_export
from tuneline.core.pipeline.keys import tokenize_key
from tuneline.core.pipeline.spec import TrainingStage
from tuneline.core.stages.registry import tokenize_stage_data
from tuneline.core.store.artifacts import Artifact, ArtifactDraft, find_artifact, write_artifact
from tuneline.core.store.cache import Damage, serve_or_compute
from tuneline.core.store.recency import note_use
from tuneline.core.store.user_folders import WRITTEN_RECORD, check_user_folder, write_user_folder, written_entries
from tuneline.core.training.job import TrainJob

_LOG = logging.getLogger(__name__)
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
                "new_special_tokens_config", "default_system", "tool_format", "enable_thinking", "preserve_thinking",
                "eval_on_each_dataset")


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
        data=dataclasses.asdict(config.data),
        optimizer=dataclasses.asdict(config.optimizer),
        runtime=dataclasses.asdict(config.runtime),
        tracking_uri=tracking_uri,
        run_id=run_id,
        keep_checkpoints=keep_checkpoints,
        overwrite_output_dir=overwrite_output_dir,
        model_max_length=config.data.cutoff_len,
        ray=dataclasses.asdict(config.ray),
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
    reading: ExitStack | None = None,
) -> Artifact:
    """The stage's tokenized data in the artifact store `store`, tokenized unless it is there
    sound (then noted as used, for `tuneline gc`, and passed to `on_hit`); the same key, work and
    manifest as the pipeline's tokenize stage, without MLflow. With `reading`, gc keeps the artifact
    until that stack closes (`core.store.readers`)."""
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

    return serve_or_compute(store, TOKENIZED_KIND, key, serve=serve, compute=compute, on_damaged=on_damaged,
                            reading=reading)


# -- merge and export --------------------------------------------------------------------------

def export_template(config: StageConfig | None) -> str:
    """The chat template an export's generation config stops on: the stage's, else the default."""
    return (config.data.template if config is not None else None) or DEFAULT_TEMPLATE


def merge_into(output_dir: str | Path, *, start_model: str, adapter: str, model_config: ModelConfig | None = None,
               model_max_length: int | None = None) -> dict[str, int]:
    """Fold a LoRA adapter into the model it was trained from, written to `output_dir` (see `merge_adapter`)."""
    return merge_adapter(start_model, adapter, output_dir, model_config=model_config, model_max_length=model_max_length)


@dataclass(frozen=True)
class ParitySource:
    """What the export's train/serve parity gate compares with (`core.evaluation.export_parity`): the
    stage's config (its probe rows and template keys; None for a model no stage trained), the folder
    of the tokenizer training prepared, and (base model, adapter) when the export merged an adapter."""

    config: StageConfig | None
    tokenizer_path: str
    adapter: tuple[str, str] | None = None
    probes: int = PROBE_COUNT


@dataclass(frozen=True)
class ExportReport:
    """What an export checked (the parity gate's metrics) and, when the folder has no Ollama
    Modelfile, why Ollama cannot express its template (None when the Modelfile was written)."""

    metrics: dict[str, float]
    modelfile_obstacle: str | None = None


def write_export(output_dir: str | Path, *, model: str, template: str, export_size_gb: int,
                 export: ExportConfig | None = None, model_config: ModelConfig | None = None, infer_dtype: str = "auto",
                 use_kv_cache: bool = True, model_max_length: int | None = None,
                 parity: ParitySource | None = None) -> ExportReport:
    """A standalone Hugging Face folder of the full-weight `model` in `output_dir` (GPTQ-quantized
    when `export` asks; see `write_hf_folder` for the other settings) with LLaMA-Factory's Ollama
    Modelfile (`write_modelfile`), then the parity gate on it (`parity.probes: 0` skips it; a
    quantized export's answers are not compared, its weights differ by design)."""
    write_hf_folder(model, output_dir, template=template, export_size_gb=export_size_gb, export=export,
                    model_config=model_config, infer_dtype=infer_dtype, use_kv_cache=use_kv_cache,
                    model_max_length=model_max_length)
    obstacle = write_modelfile(output_dir, template=template, config=parity.config if parity is not None else None)
    if parity is None or parity.probes <= 0:
        return ExportReport({}, obstacle)
    tokenizer, trained_template = training_tokenizer(parity.config, parity.tokenizer_path, template=template)
    quantized = export is not None and export.export_quantization_bit is not None
    report = check_export(output_dir, config=parity.config, template=trained_template, trained_tokenizer=tokenizer,
                          adapter=None if quantized else parity.adapter, count=parity.probes)
    if report.warning:
        _LOG.warning("%s", report.warning)
    return ExportReport(report.metrics(), obstacle)


def write_modelfile(folder: str | Path, *, template: str, config: StageConfig | None) -> str | None:
    """The Ollama Modelfile LLaMA-Factory's export writes, in `folder` (`core.templates.ollama`): the
    template `template` with the stage's template keys (`config`; None: the template as registered),
    over the exported tokenizer fixed for it. When Ollama cannot express the template, no file: the
    reason is logged as one line and returned."""
    from tuneline.core.models.loading import load_tokenizer
    from tuneline.core.templates.conversation import fix_tokenizer, get_template
    from tuneline.core.templates.ollama import MODELFILE, ollama_modelfile, ollama_obstacle

    tokenizer = load_tokenizer(folder)
    named = get_template(template, tokenizer=tokenizer)
    if config is not None:
        named = stage_template(config, tokenizer, named=named)
    obstacle = ollama_obstacle(named)
    if obstacle is not None:
        _LOG.warning("No Ollama Modelfile in the export: %s.", obstacle)
        return obstacle
    fix_tokenizer(named, tokenizer)  # the copy loaded here; the folder's tokenizer was saved as training fixed it
    (Path(folder) / MODELFILE).write_text(ollama_modelfile(named, tokenizer), encoding="utf-8", newline="")
    return None


def training_tokenizer(config: StageConfig | None, tokenizer_path: str, *, template: str) -> tuple[Any, Any]:
    """The tokenizer and template as training prepared them from `tokenizer_path` (the stage's own
    preparation; for no stage, `template` fixed onto the folder's tokenizer)."""
    if config is not None:
        prepared = prepare_tokenizer(config, tokenizer_path)
        return prepared.tokenizer, prepared.template
    from tuneline.core.models.loading import load_tokenizer
    from tuneline.core.templates.conversation import fix_tokenizer, get_template

    tokenizer = load_tokenizer(tokenizer_path)
    named = get_template(template, tokenizer=tokenizer)
    fix_tokenizer(named, tokenizer)
    return tokenizer, named


def hub_loading(model: ModelConfig) -> ModelConfig:
    """Only the settings that say where a model folder comes from (hub token, revision, cache, remote
    code), for loading the model an export starts from; nothing that changes how it loads."""
    return ModelConfig(hf_hub_token=model.hf_hub_token, model_revision=model.model_revision, cache_dir=model.cache_dir,
                       trust_remote_code=model.trust_remote_code, allow_pickle_weights=model.allow_pickle_weights)


def export_folder(config: StageConfig) -> Path:
    """`tuneline export`: merge `adapter_name_or_path` (if any) into `model_name_or_path` beside
    `export_dir`, as the pipeline's merge stage does, then export the result as its export stage
    does (GPTQ-quantized with `export_quantization_bit`), through a draft moved into place, and
    push it to `export_hub_model_id` when set. An older export in `export_dir` is replaced; a
    folder of other files is refused unless `overwrite_output_dir`, and keeps them even then
    (`core.store.user_folders`)."""
    assert config.model.model_name_or_path is not None and config.export.export_dir is not None  # required by the command
    export_dir, overwrite = Path(config.export.export_dir), config.output.overwrite_output_dir
    check_user_folder(export_dir, key="export_dir", overwrite=overwrite)  # before the merge's work
    loading = hub_loading(config.model)

    adapter = config.model.adapter_name_or_path or None
    if adapter and config.model.adapter_folder:  # the adapter's files sit in that subfolder of it
        adapter = str(Path(adapter) / config.model.adapter_folder)
    parity = ParitySource(config, tokenizer_path=adapter or config.model.model_name_or_path,
                          adapter=(config.model.model_name_or_path, adapter) if adapter else None)

    def export_into(model: str) -> Path:
        return write_user_folder(export_dir, lambda draft: write_export(
            draft, model=model, template=export_template(config), export_size_gb=config.export.export_size,
            export=config.export, model_config=dataclasses.replace(loading, rope_scaling=config.model.rope_scaling),
            infer_dtype=config.inference.infer_dtype, use_kv_cache=config.inference.use_kv_cache,
            model_max_length=export_length(config), parity=parity), key="export_dir", overwrite=overwrite)

    if not adapter:
        folder = export_into(config.model.model_name_or_path)
    else:
        merged = export_dir.with_name(f".{export_dir.name}.merged")
        shutil.rmtree(merged, ignore_errors=True)  # our own scratch folder, left by a killed run
        try:
            merge_into(merged, start_model=config.model.model_name_or_path, adapter=adapter, model_config=loading)
            folder = export_into(str(merged))
        finally:
            shutil.rmtree(merged, ignore_errors=True)
    if config.export.export_hub_model_id:  # after the folder is complete: a failed push loses no work
        push_export(folder, entries=sorted(written_entries(folder) - {WRITTEN_RECORD}), repo_id=config.export.export_hub_model_id,
                    token=config.model.hf_hub_token)
    return folder


def export_length(config: StageConfig) -> int | None:
    """The length an export's RoPE is scaled to, as LLaMA-Factory's export takes it: a `cutoff_len`
    set away from its default when merging on the CPU, otherwise none (RoPE scaled by 2)."""
    cutoff = config.data.cutoff_len
    return cutoff if config.export.export_device == "cpu" and cutoff != DataConfig.cutoff_len else None
