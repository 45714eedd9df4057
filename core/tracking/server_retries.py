"""How long tuneline's MLflow client waits for a tracking server that fails, and how it says so.

MLflow's client retries a request that fails (refused, 5xx) 7 times with waits doubling from 2 s:
about four minutes, sized for hosted servers that rate-limit. A `mlflow server` that keeps its
artifacts in an object store answers 500 to every artifact upload while that store is down, so a
stage would hang that long and then end in MLflow's traceback. Unless MLFLOW_HTTP_REQUEST_MAX_RETRIES
or MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR is set, tuneline's processes use 3 retries, about 15 s of
waits in all (a server restarting is still waited for), and an artifact upload that fails anyway
ends the stage with one paragraph naming the server and what to check.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from tuneline.core.errors import TrackingServerError
from tuneline.core.tracking.privacy import mask_password

RETRY_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "2"}


def bound_client_retries() -> None:
    """Set MLflow's retry variables to tuneline's defaults where the user has not set them (MLflow
    reads them at each request; the processes a stage starts inherit them)."""
    for name, value in RETRY_DEFAULTS.items():
        if not os.environ.get(name, "").strip():
            os.environ[name] = value


@contextmanager
def naming_failed_upload(uri: str, run_id: str, name: str) -> Iterator[None]:
    """Turn MLflow's failure to upload the artifact `name` of `run_id` to the server at `uri` into a
    TrackingServerError that names the server and says what to check (a local store: as it is)."""
    if not uri.startswith(("http://", "https://")):
        yield
        return
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as e:
        retries = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES", RETRY_DEFAULTS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"])
        raise TrackingServerError(
            f"the MLflow tracking server {mask_password(uri)} did not store the artifact {name} of run {run_id} "
            f"(retried {retries} times): {mask_password(str(e))[:400]}. A tracking server answers so while the store "
            "that holds its artifacts (`mlflow server --artifacts-destination`) does not answer: check that store and the "
            "server's log, then run the same command again. MLFLOW_HTTP_REQUEST_MAX_RETRIES and "
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR set how long the client waits.") from e
