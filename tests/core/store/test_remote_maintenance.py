"""`tuneline verify` and `tuneline gc` on a URL workspace in a real S3 store (SeaweedFS): damage found
and marked in the store, and what gc removes decided as for a local workspace, from MLflow's runs."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tuneline.core.store.artifacts import DAMAGE_NOTE, MANIFEST, find_artifact, write_artifact
from tuneline.core.store.location import parse_workspace
from tuneline.core.store.remote import RemoteWorkspace
from tuneline.core.store.remote_artifacts import fetch_artifact, publish_artifact
from tuneline.core.tracking import runs as tracking
from tuneline.flows.cli import main

pytestmark = pytest.mark.slow  # a SeaweedFS process for the session
KEPT, UNUSED, ALTERED, BAD_MANIFEST, UNFINISHED = (f"sft-{digit * 20}" for digit in "12345")


def tuneline(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def workspace(s3_store, tmp_path: Path, monkeypatch) -> RemoteWorkspace:
    """A URL workspace holding: KEPT (a recent run used it), UNUSED (no run did), ALTERED (a byte of
    its weights changed in the store), BAD_MANIFEST (an empty manifest.json), UNFINISHED (files of
    an upload cut short before its manifest); the AWS variables pointing at the store."""
    for name, value in s3_store.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TUNELINE_CACHE", str(tmp_path / "no-cache"))
    remote = RemoteWorkspace(parse_workspace(f"{s3_store.make_bucket()}/ws"))
    for key in (KEPT, UNUSED, ALTERED, BAD_MANIFEST):
        with write_artifact(tmp_path / "writer", "sft", key, config={"key": key}) as draft:
            (draft.path / "weights.bin").write_bytes(os.urandom(4096))
        publish_artifact(remote, find_artifact(tmp_path / "writer", "sft", key))
    weights = remote.artifact_url("sft", ALTERED, "weights.bin")
    changed = bytearray(remote.filesystem.cat_file(weights))
    changed[7] ^= 0xFF
    remote.write_bytes(weights, bytes(changed))
    remote.write_bytes(remote.artifact_url("sft", BAD_MANIFEST, MANIFEST), b"")
    remote.write_bytes(remote.artifact_url("sft", UNFINISHED, "weights.bin"), b"partial")
    return remote


def test_verify_marks_the_damaged_artifacts_in_the_store(workspace, capsys, tmp_path):
    url = workspace.location.url
    code, out, err = tuneline(capsys, "verify", "--workspace", url)

    assert code == 1, err
    assert f"damaged: {url}/artifacts/sft/{ALTERED}\n  weights.bin: content changed (same size, sha256 differs" in out
    assert f"damaged: {url}/artifacts/sft/{BAD_MANIFEST}\n  manifest.json is empty (0 bytes)" in out
    assert f"workspace {url}: 4 artifact(s) verified, 2 damaged" in out
    objects = workspace.list_files()
    for key in (ALTERED, BAD_MANIFEST):
        assert f"sft/{key}/{DAMAGE_NOTE}" in objects and f"sft/{key}/{MANIFEST}" not in objects
    assert fetch_artifact(workspace, "sft", ALTERED, cache=tmp_path / "cache") is None  # no host serves it any more
    assert fetch_artifact(workspace, "sft", KEPT, cache=tmp_path / "cache") is not None

    code, out, _ = tuneline(capsys, "verify", "--workspace", url)
    assert code == 0 and f"workspace {url}: 2 artifact(s) verified, 0 damaged" in out

    publish_artifact(workspace, find_artifact(tmp_path / "writer", "sft", ALTERED))  # recomputed: published again
    assert set(workspace.folder_files("sft", ALTERED)) == {"weights.bin", MANIFEST}  # verify's note went first
    code, out, _ = tuneline(capsys, "verify", "--workspace", url)
    assert code == 0 and f"workspace {url}: 3 artifact(s) verified, 0 damaged" in out


def test_gc_keeps_what_recent_runs_use_and_removes_the_rest_from_the_store(workspace, capsys, tmp_path, monkeypatch):
    url = workspace.location.url
    code, _, err = tuneline(capsys, "gc", "--workspace", url)
    assert code == 2 and f"--workspace {url}: gc needs the MLflow tracking server" in err and "MLFLOW_TRACKING_URI" in err

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    experiment = tracking.ensure_experiment(uri, "p", artifact_root=tmp_path / "mlartifacts")
    with tracking.tracked_run(uri, experiment, name="run", tags={"tuneline.pipeline": "p"}) as parent:
        with tracking.tracked_run(uri, experiment, name="sft", parent_run_id=parent, tags={"tuneline.key": KEPT}):
            pass
    assert tuneline(capsys, "verify", "--workspace", url)[0] == 1  # ALTERED and BAD_MANIFEST marked

    code, out, _ = tuneline(capsys, "gc", "--workspace", url)
    rows = dict(re.findall(r"^\s*[\d.]+ [KMGT]?B  (\S+)  \((.*)\)$", out, flags=re.M))
    assert code == 0 and rows == {
        f"{url}/artifacts/sft/{UNUSED}": "artifact that no recent run or registered model references",
        f"{url}/artifacts/sft/{ALTERED}": "artifact marked damaged by tuneline verify",
        f"{url}/artifacts/sft/{BAD_MANIFEST}": "artifact marked damaged by tuneline verify",
    }, out
    assert len(workspace.list_files()) == 9  # listing removes nothing

    code, out, _ = tuneline(capsys, "gc", "--workspace", url, "--yes")
    assert code == 0 and "removed 3 folder(s)" in out
    # what a recent run used stays whole, and an upload cut short (no manifest) is left alone, as locally
    assert set(workspace.list_files()) == {f"sft/{KEPT}/weights.bin", f"sft/{KEPT}/{MANIFEST}", f"sft/{UNFINISHED}/weights.bin"}
