"""Checks of a local tokenizer or model folder before transformers opens it.

transformers reports an empty folder, a missing or damaged file, or a folder that ships its own
code with exceptions several layers deep (or, for custom code, by loading a built-in class in its
place); these checks say what is wrong with the folder and how to fix it, and run before anything
in the folder is read as code.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tiktoken.model")
JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "special_tokens_map.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
TRUST_FIX = "set 'trust_remote_code: true' if you trust where the folder comes from, or use a folder without custom code"


def tokenizer_folder_problem(folder: Path, *, key: str, trust_remote_code: bool) -> str | None:
    """Why the tokenizer in `folder` cannot be loaded as it is, or None."""
    names = _entries(folder)
    if not names:
        return f"'{key}: {folder}' is an empty folder; put a tokenizer's files in it (tokenizer.json and tokenizer_config.json)."
    if not any(name in names for name in TOKENIZER_FILES):
        return (f"'{key}: {folder}' has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); it holds "
                f"{_listing(names)}. Copy the tokenizer's files into it or point {key} at the folder that has them.")
    return _json_problem(folder, names, key=key) or (
        None if trust_remote_code else _custom_code_problem(folder, "tokenizer_config.json", key=key, classes=("AutoTokenizer",)))


def model_folder_problem(folder: Path, *, key: str, trust_remote_code: bool) -> str | None:
    """Why the model in `folder` cannot be loaded as it is, or None (pickle weights are checked apart)."""
    names = _entries(folder)
    if not names:
        return f"'{key}: {folder}' is an empty folder; put a model's files in it (config.json and *.safetensors weights)."
    if "config.json" not in names:
        return (f"'{key}: {folder}' has no config.json, so it holds no model; it holds {_listing(names)}. Point {key} "
                "at the folder of a saved model (config.json and its weights).")
    problem = _json_problem(folder, names, key=key)
    if problem:
        return problem
    if not trust_remote_code:
        problem = _custom_code_problem(folder, "config.json", key=key, classes=None)
        if problem:
            return problem
    if not any(name.endswith(WEIGHT_SUFFIXES) for name in names):
        return (f"'{key}: {folder}' has a config.json but no weights (no *.safetensors file); copy the model's weight "
                "files into it, or save the model again with save_pretrained.")
    return None


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def _listing(names: list[str]) -> str:
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def _json_problem(folder: Path, names: list[str], *, key: str) -> str | None:
    for name in (n for n in JSON_FILES if n in names):
        stat = (folder / name).stat()
        damage = _json_damage(str(folder / name), stat.st_size, stat.st_mtime_ns)
        if damage:
            return f"'{key}: {folder}': {name} {damage}; copy it again from where the folder came from."
    return None


@functools.lru_cache(maxsize=64)
def _json_damage(path: str, size: int, mtime_ns: int) -> str | None:
    """What is wrong with the JSON file at `path`, or None; remembered by size and modification time,
    since a tokenizer.json of a large vocabulary takes half a second to parse and the same folder is
    checked by every stage that loads it."""
    try:
        json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        return "is not UTF-8 text, so it is damaged"
    except json.JSONDecodeError as e:
        return f"does not parse ({e.msg} at line {e.lineno}, column {e.colno}), so the file is cut short or damaged"
    return None


def _custom_code_problem(folder: Path, config_file: str, *, key: str, classes: tuple[str, ...] | None) -> str | None:
    """A config whose `auto_map` names classes in the folder's own Python files (for `classes`, or any)."""
    try:
        auto_map = json.loads((folder / config_file).read_text(encoding="utf-8")).get("auto_map")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(auto_map, (list, tuple)):  # older tokenizer configs: [slow, fast] for AutoTokenizer
        auto_map = {"AutoTokenizer": auto_map}
    if not isinstance(auto_map, dict):
        return None
    named = {name: ref for name, ref in auto_map.items() if classes is None or name in classes}
    if not named:
        return None
    code = sorted(p.name for p in folder.glob("*.py")) or ["code it names from the Hub"]
    what = "tokenizer" if classes == ("AutoTokenizer",) else "model"
    return (f"'{key}: {folder}' ships its own {what} code, which runs only with 'trust_remote_code: true', and that is "
            f"false ({config_file} maps {', '.join(sorted(named))} to {', '.join(code)}); {TRUST_FIX}.")
