"""Which tracking store a workspace's runs go to: MLFLOW_TRACKING_URI when set, else the local
workspace's own SQLite file; a workspace in an object store needs the server, and a server that
cannot be reached is named at once (its password masked), not after MLflow's minutes of retries."""

from __future__ import annotations

import time

import pytest

from conftest import free_port, run_cli_here
from tuneline.core.errors import ConfigError
from tuneline.core.tracking import runs as tracking
from tuneline.core.tracking.model_registry import registry_uri

SECRET = "pw-8c1f"


def test_a_local_workspace_keeps_its_sqlite_store_and_the_environment_overrides_it(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.tracking_uri(tmp_path / "ws") == f"sqlite:///{tmp_path / 'ws' / 'mlflow.db'}"
    assert tracking.tracking_uri(f"file://{tmp_path}/ws") == f"sqlite:///{tmp_path / 'ws' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert tracking.tracking_uri(tmp_path / "ws") == tracking.tracking_uri("s3://bucket/ws") == "http://mlflow.internal:5000"


def test_an_object_store_workspace_without_a_tracking_server_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ConfigError, match=r"workspace s3://bucket/ws is in an object store.*set MLFLOW_TRACKING_URI"):
        tracking.tracking_uri("s3://bucket/ws/")
    result = run_cli_here("promote", "demo", "1", "--workspace", "s3://bucket/ws", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "s3://bucket/ws is in an object store" in result.stderr and not (tmp_path / "s3:").exists()


def test_a_command_reads_the_registry_it_is_pointed_at_and_never_creates_an_empty_one(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert registry_uri(tmp_path / "none", tracking_uri="http://mlflow.internal:5000", source="tuneline promote") == (
        "http://mlflow.internal:5000")
    with pytest.raises(ConfigError, match=r"tuneline chat: --workspace .*none: no MLflow store at .*--tracking-uri URI"):
        registry_uri(tmp_path / "none", tracking_uri=None, source="tuneline chat")
    assert not (tmp_path / "none").exists()
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "mlflow.db").touch()
    assert registry_uri(tmp_path / "ws", tracking_uri=None, source="tuneline api") == f"sqlite:///{tmp_path / 'ws' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert registry_uri(tmp_path / "none", tracking_uri=None, source="tuneline api") == "http://mlflow.internal:5000"


def test_a_server_that_does_not_answer_is_named_at_once_without_its_password():
    uri = f"http://trainer:{SECRET}@127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        tracking.client(uri)
    message = str(refused.value)
    assert time.monotonic() - started < 10
    assert f"the MLflow tracking server {uri.replace(SECRET, '***')} (MLFLOW_TRACKING_URI" in message
    assert "could not answer" in message and SECRET not in message
