"""The champion in the MLflow model registry: automatic promotion after export, and `tuneline promote`
/ `tuneline rollback` by hand.

Every move of the champion alias is appended to the registered model's tag
`tuneline.champion_history` (a JSON list of versions, oldest first, the current champion last), so
a rollback returns to the version that held the alias before. MLflow is reached only through
`core/tracking.py`; the decisions themselves are in `core/promotion.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tuneline.core.errors import ConfigError, nearest
from tuneline.core.tracking import runs as tracking
from tuneline.core.tracking.privacy import mask_password
from tuneline.core.tracking.promotion import CHALLENGER_ALIAS, Decision, metrics_from_tags, push_history

HISTORY_TAG = "tuneline.champion_history"
DEFAULT_ALIAS = "champion"


def registry_uri(workspace: str | Path, *, tracking_uri: str | None, source: str) -> str:
    """The registry a command (`source`) reads: --tracking-uri, else MLFLOW_TRACKING_URI, else the
    workspace's SQLite store, which must exist (opening a missing one would create an empty store)."""
    if tracking_uri:
        return tracking_uri
    uri = tracking.tracking_uri(workspace)
    store = Path(workspace) / "mlflow.db"
    if not os.environ.get("MLFLOW_TRACKING_URI") and not store.is_file():
        raise ConfigError(f"--workspace {workspace}: no MLflow store at {store.resolve()}; pass the workspace a "
                          f"pipeline ran in (--workspace DIR) or --tracking-uri URI.", source=source)
    return uri


def champion(uri: str, *, name: str, alias: str = DEFAULT_ALIAS) -> tuple[str | None, dict[str, float]]:
    """The version behind `alias` and the metrics recorded on it (none: (None, {}))."""
    if name not in tracking.registered_model_names(uri):
        return None, {}
    version = tracking.alias_version(uri, name=name, alias=alias)
    if version is None:
        return None, {}
    return version, metrics_from_tags(tracking.model_version_tags(uri, name=name, version=version))


def apply_decision(uri: str, *, name: str, decision: Decision) -> None:
    """Point the decision's alias at its version; a winner also joins the champion history."""
    if decision.promoted:
        move_champion(uri, name=name, version=decision.version, alias=decision.alias)
    else:
        tracking.set_alias(uri, name=name, alias=CHALLENGER_ALIAS, version=decision.version)


def move_champion(uri: str, *, name: str, version: str, alias: str = DEFAULT_ALIAS) -> str | None:
    """Move `alias` to `version`, remembering the previous holder; returns that previous holder. A
    challenger that becomes champion stops being challenger."""
    previous = tracking.alias_version(uri, name=name, alias=alias)
    history = _history(uri, name=name, current=previous)
    tracking.set_alias(uri, name=name, alias=alias, version=version)
    if tracking.alias_version(uri, name=name, alias=CHALLENGER_ALIAS) == version:
        tracking.delete_alias(uri, name=name, alias=CHALLENGER_ALIAS)
    _write_history(uri, name=name, history=push_history(history, version))
    return previous


def promote(uri: str, *, name: str, version: str, alias: str = DEFAULT_ALIAS) -> str:
    """`tuneline promote`: move the champion to an existing version, by hand. Returns what happened."""
    _check_version(uri, name=name, version=version)
    previous = move_champion(uri, name=name, version=version, alias=alias)
    if previous == version:
        return f"{name}: version {version} already holds @{alias}"
    was = f"from version {previous}" if previous else "(it had no champion)"
    return f"{name}: @{alias} moves to version {version} {was}"


def rollback(uri: str, *, name: str, alias: str = DEFAULT_ALIAS) -> str:
    """`tuneline rollback`: move the champion back to the version that held it before."""
    _check_model(uri, name=name)
    current = tracking.alias_version(uri, name=name, alias=alias)
    history = _history(uri, name=name, current=current)
    if len(history) < 2:
        held = f"version {current} is the only version that has held @{alias}" if current else f"no version holds @{alias}"
        raise ConfigError(f"{name}: nothing to roll back to: {held}. Use `tuneline promote {name} VERSION` to choose one.")
    history.pop()
    target = history[-1]
    tracking.set_alias(uri, name=name, alias=alias, version=target)
    _write_history(uri, name=name, history=history)
    return f"{name}: @{alias} moves back from version {current} to version {target}"


def _history(uri: str, *, name: str, current: str | None) -> list[str]:
    """The stored history, ending with `current` even if the alias was moved outside tuneline."""
    raw = tracking.registered_model_tag(uri, name=name, key=HISTORY_TAG)
    try:
        history = [str(v) for v in json.loads(raw)] if raw else []
    except (ValueError, TypeError):
        history = []
    return push_history(history, current) if current else history


def _write_history(uri: str, *, name: str, history: list[str]) -> None:
    tracking.set_registered_model_tag(uri, name=name, key=HISTORY_TAG, value=json.dumps(history))


def _check_model(uri: str, *, name: str) -> None:
    names = tracking.registered_model_names(uri)
    if name not in names:
        guess = nearest(name, names)
        hint = f"did you mean '{guess}'? " if guess else ""
        listing = f"its registered models: {', '.join(names[:30])}" if names else "it has no registered models"
        raise ConfigError(f"unknown registered model '{name}' in {mask_password(uri)}; {hint}{listing}. Check MODEL_NAME, or point "
                          f"--workspace or --tracking-uri at the store the pipeline registered into.")


def _check_version(uri: str, *, name: str, version: str) -> None:
    _check_model(uri, name=name)
    versions = tracking.model_version_numbers(uri, name)
    if version not in versions:
        raise ConfigError(f"{name} has no version {version!r}; its versions are {', '.join(versions)}. "
                          f"Pass one of them as VERSION.")
