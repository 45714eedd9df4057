"""The tokenize unit in its Prefect task: a template that renders differently from the tokenizer's own chat template
trains with a warning, which lands in the artifact's manifest and as a tag of the stage's MLflow run,
the run that served the artifact from the cache included."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_template_warning_is_a_tag_of_the_tokenize_runs_and_in_the_manifest(shared_dir: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch):
    from prefect import flow

    from tuneline.core.pipeline.references import ExternalModel
    from tuneline.core.pipeline.spec import TrainingStage
    from tuneline.core.pipeline.stage_unit import WORKER_TAG, RunContext
    from tuneline.core.pipeline.units import TokenizeUnit
    from tuneline.core.stages.registry import build_stage_config
    from tuneline.core.store.artifacts import read_manifest
    from tuneline.core.tracking import runs as tracking
    from tuneline.core.tracking.references import TEMPLATE_WARNING_TAG
    from tuneline.tasks.stage import task_for

    monkeypatch.setenv("TUNELINE_WORKER", "tokenizing-host")
    config = build_stage_config({"stage": "sft", "dataset": "demo_alpaca", "dataset_dir": str(REPO_ROOT / "data"),
                                 "template": "chatml", "cutoff_len": 64, "max_samples": 4})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment_id = tracking.ensure_experiment(uri, "template-warning", artifact_root=tmp_path / "mlruns")

    @flow
    def tokenize_once():
        with tracking.tracked_run(uri, experiment_id, name="pipeline") as parent:
            context = RunContext(workspace=str(tmp_path), tracking_uri=uri, experiment_id=experiment_id, parent_run_id=parent)
            unit = TokenizeUnit(TrainingStage(name="sft", parent=None, config=config), fingerprints={})
            tokenizer = ExternalModel(key="qwen2.5", path=str(shared_dir / "tokenizers/qwen2.5"))
            return task_for(unit)(context, unit, {"tokenizer": tokenizer})

    outcome = tokenize_once()  # computed here, so the reference itself
    assert outcome.kind == "tokenized" and not outcome.cache_hit
    folder = tmp_path / "artifacts" / outcome.kind / outcome.key
    manifest = read_manifest(folder)
    warning = manifest["template_warning"]
    assert warning.startswith("template 'chatml' does not write what this tokenizer's own chat template writes")
    run = tracking.client(uri).get_run(manifest["mlflow_run_id"])
    assert run.data.tags[TEMPLATE_WARNING_TAG] == warning
    assert run.data.tags[WORKER_TAG] == "tokenizing-host"  # $TUNELINE_WORKER names the machine

    again = tokenize_once()  # served from the store: its own run carries the warning from the manifest
    assert again.name == "Cached" and again.result().key == outcome.key and again.result().cache_hit
    hits = tracking.client(uri).search_runs([experiment_id], "tags.`tuneline.cache_hit` = 'true'")
    assert len(hits) == 1 and hits[0].info.run_id != run.info.run_id
    assert hits[0].data.tags[TEMPLATE_WARNING_TAG] == warning
