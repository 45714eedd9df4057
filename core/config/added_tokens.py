"""The tokens a stage adds to its tokenizer, read from `add_tokens`, `add_special_tokens` and
`new_special_tokens_config` with LLaMA-Factory's meaning.

`add_tokens` and `add_special_tokens` are comma-separated lists; `new_special_tokens_config` is a
YAML file mapping each new special token to a description (whose mean embedding can start the
token's row, `init_special_tokens: desc_init`) and takes the place of `add_special_tokens`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import yaml

from tuneline.core.config.model import ModelConfig
from tuneline.core.errors import ConfigError

DESCRIBED_INITS = ("desc_init", "desc_init_w_noise")
KEY = "new_special_tokens_config"


@dataclass(frozen=True)
class AddedTokens:
    """The tokens to add, in the order they are added (plain ones first, as LLaMA-Factory adds them)."""

    plain: tuple[str, ...] = ()
    special: tuple[str, ...] = ()
    descriptions: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Special token -> its description (from new_special_tokens_config; empty otherwise)."""

    def __bool__(self) -> bool:
        return bool(self.plain or self.special)


def added_tokens(model: ModelConfig) -> AddedTokens:
    """The tokens `model`'s keys add; a ConfigError names the file and key of a config that cannot be read."""
    descriptions = read_token_descriptions(model.new_special_tokens_config) if model.new_special_tokens_config else {}
    special = tuple(descriptions) if descriptions else _listed(model.add_special_tokens)
    return AddedTokens(plain=_listed(model.add_tokens), special=special, descriptions=MappingProxyType(descriptions))


def read_token_descriptions(path: str | Path) -> dict[str, str]:
    """The token -> description mapping of a new_special_tokens_config file."""
    path = Path(path)
    fix = "give a YAML file of lines like '\"<|my_token|>\": \"what the token marks\"'"
    if not path.is_file():
        raise ConfigError(f"'{KEY}: {path}' does not exist (relative paths are read from the current folder); {fix}.")
    try:
        with path.open(encoding="utf-8") as handle:  # a stream, so that YAML's message names the file and line
            loaded = yaml.safe_load(handle)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"'{KEY}: {path}' is not valid YAML ({' '.join(str(e).split())}); {fix}.") from e
    if not isinstance(loaded, dict) or not loaded:
        found = "nothing" if not loaded else f"a {type(loaded).__name__}"
        raise ConfigError(f"'{KEY}: {path}' must map each new special token to its description, and it holds {found}; "
                          f"{fix}.")
    bad = [f"{token!r}: {text!r}" for token, text in loaded.items()
           if not isinstance(token, str) or not token.strip() or not isinstance(text, str)]
    if bad:
        raise ConfigError(f"'{KEY}: {path}' maps tokens to descriptions as text, but has {', '.join(bad[:3])}; "
                          f"quote each token and each description.")
    return {token.strip(): text for token, text in loaded.items()}


def added_token_problems(model: ModelConfig) -> list[str]:
    """The added-token keys that cannot go together, and a token file that cannot be read, one line each."""
    problems = []
    if model.new_special_tokens_config and model.add_special_tokens:
        problems.append(f"'{KEY}' and 'add_special_tokens' both name the special tokens to add (LLaMA-Factory takes the "
                        "file's and ignores the list); keep one.")
    if model.init_special_tokens in DESCRIBED_INITS and not model.new_special_tokens_config:
        problems.append(f"'init_special_tokens: {model.init_special_tokens}' starts each new token from its description, "
                        f"which only '{KEY}' gives (LLaMA-Factory falls back to noise_init); set {KEY} or choose "
                        "'init_special_tokens: noise_init'.")
    if model.new_special_tokens_config:
        try:
            read_token_descriptions(model.new_special_tokens_config)
        except ConfigError as e:
            problems.extend(e.problems)
    return problems


def _listed(value: str | None) -> tuple[str, ...]:
    return tuple(token.strip() for token in (value or "").split(",") if token.strip())
