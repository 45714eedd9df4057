"""LLaMA-Factory's `dataset_info.json`: read and validate it, and load the datasets it names.

The entries a run names are validated when it reads the file, and all their problems are
reported at once; a problem of an entry the run does not use is only a warning, because
LLaMA-Factory reads nothing but the entries named. A `file_name` is read as LLaMA-Factory joins it
to `dataset_dir` (an absolute path as written), except that a relative one may not climb out of
the folder with `..`. Entries keep LLaMA-Factory's meaning: without "columns" an alpaca entry reads
instruction/input/output and a sharegpt entry reads conversations; with "columns" only the
columns given are mapped. Missing sharegpt tags take LLaMA-Factory's defaults (from, value,
human, gpt, observation, function_call, system), so OpenAI-style messages need only
`{"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}`.
(LLaMA-Factory leaves the tags missing from a given "tags" unset instead, so there a leading
system message makes the row invalid; tuneline reads it as the system prompt.)
A source is chosen as LLaMA-Factory chooses it: hf_hub_url (then ms_hub_url, om_hub_url,
script_url, cloud_file_name) before file_name.

Loading lives in `loading` (rows, reports, streaming), `sources` and `readers` (files and the
hub) and `loader` (row conversion); the public names are re-exported here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuneline.core.data.dataset_attr import DEFAULT_TAGS, DatasetAttr
from tuneline.core.data.loading import (
    LoadReport,
    iter_rows,
    load_rows,
    load_rows_with_report,
)
from tuneline.core.data.media.columns import MEDIA_COLUMNS
from tuneline.core.data.sources import (
    DATA_CONFIG,
    dataset_file_paths,
    dataset_folder,
    file_name_problem,
)
from tuneline.core.errors import DataError, unknown_name_message

__all__ = ["DATA_CONFIG", "DEFAULT_TAGS", "DatasetAttr", "LoadReport", "dataset_file_paths",
           "get_dataset_attrs", "iter_rows", "load_rows", "load_rows_with_report",
           "read_dataset_info"]

FORMATTINGS = ("alpaca", "sharegpt")
SOURCE_KEYS = ("file_name", "hf_hub_url", "ms_hub_url", "om_hub_url", "script_url",
               "cloud_file_name")
ENTRY_KEYS = SOURCE_KEYS + ("formatting", "ranking", "subset", "split", "folder", "revision",
                            "num_samples", "columns", "tags")
COMMON_COLUMNS = ("system", "tools", "chosen", "rejected", "kto_tag", *MEDIA_COLUMNS)
FORMAT_COLUMNS = {
    "alpaca": ("prompt", "query", "response", "history"),
    "sharegpt": ("messages",),
}
DEFAULT_COLUMNS = {
    "alpaca": {"prompt": "instruction", "query": "input", "response": "output"},
    "sharegpt": {"messages": "conversations"},
}
_LOG = logging.getLogger(__name__)
_WARNED: set[tuple[str, str]] = set()  # a run reads the registry several times; each problem is told once


def read_dataset_info(dataset_dir: str | Path) -> dict[str, DatasetAttr]:
    """Every entry of `dataset_dir/dataset_info.json`, validated; all problems in one DataError."""
    path = dataset_folder(dataset_dir) / DATA_CONFIG
    attrs, problems = _validated(_read_info_file(path))
    if problems:
        raise DataError(_problems_message(path, [p for entry in problems.values() for p in entry]))
    return attrs


def get_dataset_attrs(names: Sequence[str], dataset_dir: str | Path) -> list[DatasetAttr]:
    """The entries named by `names`, in that order. As LLaMA-Factory reads only the entries a run
    names, only those must be valid: every unknown name and every problem of a named entry in one
    DataError; a problem of another entry is logged as a warning (once per file and problem)."""
    path = dataset_folder(dataset_dir) / DATA_CONFIG
    info = _read_info_file(path)
    unknown = [unknown_name_message("dataset", name, info) for name in names if name not in info]
    if unknown:
        raise DataError(
            f"{'; '.join(u.rstrip('.') for u in unknown)} (datasets are the entries of {path}). "
            "Fix the name, or add an entry for it to that file."
        )
    attrs, problems = _validated(info)
    named = [p for name in dict.fromkeys(names) for p in problems.get(name, [])]
    if named:
        raise DataError(_problems_message(path, named))
    _warn_unused(path, [p for name, entry in problems.items() if name not in names for p in entry])
    return [attrs[name] for name in names]


def _validated(info: Mapping[str, Any]) -> tuple[dict[str, DatasetAttr], dict[str, list[str]]]:
    """The valid entries as attrs, and the problems of the others by entry name."""
    attrs: dict[str, DatasetAttr] = {}
    problems: dict[str, list[str]] = {}
    for name, entry in info.items():
        entry_problems = _entry_problems(name, entry)
        if entry_problems:
            problems[name] = [f"dataset '{name}': {p}" for p in entry_problems]
        else:
            attrs[name] = _build_attr(name, entry)
    return attrs, problems


def _warn_unused(path: Path, problems: list[str]) -> None:
    fresh = [p for p in problems if (str(path), p) not in _WARNED]
    _WARNED.update((str(path), p) for p in fresh)
    for problem in fresh:
        _LOG.warning("warning: %s: %s (not used by this run, so not an error).", path, problem.rstrip("."))


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
        return f"{path} has an invalid entry: {problems[0].rstrip('.')}."
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
        return ["it has no file_name; set file_name to a data file (.json, .jsonl, .csv, "
                ".parquet, .arrow, .txt) or a folder of them, relative to the folder of "
                "dataset_info.json, or hf_hub_url to a Hugging Face Hub dataset"]
    problems = [f"{key} must be a non-empty string" for key in sources
                if not isinstance(entry[key], str) or not entry[key]]
    file_name = entry.get("file_name")
    if isinstance(file_name, str) and file_name:
        problems += [p for p in [file_name_problem(file_name)] if p]
    return problems


def _value_problems(entry: Mapping[str, Any]) -> list[str]:
    problems = []
    if not isinstance(entry.get("ranking", False), bool):
        problems.append(f"ranking must be true or false, not {entry['ranking']!r}")
    for key in ("split", "subset", "folder", "revision"):
        if key in entry and not (isinstance(entry[key], str) and entry[key]):
            problems.append(f"{key} must be a non-empty string, not {entry[key]!r}")
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
    if entry.get("ranking") is True and "kto_tag" in mapped:
        problems.append("ranking (pairwise) and columns.kto_tag (feedback) exclude each other; "
                        "remove one of them")
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
        **{key: entry.get(key) for key in SOURCE_KEYS},
        formatting=formatting,
        ranking=entry.get("ranking", False),
        subset=entry.get("subset"),
        split=entry.get("split", "train"),
        folder=entry.get("folder"),
        revision=entry.get("revision"),
        num_samples=entry.get("num_samples"),
        columns=_mapped_columns(entry, formatting=formatting),
        tags={**DEFAULT_TAGS, **entry.get("tags", {})},
    )
