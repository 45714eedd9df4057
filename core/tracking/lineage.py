"""Lineage tags of a registered model version: where it came from, enough to rebuild it.

`tuneline.key.<stage>` (each stage's cache key, which hashes its config, inputs and upstream keys),
`tuneline.data.<dataset>` (content fingerprints), `tuneline.version` (the package), and
`tuneline.git_commit` (HEAD of the git checkout holding the pipeline YAML, when there is one).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from tuneline.core.store.fingerprints import package_version


def git_commit(directory: str | Path) -> str | None:
    """`git rev-parse HEAD` in `directory`; None outside a checkout, without git, or on any git failure."""
    git = shutil.which("git")
    if git is None or not Path(directory).is_dir():
        return None
    try:
        done = subprocess.run([git, "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def lineage_tags(
    stage_keys: Iterable[tuple[str, str]], fingerprints: Mapping[str, str], *, pipeline_source: str | None
) -> dict[str, str]:
    tags = {f"tuneline.key.{name}": key for name, key in stage_keys}
    tags |= {f"tuneline.data.{name}": digest[:16] for name, digest in fingerprints.items()}
    tags["tuneline.version"] = package_version()
    if pipeline_source:
        tags["tuneline.pipeline_file"] = str(Path(pipeline_source).resolve())
        commit = git_commit(Path(pipeline_source).resolve().parent)
        if commit:
            tags["tuneline.git_commit"] = commit
    return tags
