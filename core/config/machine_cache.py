"""This machine's cache folder, for what outlives a workspace: tokenized data of `tuneline train`,
copies of a URL workspace's artifacts, registry downloads, tables read from installed packages."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$TUNELINE_CACHE`, default ~/.cache/tuneline."""
    return Path(os.environ.get("TUNELINE_CACHE") or Path.home() / ".cache" / "tuneline")
