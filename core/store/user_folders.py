"""Writing into a folder the user names (`--output`, `export_dir`) without touching their files.

A command writes its result into a hidden sibling draft, then moves the draft's entries into the
folder and records their names in `tuneline_files.json`, written last. Only entries that record
names are tuneline's: a later run may replace those, and nothing else. A folder that holds other
files is refused unless `overwrite_output_dir: true`; even then its other files stay, and a file of
the user's that has the name of an entry the command writes is refused instead of replaced. A
record naming anything but an entry of the folder itself (an absolute path, `..`, `sub/file`, a
symlink out of the folder) is refused before anything is read or deleted.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Collection
from pathlib import Path

from tuneline.core.errors import ConfigError
from tuneline.core.store.names import name_problem

WRITTEN_RECORD = "tuneline_files.json"
OVERWRITE_FIX = "set 'overwrite_output_dir: true' to write beside them (tuneline never deletes files it did not write)"


def written_entries(folder: Path) -> set[str]:
    """The entries of `folder` that tuneline wrote, as its record names them (none without one); a
    ConfigError for a record naming something that is not an entry of the folder."""
    try:
        names = json.loads((folder / WRITTEN_RECORD).read_text(encoding="utf-8"))["entries"]
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    if not isinstance(names, list):
        return set()
    for name in names:
        if (why := name_problem(folder, name, nested=False)) is not None:
            raise ConfigError(f"{folder / WRITTEN_RECORD} lists the entry {name!r} as one tuneline wrote, but {why}; "
                              f"tuneline replaces only entries of {folder} itself, so nothing was read or deleted. "
                              f"Remove that entry from {WRITTEN_RECORD} (or the file itself, and then the folder's "
                              "entries count as yours), or choose another folder.")
    return set(names) | {WRITTEN_RECORD}


def foreign_entries(folder: Path) -> list[str]:
    """The entries of `folder` that tuneline did not write, sorted (none when it does not exist)."""
    if not folder.is_dir():
        return []
    ours = written_entries(folder)
    return sorted(p.name for p in folder.iterdir() if p.name not in ours)


def check_user_folder(folder: Path, *, key: str, overwrite: bool) -> None:
    """Refuse a `folder` that holds files tuneline did not write, unless `overwrite`; refuse a file in its place."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{key} {folder} is a file, not a folder; choose a folder path (the file is left as it is).")
    foreign = foreign_entries(folder)
    if foreign and not overwrite:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ConfigError(f"{key} {folder} already holds files that tuneline did not write ({shown}); choose an empty "
                          f"or new folder, or {OVERWRITE_FIX}.")


def write_user_folder(folder: str | Path, write: Callable[[Path], None], *, key: str, overwrite: bool) -> Path:
    """Run `write(draft)` on an empty draft beside `folder`, then move its entries into `folder`,
    replacing only entries tuneline wrote there before. On failure the folder is as it was."""
    folder = Path(folder)
    check_user_folder(folder, key=key, overwrite=overwrite)
    draft = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(draft, ignore_errors=True)  # our own draft, left by a killed run
    try:
        write(draft)
        _place(draft, folder, key=key)
    finally:
        shutil.rmtree(draft, ignore_errors=True)
    return folder


def _place(draft: Path, folder: Path, *, key: str) -> None:
    new = sorted(p.name for p in draft.iterdir())
    if not folder.exists():
        (draft / WRITTEN_RECORD).write_text(json.dumps({"entries": new}, indent=1), encoding="utf-8")
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.replace(draft, folder)
        return
    ours = written_entries(folder)
    clash = [name for name in new if (folder / name).exists() and name not in ours]
    if clash:
        raise ConfigError(f"{key} {folder} holds {', '.join(clash)}, which tuneline did not write and would have to "
                          "replace; move or rename them, or choose another folder.")
    (folder / WRITTEN_RECORD).unlink(missing_ok=True)  # while entries change, the folder is not a finished output
    for name in sorted(ours - {WRITTEN_RECORD}):
        _remove(folder / name)
    for name in new:
        os.replace(draft / name, folder / name)
    (folder / WRITTEN_RECORD).write_text(json.dumps({"entries": new}, indent=1), encoding="utf-8")


def copy_into(source: Path, target: Path, *, skip: Collection[str] = ()) -> None:
    """Copy the folder `source` (an artifact: owner-only) into `target`, leaving out files named in
    `skip`. Modes are not copied: the user's umask sets them, as for every file written there."""
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.rglob("*")):
        copy = target / path.relative_to(source)
        if path.is_dir():
            copy.mkdir(exist_ok=True)
        elif path.name not in skip:
            shutil.copyfile(path, copy)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
