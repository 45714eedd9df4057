"""A registered model version named as MLflow names it (`models:/NAME@ALIAS`, `models:/NAME/VERSION`),
resolved to a folder that loads with transformers, for `tuneline api`, `webchat` and `chat`.

The version's registering run records the exported folder it was registered from (its `export`
parameter, see tasks/register.py): that folder is served when it is still there, so the tokens are
the ones export wrote, without a copy. Otherwise (another machine, a cleaned workspace) the
version's MLflow artifact is downloaded once into `download_dir/NAME/VERSION` (through a draft
renamed into place, so a half download is never served): MLflow's transformers flavor keeps the
weights under `model/` and the tokenizer under `components/tokenizer/`; a plain-files version
holds the folder itself.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from tuneline.core.errors import ConfigError, nearest
from tuneline.core.tracking import runs as tracking

MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")
EXPORT_PARAM = "export"
"""The registering run's parameter that holds the exported folder's path."""


@dataclass(frozen=True)
class RegisteredFolder:
    """Where the registered version's model and tokenizer are on this machine, and how they got there."""

    name: str
    version: str
    model: Path
    tokenizer: Path
    origin: str
    """'exported folder' or 'downloaded artifact'."""


def is_model_uri(text: str) -> bool:
    return text.startswith("models:/")


def resolve_model_uri(text: str, *, uri: str, download_dir: Path) -> RegisteredFolder:
    """The folder of the version `text` names in the registry at `uri`, or a ConfigError naming what
    does not exist there (the model, the alias, the version) and what does."""
    found = MODEL_URI.match(text)
    if found is None:
        raise ConfigError(f"'{text}' is not a registered model URI; write models:/NAME@ALIAS (such as "
                          "models:/demo@champion) or models:/NAME/VERSION.")
    name = found["name"]
    _check_name(uri, name)
    version = _version(uri, name, alias=found["alias"], version=found["version"])
    model_version = tracking.client(uri).get_model_version(name, version)
    exported = _exported_folder(uri, model_version.run_id)
    if exported is not None:
        return RegisteredFolder(name, version, exported, exported, "exported folder")
    target = download_dir / name / version
    if not (target / ".complete").is_file():
        _download(model_version.source, uri=uri, target=target)
    model, tokenizer = _model_layout(target, text=text)
    return RegisteredFolder(name, version, model, tokenizer, "downloaded artifact")


def _check_name(uri: str, name: str) -> None:
    names = tracking.registered_model_names(uri)
    if name in names:
        return
    guess = nearest(name, names)
    hint = f"did you mean '{guess}'? " if guess else ""
    listing = f"its registered models: {', '.join(names[:30])}" if names else "it has no registered models"
    raise ConfigError(f"unknown registered model '{name}' in {uri}; {hint}{listing}. Point --workspace, --tracking-uri "
                      "or MLFLOW_TRACKING_URI at the store the pipeline registered into.")


def _version(uri: str, name: str, *, alias: str | None, version: str | None) -> str:
    if alias is not None:
        aliases = {key: str(value) for key, value in tracking.client(uri).get_registered_model(name).aliases.items()}
        if alias not in aliases:
            held = ", ".join(f"@{key} (version {value})" for key, value in sorted(aliases.items())) or "none"
            raise ConfigError(f"registered model '{name}' has no alias @{alias} in {uri}; its aliases: {held}. Use one of "
                              f"them, models:/{name}/VERSION, or `tuneline promote {name} VERSION` to set @champion.")
        return aliases[alias]
    versions = tracking.model_version_numbers(uri, name)
    if version not in versions:
        raise ConfigError(f"registered model '{name}' has no version {version} in {uri}; its versions are "
                          f"{', '.join(versions) or 'none'}.")
    return str(version)


def _exported_folder(uri: str, run_id: str | None) -> Path | None:
    """The exported folder the registering run recorded, when it still holds a model."""
    if not run_id:
        return None
    recorded = tracking.client(uri).get_run(run_id).data.params.get(EXPORT_PARAM)
    folder = Path(recorded) if recorded else None
    return folder if folder is not None and (folder / "config.json").is_file() else None


def _download(source: str, *, uri: str, target: Path) -> None:
    from mlflow.artifacts import download_artifacts

    draft = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.rmtree(draft, ignore_errors=True)
    draft.mkdir(parents=True)
    download_artifacts(artifact_uri=source, dst_path=str(draft), tracking_uri=uri)
    (draft / ".complete").write_text("downloaded\n", encoding="utf-8")  # written last
    shutil.rmtree(target, ignore_errors=True)
    os.replace(draft, target)


def _model_layout(folder: Path, *, text: str) -> tuple[Path, Path]:
    """(weights folder, tokenizer folder) of a downloaded version: a plain folder, or MLflow's
    transformers flavor (`model/`, `components/tokenizer/`), each possibly under the artifact's name."""
    configs = sorted(folder.rglob("config.json"), key=lambda p: len(p.parts))
    if not configs:
        raise ConfigError(f"the artifact of {text}, downloaded to {folder}, holds no config.json: it is not a model "
                          "folder; register an exported model folder (the pipeline's `register` section does).")
    model = configs[0].parent
    tokenizers = [model, *sorted((p.parent for p in folder.rglob("tokenizer_config.json")), key=lambda p: len(p.parts))]
    return model, next((path for path in tokenizers if (path / "tokenizer_config.json").is_file()), model)
