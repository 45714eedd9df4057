"""A workspace in an object store (`s3://bucket/prefix`, or any fsspec URL): its objects, reached
with retries.

The bucket mirrors a local workspace: `<url>/artifacts/<kind>/<key>/<files>` and the artifact's
`manifest.json` beside them, uploaded last (`core.store.remote_artifacts`). Every request goes
through `RemoteWorkspace.attempt`: an error that may pass (a refused or reset connection, a
timeout, a 5xx or throttling answer) is retried with doubling waits (`RetryPolicy`: 5 tries over
7.5 s unless TUNELINE_STORE_ATTEMPTS and TUNELINE_STORE_RETRY_WAIT_S say otherwise), and one that
outlasts them becomes an `ObjectStoreError` naming the URL. A missing object (FileNotFoundError) and a refused
one (PermissionError) are answers, not outages: they are not retried.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from tuneline.core.errors import ConfigError, ObjectStoreError
from tuneline.core.store.artifacts import MANIFEST, judge_manifest
from tuneline.core.store.location import WorkspaceLocation, filesystem_class

T = TypeVar("T")
# A big download comes in ranges of 16 MiB, 8 at once, hashed while the next ones arrive. Uploads
# keep s3fs's multipart defaults (50 MiB parts, 10 at once): smaller parts measured slower
# (benchmarks/object_store.py).
_PART_BYTES = 16 << 20
_PARTS_AT_ONCE = 8
# one connection attempt per try here: the waits between tries are `RetryPolicy`'s
S3_OPTIONS = {"config_kwargs": {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 1}}}
_FILESYSTEM_OPTIONS: Mapping[str, Mapping[str, Any]] = {"s3": S3_OPTIONS, "s3a": S3_OPTIONS}
_ANSWERS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)  # the store answered: no retry
# The client libraries whose own exception classes mean "no answer" (a refused connection, a timeout):
# fsspec backends raise them as they are, or as OSError.
_CLIENT_PACKAGES = {"botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "google", "azure"}


@dataclass(frozen=True)
class Download:
    """What `RemoteWorkspace.download` wrote: its size, and its sha256 (None: not fetched, the
    object's size already differs)."""

    size: int
    sha256: str | None


ATTEMPTS_ENV = "TUNELINE_STORE_ATTEMPTS"
FIRST_WAIT_ENV = "TUNELINE_STORE_RETRY_WAIT_S"


@dataclass(frozen=True)
class RetryPolicy:
    """How long an unreachable store is waited for: `attempts` tries, the n-th wait `first_wait_s * 2**n`
    (by default 5 tries over 7.5 s of waits)."""

    attempts: int = 5
    first_wait_s: float = 0.5

    def waits(self) -> list[float]:
        return [self.first_wait_s * 2**n for n in range(self.attempts - 1)]

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The policy TUNELINE_STORE_ATTEMPTS and TUNELINE_STORE_RETRY_WAIT_S set, each defaulting to the above."""
        attempts = _setting(ATTEMPTS_ENV, int, cls.attempts, "a whole number of tries, 1 or more, such as 5")
        first_wait_s = _setting(FIRST_WAIT_ENV, float, cls.first_wait_s, "a number of seconds, 0 or more, such as 0.5")
        if attempts < 1 or first_wait_s < 0:
            raise ConfigError(f"{ATTEMPTS_ENV}={attempts} and {FIRST_WAIT_ENV}={first_wait_s}: give 1 or more tries and a wait "
                              "of 0 or more seconds, or unset them for 5 tries from 0.5 s.")
        return cls(attempts=attempts, first_wait_s=first_wait_s)


def _setting(name: str, kind: Callable[[str], T], default: T, expected: str) -> T:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not {expected}; unset it for the default ({default}).") from None


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

    def __init__(self, location: WorkspaceLocation, *, retry: RetryPolicy | None = None, filesystem: Any = None,
                 part_bytes: int = _PART_BYTES, parts_at_once: int = _PARTS_AT_ONCE) -> None:
        if not location.is_remote:
            raise ValueError(f"{location} is a local workspace")
        self.location = location
        self.retry = retry or RetryPolicy.from_env()
        self._filesystem = filesystem
        self.part_bytes = part_bytes  # a download's ranges: objects up to this size take one GET
        self.parts_at_once = parts_at_once

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

    def upload(self, source: Path, url: str) -> None:
        """Upload a local file (in parts, several at once, when it is big)."""
        self.attempt("uploading", url, lambda: self.filesystem.put_file(str(source), url))

    def download(self, url: str, target: Path, *, expected_size: int) -> Download:
        """Download an object to a local file, hashing it as it is written: a small one with one GET,
        a big one (over one part) in ranges of `part_bytes`, `parts_at_once` at a time, while the
        previous ranges are written and hashed. The object's size is asked first only for a big one
        (a HEAD), so one of another size than `expected_size` is not fetched."""
        if expected_size <= self.part_bytes:
            data = self.attempt("downloading", url, lambda: self.filesystem.cat_file(url, **self._one_request))
            target.write_bytes(data)
            return Download(size=len(data), sha256=hashlib.sha256(data).hexdigest())
        size = int(self.attempt("reading the size of", url, lambda: self.filesystem.info(url))["size"])
        if size != expected_size:
            return Download(size=size, sha256=None)
        starts = list(range(0, size, self.part_bytes))
        windows = [starts[i : i + self.parts_at_once] for i in range(0, len(starts), self.parts_at_once)]

        def fetch(window: list[int]) -> list[bytes]:
            ends = [min(start + self.part_bytes, size) for start in window]
            return self.attempt("downloading", url, lambda: self.filesystem.cat_ranges(
                [url] * len(window), window, ends, on_error="raise"))

        digest = hashlib.sha256()
        with ThreadPoolExecutor(max_workers=1) as ahead, target.open("wb") as out:
            pending = ahead.submit(fetch, windows[0])
            for following in [*windows[1:], None]:
                parts = pending.result()
                if following is not None:
                    pending = ahead.submit(fetch, following)
                for part in parts:
                    out.write(part)
                    digest.update(part)
        return Download(size=target.stat().st_size, sha256=digest.hexdigest())

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
