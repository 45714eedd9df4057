"""How a config field is declared: a default and one line of help (shown by `tuneline keys`)."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def documented(text: str, **kwargs: Any) -> Any:
    return field(metadata={"help": text}, **kwargs)
