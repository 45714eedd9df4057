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
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tuneline.core.store.names import name_problem

_CHUNK_BYTES = 1 << 20  # hashing streams big weight files in 1 MiB reads


@dataclass(frozen=True)
class FileRecord:
    """One file of an artifact as the manifest recorded it."""

    size: int
    sha256: str | None  # None in manifests written before hashes were recorded


def sha256_of(path: Path) -> str:
    with path.open("rb") as handle:
        return sha256_of_stream(handle)


def sha256_of_stream(handle: BinaryIO) -> str:
    """The sha256 of what `handle` reads to its end (a local file, or an object opened with fsspec)."""
    digest = hashlib.sha256()
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


def table_problems(path: Path | None, manifest: Mapping[str, Any]) -> list[str]:
    """What makes the manifest's file table unusable for the artifact at `path` (None: one in an
    object store): not a table, an entry that records no size, a name that is not a file inside
    the artifact (no file is read)."""
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
    return compare_files(table, _sizes_on_disk(path, table), digest=None)


def content_problems(path: Path, manifest: Mapping[str, Any], *, manifest_name: str) -> list[str]:
    """Everything that differs from the manifest: missing files, sizes, contents (re-hashed), and
    files the manifest does not list."""
    if problems := table_problems(path, manifest):
        return problems
    table = recorded_files(manifest)
    if table is None:
        return []
    on_disk = {f.relative_to(path).as_posix() for f in path.rglob("*") if f.is_file()}
    return compare_files(table, _sizes_on_disk(path, table), digest=lambda name: sha256_of(path / name),
                         extra=on_disk - set(table) - {manifest_name})


def compare_files(table: Mapping[str, FileRecord], sizes: Mapping[str, int], *, digest: Callable[[str], str] | None,
                  extra: Collection[str] = ()) -> list[str]:
    """What differs between the manifest's `table` and the files found (`sizes`, name -> bytes; on
    disk or in an object store): missing files and sizes, then, with `digest` (name -> sha256),
    the contents of the files of the right size, then the `extra` files the manifest does not list."""
    problems = []
    for name, record in table.items():
        if name not in sizes:
            problems.append(f"{name}: missing")
        elif sizes[name] != record.size:
            problems.append(f"{name}: {sizes[name]} bytes, manifest says {record.size}")
    damaged = {problem.split(": ", 1)[0] for problem in problems}
    if digest is not None:
        problems += [f"{name}: content changed (same size, sha256 differs from the manifest's)"
                     for name, record in table.items()
                     if name not in damaged and record.sha256 is not None and digest(name) != record.sha256]
    return problems + [f"{name}: extra file, not in the manifest" for name in sorted(extra)]


def _sizes_on_disk(path: Path, table: Mapping[str, FileRecord]) -> dict[str, int]:
    return {name: (path / name).stat().st_size for name in table if (path / name).is_file()}
