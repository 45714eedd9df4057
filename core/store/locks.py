"""Locks between processes, on a lock file (`fcntl.flock`, POSIX): exclusive for a writer or a
remover, shared for readers (`core.store.readers`).

The kernel releases a lock when its holder exits, killed or not, so a crashed process never leaves
one behind. Lock files are never removed: a process that removed one while another waited on it
would let a third lock a new file with the same name, and two would then hold "the" lock.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path


@contextmanager
def file_lock(path: str | Path, *, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing); `on_wait` is called once when another
    process holds it and this one has to wait."""
    with _locked(path, wait=True, on_wait=on_wait):
        yield


def lock_if_free(path: str | Path) -> AbstractContextManager[bool]:
    """Hold the lock on `path` if no process holds it, without waiting: yields True while held,
    False (and holds nothing) when another process has it."""
    return _locked(path, wait=False, on_wait=None)


@contextmanager
def shared_lock(path: str | Path) -> Iterator[bool]:
    """Hold a shared lock on `path` (created if missing), waiting while an exclusive holder has it:
    any number of processes share it, and no one takes it exclusively meanwhile. Yields False (and
    holds nothing) when the lock file can be neither created nor opened: a store this process may
    only read, whose owner never created it."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+b")
    except OSError:
        try:
            handle = open(path, "rb")
        except OSError:
            yield False
            return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def _locked(path: str | Path, *, wait: bool, on_wait: Callable[[], None] | None) -> Iterator[bool]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
