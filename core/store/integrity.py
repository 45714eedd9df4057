"""What an artifact's manifest says about its files, and whether the disk still agrees.

A manifest's `files` table holds every file's relative path, size and sha256, hashed once when the
draft is finalised. Serving a cache hit checks only the sizes (a stat per file): a truncated
or deleted file is caught at no cost. `tuneline verify` re-hashes everything and also finds a
changed byte and a file that was added.

Manifests written before the table held hashes map each path to its size: their sizes are
checked, their contents cannot be. A manifest without a table is trusted as it always was. A table
that is not one (an entry without a size, a name outside the artifact: `core.store.names`) is
damage like a missing file, found before any file is read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneline.core.store.names import name_problem

_CHUNK_BYTES = 1 << 20  # hashing streams big weight files in 1 MiB reads


@dataclass(frozen=True)
class FileRecord:
    """One file of an artifact as the manifest recorded it."""

    size: int
    sha256: str | None  # None in manifests written before hashes were recorded


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def record_files(root: Path) -> dict[str, dict[str, Any]]:
    """The manifest's `files` table for the folder `root`: relative path -> size and sha256."""
    return {
        file.relative_to(root).as_posix(): {"size": file.stat().st_size, "sha256": sha256_of(file)}
        for file in sorted(root.rglob("*"))
        if file.is_file()
    }


def recorded_files(manifest: Mapping[str, Any]) -> dict[str, FileRecord] | None:
    """The manifest's file table, or None when it has none (nothing to check against); the caller
    has found no `table_problems`."""
    table = manifest.get("files")
    if not isinstance(table, Mapping):
        return None
    return {name: _record(entry) for name, entry in table.items()}


def table_problems(path: Path, manifest: Mapping[str, Any]) -> list[str]:
    """What makes the manifest's file table unusable for the artifact at `path`: not a table, an
    entry that records no size, a name that is not a file inside the artifact (no file is read)."""
    table = manifest.get("files")
    if table is None:
        return []
    if not isinstance(table, Mapping):
        return ["manifest.json: its 'files' entry is not a table of files"]
    problems = []
    for name, entry in table.items():
        if (why := name_problem(path, name, nested=True)) is not None:
            problems.append(f"manifest.json names the file {name!r}, but {why}")
        elif not _is_record(entry):
            problems.append(f"manifest.json: {name}: no size recorded ({entry!r})")
    return problems


def _is_record(entry: Any) -> bool:
    size = entry.get("size") if isinstance(entry, Mapping) else entry
    digest = entry.get("sha256") if isinstance(entry, Mapping) else None
    return type(size) is int and size >= 0 and (digest is None or isinstance(digest, str))


def _record(entry: Any) -> FileRecord:
    if isinstance(entry, Mapping):
        return FileRecord(size=entry["size"], sha256=entry.get("sha256"))
    return FileRecord(size=entry, sha256=None)  # an older manifest: the size alone


def size_problems(path: Path, manifest: Mapping[str, Any]) -> list[str]:
    """Files that are missing or whose size differs from the manifest's (a stat each, no reads)."""
    if problems := table_problems(path, manifest):
        return problems
    table = recorded_files(manifest)
    if table is None:
        return []
    problems = []
    for name, record in table.items():
        file = path / name
        if not file.is_file():
            problems.append(f"{name}: missing")
        elif (size := file.stat().st_size) != record.size:
            problems.append(f"{name}: {size} bytes, manifest says {record.size}")
    return problems


def content_problems(path: Path, manifest: Mapping[str, Any], *, manifest_name: str) -> list[str]:
    """Everything that differs from the manifest: missing files, sizes, contents (re-hashed), and
    files the manifest does not list."""
    if problems := table_problems(path, manifest):
        return problems
    table = recorded_files(manifest)
    if table is None:
        return []
    problems = size_problems(path, manifest)
    damaged = {problem.split(": ", 1)[0] for problem in problems}
    for name, record in table.items():
        if name not in damaged and record.sha256 is not None and sha256_of(path / name) != record.sha256:
            problems.append(f"{name}: content changed (same size, sha256 differs from the manifest's)")
    on_disk = {f.relative_to(path).as_posix() for f in path.rglob("*") if f.is_file()}
    problems += [f"{name}: extra file, not in the manifest" for name in sorted(on_disk - set(table) - {manifest_name})]
    return problems
