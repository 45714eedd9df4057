"""The tokenize task: a template that renders differently from the tokenizer's own chat template
trains with a warning, which lands in the artifact's manifest and as a tag of the stage's MLflow run,
the run that served the artifact from the cache included."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_template_warning_is_a_tag_of_the_tokenize_runs_and_in_the_manifest(shared_dir: Path, tmp_path: Path):
    from prefect import flow

    from tuneline.core.pipeline.spec import TrainingStage
    from tuneline.core.stages.registry import build_stage_config
    from tuneline.core.store.artifacts import read_manifest
    from tuneline.core.tracking import runs as tracking
    from tuneline.core.tracking.references import TEMPLATE_WARNING_TAG
    from tuneline.tasks.common import RunContext
    from tuneline.tasks.tokenize import tokenize

    config = build_stage_config({"stage": "sft", "dataset": "demo_alpaca", "dataset_dir": str(REPO_ROOT / "data"),
                                 "template": "chatml", "cutoff_len": 64, "max_samples": 4})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment_id = tracking.ensure_experiment(uri, "template-warning", artifact_root=tmp_path / "mlruns")

    @flow
    def tokenize_once():
        with tracking.tracked_run(uri, experiment_id, name="pipeline") as parent:
            context = RunContext(workspace=str(tmp_path), tracking_uri=uri, experiment_id=experiment_id, parent_run_id=parent)
            stage = TrainingStage(name="sft", parent=None, config=config)
            return tokenize(context, stage, key="k1", tokenizer_path=str(shared_dir / "tokenizers/qwen2.5"), inputs={})

    outcome = tokenize_once()
    manifest = read_manifest(Path(outcome.path))  # computed here, so the result itself
    warning = manifest["template_warning"]
    assert warning.startswith("template 'chatml' does not write what this tokenizer's own chat template writes")
    run = tracking.client(uri).get_run(manifest["mlflow_run_id"])
    assert run.data.tags[TEMPLATE_WARNING_TAG] == warning

    again = tokenize_once()  # served from the store: its own run carries the warning from the manifest
    assert again.name == "Cached" and again.result().path == outcome.path
    hits = tracking.client(uri).search_runs([experiment_id], "tags.`tuneline.cache_hit` = 'true'")
    assert len(hits) == 1 and hits[0].info.run_id != run.info.run_id
    assert hits[0].data.tags[TEMPLATE_WARNING_TAG] == warning
