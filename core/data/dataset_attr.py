"""`DatasetAttr`: one validated `dataset_info.json` entry, the value every data module passes around.

It has a module of its own so that readers, sources and loaders can name it without importing the
registry file's reader (`dataset_info.py`), which imports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

DEFAULT_TAGS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}
LoadFrom = Literal["hf_hub", "ms_hub", "om_hub", "script", "cloud_file", "file"]


@dataclass(frozen=True)
class DatasetAttr:
    """One validated `dataset_info.json` entry."""

    name: str
    """The entry's key in dataset_info.json."""
    file_name: str | None = None
    """A file or folder: an absolute path as written, or a path inside the dataset folder."""
    hf_hub_url: str | None = None
    """A Hugging Face Hub dataset id; takes precedence over file_name, as in LLaMA-Factory."""
    ms_hub_url: str | None = None
    """A ModelScope dataset id (recognised, not loaded)."""
    om_hub_url: str | None = None
    """A Modelers (openMind) dataset id (recognised, not loaded)."""
    script_url: str | None = None
    """A loading script folder (recognised, not loaded)."""
    cloud_file_name: str | None = None
    """A cloud storage file (recognised, not loaded)."""
    formatting: Literal["alpaca", "sharegpt"] = "alpaca"
    """Row layout: alpaca (instruction/input/output columns) or sharegpt (message lists)."""
    ranking: bool = False
    """Pairwise preference data: the response is [chosen, rejected]."""
    subset: str | None = None
    """Hub datasets: the configuration name (load_dataset's `name`)."""
    split: str = "train"
    """The split to read; local files hold only "train"."""
    folder: str | None = None
    """Hub datasets: the folder inside the repository (load_dataset's `data_dir`)."""
    revision: str | None = None
    """Hub datasets: the branch, tag or commit."""
    num_samples: int | None = None
    """Use this many rows: the first N, repeated in order when the file has fewer."""
    columns: Mapping[str, str] = field(default_factory=dict, hash=False)
    """LLaMA-Factory column keys (prompt, query, ...) to the column names in the file."""
    tags: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_TAGS), hash=False)
    """sharegpt keys and role names: role_tag, content_tag, user_tag, ... with defaults filled."""

    @property
    def load_from(self) -> LoadFrom:
        """The source LLaMA-Factory would read (without USE_MODELSCOPE_HUB/USE_OPENMIND_HUB)."""
        sources: list[tuple[LoadFrom, str | None]] = [
            ("hf_hub", self.hf_hub_url), ("ms_hub", self.ms_hub_url),
            ("om_hub", self.om_hub_url), ("script", self.script_url),
            ("cloud_file", self.cloud_file_name),
        ]
        return next((kind for kind, value in sources if value is not None), "file")
