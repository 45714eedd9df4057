"""Hub datasets (`hf_hub_url`), loaded with `datasets.load_dataset` as LLaMA-Factory does.

`subset`, `folder`, `split` and `revision` become load_dataset's `name`, `data_dir`, `split` and
`revision`. Without a network (or with HF_HUB_OFFLINE=1) only datasets already in the local
`datasets` cache load; anything else is a DataError that says how to use a local file instead.
`token` is the config's `hf_hub_token` (None: huggingface_hub's own login or HF_TOKEN).
ModelScope (`ms_hub_url`) and Modelers (`om_hub_url`) hubs are not used: their ids name other
repositories than the Hugging Face Hub's, so an entry with only those is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneline.core.data.readers import Record
from tuneline.core.errors import DataError

if TYPE_CHECKING:
    from tuneline.core.data.dataset_attr import DatasetAttr

LOAD_FROM_KEYS = {"ms_hub": "ms_hub_url", "om_hub": "om_hub_url", "script": "script_url",
                  "cloud_file": "cloud_file_name"}


def open_hub(attr: DatasetAttr, *, entry: str, streaming: bool = False,
             token: str | None = None) -> Callable[[], Iterator[Record]]:
    """A function that iterates the hub dataset's rows (again on each call)."""
    dataset = _load(attr, entry=entry, streaming=streaming, token=token)
    source = f"hub dataset '{attr.hf_hub_url}' (split '{attr.split}')"

    def records() -> Iterator[Record]:
        for index, row in enumerate(dataset):
            yield Record(source=source, index=index, line=None, data=row)

    return records


def hub_cache_files(attr: DatasetAttr, *, entry: str, token: str | None = None) -> list[Path]:
    """The Arrow files in the local `datasets` cache that hold the hub dataset's split."""
    dataset = _load(attr, entry=entry, streaming=False, token=token)
    return sorted(Path(item["filename"]) for item in dataset.cache_files)


def check_hub_source(attr: DatasetAttr, *, entry: str) -> None:
    """Refuse the sources tuneline does not load: ModelScope, Modelers, scripts and clouds.

    LLaMA-Factory prefers them to `file_name` when both are given, so a file is no fallback.
    """
    if attr.load_from in ("hf_hub", "file"):
        return
    key = LOAD_FROM_KEYS[attr.load_from]
    value = {"ms_hub_url": attr.ms_hub_url, "om_hub_url": attr.om_hub_url,
             "script_url": attr.script_url, "cloud_file_name": attr.cloud_file_name}[key]
    raise DataError(
        f"{entry} loads from {key} '{value}', which tuneline does not support (it "
        "reads local files, and the Hugging Face Hub through hf_hub_url). Download the data, "
        "save it as .json/.jsonl/.parquet next to dataset_info.json, set \"file_name\" to it "
        f"and remove {key}."
    )


def _load(attr: DatasetAttr, *, entry: str, streaming: bool, token: str | None) -> Any:
    import datasets

    try:
        return datasets.load_dataset(
            path=attr.hf_hub_url, name=attr.subset, data_dir=attr.folder, split=attr.split,
            revision=attr.revision, streaming=streaming, token=token,
        )
    except Exception as e:  # load_dataset raises many kinds; each means "not available"
        raise DataError(_failure_message(attr, entry=entry, error=e)) from e


def _failure_message(attr: DatasetAttr, *, entry: str, error: Exception) -> str:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        why = ("the hub is offline here (HF_HUB_OFFLINE=1) and the dataset is not in the local "
               "datasets cache")
    else:
        why = ("the hub is unreachable from here, or the dataset, subset or split does not "
               "exist")
    cause = (str(error).strip().splitlines() or [""])[0][:200]
    local = f"{attr.name}.jsonl"
    return (
        f"{entry}: cannot load hf_hub_url '{attr.hf_hub_url}': {why} ({type(error).__name__}: "
        f"{cause}). Use a local file instead: where the hub is reachable, run "
        f"datasets.load_dataset(\"{attr.hf_hub_url}\", split=\"{attr.split}\")"
        f".to_json(\"{local}\"), put {local} next to dataset_info.json and replace hf_hub_url "
        f"with \"file_name\": \"{local}\" in the entry."
    )
