"""The keys `tuneline gc` keeps: each pipeline's last N runs' stage keys and every registered
version's lineage, read from a real MLflow store on SQLite; and `tracked_run`'s end states."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tuneline.core.tracking import runs as tracking
from tuneline.core.tracking.references import referenced_keys


def pipeline_run(uri: str, experiment_id: str, stage_keys: list[str]) -> str:
    with tracking.tracked_run(uri, experiment_id, name="run", tags={"tuneline.pipeline": "p"}) as parent:
        for key in stage_keys:
            with tracking.tracked_run(uri, experiment_id, name=key, parent_run_id=parent, tags={"tuneline.key": key}):
                pass
    time.sleep(0.01)  # distinct start times order the runs
    return parent


def test_recent_runs_and_registered_lineage_are_referenced(tmp_path: Path):
    uri = tracking.tracking_uri(tmp_path)
    first = tracking.ensure_experiment(uri, "p", artifact_root=tmp_path / "mlartifacts")
    other = tracking.ensure_experiment(uri, "q", artifact_root=tmp_path / "mlartifacts")
    register_run = pipeline_run(uri, first, ["base-1", "sft-1", "export-1"])
    pipeline_run(uri, first, ["base-1", "sft-2"])
    pipeline_run(uri, first, ["base-1", "sft-3"])
    pipeline_run(uri, other, ["base-9"])  # another pipeline's runs are counted apart
    tracking.register_model_version(uri, name="m", run_id=register_run, artifact_path="model", alias=None,
                                    tags={"tuneline.key.sft": "sft-1", "tuneline.export_key": "export-1", "tuneline.version": "0"})

    assert referenced_keys(uri, keep_runs=2) == {"base-1", "sft-2", "sft-3", "base-9", "sft-1", "export-1"}
    assert referenced_keys(uri, keep_runs=0) == {"sft-1", "export-1"}  # the registry alone


def test_tracked_run_ends_finished_or_failed(tmp_path: Path):
    uri = tracking.tracking_uri(tmp_path)
    experiment = tracking.ensure_experiment(uri, "e")
    with tracking.tracked_run(uri, experiment, name="ok") as ok:
        assert tracking.client(uri).get_run(ok).info.status == "RUNNING"
    with pytest.raises(KeyError):
        with tracking.tracked_run(uri, experiment, name="bad") as bad:
            raise KeyError("x")
    assert tracking.client(uri).get_run(ok).info.status == "FINISHED"
    assert tracking.client(uri).get_run(bad).info.status == "FAILED"
