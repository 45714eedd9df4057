"""A pipeline on a work pool carries the dataset files its stages read to the workers through the store,
and a worker keys each stage as the launching machine did from its own copy of them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tuneline.core.config import parse_overrides
from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.keys import pipeline_dataset_fingerprints
from tuneline.core.pipeline.references import ExternalModel, StageStore
from tuneline.core.pipeline.shipped_datasets import DATASETS_KIND, ship_datasets, with_dataset_dirs
from tuneline.core.pipeline.spec import build_pipeline
from tuneline.core.pipeline.stage_runs import TOKENIZED_KIND
from tuneline.core.pipeline.stage_unit import unit_key
from tuneline.core.pipeline.unit_plan import UnitAddress, build_unit, rebuild_sent_unit

DATA = Path(__file__).resolve().parents[3] / "data"
TOKENIZER = ExternalModel(key="external-tokenizer", path="unused")  # keys name it; nothing reads it


def fork(dataset_dir: Path, *, pool: str | None = "gpu", sft_data: str = "demo_alpaca"):
    stages = [{"name": "base", "stage": "build_base", "corpus": "demo_pretrain"},
              {"name": "sft", "stage": "sft", "from": "base", "dataset": sft_data, "template": "default"}]
    return build_pipeline({"name": "p", "stages": stages, "defaults": {"dataset_dir": str(dataset_dir)},
                           **({"work_pool": pool} if pool else {})}, overrides=parse_overrides([]))


def tokenize_key(pipeline) -> str:
    unit = build_unit(pipeline, pipeline_dataset_fingerprints(pipeline), UnitAddress(TOKENIZED_KIND, "sft"))
    return unit_key(unit, {"tokenizer": TOKENIZER})


def test_the_read_files_are_shipped_once_and_a_worker_keys_its_copy_as_the_launcher_did(tmp_path: Path):
    launch_data = tmp_path / "launch" / "data"
    shutil.copytree(DATA, launch_data, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    pipeline = fork(launch_data)
    launcher = StageStore(tmp_path / "workspace")
    shipped = ship_datasets(pipeline, launcher)
    assert list(shipped) == [str(launch_data)]
    folder = launcher.root / "artifacts" / DATASETS_KIND / shipped[str(launch_data)]
    assert sorted(p.name for p in folder.iterdir()) == ["dataset_info.json", "demo_alpaca.json", "demo_pretrain.jsonl", "manifest.json"]
    assert ship_datasets(pipeline, launcher) == shipped  # the same files: the same artifact, not written again
    launcher_key, fingerprints = tokenize_key(pipeline), pipeline_dataset_fingerprints(pipeline)

    shutil.rmtree(launch_data)  # the worker has no such folder
    on_worker = with_dataset_dirs(pipeline, shipped, launcher)
    assert on_worker.stage("sft").config.data.dataset_dir == str(folder)
    assert on_worker.stage("base").dataset_dir == str(folder)
    assert tokenize_key(on_worker) == launcher_key
    sent = dict(key=launcher_key, datasets=shipped, workspace=str(launcher.root), machine="worker-2")
    address = UnitAddress(TOKENIZED_KIND, "sft")
    rebuilt = rebuild_sent_unit(pipeline, fingerprints, address, {"tokenizer": TOKENIZER}, **sent)
    assert rebuilt.stage.config.data.dataset_dir == str(folder)
    refusal = r"sft/tokenize: worker-2 keys the stage tokenize-\w+, the pipeline that sent it 0+: the two machines run different"
    with pytest.raises(ConfigError, match=refusal):
        rebuild_sent_unit(pipeline, fingerprints, address, {"tokenizer": TOKENIZER}, **{**sent, "key": "0" * 16})


def test_changed_files_are_shipped_under_another_key(tmp_path: Path):
    data = tmp_path / "data"
    shutil.copytree(DATA, data, ignore=shutil.ignore_patterns("*.py", "__pycache__", "*_demo"))
    store = StageStore(tmp_path / "workspace")
    before = ship_datasets(fork(data), store)[str(data)]
    with (data / "demo_alpaca.json").open("a") as handle:
        handle.write("\n")
    assert ship_datasets(fork(data), store)[str(data)] != before


def test_a_pipeline_without_a_pool_ships_nothing_and_media_on_a_pool_are_refused_by_name(tmp_path: Path):
    assert ship_datasets(fork(DATA, pool=None), StageStore(tmp_path)) == {}
    pictures = build_pipeline({"name": "p", "work_pool": "gpu", "stages": [
        {"name": "sft", "stage": "sft", "model_name_or_path": "m", "dataset": "picture_questions", "template": "qwen2_vl",
         "dataset_dir": str(DATA / "picture_demo")}]}, overrides={})
    with pytest.raises(ConfigError, match=r"stage 'sft' runs on work pool 'gpu' and reads the media dataset\(s\) picture_questions"):
        ship_datasets(pictures, StageStore(tmp_path))
