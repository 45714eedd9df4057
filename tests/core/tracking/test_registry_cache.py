"""The download cache of registered versions (`models:/`), against two real MLflow registries on
SQLite that both hold `demo/1`, each with its own weights, registered from a folder no longer on
this machine: entries are keyed by registry and run, a first download happens once however many
ask at the same time, and names, aliases and versions that read as paths are refused.

The registries are created under umask 022, so they also show that `mlflow.db` is owner-only.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

from tuneline.core.errors import ConfigError
from tuneline.core.tracking import runs as tracking
from tuneline.core.tracking.model_uris import RegisteredFolder, registry_identity, resolve_model_uri

NAME = "demo"


def register_demo(root: Path, weights: bytes) -> str:
    """A registry at `root/mlflow.db` whose `demo/1` (@champion) holds `weights`; its export param names
    a folder that is not on this machine, so resolving it downloads the artifact."""
    logged = root / "logged"
    logged.mkdir(parents=True)
    (logged / "config.json").write_text('{"model_type": "llama"}')
    (logged / "model.safetensors").write_bytes(weights)
    (logged / "tokenizer_config.json").write_text("{}")
    uri = tracking.tracking_uri(root)
    experiment = tracking.ensure_experiment(uri, "cache", artifact_root=root / "mlartifacts")
    with tracking.tracked_run(uri, experiment, name="register") as run_id:
        tracking.log_params(uri, run_id, {"export": str(root / "gone" / "export-1")})
        tracking.client(uri).log_artifacts(run_id, str(logged), artifact_path="model")
    tracking.register_model_version(uri, name=NAME, run_id=run_id, artifact_path="model", tags={}, alias="champion")
    return uri


@pytest.fixture(scope="module")
def registries(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("registry_cache")
    previous = os.umask(0o022)
    try:
        uris = {"a": register_demo(root / "a", b"weights of registry a"), "b": register_demo(root / "b", b"weights of b")}
    finally:
        os.umask(previous)
    tracking.set_alias(uris["a"], name=NAME, alias="hostile", version="1")
    with sqlite3.connect(root / "a" / "mlflow.db") as database:  # what a tampered or hostile registry answers
        database.execute("UPDATE registered_model_aliases SET version = '../../victim' WHERE alias = 'hostile'")
    return uris


def weights(found: RegisteredFolder) -> bytes:
    return (found.model / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_two_registries_holding_demo_1_get_their_own_entries_and_weights(registries: dict[str, str], tmp_path: Path):
    from_a = resolve_model_uri(f"models:/{NAME}/1", uri=registries["a"], download_dir=tmp_path)
    from_b = resolve_model_uri(f"models:/{NAME}@champion", uri=registries["b"], download_dir=tmp_path)
    assert (from_a.origin, from_b.origin) == ("downloaded artifact", "downloaded artifact")
    assert weights(from_a) == b"weights of registry a" and weights(from_b) == b"weights of b"
    entries = sorted(path.name for path in (tmp_path / NAME).iterdir() if not path.name.startswith("."))
    assert len(entries) == 2 and all(entry.startswith("1-") for entry in entries)
    assert resolve_model_uri(f"models:/{NAME}@champion", uri=registries["a"], download_dir=tmp_path) == from_a


def test_a_registry_is_the_same_however_its_uri_is_spelled_and_whatever_its_password():
    assert registry_identity("https://alice:s3cret@MLflow.example.com:5000/") == "https://mlflow.example.com:5000"
    assert registry_identity("https://bob:other@mlflow.example.com:5000") == "https://mlflow.example.com:5000"
    here = Path.cwd()
    assert registry_identity("sqlite:///ws/../ws/mlflow.db") == f"sqlite:///{here / 'ws' / 'mlflow.db'}"


@pytest.mark.slow
def test_mlflow_db_is_created_owner_only_whatever_the_umask(registries: dict[str, str]):
    for uri in registries.values():
        database = Path(uri.removeprefix("sqlite:///"))
        assert database.stat().st_mode & 0o777 == 0o600, uri


@pytest.mark.slow
def test_two_first_downloads_at_once_both_get_the_whole_folder(registries: dict[str, str], tmp_path: Path):
    start = threading.Barrier(2)
    found: list[RegisteredFolder | BaseException] = []

    def resolve() -> None:
        start.wait()
        try:
            found.append(resolve_model_uri(f"models:/{NAME}@champion", uri=registries["b"], download_dir=tmp_path))
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            found.append(error)

    threads = [threading.Thread(target=resolve) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(result, RegisteredFolder) for result in found), found
    assert len(found) == 2 and found[0] == found[1] and weights(found[0]) == b"weights of b"
    assert (found[0].tokenizer / "tokenizer_config.json").is_file() and (found[0].model / "config.json").is_file()
    assert not list((tmp_path / NAME).glob("*.partial"))


@pytest.mark.slow
@pytest.mark.parametrize(("text", "message"), [
    ("models:/../1", "names the registered model '..', which reads as a path"),
    ("models:/..@champion", "names the registered model '..', which reads as a path"),
    ("models:/.@champion", "names the registered model '.', which reads as a path"),
    (f"models:/{NAME}@..", "names the alias @.., which MLflow cannot hold"),
    (f"models:/{NAME}@hostile", "answers version '../../victim', which is not a version number"),
])
def test_names_aliases_and_versions_that_read_as_paths_are_refused(registries: dict[str, str], tmp_path: Path,
                                                                  text: str, message: str):
    cache = tmp_path / "cache" / "registry"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("kept")
    with pytest.raises(ConfigError) as refused:
        resolve_model_uri(text, uri=registries["a"], download_dir=cache)
    assert f"'{text}'" in str(refused.value) and message in str(refused.value)
    assert (victim / "keep.txt").read_text() == "kept"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["victim"]  # nothing downloaded anywhere


def test_a_registry_that_cannot_answer_is_named_without_its_password(monkeypatch, tmp_path: Path):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(ConfigError) as refused:
        resolve_model_uri(f"models:/{NAME}@champion", uri=f"http://trainer:s3cretPass@127.0.0.1:{port}", download_dir=tmp_path)
    assert f"http://trainer:***@127.0.0.1:{port}" in str(refused.value) and "could not answer" in str(refused.value)
    assert "s3cretPass" not in str(refused.value)
