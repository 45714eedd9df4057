"""Tokenize a stage's datasets to Arrow: rows in, `input_ids`/`attention_mask`/`labels` out.

The output folder loads with `datasets.load_from_disk` (splits `train` and, with `val_size`,
`validation`) and holds the tokenizer as the template fixed it, under `tokenizer/`, so training,
merging and export all use exactly the tokens this step produced.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuneline.core.config import StageConfig
from tuneline.core.data.processors import encode_pretrain_texts, encode_supervised_row
from tuneline.core.data.registry import dataset_file_paths, get_dataset_attrs, load_rows
from tuneline.core.errors import ConfigError
from tuneline.core.fingerprint import tree_fingerprint
from tuneline.core.templates import chat_template_jinja, fix_tokenizer, get_template

TOKENIZER_DIR = "tokenizer"
PREVIEW_FILE = "preview.txt"
DEFAULT_TEMPLATE = "default"


def dataset_names(value: str | None) -> list[str]:
    return [name.strip() for name in (value or "").split(",") if name.strip()]


def dataset_fingerprints(config: StageConfig) -> dict[str, str]:
    """Content digest of every dataset the stage reads, by dataset name."""
    names = dataset_names(config.data.dataset) + dataset_names(config.data.eval_dataset)
    attrs = get_dataset_attrs(names, config.data.dataset_dir)
    return {attr.name: tree_fingerprint(dataset_file_paths(attr, config.data.dataset_dir)) for attr in attrs}


def read_rows(names: Sequence[str], config: StageConfig) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for attr in get_dataset_attrs(names, config.data.dataset_dir):
        loaded = load_rows(attr, config.data.dataset_dir)
        rows.extend(loaded[: config.data.max_samples] if config.data.max_samples else loaded)
    return rows


def split_rows(rows: list[dict], *, val_size: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, validation), the validation rows drawn by a seeded shuffle of row indices."""
    if not val_size:
        return rows, []
    count = int(val_size) if val_size >= 1 else max(1, round(len(rows) * val_size))
    if count >= len(rows):
        raise ConfigError(f"'val_size: {val_size}' leaves no training rows out of {len(rows)}.")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[:count])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def tokenize_dataset(config: StageConfig, *, tokenizer_path: str | Path, output_dir: str | Path) -> dict[str, int]:
    """Write the tokenized splits and fixed tokenizer to `output_dir`; return the counters."""
    from datasets import Dataset, DatasetDict

    from tuneline.core.model import load_tokenizer

    if not config.data.dataset:
        raise ConfigError("'dataset' is not set; name one or more entries of dataset_info.json.")
    tokenizer = load_tokenizer(tokenizer_path, model=config.model)
    template = get_template(config.data.template or DEFAULT_TEMPLATE)
    fix_tokenizer(template, tokenizer)
    tokenizer.chat_template = chat_template_jinja(template, tokenizer)

    seed = int(config.training.get("seed", 42))
    train_rows, val_rows = split_rows(read_rows(dataset_names(config.data.dataset), config), val_size=config.data.val_size, seed=seed)
    if config.data.eval_dataset:
        val_rows = read_rows(dataset_names(config.data.eval_dataset), config)
    counters: dict[str, int] = {"rows_in": len(train_rows) + len(val_rows)}
    splits = {"train": _encode(train_rows, config, tokenizer, template, counters)}
    if val_rows:
        splits["validation"] = _encode(val_rows, config, tokenizer, template, counters)
    if not len(splits["train"]):
        raise ConfigError(f"no training example is left after tokenization with cutoff_len {config.data.cutoff_len}.")

    output_dir = Path(output_dir)
    DatasetDict({name: Dataset.from_list(examples) for name, examples in splits.items()}).save_to_disk(str(output_dir))
    tokenizer.save_pretrained(output_dir / TOKENIZER_DIR)
    (output_dir / PREVIEW_FILE).write_text(render_preview(splits["train"][0], tokenizer), encoding="utf-8")
    return counters


def _encode(rows: list[dict], config: StageConfig, tokenizer, template, counters: dict[str, int]) -> list[dict]:
    data = config.data
    if config.finetuning.stage == "pt":
        texts = [row["prompt"][0]["content"] for row in rows]
        examples = encode_pretrain_texts(texts, tokenizer=tokenizer, template=template, cutoff_len=data.cutoff_len)
    else:
        encoded = [
            encode_supervised_row(
                row, template=template, tokenizer=tokenizer, cutoff_len=data.cutoff_len,
                train_on_prompt=data.train_on_prompt, mask_history=data.mask_history,
            )
            for row in rows
        ]
        examples = [e for e in encoded if e is not None]
        counters["rows_dropped_nothing_to_train"] = counters.get("rows_dropped_nothing_to_train", 0) + len(encoded) - len(examples)
    counters["examples"] = counters.get("examples", 0) + len(examples)
    counters["total_tokens"] = counters.get("total_tokens", 0) + sum(len(e["input_ids"]) for e in examples)
    counters["trained_tokens"] = counters.get("trained_tokens", 0) + sum(
        sum(1 for label in e["labels"] if label != -100) for e in examples
    )
    return examples


def render_preview(example: dict, tokenizer) -> str:
    """The example as the model sees it: trained spans in [[double brackets]], the rest masked."""
    pieces, current, trained = [], [], None
    for token, label in zip(example["input_ids"], example["labels"]):
        is_trained = label != -100
        if trained is not None and is_trained != trained:
            pieces.append((trained, current))
            current = []
        current.append(token)
        trained = is_trained
    if current:
        pieces.append((trained, current))
    text = "".join(
        f"[[{tokenizer.decode(ids)}]]" if is_trained else tokenizer.decode(ids) for is_trained, ids in pieces
    )
    return f"input_ids: {example['input_ids']}\nlabels: {example['labels']}\n\n{text}\n"
