"""The one door from `core/` to MLflow (DESIGN.md §5).

Runs are addressed by id through `MlflowClient`, never through MLflow's global "active run", so a
flow, its tasks and a training worker in another process can all log to the same run. The store
defaults to `sqlite:///<workspace>/mlflow.db` with artifacts beside it; `MLFLOW_TRACKING_URI`
points everything at a server instead.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlflow import MlflowClient

RUN_ID_ENV = "TUNELINE_MLFLOW_RUN_ID"
PARENT_TAG = "mlflow.parentRunId"
_MAX_PARAM_CHARS = 6000
_BATCH = 100


def tracking_uri(workspace: str | Path) -> str:
    """The tracking URI for a workspace: the environment's if set, else the workspace's SQLite file."""
    from_env = os.environ.get("MLFLOW_TRACKING_URI")
    if from_env:
        return from_env
    return f"sqlite:///{(Path(workspace) / 'mlflow.db').resolve()}"


@cache
def client(uri: str) -> MlflowClient:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def ensure_experiment(uri: str, name: str, *, artifact_root: Path | None = None) -> str:
    """Id of the experiment `name`, created (artifacts under `artifact_root`) if missing."""
    mlflow_client = client(uri)
    experiment = mlflow_client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = artifact_root.resolve().as_uri() if artifact_root and uri.startswith("sqlite") else None
    try:
        return mlflow_client.create_experiment(name, artifact_location=location)
    except Exception:  # created meanwhile by a concurrent run
        experiment = mlflow_client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def start_run(
    uri: str,
    experiment_id: str,
    *,
    name: str,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> str:
    all_tags = dict(tags or {})
    if parent_run_id:
        all_tags[PARENT_TAG] = parent_run_id
    run = client(uri).create_run(experiment_id, run_name=name, tags=all_tags)
    return run.info.run_id


def end_run(uri: str, run_id: str, *, failed: bool = False) -> None:
    client(uri).set_terminated(run_id, status="FAILED" if failed else "FINISHED")


def end_abandoned_run(uri: str, run_id: str, *, status: str = "KILLED") -> bool:
    """End with `status` a run that a killed process left RUNNING, and its parent run if that is still
    RUNNING too (the same process held it). False when the run had ended or is not in this store
    (a workspace moved, a store replaced)."""
    from mlflow.exceptions import MlflowException

    try:
        run = client(uri).get_run(run_id)
    except MlflowException:
        return False
    if run.info.status != "RUNNING":
        return False
    client(uri).set_terminated(run_id, status=status)
    parent = run.data.tags.get(PARENT_TAG)
    if parent and client(uri).get_run(parent).info.status == "RUNNING":
        client(uri).set_terminated(parent, status=status)
    return True


def log_params(uri: str, run_id: str, params: Mapping[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k, _param_text(v)) for k, v in sorted(params.items())]
    for start in range(0, len(items), _BATCH):
        client(uri).log_batch(run_id, params=items[start : start + _BATCH])


def log_metrics(uri: str, run_id: str, metrics: Mapping[str, float], *, step: int | None = None) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(k, float(v), now, step or 0) for k, v in sorted(metrics.items()) if _is_number(v)]
    for start in range(0, len(items), _BATCH):
        client(uri).log_batch(run_id, metrics=items[start : start + _BATCH])


def set_tags(uri: str, run_id: str, tags: Mapping[str, Any]) -> None:
    from mlflow.entities import RunTag

    client(uri).log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def log_artifact(uri: str, run_id: str, path: str | Path, *, artifact_path: str | None = None) -> None:
    path = Path(path)
    if path.is_dir():
        client(uri).log_artifacts(run_id, str(path), artifact_path=artifact_path)
    else:
        client(uri).log_artifact(run_id, str(path), artifact_path=artifact_path)


def log_dict(uri: str, run_id: str, values: Mapping[str, Any], name: str) -> None:
    """Store `values` as a JSON artifact `name` of the run (the resolved stage config)."""
    client(uri).log_dict(run_id, json.loads(json.dumps(values, default=str)), name)


def log_dataset_inputs(uri: str, run_id: str, fingerprints: Mapping[str, str]) -> None:
    """Record each dataset by name and content digest as an MLflow dataset input."""
    from mlflow.entities import Dataset, DatasetInput

    inputs = [
        DatasetInput(Dataset(name=name, digest=digest[:36], source_type="local", source=name))
        for name, digest in sorted(fingerprints.items())
    ]
    client(uri).log_inputs(run_id, datasets=inputs)


def register_model_version(
    uri: str,
    *,
    name: str,
    run_id: str,
    artifact_path: str,
    tags: Mapping[str, str],
    alias: str | None,
) -> str:
    """Register the run's `artifact_path` as a new version of `name`; point `alias` at it."""
    mlflow_client = client(uri)
    try:
        mlflow_client.create_registered_model(name)
    except Exception:  # already registered: versions are added below
        mlflow_client.get_registered_model(name)
    run = mlflow_client.get_run(run_id)
    source = f"{run.info.artifact_uri}/{artifact_path}"
    version = mlflow_client.create_model_version(name, source=source, run_id=run_id, tags=dict(tags))
    if alias:
        mlflow_client.set_registered_model_alias(name, alias, version.version)
    return str(version.version)


def find_model_version(uri: str, *, name: str, tag: str, value: str) -> str | None:
    """The newest version of `name` whose tag `tag` equals `value`, if any."""
    mlflow_client = client(uri)
    try:
        versions = mlflow_client.search_model_versions(f"name='{name}'")
    except Exception:  # no such registered model yet
        return None
    matching = [int(v.version) for v in versions if v.tags.get(tag) == value]
    return str(max(matching)) if matching else None


def set_alias(uri: str, *, name: str, alias: str, version: str) -> None:
    client(uri).set_registered_model_alias(name, alias, version)


def _param_text(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _MAX_PARAM_CHARS else text[: _MAX_PARAM_CHARS - 3] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
