"""`--workspace` as a local folder (unchanged) or an fsspec URL, and the retry rule of a URL workspace."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneline.core.errors import ConfigError, ObjectStoreError
from tuneline.core.store.location import parse_workspace
from tuneline.core.store.remote import RemoteWorkspace, RetryPolicy, transient


@pytest.mark.parametrize("text, folder", [("workspace", "workspace"), ("/data/runs/ws", "/data/runs/ws"),
                                          ("file:///data/runs/ws", "/data/runs/ws"), ("./a:b", "./a:b")])
def test_a_path_or_file_url_stays_a_local_folder(text, folder):
    location = parse_workspace(text)
    assert not location.is_remote and location.path == Path(folder) and location.url is None


def test_an_object_store_url_keeps_the_local_layout():
    location = parse_workspace("s3://team-bucket/tuneline/ws/")
    assert location.is_remote and location.protocol == "s3" and location.path is None
    assert location.url == "s3://team-bucket/tuneline/ws"
    assert location.artifact_url("sft", "sft-" + "a" * 20) == f"s3://team-bucket/tuneline/ws/artifacts/sft/sft-{'a' * 20}"


def test_an_unknown_scheme_or_a_url_without_a_bucket_is_refused_by_name():
    with pytest.raises(ConfigError) as unknown:
        parse_workspace("gcss://bucket/ws", source="pipeline.yaml")
    assert str(unknown.value) == ("Invalid configuration in pipeline.yaml: workspace 'gcss://bucket/ws': unknown URL scheme "
                                  "'gcss'; did you mean 'gcs'? Give a local folder or an object-store URL such as s3://bucket/prefix.")
    with pytest.raises(ConfigError, match=r"workspace 's3://': the URL names no bucket"):
        parse_workspace("s3://")


def test_only_failures_to_answer_are_retried_and_then_named(tmp_path):
    assert transient(ConnectionRefusedError()) and transient(TimeoutError())
    assert not transient(FileNotFoundError()) and not transient(PermissionError()) and not transient(ValueError())
    remote = RemoteWorkspace(parse_workspace("memory://bucket/ws"), retry=RetryPolicy(attempts=3, first_wait_s=0.001))
    tries = []

    def refused():
        tries.append(1)
        raise ConnectionResetError("connection reset by peer")

    with pytest.raises(ObjectStoreError) as failed:
        remote.attempt("uploading", "memory://bucket/ws/artifacts/sft/k/model.safetensors", refused)
    assert len(tries) == 3
    assert str(failed.value).startswith("the object store did not answer: uploading "
                                        "memory://bucket/ws/artifacts/sft/k/model.safetensors failed 3 times over ")
    assert "ConnectionResetError: connection reset by peer" in str(failed.value)
