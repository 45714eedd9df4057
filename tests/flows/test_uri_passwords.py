"""A tracking URI's password never reaches the terminal: not in the summary a run ends with, not in
the report of an error MLflow raised with the URI in its message."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from conftest import run_cli
from tuneline.flows.report import print_summary

SECRET = "s3cretPass"


def test_the_run_summary_prints_the_tracking_uri_without_its_password(capsys):
    summary = {"stages": [{"name": "sft", "kind": "trained", "cache_hit": False, "path": "/ws/artifacts/sft", "seconds": 3.0}],
               "workspace": "/ws", "tracking_uri": f"https://trainer:{SECRET}@mlflow.example.com/", "parent_run_id": "abc"}
    print_summary(summary, seconds=3.5)
    printed = capsys.readouterr().out
    assert "MLflow:          https://trainer:***@mlflow.example.com/ (parent run abc)" in printed
    assert SECRET not in printed


@pytest.mark.slow
def test_an_unreachable_tracking_server_is_reported_without_its_password(tmp_path: Path, monkeypatch):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    uri = f"http://trainer:{SECRET}@127.0.0.1:{port}"
    # checked before MLflow's client retries: one paragraph naming the server, in a process of its own
    promoted = run_cli("promote", "demo", "1", "--tracking-uri", uri, cwd=tmp_path)
    assert promoted.returncode == 2 and "Traceback" not in promoted.stderr, promoted.stderr[-2000:]
    assert f"http://trainer:***@127.0.0.1:{port}" in promoted.stderr and SECRET not in promoted.stderr + promoted.stdout
