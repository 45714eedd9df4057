"""Write tokenized examples to Arrow batch by batch, in the layout `datasets.load_from_disk` reads.

Memory stays bounded by one batch however large the dataset: rows are appended to an Arrow IPC
stream as they are encoded, and the small JSON files `datasets` expects are written at the end.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuneline.core.data.media.columns import MEDIA_COLUMNS

ARROW_FILE = "data-00000-of-00001.arrow"
TEXT_LIST_COLUMNS = frozenset(MEDIA_COLUMNS)  # lists of file paths, not of token ids


def _feature(value: Any) -> dict[str, Any]:
    """The `datasets` feature of one column, inferred from a sample value."""
    if isinstance(value, bool):
        return {"dtype": "bool", "_type": "Value"}
    if isinstance(value, int):
        return {"dtype": "int64", "_type": "Value"}
    if isinstance(value, float):
        return {"dtype": "float64", "_type": "Value"}
    if isinstance(value, str):
        return {"dtype": "string", "_type": "Value"}
    if isinstance(value, (list, tuple)):
        return {"feature": {"dtype": "int32", "_type": "Value"}, "_type": "List"}
    raise TypeError(f"cannot store a {type(value).__name__} in a tokenized dataset column")


def _arrow_type(feature: Mapping[str, Any]):
    import pyarrow as pa

    if feature["_type"] == "List":
        return pa.list_(pa.string() if feature["feature"]["dtype"] == "string" else pa.int32())
    return {"bool": pa.bool_(), "int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}[feature["dtype"]]


def _column_array(values: list[Any], feature: Mapping[str, Any]):
    """One column as an Arrow array; token lists go through one flat int32 buffer and their
    offsets, several times faster than converting each list on its own."""
    import numpy as np
    import pyarrow as pa

    if feature["_type"] != "List" or feature["feature"]["dtype"] == "string":
        return pa.array(values, type=_arrow_type(feature))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum([len(value) for value in values], out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError(f"a batch of {offsets[-1]} tokens is too large for one Arrow list array; lower preprocessing_batch_size")
    flat = np.fromiter(itertools.chain.from_iterable(values), dtype=np.int32, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(flat), type=_arrow_type(feature))


class SplitWriter:
    """Appends examples (dicts of equal keys) of one split; `close()` finishes the folder."""

    def __init__(self, folder: str | Path, *, fingerprint: str) -> None:
        self.folder = Path(folder)
        self.fingerprint = fingerprint
        self.features: dict[str, dict[str, Any]] | None = None
        self.rows = 0
        self._sink = None
        self._writer = None

    def write(self, examples: Sequence[Mapping[str, Any]]) -> None:
        if not examples:
            return
        import pyarrow as pa

        if self._writer is None:
            self._open(examples[0])
        arrays = [_column_array([example[name] for example in examples], feature) for name, feature in self.features.items()]
        batch = pa.record_batch(arrays, names=list(self.features))
        self._writer.write_batch(batch)
        self.rows += len(examples)

    def _open(self, sample: Mapping[str, Any]) -> None:
        import pyarrow as pa

        self.features = {name: {"feature": {"dtype": "string", "_type": "Value"}, "_type": "List"} if name in TEXT_LIST_COLUMNS
                         else _feature(value) for name, value in sample.items()}
        schema = pa.schema([(name, _arrow_type(f)) for name, f in self.features.items()])
        self.folder.mkdir(parents=True, exist_ok=True)
        self._sink = pa.OSFile(str(self.folder / ARROW_FILE), "wb")
        self._writer = pa.ipc.new_stream(self._sink, schema)

    def close(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._sink.close()
        info = {"citation": "", "description": "", "features": self.features, "homepage": "", "license": ""}
        state = {
            "_data_files": [{"filename": ARROW_FILE}], "_fingerprint": self.fingerprint[:16], "_format_columns": None,
            "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False, "_split": None,
        }
        (self.folder / "dataset_info.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
        (self.folder / "state.json").write_text(json.dumps(state, indent=2), encoding="utf-8")


def write_dataset_dict(folder: str | Path, splits: Sequence[str]) -> None:
    """The top-level file that makes `folder` a DatasetDict of `splits`."""
    (Path(folder) / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}), encoding="utf-8")
