"""Errors that the CLI turns into a one-paragraph message and exit status 2.

Anything else that escapes is a bug or an environment failure and exits 1.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TunelineError(Exception):
    """Bad configuration or input: the message says what, where and how to fix it."""

    exit_code = 2


class ConfigError(TunelineError):
    """One or more problems in a configuration, all listed at once."""

    def __init__(self, problems: str | list[str], *, source: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        where = f" in {source}" if source else ""
        if len(self.problems) == 1:
            message = f"Invalid configuration{where}: {self.problems[0]}"
        else:
            listed = "\n".join(f"  - {p}" for p in self.problems)
            message = f"Invalid configuration{where} ({len(self.problems)} problems):\n{listed}"
        super().__init__(message)


class DataError(TunelineError):
    """A dataset file, row or registry entry that cannot be used as given."""


class ObjectStoreError(TunelineError):
    """An object-store workspace that did not answer after retries, or an object that differs from
    the manifest that vouches for it: the message names the URL, the file and what differs."""


class TrackingServerError(TunelineError):
    """An MLflow tracking server that failed a request after the client's retries: the message names
    the server and what to check."""


def nearest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to `name`, for "did you mean" hints."""
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_name_message(kind: str, name: str, candidates: Iterable[str]) -> str:
    """`unknown <kind> 'x'; did you mean 'y'?` plus the valid names when they are few."""
    options = sorted(candidates)
    guess = nearest(name, options)
    hint = f"; did you mean '{guess}'?" if guess else ""
    listing = f"; valid: {', '.join(options)}." if len(options) <= 30 else ""
    return f"unknown {kind} '{name}'{hint}{listing}"


def listed(names: Iterable[str], *, last: str = "or") -> str:
    """`a, b or c`: names joined for a message."""
    names = list(names)
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else "".join(names)
