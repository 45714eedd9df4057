"""How long tuneline's MLflow client retries a tracking server: its own bound unless the user set
MLflow's variables, and MLflow's failure to upload an artifact named in one paragraph."""

from __future__ import annotations

import os

import pytest

from tuneline.core.errors import TrackingServerError
from tuneline.core.tracking.server_retries import RETRY_DEFAULTS, bound_client_retries, naming_failed_upload


def test_the_bound_applies_where_the_user_set_nothing_and_never_over_a_users_setting(monkeypatch):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")
    bound_client_retries()
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "7"
    assert os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] == RETRY_DEFAULTS["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] == "2"

    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR, MLFLOW_HTTP_REQUEST_MAX_RETRIES

    assert (MLFLOW_HTTP_REQUEST_MAX_RETRIES.get(), MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR.get()) == (7, 2)  # as MLflow reads them


def test_a_failed_upload_names_the_server_without_its_password():
    from mlflow.exceptions import MlflowException

    uri = "http://trainer:pw-51e0@127.0.0.1:5000"
    with pytest.raises(TrackingServerError) as failed, naming_failed_upload(uri, "run-1", "training_loss.png"):
        raise MlflowException(f"API request to {uri}/api/2.0/mlflow-artifacts/artifacts failed: too many 500 error responses")
    message = str(failed.value)
    assert message.startswith("the MLflow tracking server http://trainer:***@127.0.0.1:5000 did not store the artifact "
                              "training_loss.png of run run-1")
    assert "pw-51e0" not in message and "--artifacts-destination" in message and "\n" not in message
