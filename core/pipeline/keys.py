"""What each pipeline stage computes and which inputs decide its key.

One `*_key` function per stage (docs/ARCHITECTURE.md, "Artifacts, keys and runs") and one function that does the work into a given
folder. Both are plain Python: the Prefect tasks only wire them to artifacts and MLflow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneline.core.config import InferenceConfig, StageConfig, trains
from tuneline.core.config.added_tokens import added_tokens
from tuneline.core.data.dataset_info import get_dataset_attrs, load_rows
from tuneline.core.data.sources import dataset_file_paths
from tuneline.core.data.tokenization import dataset_fingerprints, dataset_names, entry_fingerprint, media_datasets, read_rows
from tuneline.core.evaluation.benchmark_plan import benchmark_folders, check_plan
from tuneline.core.models.tiny.text import build_base_model
from tuneline.core.pipeline.spec import BaseStage, EvaluateSettings, ExportSettings, Pipeline, TrainingStage
from tuneline.core.store.fingerprints import stage_key, tree_fingerprint
from tuneline.core.training.optimizers.rules import chosen_optimizers

# Keys that change how a stage runs or reports, never what it produces.
_NOT_OUTPUT = frozenset({
    "output_dir", "overwrite_output_dir", "overwrite_cache", "preprocessing_num_workers", "logging_steps",
    "logging_strategy", "report_to", "plot_loss", "dataloader_num_workers", "disable_tqdm", "run_name",
    "save_steps", "save_strategy", "save_total_limit", "save_only_model", "resume_from_checkpoint",
    "tokenized_path", "export_dir", "do_train", "do_eval", "do_predict",
    "hf_hub_token", "ms_hub_token", "om_hub_token", "hub_token",  # credentials, not settings
})


def output_relevant(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sorted(values.items()) if k not in _NOT_OUTPUT}


@dataclass(frozen=True)
class PipelineFingerprints:
    """The content digest of every dataset a pipeline reads, hashed once per flow run (the
    register_datasets task) and handed to the key functions, which then hash nothing."""

    stages: Mapping[str, Mapping[str, str]]
    """Stage name -> {dataset name: digest} of what it reads (a base stage: its corpus)."""
    heldout: Mapping[str, str]
    """The evaluate section's held-out dataset."""

    def all(self) -> dict[str, str]:
        """By dataset name: what the parent run records as its inputs and lineage tags name."""
        merged: dict[str, str] = {}
        for digests in self.stages.values():
            merged.update(digests)
        return {**merged, **self.heldout}


def pipeline_dataset_fingerprints(pipeline: Pipeline) -> PipelineFingerprints:
    """Hash every dataset any stage of `pipeline` reads, each (folder, entry) once."""
    digests: dict[tuple[str, str], str] = {}

    def digest(names: list[str], dataset_dir: str, token: str | None = None) -> dict[str, str]:
        for attr in get_dataset_attrs(names, dataset_dir):
            if (dataset_dir, attr.name) not in digests:
                digests[dataset_dir, attr.name] = entry_fingerprint(attr, dataset_dir, token=token)
        return {name: digests[dataset_dir, name] for name in names}

    stages = {stage.name: digest(stage_datasets(stage), stage_dataset_dir(stage), stage_hub_token(stage))
              for stage in pipeline.stages}
    heldout: dict[str, str] = {}
    if pipeline.evaluate and pipeline.evaluate.dataset:
        config = pipeline.stage(pipeline.evaluate.stage).config
        heldout = digest([pipeline.evaluate.dataset], config.data.dataset_dir, config.model.hf_hub_token)
    if pipeline.evaluate:
        heldout.update(benchmark_fingerprints(pipeline.evaluate))
    return PipelineFingerprints(stages=stages, heldout=heldout)


def benchmark_fingerprints(settings: EvaluateSettings) -> dict[str, str]:
    """Content digests of the folders the evaluate section's benchmarks and harness tasks read, so that
    changed questions evaluate again."""
    folders = benchmark_folders(settings.benchmark_plan())
    return {name: tree_fingerprint([folder]) for name, folder in folders.items() if folder.exists()}


def check_pipeline_datasets(pipeline: Pipeline) -> None:
    """Every dataset entry the pipeline names exists and its files are there, checked without
    reading them (the flow's register_datasets hashes them, once)."""
    named = [(stage_datasets(stage), stage_dataset_dir(stage), stage_hub_token(stage)) for stage in pipeline.stages]
    if pipeline.evaluate and pipeline.evaluate.dataset:
        config = pipeline.stage(pipeline.evaluate.stage).config
        named.append(([pipeline.evaluate.dataset], config.data.dataset_dir, config.model.hf_hub_token))
    for names, dataset_dir, token in named:
        for attr in get_dataset_attrs(names, dataset_dir):
            dataset_file_paths(attr, dataset_dir, token=token)
    if pipeline.evaluate:
        check_plan(pipeline.evaluate.benchmark_plan(), source=pipeline.source)


def stage_datasets(stage: BaseStage | TrainingStage) -> list[str]:
    if isinstance(stage, BaseStage):
        return list(stage.corpus)
    return dataset_names(stage.config.data.dataset) + dataset_names(stage.config.data.eval_dataset)


def stage_dataset_dir(stage: BaseStage | TrainingStage) -> str:
    return stage.dataset_dir if isinstance(stage, BaseStage) else stage.config.data.dataset_dir


def stage_hub_token(stage: BaseStage | TrainingStage) -> str | None:
    """The stage's `hf_hub_token` for its hub datasets (a base stage reads the project's own corpus)."""
    return None if isinstance(stage, BaseStage) else stage.config.model.hf_hub_token


# -- build_base --------------------------------------------------------------------------------

def base_key(stage: BaseStage, *, fingerprints: Mapping[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """Decided by the build settings and the corpus; `fingerprints` (the run's digests of the
    corpus) saves hashing it again."""
    if fingerprints is None:
        attrs = get_dataset_attrs(stage.corpus, stage.dataset_dir)
        fingerprints = {a.name: entry_fingerprint(a, stage.dataset_dir) for a in attrs}
    inputs = dict(fingerprints)
    config = {**dataclasses.asdict(stage.build), "corpus": list(stage.corpus)}
    return stage_key("base", config=config, inputs=inputs), inputs


def run_build_base(stage: BaseStage, output_dir: Path) -> dict[str, int]:
    texts = []
    for attr in get_dataset_attrs(stage.corpus, stage.dataset_dir):
        for row in load_rows(attr, stage.dataset_dir):
            texts.extend(m["content"] for m in [*row["prompt"], *row["response"]])
    return build_base_model(texts, output_dir, config=stage.build)


# -- tokenize ----------------------------------------------------------------------------------

def tokenize_key(
    stage: TrainingStage, *, tokenizer_key: str, fingerprints: Mapping[str, str] | None = None
) -> tuple[str, dict[str, str]]:
    """Decided by the data settings, the stage kind, the split seed, the tokenizer, how it splits
    special tokens and the tokens added to it (the tokens and descriptions a
    new_special_tokens_config file holds, not its path), and the data; `fingerprints` (the run's
    digests of the stage's datasets) saves hashing them again."""
    config = stage.config
    tokens = added_tokens(config.model)
    relevant = {
        **dataclasses.asdict(config.data),
        "stage": config.finetuning.stage,
        "seed": config.training.get("seed", 42),
        "use_fast_tokenizer": config.model.use_fast_tokenizer,
        "split_special_tokens": config.model.split_special_tokens,
        "added_tokens": {"plain": list(tokens.plain), "special": list(tokens.special), "descriptions": dict(tokens.descriptions)},
    }
    if media_datasets(config):
        relevant["media"] = dataclasses.asdict(config.media)  # the sizes and the frame rate decide how many tokens a medium takes
    else:  # the datasets' digests stand for their files wherever the folder is (a worker reads a copy of it)
        del relevant["dataset_dir"]
    if config.training.get("do_predict") and not trains(config.training):
        relevant["prediction_prompts"] = True  # prompts alone are encoded, apart from training examples
    inputs = dict(fingerprints) if fingerprints is not None else dataset_fingerprints(config)
    return stage_key("tokenize", config=output_relevant(relevant), upstream={"tokenizer": tokenizer_key}, inputs=inputs), inputs


# -- train -------------------------------------------------------------------------------------

def train_key(stage: TrainingStage, *, tokenized_key: str, parent_key: str, reference_keys: Mapping[str, str] | None = None) -> str:
    """Decided by the output-relevant settings, the data, the starting model and, for `ref_model` or
    `reward_model` naming a stage, that stage's model key (so changing the reference retrains)."""
    config = stage.config
    relevant = {
        **dataclasses.asdict(config.finetuning),
        **dataclasses.asdict(config.model),
        **dataclasses.asdict(config.generating),  # ppo samples with them; do_predict answers with them
        **config.training,
    }
    if chosen_optimizers(config.optimizer):  # the optimizer keys change nothing unless one is chosen
        relevant.update(dataclasses.asdict(config.optimizer))
    relevant.pop("model_name_or_path", None)  # the parent key stands for the starting weights
    # the data keys the worker reads, keyed only when set, so that other stages keep their keys
    if config.data.eval_num_beams is not None:
        relevant["eval_num_beams"] = config.data.eval_num_beams
    if not config.data.ignore_pad_token_for_loss:
        relevant["ignore_pad_token_for_loss"] = False
    for key in stage.references:
        relevant.pop(key, None)  # the referenced stage's key stands for it
    missing = set(stage.references) - set(reference_keys or {})
    if missing:
        raise ValueError(f"stage '{stage.name}': no key given for {', '.join(sorted(missing))}")
    upstream = {"data": tokenized_key, "model": parent_key, **(reference_keys or {})}
    return stage_key(stage.name, config=output_relevant(relevant), upstream=upstream)


# -- evaluate ----------------------------------------------------------------------------------

def evaluate_key(settings: EvaluateSettings, *, stage_key_: str, baseline_key: str | None, tokenized_key: str,
                 inputs: Mapping[str, str]) -> str:
    upstream = {"stage": stage_key_, "data": tokenized_key, **({"baseline": baseline_key} if baseline_key else {})}
    return stage_key("evaluate", config=dataclasses.asdict(settings), upstream=upstream, inputs=inputs)


def heldout_rows(settings: EvaluateSettings, config: StageConfig) -> list[dict[str, Any]]:
    rows = read_rows([settings.dataset], config) if settings.dataset else []
    return rows[: settings.max_samples] if settings.max_samples else rows


def heldout_fingerprints(settings: EvaluateSettings, config: StageConfig) -> dict[str, str]:
    if not settings.dataset:
        return {}
    attrs = get_dataset_attrs([settings.dataset], config.data.dataset_dir)
    return {a.name: entry_fingerprint(a, config.data.dataset_dir, token=config.model.hf_hub_token) for a in attrs}


# -- merge and export --------------------------------------------------------------------------

def merge_key(*, trained_key: str) -> str:
    return stage_key("merge", config={}, upstream={"trained": trained_key})


def export_key(settings: ExportSettings, *, model_key: str, template: str, inference: InferenceConfig) -> str:
    return stage_key("export", config={"export_size": settings.export_size, "template": template,
                                       "infer_dtype": inference.infer_dtype, "use_kv_cache": inference.use_kv_cache,
                                       "parity_probes": settings.parity_probes},
                     upstream={"model": model_key})
