"""Where a dataset's rows come from: its local file or folder, or the Hugging Face Hub."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tuneline.core.data.hub import check_hub_source, hub_cache_files, open_hub
from tuneline.core.data.readers import (
    SUPPORTED_HELP,
    TEXT_COLUMN,
    Record,
    file_type,
    read_file,
)
from tuneline.core.errors import DataError

if TYPE_CHECKING:
    from tuneline.core.data.dataset_attr import DatasetAttr

DATA_CONFIG = "dataset_info.json"


def dataset_folder(dataset_dir: str | Path) -> Path:
    """`dataset_dir` as an absolute path (symlinks kept), so messages name files unambiguously."""
    return Path(dataset_dir).absolute()


def entry_label(attr: DatasetAttr, dataset_dir: str | Path) -> str:
    """`dataset 'x' in /data/dataset_info.json`: how every message names the entry."""
    return f"dataset '{attr.name}' in {dataset_folder(dataset_dir) / DATA_CONFIG}"


def file_name_problem(file_name: str) -> str | None:
    """Why `file_name` may not be used. An absolute path is read as written (the user named that
    file, as LLaMA-Factory's `os.path.join` reads it); a relative one may not climb out of the
    dataset folder with `..`, which LLaMA-Factory allows and tuneline refuses, so that an entry
    copied with its folder never reads a file beside it."""
    if os.path.isabs(file_name):
        return None
    if os.path.normpath(file_name).split(os.sep)[0] == "..":
        return (
            f"file_name '{file_name}' climbs out of the folder of dataset_info.json with '..'; "
            "give the data's absolute path, or move it into that folder and give file_name "
            "relative to it"
        )
    return None


def dataset_file(attr: DatasetAttr, dataset_dir: str | Path) -> Path:
    """The file or folder `attr.file_name` names: itself when absolute, else inside the dataset folder."""
    assert attr.file_name is not None
    name = Path(attr.file_name)
    return name if name.is_absolute() else dataset_folder(dataset_dir) / name


def dataset_file_paths(attr: DatasetAttr, dataset_dir: str | Path, *, token: str | None = None) -> list[Path]:
    """The files that hold `attr`'s rows: its file, every file of its folder sorted by name,
    or, for a hub dataset, the Arrow files of its split in the local `datasets` cache."""
    entry = entry_label(attr, dataset_dir)
    check_hub_source(attr, entry=entry)
    if attr.load_from == "hf_hub":
        return hub_cache_files(attr, entry=entry, token=token)
    return _local_files(attr, dataset_dir, entry=entry)


def open_records(attr: DatasetAttr, dataset_dir: str | Path, *, streaming: bool = False,
                 token: str | None = None) -> tuple[Callable[[], Iterator[Record]], str]:
    """A function that iterates the dataset's raw rows (from the start on each call), and
    the files or hub dataset they come from, for messages."""
    entry = entry_label(attr, dataset_dir)
    check_hub_source(attr, entry=entry)
    if attr.load_from == "hf_hub":
        return (open_hub(attr, entry=entry, streaming=streaming, token=token),
                f"hub dataset '{attr.hf_hub_url}' (split '{attr.split}')")
    _check_local_options(attr, entry=entry)
    paths = _local_files(attr, dataset_dir, entry=entry)
    if file_type(paths[0]) == "text":
        _check_text_columns(attr, entry=entry)

    def records() -> Iterator[Record]:
        for path in paths:
            yield from read_file(path, entry=entry)

    return records, ", ".join(str(path) for path in paths)


def _local_files(attr: DatasetAttr, dataset_dir: str | Path, *, entry: str) -> list[Path]:
    if attr.file_name is None:
        raise DataError(f"{entry} has no file_name; set it to a data file or folder (absolute, or "
                        f"relative to {dataset_folder(dataset_dir)}).")
    problem = file_name_problem(attr.file_name)
    if problem:
        raise DataError(f"{entry}: {problem}.")
    path = dataset_file(attr, dataset_dir)
    if not path.exists():
        relative = "" if os.path.isabs(attr.file_name) else f" (it is relative to {dataset_folder(dataset_dir)})"
        raise DataError(
            f"{entry} points to file_name '{attr.file_name}', but {path} does not exist; create "
            f"it or fix file_name{relative}."
        )
    files = _folder_files(path, entry=entry) if path.is_dir() else [path]
    for file in files:
        if file_type(file) is None:
            raise DataError(
                f"{entry}: cannot read {file} (extension '{file.suffix}'). Supported: "
                f"{SUPPORTED_HELP}. Convert the file or point file_name at another one."
            )
    kinds = sorted({file_type(file) or "" for file in files})
    if len(kinds) > 1:
        raise DataError(
            f"{entry}: folder {path} mixes file types ({', '.join(kinds)}); LLaMA-Factory reads "
            "a folder as one type. Convert the files to one type or give each its own entry."
        )
    return files


def _folder_files(folder: Path, *, entry: str) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    if not files:
        raise DataError(f"{entry}: folder {folder} is empty; put data files in it.")
    for path in files:
        if not path.is_file():
            raise DataError(
                f"{entry}: {path} is not a file; a dataset folder holds data files only "
                "(no sub-folders). Move it out or give its files their own entry."
            )
    return files


def _check_local_options(attr: DatasetAttr, *, entry: str) -> None:
    """Hub-only options on a local entry would be ignored silently; say so instead."""
    if attr.split != "train":
        raise DataError(
            f"{entry} asks for split '{attr.split}', but a local file holds only the 'train' "
            "split. Remove \"split\" or put the rows of that split in their own entry."
        )
    for key, value in (("subset", attr.subset), ("folder", attr.folder),
                       ("revision", attr.revision)):
        if value is not None:
            raise DataError(
                f"{entry} sets \"{key}\": \"{value}\", which applies to hub datasets only; "
                f"remove it, or point file_name at the data it selects."
            )


def _check_text_columns(attr: DatasetAttr, *, entry: str) -> None:
    """A .txt file has one column, "text", as LLaMA-Factory's text loader names it."""
    if attr.formatting != "alpaca" or set(attr.columns.values()) != {TEXT_COLUMN}:
        raise DataError(
            f"{entry} reads .txt files, which have one column, '{TEXT_COLUMN}' (one row per "
            f"line), but the entry maps {dict(attr.columns)}. Set \"columns\": {{\"prompt\": "
            f"\"{TEXT_COLUMN}\"}} (alpaca formatting) for pretraining text."
        )
