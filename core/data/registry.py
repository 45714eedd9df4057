"""LLaMA-Factory's `dataset_info.json`: read, validate, and load its local datasets.

Every entry of the file is validated when the file is read, and all problems are reported at
once. Entries keep LLaMA-Factory's meaning: without "columns" an alpaca entry reads
instruction/input/output and a sharegpt entry reads conversations; with "columns" only the
columns given are mapped. Missing sharegpt tags take LLaMA-Factory's defaults (from, value,
human, gpt, observation, function_call, system).

Only local .json/.jsonl files and folders of them are loaded in this version; hub datasets,
multimodal columns and KTO tags are recognised in the file but refused when loaded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tuneline.core.data.loader import (
    SUPPORTED_HELP,
    SUPPORTED_SUFFIXES,
    Record,
    convert_records,
    read_records,
)
from tuneline.core.errors import DataError, unknown_name_message

DATA_CONFIG = "dataset_info.json"
FORMATTINGS = ("alpaca", "sharegpt")
SOURCE_KEYS = ("file_name", "hf_hub_url", "ms_hub_url", "om_hub_url", "script_url",
               "cloud_file_name")
ENTRY_KEYS = SOURCE_KEYS + ("formatting", "ranking", "subset", "split", "folder", "revision",
                            "num_samples", "columns", "tags")
COMMON_COLUMNS = ("system", "tools", "chosen", "rejected", "kto_tag", "images", "videos",
                  "audios")
FORMAT_COLUMNS = {
    "alpaca": ("prompt", "query", "response", "history"),
    "sharegpt": ("messages",),
}
DEFAULT_COLUMNS = {
    "alpaca": {"prompt": "instruction", "query": "input", "response": "output"},
    "sharegpt": {"messages": "conversations"},
}
DEFAULT_TAGS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}
UNSUPPORTED_COLUMNS = ("images", "videos", "audios", "kto_tag")


@dataclass(frozen=True)
class DatasetAttr:
    """One validated `dataset_info.json` entry."""

    name: str
    """The entry's key in dataset_info.json."""
    file_name: str | None = None
    """A file or folder, relative to the dataset folder."""
    hf_hub_url: str | None = None
    """A Hugging Face Hub dataset id; takes precedence over file_name, as in LLaMA-Factory."""
    formatting: Literal["alpaca", "sharegpt"] = "alpaca"
    """Row layout: alpaca (instruction/input/output columns) or sharegpt (message lists)."""
    ranking: bool = False
    """Pairwise preference data: the response is [chosen, rejected]."""
    split: str = "train"
    """The split to read; local files hold only "train"."""
    num_samples: int | None = None
    """Use this many rows: the first N, repeated in order when the file has fewer."""
    columns: Mapping[str, str] = field(default_factory=dict, hash=False)
    """LLaMA-Factory column keys (prompt, query, ...) to the column names in the file."""
    tags: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_TAGS), hash=False)
    """sharegpt keys and role names: role_tag, content_tag, user_tag, ... with defaults filled."""


def read_dataset_info(dataset_dir: str | Path) -> dict[str, DatasetAttr]:
    """Every entry of `dataset_dir/dataset_info.json`, validated; all problems in one DataError."""
    path = _folder(dataset_dir) / DATA_CONFIG
    info = _read_info_file(path)
    problems: list[str] = []
    attrs: dict[str, DatasetAttr] = {}
    for name, entry in info.items():
        entry_problems = _entry_problems(name, entry)
        if entry_problems:
            problems += [f"dataset '{name}': {p}" for p in entry_problems]
        else:
            attrs[name] = _build_attr(name, entry)
    if problems:
        raise DataError(_problems_message(path, problems))
    return attrs


def get_dataset_attrs(names: Sequence[str], dataset_dir: str | Path) -> list[DatasetAttr]:
    """The entries named by `names`, in that order; every unknown name in one DataError."""
    attrs = read_dataset_info(dataset_dir)
    unknown = [unknown_name_message("dataset", name, attrs) for name in names if name not in attrs]
    if unknown:
        path = _folder(dataset_dir) / DATA_CONFIG
        raise DataError(
            f"{'; '.join(unknown)} (datasets are the entries of {path}). Fix the name, or add "
            "an entry for it to that file."
        )
    return [attrs[name] for name in names]


def dataset_file_paths(attr: DatasetAttr, dataset_dir: str | Path) -> list[Path]:
    """The files that make up `attr`: its file, or every file of its folder sorted by name."""
    entry = _entry_label(attr, dataset_dir)
    file_name = _local_file_name(attr, entry=entry)
    path = _folder(dataset_dir) / file_name
    if not path.exists():
        raise DataError(
            f"{entry} points to file_name '{file_name}', but {path} does not exist; create it "
            f"or fix file_name (it is relative to {_folder(dataset_dir)})."
        )
    files = _folder_files(path, entry=entry) if path.is_dir() else [path]
    for file in files:
        if file.suffix.lower() not in SUPPORTED_SUFFIXES:
            raise DataError(
                f"{entry}: cannot read {file} (extension '{file.suffix}'). Supported: "
                f"{SUPPORTED_HELP}. Convert the file or point file_name at another one."
            )
    return files


def load_rows(attr: DatasetAttr, dataset_dir: str | Path) -> list[dict]:
    """The dataset's rows in tuneline's standard shape (see `tuneline.core.data.loader`)."""
    entry = _entry_label(attr, dataset_dir)
    paths = dataset_file_paths(attr, dataset_dir)
    _check_loadable(attr, entry=entry)
    records = [record for path in paths for record in read_records(path, entry=entry)]
    if not records:
        raise DataError(f"{entry} has no rows; add rows to its file(s) or remove the entry.")
    return convert_records(_take(records, attr.num_samples), attr, entry=entry)


def _take(records: list[Record], num_samples: int | None) -> list[Record]:
    """The first `num_samples` records, cycling through them again when there are fewer."""
    if num_samples is None:
        return records
    return [records[i % len(records)] for i in range(num_samples)]


def _folder(dataset_dir: str | Path) -> Path:
    """`dataset_dir` as an absolute path (symlinks kept), so messages name files unambiguously."""
    return Path(dataset_dir).absolute()


def _entry_label(attr: DatasetAttr, dataset_dir: str | Path) -> str:
    return f"dataset '{attr.name}' in {_folder(dataset_dir) / DATA_CONFIG}"


def _local_file_name(attr: DatasetAttr, *, entry: str) -> str:
    if attr.hf_hub_url is not None:
        raise DataError(
            f"{entry} is a hub dataset (hf_hub_url '{attr.hf_hub_url}'), and hub datasets are "
            "not loaded yet in this version of tuneline. Download it, save it as .json or "
            ".jsonl next to dataset_info.json, and give that file as file_name instead."
        )
    if attr.file_name is None:
        raise DataError(
            f"{entry} has no file_name; this version of tuneline loads local files only "
            f"({', '.join(SOURCE_KEYS[2:])} are not supported). Save the data as .json or "
            ".jsonl next to dataset_info.json and set file_name."
        )
    problem = _file_name_problem(attr.file_name)
    if problem:
        raise DataError(f"{entry}: {problem}")
    return attr.file_name


def _check_loadable(attr: DatasetAttr, *, entry: str) -> None:
    unsupported = [key for key in UNSUPPORTED_COLUMNS if key in attr.columns]
    if unsupported:
        raise DataError(
            f"{entry} maps column(s) {', '.join(unsupported)}, which this version of tuneline "
            "does not load (no multimodal or KTO data yet). Remove them from \"columns\"."
        )
    if attr.ranking and not {"chosen", "rejected"} <= set(attr.columns):
        raise DataError(
            f"{entry} has \"ranking\": true but does not map both chosen and rejected; add "
            "them to \"columns\" (the preferred and the rejected response)."
        )
    if attr.split != "train":
        raise DataError(
            f"{entry} asks for split '{attr.split}', but a local file holds only the 'train' "
            "split. Remove \"split\" or put the rows of that split in their own entry."
        )


def _folder_files(folder: Path, *, entry: str) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    if not files:
        raise DataError(f"{entry}: folder {folder} is empty; put .json or .jsonl files in it.")
    for path in files:
        if not path.is_file():
            raise DataError(
                f"{entry}: {path} is not a file; a dataset folder holds data files only "
                "(no sub-folders). Move it out or give its files their own entry."
            )
    return files


def _read_info_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        where = path.parent
        missing = "" if where.is_dir() else f" ({where} itself does not exist)"
        raise DataError(
            f"no {DATA_CONFIG} in dataset_dir {where}{missing}: {path} is not a file. Set "
            f"dataset_dir to the folder that holds {DATA_CONFIG} (LLaMA-Factory's format)."
        )
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}. Fix the "
            "file at that line."
        ) from e
    if not isinstance(info, dict):
        raise DataError(
            f"{path} must hold a JSON object mapping dataset names to entries, not a "
            f"{type(info).__name__}."
        )
    return info


def _problems_message(path: Path, problems: list[str]) -> str:
    if len(problems) == 1:
        return f"{path} has an invalid entry: {problems[0]}."
    listed = "\n".join(f"  - {p}" for p in problems)
    return f"{path} has {len(problems)} problems:\n{listed}"


def _entry_problems(name: str, entry: Any) -> list[str]:
    """Everything wrong with one entry (empty when it is valid)."""
    if not isinstance(entry, dict):
        return [f"the entry must be a JSON object, not {type(entry).__name__}"]
    problems = [unknown_name_message("key", key, ENTRY_KEYS) for key in entry
                if key not in ENTRY_KEYS]
    problems += _source_problems(entry)
    problems += _value_problems(entry)
    formatting = entry.get("formatting", "alpaca")
    if formatting not in FORMATTINGS:
        problems.append(unknown_name_message("formatting", str(formatting), FORMATTINGS))
        return problems
    problems += _columns_problems(entry, formatting=formatting)
    problems += _tags_problems(entry, formatting=formatting)
    return problems


def _source_problems(entry: Mapping[str, Any]) -> list[str]:
    sources = [key for key in SOURCE_KEYS if key in entry]
    if not sources:
        return ["it has no file_name; set file_name to a .json/.jsonl file or a folder of them, "
                "relative to the folder of dataset_info.json"]
    problems = [f"{key} must be a non-empty string" for key in sources
                if not isinstance(entry[key], str) or not entry[key]]
    file_name = entry.get("file_name")
    if isinstance(file_name, str) and file_name:
        problems += [p for p in [_file_name_problem(file_name)] if p]
    return problems


def _file_name_problem(file_name: str) -> str | None:
    """Why `file_name` may not be used: it must stay inside the dataset folder."""
    if os.path.isabs(file_name) or os.path.normpath(file_name).split(os.sep)[0] == "..":
        return (
            f"file_name '{file_name}' points outside the folder of dataset_info.json; move the "
            "data into that folder and give file_name relative to it"
        )
    return None


def _value_problems(entry: Mapping[str, Any]) -> list[str]:
    problems = []
    if not isinstance(entry.get("ranking", False), bool):
        problems.append(f"ranking must be true or false, not {entry['ranking']!r}")
    if not isinstance(entry.get("split", "train"), str):
        problems.append(f"split must be a string, not {entry['split']!r}")
    num_samples = entry.get("num_samples")
    if num_samples is not None and (
        isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1
    ):
        problems.append(f"num_samples must be a positive integer, not {num_samples!r}")
    return problems


def _columns_problems(entry: Mapping[str, Any], *, formatting: str) -> list[str]:
    columns = entry.get("columns", {})
    if not _is_str_mapping(columns):
        return ["columns must be an object mapping column keys to column names (strings)"]
    valid = FORMAT_COLUMNS[formatting] + COMMON_COLUMNS
    problems = []
    for key in (k for k in columns if k not in valid):
        other = next((f for f, keys in FORMAT_COLUMNS.items() if key in keys), None)
        if other is not None:
            problems.append(f"column key '{key}' belongs to {other} datasets, but formatting is "
                            f"'{formatting}'; set \"formatting\": \"{other}\" or remove '{key}'")
        else:
            problems.append(unknown_name_message("column key", key, valid))
    mapped = _mapped_columns(entry, formatting=formatting)
    if formatting == "sharegpt" and "messages" not in mapped:
        problems.append("a sharegpt entry needs columns.messages (the list of messages)")
    return problems


def _tags_problems(entry: Mapping[str, Any], *, formatting: str) -> list[str]:
    if "tags" not in entry:
        return []
    tags = entry["tags"]
    if formatting != "sharegpt":
        return ["tags apply to sharegpt datasets only; set \"formatting\": \"sharegpt\" or "
                "remove tags"]
    if not _is_str_mapping(tags):
        return ["tags must be an object mapping tag keys to strings"]
    return [unknown_name_message("tag", key, DEFAULT_TAGS) for key in tags
            if key not in DEFAULT_TAGS]


def _is_str_mapping(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(v, str) and v for v in value.values()
    )


def _mapped_columns(entry: Mapping[str, Any], *, formatting: str) -> dict[str, str]:
    """LLaMA-Factory's rule: given "columns" replace the defaults instead of adding to them."""
    if "columns" in entry:
        return dict(entry["columns"])
    return dict(DEFAULT_COLUMNS[formatting])


def _build_attr(name: str, entry: Mapping[str, Any]) -> DatasetAttr:
    formatting = entry.get("formatting", "alpaca")
    return DatasetAttr(
        name=name,
        file_name=entry.get("file_name"),
        hf_hub_url=entry.get("hf_hub_url"),
        formatting=formatting,
        ranking=entry.get("ranking", False),
        split=entry.get("split", "train"),
        num_samples=entry.get("num_samples"),
        columns=_mapped_columns(entry, formatting=formatting),
        tags={**DEFAULT_TAGS, **entry.get("tags", {})},
    )
