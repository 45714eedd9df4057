"""Names a record may give for a file of its own folder: a relative path that stays inside it.

A manifest's file table and a user folder's `tuneline_files.json` are read back from disk, where
anyone may have edited them. Every name in them is checked before a file is read, hashed or
deleted: an absolute path, a `..` part or a symlink that resolves outside the folder would reach
files the record does not own.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath


def name_problem(folder: Path | None, name: object, *, nested: bool) -> str | None:
    """Why `name` cannot be a file of `folder` (None: it can). `nested` allows `sub/file`; without
    it a name is one entry of the folder itself. `folder` None: a folder in an object store, which
    has no symlinks (the name alone is checked)."""
    if not isinstance(name, str) or not name or "\0" in name:
        return "it is not a file name"
    pure = PurePosixPath(name)
    if pure.is_absolute():
        return "it is an absolute path"
    if ".." in pure.parts:
        return "it has a '..' part, which leaves the folder"
    if pure.as_posix() != name or not pure.parts or "." in pure.parts:
        return "it is not a plain relative path (an empty or '.' part)"
    if not nested and len(pure.parts) != 1:
        return "it names something below an entry, not an entry of the folder"
    if folder is None:
        return None
    target = folder / name
    if (target.is_symlink() or any((folder / p).is_symlink() for p in _parents(pure))) and not _resolves_inside(folder, target):
        return "it is a symlink that resolves outside the folder"
    return None


def _parents(pure: PurePosixPath) -> list[PurePosixPath]:
    return [PurePosixPath(*pure.parts[:end]) for end in range(1, len(pure.parts))]


def _resolves_inside(folder: Path, target: Path) -> bool:
    return target.resolve().is_relative_to(folder.resolve())
