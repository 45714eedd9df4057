"""A workspace in an object store (`s3://bucket/prefix`, or any fsspec URL): its objects, reached
with retries.

The bucket mirrors a local workspace: `<url>/artifacts/<kind>/<key>/<files>` and the artifact's
`manifest.json` beside them, uploaded last (`core.store.remote_artifacts`). Every request goes
through `RemoteWorkspace.attempt`: an error that may pass (a refused or reset connection, a
timeout, a 5xx or throttling answer) is retried with doubling waits, and one that outlasts them
becomes an `ObjectStoreError` naming the URL. A missing object (FileNotFoundError) and a refused
one (PermissionError) are answers, not outages: they are not retried.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, TypeVar

from tuneline.core.errors import ObjectStoreError
from tuneline.core.store.artifacts import MANIFEST, judge_manifest
from tuneline.core.store.location import WorkspaceLocation, filesystem_class

T = TypeVar("T")
# Transfers of big files: s3fs's multipart uploads and ranged downloads, parts of 16 MiB, 8 at once.
S3_OPTIONS = {"max_concurrency": 8, "default_block_size": 16 << 20,
              # one connection attempt per try here: the waits between tries are `RetryPolicy`'s
              "config_kwargs": {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 1}}}
_FILESYSTEM_OPTIONS: Mapping[str, Mapping[str, Any]] = {"s3": S3_OPTIONS, "s3a": S3_OPTIONS}
_ANSWERS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)  # the store answered: no retry
# The client libraries whose own exception classes mean "no answer" (a refused connection, a timeout):
# fsspec backends raise them as they are, or as OSError.
_CLIENT_PACKAGES = {"botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "google", "azure"}


@dataclass(frozen=True)
class RetryPolicy:
    """How long an unreachable store is waited for: `attempts` tries, the n-th wait `first_wait_s * 2**n`."""

    attempts: int = 5
    first_wait_s: float = 0.5

    def waits(self) -> list[float]:
        return [self.first_wait_s * 2**n for n in range(self.attempts - 1)]


def transient(error: Exception) -> bool:
    """Whether `error` may pass if the request is sent again: a failure to reach the store or a
    5xx/throttling answer (OSError, or the client library's own class), not an answer such as
    "no such object", and not tuneline's own ObjectStoreError."""
    if isinstance(error, (*_ANSWERS, ObjectStoreError)):
        return False
    return isinstance(error, OSError) or type(error).__module__.split(".")[0] in _CLIENT_PACKAGES


class RemoteWorkspace:
    """The objects of one URL workspace, through a filesystem of its own (fsspec's shared instances
    would keep the credentials and endpoint of the first caller)."""

    def __init__(self, location: WorkspaceLocation, *, retry: RetryPolicy = RetryPolicy(), filesystem: Any = None) -> None:
        if not location.is_remote:
            raise ValueError(f"{location} is a local workspace")
        self.location = location
        self.retry = retry
        self._filesystem = filesystem

    @property
    def filesystem(self) -> Any:
        if self._filesystem is None:
            options = _FILESYSTEM_OPTIONS.get(self.location.protocol or "", {})
            self._filesystem = filesystem_class(self.location)(skip_instance_cache=True, **options)
            if self.location.protocol in ("s3", "s3a"):
                self._filesystem.retries = 1  # s3fs's own retries (a class setting): `RetryPolicy` waits instead
        return self._filesystem

    def artifact_url(self, kind: str, key: str, name: str | None = None) -> str:
        folder = self.location.artifact_url(kind, key)
        return folder if name is None else f"{folder}/{name}"

    def attempt(self, what: str, url: str, operation: Callable[[], T]) -> T:
        """Run `operation` (one request, or one transfer), retrying while the store does not answer;
        then an ObjectStoreError saying what failed, on which URL, after how long."""
        started = time.monotonic()
        for wait_s in [*self.retry.waits(), None]:
            try:
                return operation()
            except Exception as error:
                if not transient(error):
                    raise
                if wait_s is None:
                    raise ObjectStoreError(
                        f"the object store did not answer: {what} {url} failed {self.retry.attempts} times over "
                        f"{time.monotonic() - started:.1f} s, the last time with {type(error).__name__}: {error}. Check "
                        f"that the store is up and that AWS_ENDPOINT_URL and the credentials point at it, then run the "
                        f"same command again: nothing half-written is ever served (an artifact counts only once its "
                        f"{MANIFEST} is there).") from error
                time.sleep(wait_s)
        raise AssertionError("unreachable")

    def read_text(self, url: str) -> str | None:
        """An object's text (one GET), or None when there is no such object."""
        try:
            data = self.attempt("reading", url, lambda: self.filesystem.cat_file(url, **self._one_request))
        except FileNotFoundError:
            return None
        return data.decode("utf-8", errors="replace")

    @property
    def _one_request(self) -> dict[str, Any]:
        """cat_file's options that read a small object with one GET: s3fs otherwise asks for its size
        first (a HEAD) to decide whether to split the download."""
        return {"max_concurrency": 1} if self.location.protocol in ("s3", "s3a") else {}

    def write_bytes(self, url: str, data: bytes) -> None:
        self.attempt("writing", url, lambda: self.filesystem.pipe_file(url, data))

    def read_manifest(self, kind: str, key: str) -> dict[str, Any] | None:
        """The artifact's manifest (one GET), None when it has none (not published, or not finished);
        an ObjectStoreError naming it when what is there is not a manifest of that artifact."""
        url = self.artifact_url(kind, key, MANIFEST)
        text = self.read_text(url)
        if text is None:
            return None
        judged = judge_manifest(text, PurePosixPath(kind, key))
        if isinstance(judged, str):
            raise ObjectStoreError(f"{url}: {judged}; the artifact is not served. Run `tuneline verify --workspace "
                                   f"{self.location.url}` to mark it, and the next run computes it again.")
        return judged

    def list_files(self, below: str = "") -> dict[str, int]:
        """Every object under `<url>/artifacts/` (under `<url>/artifacts/<below>/` when given), by its
        path below `artifacts/` (`kind/key/name`), with its size."""
        root = self.location.artifacts_url()
        folder = f"{root}/{below}" if below else root
        try:
            found = self.attempt("listing", folder, lambda: self.filesystem.find(folder, detail=True))
        except FileNotFoundError:
            return {}
        prefix = self.filesystem._strip_protocol(root).rstrip("/") + "/"
        return {path[len(prefix):]: int(info.get("size") or 0) for path, info in found.items()
                if path.startswith(prefix) and info.get("type", "file") == "file"}

    def folder_files(self, kind: str, key: str) -> dict[str, int]:
        """The objects of one artifact folder, by name inside it, with their sizes (one listing)."""
        prefix = f"{kind}/{key}/"
        return {path[len(prefix):]: size for path, size in self.list_files(f"{kind}/{key}").items() if path.startswith(prefix)}

    def remove(self, urls: list[str]) -> None:
        for url in urls:
            try:
                self.attempt("removing", url, lambda url=url: self.filesystem.rm_file(url))
            except FileNotFoundError:
                pass
