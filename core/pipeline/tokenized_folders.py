"""A stage's tokenized dataset in a folder of the user's (`tokenized_path`, `data preprocess --output`).

The folder holds what a tokenized artifact holds (the splits, the fixed tokenizer, the preview)
and `tokenized_dataset.json`, the record of what it was tokenized for: the examples' shape, the
tokenizer's fingerprint and the data settings. It is written through `store/user_folders.py`
(a draft moved into place, never over the user's own files). Loading one checks the record
against the config, because a dataset tokenized for another shape, tokenizer or template would
train on the wrong tokens without any error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuneline.core.config import StageConfig
from tuneline.core.config.added_tokens import added_tokens
from tuneline.core.data.tokenization import TOKENIZER_DIR
from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.stage_runs import tokenize_params
from tuneline.core.stages.registry import stage_kind
from tuneline.core.store.artifacts import MANIFEST, read_manifest
from tuneline.core.store.user_folders import WRITTEN_RECORD, copy_into, write_user_folder

RECORD = "tokenized_dataset.json"
FORMAT = "tuneline tokenized dataset"
KEY = "tokenized_path"
# The settings that decide which token ids a row becomes: a saved dataset must agree on them, and on
# the tokens added to the vocabulary (`added`: those a new_special_tokens_config file names, not its path).
TOKEN_SETTINGS = ("template", "split_special_tokens")
ADDED_TOKEN_KEYS = ("add_tokens", "add_special_tokens", "new_special_tokens_config")
REQUIRED_ENTRIES = ("dataset_dict.json", "train", TOKENIZER_DIR)


def holds_files(folder: Path) -> bool:
    """Whether `tokenized_path` names a folder with anything in it, which is loaded rather than written."""
    return folder.is_dir() and any(folder.iterdir())


def tokenized_record(config: StageConfig, *, tokenizer_key: str) -> dict[str, Any]:
    """The record of a dataset tokenized for `config`, as its JSON file reads back."""
    tokens = added_tokens(config.model)
    record = {"format": FORMAT, "examples": stage_kind(config.finetuning.stage).examples, "tokenizer": tokenizer_key,
              "settings": tokenize_params(config), "added": {"plain": list(tokens.plain), "special": list(tokens.special)}}
    return json.loads(json.dumps(record, default=str))


def write_record(folder: Path, config: StageConfig, *, tokenizer_key: str, counters: Mapping[str, int]) -> None:
    """The record, with tokenizing's `counters` (rows, tokens, ...) for `data preview` to show."""
    record = {**tokenized_record(config, tokenizer_key=tokenizer_key), "counters": dict(counters)}
    (folder / RECORD).write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")


def saved_counters(folder: Path) -> dict[str, int]:
    """Tokenizing's counters as the folder's record holds them (none in a record without them)."""
    return dict(_read_record(folder).get("counters") or {})


def save_tokenized(folder: Path, *, tokenized: Path, config: StageConfig, tokenizer_key: str) -> Path:
    """Copy the tokenized data at `tokenized` (an artifact of the store) into `folder` with its record."""
    counters = read_manifest(tokenized).get("metrics") or {}

    def write(draft: Path) -> None:
        copy_into(tokenized, draft, skip={MANIFEST})  # the user's folder: their umask, not the store's owner-only modes
        write_record(draft, config, tokenizer_key=tokenizer_key, counters=counters)

    return write_user_folder(folder, write, key=KEY, overwrite=config.output.overwrite_output_dir)


def load_tokenized(folder: Path, *, config: StageConfig, tokenizer_key: str) -> Path:
    """`folder`, checked to be a tokenized dataset tuneline saved for this config's shape, tokenizer
    and token settings; its other data settings are the saved ones (returned by `ignored_settings`)."""
    saved = _read_record(folder)
    missing = [name for name in REQUIRED_ENTRIES if not (folder / name).exists()]
    if missing:
        raise ConfigError(f"'{KEY}: {folder}' is a tokenized dataset with {', '.join(missing)} missing; it was moved or "
                          "deleted in part. Delete the folder (or point the key at a new one) to tokenize into it again.")
    wanted = tokenized_record(config, tokenizer_key=tokenizer_key)
    problems = []
    if saved.get("examples") != wanted["examples"]:
        problems.append(f"'{KEY}: {folder}' holds {saved.get('examples')} examples, and 'stage: {config.finetuning.stage}' "
                        f"trains on {wanted['examples']} ones; point the key at a folder tokenized for this stage, or at a "
                        "new folder to tokenize into.")
    if saved.get("tokenizer") != tokenizer_key:
        problems.append(f"'{KEY}: {folder}' was tokenized with another tokenizer than the one of 'model_name_or_path: "
                        f"{config.model.model_name_or_path}'; point the key at a new folder to tokenize for this model.")
    settings = saved.get("settings") or {}
    # a record written before `added` was kept compares the keys themselves
    compared = TOKEN_SETTINGS if "added" in saved else TOKEN_SETTINGS + ADDED_TOKEN_KEYS
    differing = [f"'{key}' {settings.get(key)!r} there, {wanted['settings'].get(key)!r} here"
                 for key in compared if settings.get(key) != wanted["settings"].get(key)]
    if "added" in saved and saved["added"] != wanted["added"]:
        differing.append(f"added tokens {saved['added']} there, {wanted['added']} here")
    if differing:
        problems.append(f"'{KEY}: {folder}' was tokenized with other token settings ({', '.join(differing)}); set them as "
                        "saved, or point the key at a new folder to tokenize with these.")
    if problems:
        raise ConfigError(problems)
    return folder


def ignored_settings(folder: Path, config: StageConfig) -> list[str]:
    """The data settings of `config` that differ from those `folder` was tokenized with (the saved ones hold)."""
    saved = _read_record(folder).get("settings") or {}
    wanted = tokenized_record(config, tokenizer_key="")["settings"]
    return sorted(key for key, value in wanted.items()
                  if key not in TOKEN_SETTINGS + ADDED_TOKEN_KEYS and saved.get(key) != value)


def _read_record(folder: Path) -> Mapping[str, Any]:
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or record.get("format") != FORMAT or not (folder / WRITTEN_RECORD).is_file():
        shown = ", ".join(sorted(p.name for p in folder.iterdir())[:5])
        raise ConfigError(f"'{KEY}: {folder}' already holds files ({shown}) and is not a tokenized dataset that tuneline "
                          f"saved (it has no readable {RECORD}); tuneline loads only its own tokenized folders and never "
                          "writes into a folder of other files. Point the key at a new or empty folder to tokenize into "
                          "it, or at one a run with tokenized_path or `tuneline data preprocess --output` wrote.")
    return record
