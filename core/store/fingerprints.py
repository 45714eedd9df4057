"""Content fingerprints and stage keys (docs/ARCHITECTURE.md, "Artifacts, keys and runs").

A stage key hashes what decides a stage's output: its name, the config fields that change the
output, its upstream keys, the fingerprints of its input files, the package version and a digest
of the library's own source (so editing `core/` invalidates results computed by the old code,
which Prefect's TASK_SOURCE policy would miss).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

# Files at most this large are hashed whole; larger ones by size, head, middle and tail.
_SMALL_FILE_BYTES = 64 * 1024 * 1024
_SAMPLE_BYTES = 4 * 1024 * 1024
_KEY_DIGITS = 20
_KEY_SHAPE = re.compile(rf"[^./][^/]*-[0-9a-f]{{{_KEY_DIGITS}}}")


def file_fingerprint(path: str | Path) -> dict[str, Any]:
    """size + sha256 of a file (sampled for large files); mtime is recorded but not hashed."""
    path = Path(path)
    stat = path.stat()
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        if stat.st_size <= _SMALL_FILE_BYTES:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        else:
            for offset in (0, stat.st_size // 2, stat.st_size - _SAMPLE_BYTES):
                handle.seek(offset)
                digest.update(handle.read(_SAMPLE_BYTES))
    return {"size": stat.st_size, "mtime": stat.st_mtime, "sha256": digest.hexdigest()}


def tree_fingerprint(paths: Iterable[str | Path]) -> str:
    """One digest over files and folders (every file below a folder), independent of mtime."""
    digest = hashlib.sha256()
    for path in sorted(Path(p) for p in paths):
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        for file in files:
            name = file.relative_to(path).as_posix() if path.is_dir() else file.name
            fp = file_fingerprint(file)
            digest.update(f"{name}\0{fp['size']}\0{fp['sha256']}\n".encode())
    return digest.hexdigest()


def package_version() -> str:
    try:
        return metadata.version("tuneline")
    except metadata.PackageNotFoundError:
        return "0+unknown"


LIBRARY_ROOT = Path(__file__).resolve().parent.parent
"""`core/`: the code whose results stage keys stand for (the store's own folder is one of its parts)."""


@cache
def code_digest() -> str:
    """Digest of the library's source files: results computed by other code get other keys."""
    return source_digest(LIBRARY_ROOT)


def source_digest(root: Path) -> str:
    """Digest of every Python file under `root`, with its path relative to it."""
    digest = hashlib.sha256()
    for file in sorted(root.rglob("*.py")):
        digest.update(file.relative_to(root).as_posix().encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def stage_key(
    stage: str,
    *,
    config: Mapping[str, Any],
    upstream: Mapping[str, str] | None = None,
    inputs: Mapping[str, str] | None = None,
) -> str:
    """The cache key of one stage run: equal keys mean equal outputs."""
    payload = {
        "stage": stage,
        "config": config,
        "upstream": dict(sorted((upstream or {}).items())),
        "inputs": dict(sorted((inputs or {}).items())),
        "version": package_version(),
        "code": code_digest(),
    }
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return f"{stage}-{hashlib.sha256(blob).hexdigest()[:_KEY_DIGITS]}"


def looks_like_key(name: str) -> bool:
    """Whether `name` has the shape of a `stage_key` (`<stage>-<20 hex digits>`): a folder of that
    name in an artifact store is tuneline's even when its manifest is damaged."""
    return _KEY_SHAPE.fullmatch(name) is not None
