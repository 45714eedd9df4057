"""Where a workspace lives: a local folder (as always) or an fsspec URL (`s3://bucket/prefix`,
`gs://...`, `abfs://...`).

A text without `scheme://`, or a `file://` URL, is a local folder and keeps every local behaviour.
Any other scheme is a URL whose filesystem fsspec provides (s3fs for `s3://`, in the `cluster`
extra). Credentials, endpoint and region are the filesystem's own business: s3fs and botocore read
the standard AWS variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_DEFAULT_REGION`), and nothing tuneline-specific is passed to them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tuneline.core.errors import ConfigError, unknown_name_message

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
# What to install for the schemes people use most; fsspec's own hint for any other.
_PACKAGE_HINTS = {"s3": "pip install 'tuneline[cluster]' (s3fs)", "s3a": "pip install 'tuneline[cluster]' (s3fs)",
                  "gs": "pip install gcsfs", "gcs": "pip install gcsfs", "abfs": "pip install adlfs", "az": "pip install adlfs"}


@dataclass(frozen=True)
class WorkspaceLocation:
    """A parsed workspace: `path` for a local folder, else `url` (no trailing slash) and its `protocol`."""

    text: str  # as given
    path: Path | None = None
    url: str | None = None
    protocol: str | None = None

    @property
    def is_remote(self) -> bool:
        return self.url is not None

    def artifacts_url(self) -> str:
        return f"{self._remote_url()}/artifacts"

    def artifact_url(self, kind: str, key: str) -> str:
        """`<url>/artifacts/<kind>/<key>`: the layout of a local workspace, in the bucket."""
        return f"{self._remote_url()}/artifacts/{kind}/{key}"

    def _remote_url(self) -> str:
        if self.url is None:
            raise ValueError(f"{self.text} is a local workspace, not a URL")
        return self.url

    def __str__(self) -> str:
        return self.url if self.url is not None else str(self.path)


def parse_workspace(text: str | Path, *, source: str | None = None) -> WorkspaceLocation:
    """A local folder or a URL whose scheme fsspec knows; anything else is a ConfigError naming the
    value, the known schemes and what to install (`source` says where the value came from)."""
    if isinstance(text, Path):
        return WorkspaceLocation(text=str(text), path=text)
    match = _SCHEME.match(text)
    if match is None:
        return WorkspaceLocation(text=text, path=Path(text))
    protocol, rest = match.group(1).lower(), match.group(2)
    if protocol in ("file", "local"):
        return WorkspaceLocation(text=text, path=Path(rest))
    from fsspec.registry import known_implementations, registry

    if protocol not in known_implementations and protocol not in registry:
        unknown = unknown_name_message("URL scheme", protocol, set(known_implementations) | set(registry)).rstrip(".")
        raise ConfigError(f"workspace {text!r}: {unknown}{'' if unknown.endswith('?') else '.'} Give a local folder or an "
                          "object-store URL such as s3://bucket/prefix.", source=source)
    if not rest.strip("/"):
        raise ConfigError(f"workspace {text!r}: the URL names no bucket or container; give one, e.g. {protocol}://bucket/prefix.",
                          source=source)
    return WorkspaceLocation(text=text, url=f"{protocol}://{rest.rstrip('/')}", protocol=protocol)


def filesystem_class(location: WorkspaceLocation, *, source: str | None = None) -> type:
    """fsspec's filesystem class for the URL's scheme; a ConfigError saying what to install when its
    package is missing."""
    import fsspec

    try:
        return fsspec.get_filesystem_class(location.protocol)
    except ImportError as e:
        hint = _PACKAGE_HINTS.get(location.protocol or "", "install the fsspec package for it")
        raise ConfigError(f"workspace {location.url}: the {location.protocol}:// filesystem is not installed ({e}); {hint}.",
                          source=source) from e
