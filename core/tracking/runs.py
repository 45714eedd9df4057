"""The one door from `core/` to MLflow (docs/ARCHITECTURE.md, "Tracking").

Runs are addressed by id through `MlflowClient`, never through MLflow's global "active run", so a
flow, its tasks and a training worker in another process can all log to the same run. The store
defaults to `sqlite:///<workspace>/mlflow.db` with artifacts beside it; `MLFLOW_TRACKING_URI`
points everything at a server instead (which a workspace in an object store needs), and each
process that runs a stage, on whichever machine, logs its own child run there.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from tuneline.core.errors import ConfigError
from tuneline.core.store.location import parse_workspace
from tuneline.core.store.locks import file_lock
from tuneline.core.tracking.privacy import REDACTED, create_owner_only, mask_password
from tuneline.core.tracking.server_retries import bound_client_retries, naming_failed_upload

if TYPE_CHECKING:
    from mlflow import MlflowClient

RUN_ID_ENV = "TUNELINE_MLFLOW_RUN_ID"
PARENT_TAG = "mlflow.parentRunId"
_MAX_PARAM_CHARS = 6000
_BATCH = 100
_CONNECT_TIMEOUT_S = 10
_SUPPRESS_RUN_LINKS = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


def tracking_uri(workspace: str | Path) -> str:
    """The tracking URI for a workspace: the environment's if set (a tracking server every machine
    reaches), else the workspace's SQLite file. A workspace in an object store has no SQLite file:
    one on each machine would split the pipeline's runs, so it needs the server."""
    from_env = os.environ.get("MLFLOW_TRACKING_URI")
    if from_env:
        return from_env
    location = parse_workspace(workspace)
    if location.path is None:
        raise ConfigError(f"workspace {location.url} is in an object store, where MLflow cannot keep its SQLite store "
                          "(mlflow.db) for every machine that runs a stage; set MLFLOW_TRACKING_URI to the tracking server "
                          "the pipeline's runs go to (a `mlflow server` every machine reaches, e.g. "
                          "MLFLOW_TRACKING_URI=http://mlflow.internal:5000), or use a local workspace folder.")
    return f"sqlite:///{(location.path / 'mlflow.db').resolve()}"


@cache
def client(uri: str) -> MlflowClient:
    """The client for `uri`, its store opened at once. MLflow creates a new SQLite store's tables
    and runs their migrations without a lock, so two processes opening one new `mlflow.db` together
    fail ("Online migration expected to match one row"); the first open of a SQLite store is done
    under a file lock beside it. A new database file is created owner-only (privacy.py)."""
    if not uri.startswith("sqlite:///"):
        _check_server_answers(uri)  # before MLflow is imported: a refusal costs no second of imports
        bound_client_retries()
    from mlflow import MlflowClient

    if not uri.startswith("sqlite:///"):
        if mask_password(uri) != uri:  # MLflow prints each ended run's page as this URI, password and all
            os.environ[_SUPPRESS_RUN_LINKS] = "true"
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    database = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    with file_lock(database.with_name(database.name + ".init.lock")):
        create_owner_only(database)  # before SQLite creates it with the umask's mode
        mlflow_client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        mlflow_client.search_experiments(max_results=1)  # the tracking store: tables created if new
        mlflow_client.search_registered_models(max_results=1)  # the registry store, same file
    return mlflow_client


def _check_server_answers(uri: str) -> None:
    """A tracking server that cannot be reached at all is named at once: MLflow's client retries each
    request for about four minutes and then ends in a traceback. Any HTTP answer will do (a server
    behind a login may answer 401); a TLS problem is left to MLflow, which has its own settings for
    certificates (MLFLOW_TRACKING_SERVER_CERT_PATH, MLFLOW_TRACKING_INSECURE_TLS)."""
    if urlsplit(uri).scheme not in ("http", "https"):
        return
    import requests

    try:
        requests.get(f"{uri.rstrip('/')}/health", timeout=(_CONNECT_TIMEOUT_S, 60))
    except (requests.exceptions.SSLError, requests.exceptions.ReadTimeout):
        return
    except requests.exceptions.RequestException as e:
        raise ConfigError(f"the MLflow tracking server {mask_password(uri)} (MLFLOW_TRACKING_URI, or --tracking-uri) could not "
                          f"answer: {mask_password(str(e))[:300]}. Start it or point MLFLOW_TRACKING_URI at one that runs; "
                          "unset MLFLOW_TRACKING_URI to track into the workspace's own SQLite store (mlflow.db).") from e


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


def _create_run(uri: str, experiment_id: str, name: str, parent_run_id: str | None, tags: Mapping[str, str] | None) -> str:
    all_tags = {**(tags or {}), **({PARENT_TAG: parent_run_id} if parent_run_id else {})}
    return client(uri).create_run(experiment_id, run_name=name, tags=all_tags).info.run_id


def end_run(uri: str, run_id: str, *, failed: bool = False) -> None:
    client(uri).set_terminated(run_id, status="FAILED" if failed else "FINISHED")


@contextmanager
def tracked_run(
    uri: str,
    experiment_id: str,
    *,
    name: str,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """Open a run (a child of `parent_run_id` if given) and yield its id; it ends FINISHED when the
    block does, FAILED when the block raises (the exception goes on). A killed process leaves it
    RUNNING: `end_abandoned_run` ends it later."""
    run_id = _create_run(uri, experiment_id, name, parent_run_id, tags)
    try:
        yield run_id
    except BaseException:
        end_run(uri, run_id, failed=True)
        raise
    end_run(uri, run_id)


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
    """Log `params` with their secrets masked (see `redact`)."""
    from mlflow.entities import Param

    items = [Param(k, _param_text(v)) for k, v in sorted(redact(params).items())]
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
    with naming_failed_upload(uri, run_id, f"{artifact_path}/{path.name}" if artifact_path else path.name):
        if path.is_dir():
            client(uri).log_artifacts(run_id, str(path), artifact_path=artifact_path)
        else:
            client(uri).log_artifact(run_id, str(path), artifact_path=artifact_path)


def log_table(uri: str, run_id: str, columns: Mapping[str, list[Any]], name: str) -> None:
    """Store `columns` (equal-length lists) as the run's table artifact `name`, which MLflow's UI shows as a table."""
    with naming_failed_upload(uri, run_id, name):
        client(uri).log_table(run_id, data=dict(columns), artifact_file=name)


def log_dict(uri: str, run_id: str, values: Mapping[str, Any], name: str) -> None:
    """Store `values`, secrets masked, as a JSON artifact `name` of the run (the resolved stage config)."""
    with naming_failed_upload(uri, run_id, name):
        client(uri).log_dict(run_id, json.loads(json.dumps(redact(values), default=str)), name)


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


def log_chat_model(uri: str, run_id: str, folder: str | Path, *, artifact_path: str) -> tuple[str, str | None]:
    """Log an exported Hugging Face folder as an MLflow model that loads back with MLflow's own API
    (`mlflow.transformers.load_model` / `mlflow.pyfunc.load_model("models:/NAME@champion")`).

    What works with mlflow 3.17 and transformers 5.x: saving a `transformers.pipeline` object with
    `task="llm/v1/chat"` and explicit `pip_requirements`. The pyfunc then takes OpenAI-style
    `{"messages": [...]}` and renders them with the tokenizer's own chat template. What fails: a
    local checkpoint path (`build_flavor_config_from_local_checkpoint` reads
    `check_task(task)[1]["impl"].__name__`, but transformers 5 registers the pipeline class by
    name: "'str' object has no attribute '__name__'"), and a pipeline without `pip_requirements`
    (MLflow pins torchvision, which a CPU install may lack). Saved with `save_model` and uploaded
    with the client, since runs here are addressed by id, never through MLflow's active run.

    Returns ("transformers", None), or ("files", reason) when the flavor could not be written: then
    the plain folder is logged (loadable with transformers from the downloaded artifact, not with
    MLflow's loaders) and the reason goes to the caller's log and to the version's tags.
    """
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as scratch:
            _save_transformers_chat_model(folder, Path(scratch) / "model")
            client(uri).log_artifacts(run_id, str(Path(scratch) / "model"), artifact_path=artifact_path)
        return "transformers", None
    except Exception as e:  # an MLflow/transformers combination the flavor does not handle
        client(uri).log_artifacts(run_id, str(folder), artifact_path=artifact_path)
        return "files", f"{type(e).__name__}: {e}"[:500]


def _save_transformers_chat_model(folder: str | Path, path: Path) -> None:
    import logging

    import mlflow.transformers
    import torch
    import transformers

    pipe = transformers.pipeline("text-generation", model=str(folder), tokenizer=str(folder), device="cpu")
    requirements = [f"transformers=={transformers.__version__}", f"torch=={torch.__version__.split('+')[0]}"]
    flavor_logger = logging.getLogger("mlflow.transformers")
    level = flavor_logger.level
    flavor_logger.setLevel(logging.ERROR)  # a local folder has no hub model card or license to look up
    try:
        mlflow.transformers.save_model(pipe, str(path), task="llm/v1/chat", pip_requirements=requirements)
    finally:
        flavor_logger.setLevel(level)


def delete_alias(uri: str, *, name: str, alias: str) -> None:
    client(uri).delete_registered_model_alias(name, alias)


def registered_model_names(uri: str) -> list[str]:
    return sorted(m.name for m in client(uri).search_registered_models(max_results=1000))


def model_version_numbers(uri: str, name: str) -> list[str]:
    versions = client(uri).search_model_versions(f"name='{name}'")
    return sorted((str(v.version) for v in versions), key=int)


def model_version_tags(uri: str, *, name: str, version: str) -> dict[str, str]:
    return dict(client(uri).get_model_version(name, version).tags)


def set_model_version_tags(uri: str, *, name: str, version: str, tags: Mapping[str, str]) -> None:
    for key, value in tags.items():
        client(uri).set_model_version_tag(name, version, key, value)


def alias_version(uri: str, *, name: str, alias: str) -> str | None:
    """The version `alias` points at, or None when the model has no such alias."""
    aliases = client(uri).get_registered_model(name).aliases
    version = aliases.get(alias)
    return None if version is None else str(version)


def registered_model_tag(uri: str, *, name: str, key: str) -> str | None:
    return client(uri).get_registered_model(name).tags.get(key)


def set_registered_model_tag(uri: str, *, name: str, key: str, value: str) -> None:
    client(uri).set_registered_model_tag(name, key, value)


_SECRET_KEY = re.compile(
    r"(^|[_.-])(password|passwd|secret|credentials?|api_?key|private_?key|auth)([_.-]|$)"  # db_password, aws_secret_key
    r"|(^|[_.-])(hub|hf|access|api|auth|bearer|refresh|session)_token$|^token$",  # hf_hub_token; never pad_token, max_new_tokens
    re.IGNORECASE,
)


def redact(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` safe to record: a key that names a secret (`hub_token`, `password`, `api_key`, ...)
    gets its value replaced, and a password inside a URI (`https://user:secret@host`) is masked
    wherever it appears, nested mappings and lists included. Secrets belong in the environment;
    this keeps one that reached a config out of MLflow's params and config.json."""
    return {key: _redacted(key, value) for key, value in values.items()}


def _redacted(key: str, value: Any) -> Any:
    if _SECRET_KEY.search(str(key)) and value not in (None, "", False):
        return REDACTED
    if isinstance(value, Mapping):
        return redact(value)
    if isinstance(value, (list, tuple)):
        return [_redacted("", item) for item in value]
    if isinstance(value, str):
        return mask_password(value)
    return value


def _param_text(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _MAX_PARAM_CHARS else text[: _MAX_PARAM_CHARS - 3] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
