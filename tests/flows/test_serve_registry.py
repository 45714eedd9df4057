"""Serving a registered version: `models:/NAME@ALIAS` resolved through a real MLflow registry on
SQLite, registered the way tasks/register.py registers an export (the registering run records the
exported folder as its `export` parameter and logs the model as the version's artifact).

Version 1 (@champion) still has its exported folder on this machine; version 2 (@challenger) was
registered elsewhere: only its MLflow artifact exists, which is downloaded once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli_here
from tuneline.core.errors import ConfigError

NAME = "demo-chat"


def model_folder(path: Path) -> Path:
    """The files a resolved folder is recognised by (nothing here loads it)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "llama"}')
    (path / "model.safetensors").write_bytes(b"weights")
    (path / "tokenizer_config.json").write_text("{}")
    return path


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> dict:
    from tuneline.core.tracking import runs as tracking
    from tuneline.core.tracking.model_registry import move_champion

    workspace = tmp_path_factory.mktemp("serve_registry") / "workspace"
    exported = model_folder(workspace / "artifacts" / "export" / "export-abc")
    logged_elsewhere = model_folder(workspace.parent / "logged")
    uri = tracking.tracking_uri(workspace)
    experiment = tracking.ensure_experiment(uri, "serve", artifact_root=workspace / "mlartifacts")
    versions = []
    for export, logged in ((exported, None), (workspace / "elsewhere" / "export-def", logged_elsewhere)):
        with tracking.tracked_run(uri, experiment, name="register") as run_id:
            tracking.log_params(uri, run_id, {"model_name": NAME, "export": str(export)})
            if logged is not None:
                tracking.client(uri).log_artifacts(run_id, str(logged), artifact_path="model")
        versions.append(tracking.register_model_version(uri, name=NAME, run_id=run_id, artifact_path="model",
                                                        tags={"tuneline.export_key": export.name}, alias=None))
    move_champion(uri, name=NAME, version=versions[0])
    tracking.set_alias(uri, name=NAME, alias="challenger", version=versions[1])
    return {"uri": uri, "workspace": workspace, "exported": exported, "versions": versions}


def test_an_alias_resolves_to_the_exported_folder_it_was_registered_from(registry: dict, tmp_path: Path):
    from tuneline.core.tracking.model_uris import resolve_model_uri

    found = resolve_model_uri(f"models:/{NAME}@champion", uri=registry["uri"], download_dir=tmp_path)
    assert (found.version, found.model, found.tokenizer, found.origin) == ("1", registry["exported"], registry["exported"],
                                                                           "exported folder")
    assert resolve_model_uri(f"models:/{NAME}/1", uri=registry["uri"], download_dir=tmp_path).model == registry["exported"]
    assert not any(tmp_path.iterdir())  # nothing downloaded


def test_a_version_registered_elsewhere_is_downloaded_once(registry: dict, tmp_path: Path):
    from tuneline.core.tracking.model_uris import resolve_model_uri

    found = resolve_model_uri(f"models:/{NAME}@challenger", uri=registry["uri"], download_dir=tmp_path)
    assert found.version == "2" and found.origin == "downloaded artifact"
    entry, = (tmp_path / NAME).glob("2-*")  # keyed by the registry and the version's run
    assert found.model.is_relative_to(entry) and (found.tokenizer / "tokenizer_config.json").is_file()
    assert (found.model / "model.safetensors").read_bytes() == b"weights"
    marker = (entry / ".complete").stat().st_mtime_ns
    assert resolve_model_uri(f"models:/{NAME}@challenger", uri=registry["uri"], download_dir=tmp_path) == found
    assert (entry / ".complete").stat().st_mtime_ns == marker


def test_the_served_model_of_a_registered_alias(registry: dict):
    from tuneline.core.serving.sources import served_model

    served = served_model(f"models:/{NAME}@champion", tracking_uri=lambda: registry["uri"], overrides=["temperature=0.2"])
    assert served.source.model == str(registry["exported"]) and served.source.adapter is None
    assert served.name == f"{NAME}@champion" and served.generating.temperature == 0.2


@pytest.mark.parametrize(("uri", "message"), [
    (f"models:/{NAME}@nope", f"registered model '{NAME}' has no alias @nope in sqlite:"),
    (f"models:/{NAME}/7", f"registered model '{NAME}' has no version 7"),
    ("models:/demo-chatt@champion", "unknown registered model 'demo-chatt' in sqlite:"),
    (f"models:/{NAME}", "is not a registered model URI; write models:/NAME@ALIAS"),
])
def test_what_the_registry_does_not_hold_is_named(registry: dict, tmp_path: Path, uri: str, message: str):
    from tuneline.core.tracking.model_uris import resolve_model_uri

    with pytest.raises(ConfigError) as raised:
        resolve_model_uri(uri, uri=registry["uri"], download_dir=tmp_path)
    assert message in str(raised.value)
    if "@nope" in uri:
        assert "its aliases: @challenger (version 2), @champion (version 1)" in str(raised.value)
    if "chatt" in uri:
        assert f"did you mean '{NAME}'?" in str(raised.value)


def test_tuneline_api_on_an_unknown_alias_exits_2_with_the_aliases(registry: dict, tmp_path: Path):
    by_workspace = run_cli_here("api", f"models:/{NAME}@nope", "--workspace", str(registry["workspace"]), cwd=tmp_path)
    by_uri = run_cli_here("webchat", f"models:/{NAME}@nope", "--tracking-uri", registry["uri"], cwd=tmp_path)
    for result in (by_workspace, by_uri):
        assert result.returncode == 2, result.stderr
        assert "has no alias @nope" in result.stderr and "@champion (version 1)" in result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""
    missing = run_cli_here("api", f"models:/{NAME}@champion", "--workspace", str(tmp_path / "none"), cwd=tmp_path)
    assert missing.returncode == 2 and "no MLflow store at" in missing.stderr
