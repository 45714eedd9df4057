"""A registered model version named as MLflow names it (`models:/NAME@ALIAS`, `models:/NAME/VERSION`),
resolved to a folder that loads with transformers, for `tuneline api`, `webchat` and `chat`.

The version's registering run records the exported folder it was registered from (its `export`
parameter, see tasks/register.py): that folder is served when it is still there, so the tokens are
the ones export wrote, without a copy. Otherwise (another machine, a cleaned workspace) the
version's MLflow artifact is downloaded once into `download_dir/NAME/VERSION-KEY`, KEY a digest of
the registry (its URI without user or password) and the version's run and source, so two
registries that both hold `demo/1` never share an entry. The first download runs under a lock
into a draft renamed into place, so concurrent first downloads neither delete each other's result
nor serve a half-written one. Names and versions become path parts only when they are one plain
name, whatever a registry answers. MLflow's transformers flavor keeps the weights under `model/`
and the tokenizer under `components/tokenizer/`; a plain-files version holds the folder itself.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tuneline.core.errors import ConfigError, nearest
from tuneline.core.store.locks import file_lock
from tuneline.core.tracking import runs as tracking
from tuneline.core.tracking.privacy import mask_password

MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")
VERSION_NUMBER = re.compile(r"[0-9]+")
MLFLOW_ALIAS = re.compile(r"[\w-]+")
"""The characters MLflow allows in an alias."""
COMPLETE_MARKER = ".complete"
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
    from mlflow.exceptions import MlflowException

    found = MODEL_URI.match(text)
    if found is None:
        raise ConfigError(f"'{text}' is not a registered model URI; write models:/NAME@ALIAS (such as "
                          "models:/demo@champion) or models:/NAME/VERSION.")
    _check_path_safe_name(found["name"], text=text)
    if found["alias"] is not None and not MLFLOW_ALIAS.fullmatch(found["alias"]):
        raise ConfigError(f"'{text}' names the alias @{found['alias']}, which MLflow cannot hold: an alias has only letters, "
                          "digits, '_' and '-'. Write models:/NAME@ALIAS with such an alias, or models:/NAME/VERSION.")
    try:
        return _registered_folder(text, found["name"], alias=found["alias"], version=found["version"], uri=uri,
                                  download_dir=download_dir)
    except MlflowException as e:  # its message quotes the URI, password included
        raise ConfigError(f"'{text}': the registry at {mask_password(uri)} could not answer: {mask_password(e.message)[:600]} "
                          "Check --workspace, --tracking-uri or MLFLOW_TRACKING_URI and that the server is up.") from e


def _registered_folder(text: str, name: str, *, alias: str | None, version: str | None, uri: str,
                       download_dir: Path) -> RegisteredFolder:
    _check_name(uri, name)
    version = _version(uri, name, alias=alias, version=version)
    if not VERSION_NUMBER.fullmatch(version):
        raise ConfigError(f"'{text}': the registry at {mask_password(uri)} answers version '{version}', which is not a version "
                          "number (MLflow numbers versions 1, 2, ...), so nothing is downloaded for it. The registry holds "
                          "something MLflow never writes; check where --tracking-uri or MLFLOW_TRACKING_URI points.")
    model_version = tracking.client(uri).get_model_version(name, version)
    exported = _exported_folder(uri, model_version.run_id)
    if exported is not None:
        return RegisteredFolder(name, version, exported, exported, "exported folder")
    target = download_dir / name / f"{version}-{_cache_key(uri, run_id=model_version.run_id, source=model_version.source)}"
    if not (target / COMPLETE_MARKER).is_file():
        _download_once(model_version.source, uri=uri, target=target)
    model, tokenizer = _model_layout(target, text=text)
    return RegisteredFolder(name, version, model, tokenizer, "downloaded artifact")


def registry_identity(uri: str) -> str:
    """The registry `uri` names, written one way however it is spelled and without what may change
    or must stay secret: a SQLite or file store by its resolved path; a server by scheme, host, port
    and path, without user, password or query."""
    parts = urlsplit(uri)
    if parts.scheme == "sqlite":
        return f"sqlite:///{Path(uri.removeprefix('sqlite:///').split('?', 1)[0]).resolve()}"
    if parts.scheme in ("", "file"):
        return f"file://{Path(parts.path).resolve()}"
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return f"{parts.scheme.lower()}://{host}{parts.path.rstrip('/')}"


def _cache_key(uri: str, *, run_id: str | None, source: str) -> str:
    return hashlib.sha256("\n".join((registry_identity(uri), run_id or "", source)).encode()).hexdigest()[:16]


def _check_path_safe_name(name: str, *, text: str) -> None:
    """A registered model name becomes a folder of the download cache: it must be one plain name
    (MLflow's own rule), or it could steer the download, and the removal of a stale one, elsewhere."""
    if name == "." or posixpath.normpath(name) != name or name.startswith("..") or any(c in name for c in "/\\\0"):
        raise ConfigError(f"'{text}' names the registered model '{name}', which reads as a path ('..', '/', '\\' or an "
                          "absolute path), not one plain name as MLflow requires of registered models; nothing is "
                          "downloaded for it. Write the model's registered name, such as models:/demo@champion.")


def _check_name(uri: str, name: str) -> None:
    names = tracking.registered_model_names(uri)
    if name in names:
        return
    guess = nearest(name, names)
    hint = f"did you mean '{guess}'? " if guess else ""
    listing = f"its registered models: {', '.join(names[:30])}" if names else "it has no registered models"
    raise ConfigError(f"unknown registered model '{name}' in {mask_password(uri)}; {hint}{listing}. Point --workspace, "
                      "--tracking-uri or MLFLOW_TRACKING_URI at the store the pipeline registered into.")


def _version(uri: str, name: str, *, alias: str | None, version: str | None) -> str:
    if alias is not None:
        aliases = {key: str(value) for key, value in tracking.client(uri).get_registered_model(name).aliases.items()}
        if alias not in aliases:
            held = ", ".join(f"@{key} (version {value})" for key, value in sorted(aliases.items())) or "none"
            raise ConfigError(f"registered model '{name}' has no alias @{alias} in {mask_password(uri)}; its aliases: {held}. "
                              f"Use one of them, models:/{name}/VERSION, or `tuneline promote {name} VERSION` to set @champion.")
        return aliases[alias]
    versions = tracking.model_version_numbers(uri, name)
    if version not in versions:
        raise ConfigError(f"registered model '{name}' has no version {version} in {mask_password(uri)}; its versions are "
                          f"{', '.join(versions) or 'none'}.")
    return str(version)


def _exported_folder(uri: str, run_id: str | None) -> Path | None:
    """The exported folder the registering run recorded, when it still holds a model."""
    if not run_id:
        return None
    recorded = tracking.client(uri).get_run(run_id).data.params.get(EXPORT_PARAM)
    folder = Path(recorded) if recorded else None
    return folder if folder is not None and (folder / "config.json").is_file() else None


def _download_once(source: str, *, uri: str, target: Path) -> None:
    """Download `source` into `target`, by one process or thread at a time: a second one waits on
    the lock and then finds the entry complete. The draft left by a killed download is replaced."""
    from mlflow.artifacts import download_artifacts

    with file_lock(target.with_name(f".{target.name}.lock")):
        if (target / COMPLETE_MARKER).is_file():
            return
        draft = target.with_name(f".{target.name}.partial")
        shutil.rmtree(draft, ignore_errors=True)
        draft.mkdir(parents=True)
        download_artifacts(artifact_uri=source, dst_path=str(draft), tracking_uri=uri)
        (draft / COMPLETE_MARKER).write_text("downloaded\n", encoding="utf-8")  # written last
        shutil.rmtree(target, ignore_errors=True)  # an entry whose marker was removed by hand
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
