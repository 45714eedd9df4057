"""A pipeline's local datasets, carried to the workers of its work pools through the store.

A worker shares no folder with the machine that launched the pipeline, so the `dataset_dir` a
stage names there means nothing on it. Before the first stage is sent to a pool, the launching
machine publishes, for each `dataset_dir` its stages read, one artifact of kind `datasets` holding
that folder's `dataset_info.json` and the files of the entries the pipeline reads (their places
below the folder kept), keyed by their content: the same files are uploaded once, whichever
pipeline ships them. A worker fetches that artifact into its cache (verified like any other) and
reads the stage's datasets from there (`with_dataset_dirs`). Stage keys hold the datasets' content
digests, not the folder's path, so the worker keys each stage as the launching machine did.

What is not shipped, and so refused on a pool by name: media files (images, videos, sounds) that
rows name, and the evaluate section's benchmark folders. Hub datasets are read from each machine's
own Hugging Face cache, as on one machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import tempfile
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path

from tuneline.core.data.dataset_info import get_dataset_attrs
from tuneline.core.data.sources import dataset_file_paths
from tuneline.core.data.tokenization import media_datasets
from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.keys import stage_dataset_dir, stage_datasets
from tuneline.core.pipeline.references import ArtifactRef, StageStore
from tuneline.core.pipeline.spec import BaseStage, Pipeline, TrainingStage
from tuneline.core.store.artifacts import find_artifact, write_artifact
from tuneline.core.store.fingerprints import file_fingerprint

DATASETS_KIND = "datasets"
DATASET_INFO = "dataset_info.json"  # the folder's index of its datasets


def on_a_pool(pipeline: Pipeline) -> bool:
    """Whether some stage runs away from the launching machine (a work pool's worker, a Ray node)."""
    return any(stage.placement.elsewhere for stage in pipeline.stages)


def ship_datasets(pipeline: Pipeline, store: StageStore) -> dict[str, str]:
    """Publish the local dataset files every pool stage of `pipeline` reads; by `dataset_dir` as the
    pipeline names it, the key of the `datasets` artifact that holds them."""
    shipped = {}
    for dataset_dir, files in _pool_dataset_files(pipeline).items():
        key = _content_key(dataset_dir, files)
        store.serve_or_compute(DATASETS_KIND, key, serve=lambda artifact: None,
                               compute=lambda damage, folder=dataset_dir, files=files, key=key: _publish(store, folder, files, key),
                               on_wait=lambda: None, on_damaged=lambda damage: None)
        shipped[dataset_dir] = key
    return shipped


def with_dataset_dirs(pipeline: Pipeline, shipped: Mapping[str, str], store: StageStore) -> Pipeline:
    """`pipeline` reading each shipped `dataset_dir` from this machine's verified copy of its files."""
    local: dict[str, str] = {}
    for dataset_dir, key in shipped.items():
        artifact = store.find(DATASETS_KIND, key)
        if artifact is None:
            raise ConfigError(f"the datasets of folder {dataset_dir} were shipped as {DATASETS_KIND}/{key}, which the "
                              f"workspace {store.place(ArtifactRef(name=key, kind=DATASETS_KIND, key=key))} does not hold "
                              "(removed by `tuneline gc`?); run the pipeline again to ship them again.")
        local[dataset_dir] = str(store.folder(ArtifactRef.from_artifact(artifact, name=DATASETS_KIND, cache_hit=True)))

    def moved(stage: BaseStage | TrainingStage) -> BaseStage | TrainingStage:
        if isinstance(stage, BaseStage):
            return dataclasses.replace(stage, dataset_dir=local.get(stage.dataset_dir, stage.dataset_dir))
        data = stage.config.data
        return dataclasses.replace(stage, config=dataclasses.replace(
            stage.config, data=dataclasses.replace(data, dataset_dir=local.get(data.dataset_dir, data.dataset_dir))))

    return dataclasses.replace(pipeline, stages=tuple(moved(stage) for stage in pipeline.stages))


def _pool_dataset_files(pipeline: Pipeline) -> dict[str, list[Path]]:
    """By `dataset_dir`: the local files the pool stages (and an evaluate section on a pool) read."""
    wanted: dict[str, set[str]] = {}
    for stage in pipeline.stages:
        if stage.placement.elsewhere is None:
            continue
        if isinstance(stage, TrainingStage) and (media := media_datasets(stage.config)):
            raise ConfigError(f"stage '{stage.name}' runs on {stage.placement.elsewhere} and reads the media "
                              f"dataset(s) {', '.join(media)}: a pipeline on a pool carries its dataset files to the "
                              "workers through the store, but not yet the images, videos or sounds their rows name. "
                              f"Run stage '{stage.name}' in the pipeline's own process (no work_pool for it).")
        wanted.setdefault(stage_dataset_dir(stage), set()).update(stage_datasets(stage))
    if pipeline.evaluate and pipeline.stage(pipeline.evaluate.stage).placement.elsewhere:
        evaluated = pipeline.stage(pipeline.evaluate.stage)
        if pipeline.evaluate.benchmarks or pipeline.evaluate.harness_tasks:
            raise ConfigError(f"the evaluate section scores stage '{evaluated.name}' on a work pool with benchmarks or harness "
                              "tasks, whose folders are not carried to the workers; leave them out there, or run that "
                              "stage without work_pool.")
        if pipeline.evaluate.dataset:
            wanted.setdefault(stage_dataset_dir(evaluated), set()).add(pipeline.evaluate.dataset)
    return {folder: _local_files(folder, sorted(names)) for folder, names in wanted.items()}


def _local_files(dataset_dir: str, names: list[str]) -> list[Path]:
    root = Path(dataset_dir).resolve()
    files = {root / DATASET_INFO} if (root / DATASET_INFO).is_file() else set()
    for attr in get_dataset_attrs(names, dataset_dir):
        if attr.load_from == "hf_hub":
            continue  # each machine reads its own hub cache
        for path in dataset_file_paths(attr, dataset_dir):
            path = Path(path).resolve()
            if not path.is_relative_to(root):
                raise ConfigError(f"dataset '{attr.name}' reads {path}, outside its dataset_dir {dataset_dir}; a pipeline "
                                  "on a work pool carries a dataset's files below their folder to the workers: move the "
                                  "file into the folder and name it relative to it in dataset_info.json.")
            files.add(path)
    return sorted(files)


def _content_key(dataset_dir: str, files: list[Path]) -> str:
    root = Path(dataset_dir).resolve()
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(root).as_posix()}\0{file_fingerprint(path)['sha256']}\n".encode())
    return f"datasets-{digest.hexdigest()[:20]}"


def _publish(store: StageStore, dataset_dir: str, files: list[Path], key: str) -> None:
    source = Path(dataset_dir).resolve()
    with ExitStack() as scratch:
        # uploaded from a scratch folder: the launching machine's cache keeps no copy of its own data
        root = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="tuneline-datasets-"))) if store.is_cache else store.root
        with write_artifact(root, DATASETS_KIND, key, config={"files": len(files)}) as draft:
            for path in files:
                target = draft.path / path.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
        artifact = find_artifact(root, DATASETS_KIND, key)
        assert artifact is not None  # just written, under the key's lock
        store.publish(artifact)
