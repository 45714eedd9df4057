"""The media of tokenized rows, cut for a batch of their ids: what the training collators do, for the
evaluation and prediction code that runs a model on rows outside the training loop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneline.core.data.media_rows import MediaRows


def media_files(rows: Sequence[Mapping[str, Any]], column: str) -> list[str]:
    """The files of `column` (`images`, `videos`, `audios`) of each row, one list in row order."""
    return [path for row in rows for path in row.get(column) or ()]
@dataclass(frozen=True)
class RowMedia:
    """The media of tokenized rows, cut for a batch of their ids outside the training loop (the held-out
    pairs' log-probabilities, the answers `do_predict` generates)."""

    media: MediaRows
    token_ids: dict[str, int]

    def inputs(self, input_ids: Any, rows: Sequence[Mapping[str, Any]], *, attention_mask: Any = None) -> dict[str, Any]:
        """What the model takes beside `input_ids` (a [batch, n] tensor) for the media of `rows`, one row a line."""
        device = input_ids.device
        inputs = self.media.model_inputs(input_ids.cpu(), media_files(rows, "images"), media_files(rows, "videos"), media_files(rows, "audios"),
                                         token_ids=self.token_ids,
                                         attention_mask=None if attention_mask is None else attention_mask.cpu())
        return {key: value.to(device) if hasattr(value, "to") else value for key, value in inputs.items()}

    @classmethod
    def of_tokenized(cls, tokenized_path: str | Path, tokenizer: Any) -> RowMedia | None:
        """The media of a tokenized dataset's rows, as its tokenization saved them; None for a text dataset."""
        from tuneline.core.data.media_rows import SETTINGS_FILE
        from tuneline.core.data.tokenization import TOKENIZER_DIR

        folder = Path(tokenized_path) / TOKENIZER_DIR
        if not (folder / SETTINGS_FILE).is_file():
            return None
        media = MediaRows.read(folder)
        return cls(media, token_ids=media.token_ids(tokenizer))

    @staticmethod
    def files_of(dataset: Any) -> list[dict[str, Any]]:
        """Each row's media columns (`images`, `videos`, `audios`), those the dataset has."""
        columns = [column for column in ("images", "videos", "audios") if column in dataset.column_names]
        return list(dataset.select_columns(columns)) if columns else [{} for _ in range(len(dataset))]
