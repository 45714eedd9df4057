"""The validation splits of a tokenized dataset, and the names of their metrics.

One split `validation` holds the evaluation rows (`val_size` or `eval_dataset`). With
`eval_on_each_dataset`, each dataset of `eval_dataset` has its own split `validation_<name>`, as
LLaMA-Factory names them, and its metrics are named `eval_<name>_<metric>`: transformers' Trainer
names them so when it evaluates a mapping of datasets (`metric_key_prefix` `eval_<name>`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

VALIDATION = "validation"
EVAL_PREFIX = "eval_"


def split_name(dataset: str) -> str:
    """The split that holds `dataset`'s evaluation rows with `eval_on_each_dataset`."""
    return f"{VALIDATION}_{dataset}"


def per_dataset_splits(split_names: Iterable[str]) -> dict[str, str]:
    """{dataset name: split name} of the per-dataset validation splits among `split_names`."""
    head = VALIDATION + "_"
    return {name[len(head):]: name for name in split_names if name.startswith(head)}


def dataset_metrics(metrics: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    """`metrics` of one evaluation with the dataset's name after `eval_` (other keys, such as
    `epoch`, as they are)."""
    return {(f"{EVAL_PREFIX}{dataset}_{key[len(EVAL_PREFIX):]}" if key.startswith(EVAL_PREFIX) else key): value
            for key, value in metrics.items()}
