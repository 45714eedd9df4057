"""Readers of an artifact hold a shared lock that `tuneline gc` respects.

A process that reads an artifact after finding it (a server serving a trained or exported model,
`tuneline train` on its tokenized data) holds a shared `flock` on `.<key>.readers` beside it for as
long as it reads. gc takes that lock exclusively, without waiting, before it removes the artifact:
while any reader holds it, gc keeps the artifact and says that a process is reading it; once the
readers are gone, the next gc removes it. A reader that finds gc mid-removal waits the moment gc
holds the lock, then finds no artifact.

A lock, not a grace period recorded in the manifest: a server may serve one artifact for days,
longer than any period chosen in advance, and the kernel drops the lock of a process that ends,
killed or not, so no reader that is gone keeps anything alive. The reader lock is a file of its own,
not the key's writer lock (`.<key>.lock`): a run recomputing a damaged artifact, or `tuneline
verify` marking one, never waits for a server. A pipeline's stages read their upstream artifacts
without it; gc keeps those as the stages of a recent run.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

from tuneline.core.errors import ConfigError
from tuneline.core.store.artifacts import own_manifest, readers_path
from tuneline.core.store.locks import lock_if_free, shared_lock


def reading_artifact(folder: Path) -> AbstractContextManager[bool]:
    """Hold the shared reader lock of the artifact `folder` (which may not exist yet: a caller about
    to compute it); yields False when a store this process may only read has no lock file."""
    return shared_lock(readers_path(folder))


def without_readers(folder: Path) -> AbstractContextManager[bool]:
    """Hold the reader lock of `folder` exclusively if no process reads it, without waiting: yields
    True while held (no reader can start), False when a reader holds it."""
    return lock_if_free(readers_path(folder))


@contextmanager
def reading_artifacts(paths: Iterable[str | Path | None]) -> Iterator[None]:
    """Hold the reader lock of each of `paths` that is an artifact folder (a manifest written for it;
    other paths are not the store's) while the block runs. An artifact gc removed between finding
    it and locking it is a ConfigError naming it."""
    with ExitStack() as stack:
        for path in paths:
            folder = Path(path) if path is not None else None
            if folder is None or own_manifest(folder) is None:
                continue
            stack.enter_context(reading_artifact(folder))
            if own_manifest(folder) is None:
                raise ConfigError(f"artifact {folder} was removed (tuneline gc) while it was being opened; "
                                  "pass an artifact that exists, or run the pipeline again to recompute it.")
        yield
