"""Artifacts between a URL workspace and the local content-keyed cache (`TUNELINE_CACHE`).

`publish_artifact` uploads a finished local artifact: every file its manifest lists, then the
manifest, which is the commit: an upload cut short leaves objects that no reader trusts, and
publishing again completes it (removing first what the folder holds that the manifest does not list:
a file of the cut-short upload, or `tuneline verify`'s note on a damaged copy). A key already
published (its manifest is there) is left as it is: keys are content-addressed, so it is the same
artifact.

`fetch_artifact` brings an artifact into the cache, where it is a folder exactly as in a local
workspace (`artifacts/<kind>/<key>/`), so every local reader works on it. It reads the remote
manifest (one GET); a cache that already holds the artifact with that manifest's files is served
as it is (no other request). Otherwise every file is downloaded into a temporary sibling, hashed
as it is written and checked against the manifest's size and sha256, and only then is the folder
renamed into place. An object that differs (cut short, altered, missing) is refused by name: the URL, the file
and what differs.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from tuneline.core.errors import ObjectStoreError
from tuneline.core.store.artifacts import (
    MANIFEST,
    Artifact,
    artifact_path,
    find_artifact,
    set_aside,
)
from tuneline.core.store.durable import OWNER_ONLY, fsync_path, seal, write_durably
from tuneline.core.store.integrity import FileRecord, compare_files, recorded_files, size_problems, table_problems
from tuneline.core.store.remote import RemoteWorkspace

_DOWNLOAD = ".fetch-"  # `.<key>.fetch-<pid>-<hex>`: a download in progress beside the cache's artifact folder


def publish_artifact(remote: RemoteWorkspace, artifact: Artifact) -> str:
    """Upload the local `artifact` (files first, manifest last) unless the store has it; its URL."""
    kind, key = artifact.path.parent.name, artifact.path.name
    url = remote.artifact_url(kind, key)
    if remote.read_manifest(kind, key) is not None:
        return url
    if problems := size_problems(artifact.path, artifact.manifest):
        raise ObjectStoreError(f"{artifact.path} is damaged, so it is not uploaded to {url}: {'; '.join(problems)}. "
                               "Run the stage again to recompute it.")
    table = recorded_files(artifact.manifest)
    if table is None:
        raise ObjectStoreError(f"{artifact.path}/{MANIFEST} lists no files (written by an older tuneline), so it cannot be "
                               f"checked after an upload to {url}; run the stage again to recompute it.")
    # What an earlier attempt left that this artifact does not hold (a file of an upload cut short,
    # verify's note on a damaged copy) goes first: the folder ends up holding the manifest's files alone.
    stale = set(remote.folder_files(kind, key)) - set(table) - {MANIFEST}
    remote.remove([f"{url}/{name}" for name in sorted(stale)])
    for name in table:
        remote.upload(artifact.path / name, f"{url}/{name}")
    remote.write_bytes(f"{url}/{MANIFEST}", (artifact.path / MANIFEST).read_bytes())
    return url


def fetch_artifact(remote: RemoteWorkspace, kind: str, key: str, *, cache: Path) -> Artifact | None:
    """The artifact of `key` in the local `cache`, downloaded and verified when the cache lacks it;
    None when the store has no finished artifact of that key."""
    manifest = remote.read_manifest(kind, key)
    if manifest is None:
        return None
    if (cached := _same_artifact(cache, kind, key, manifest)) is not None:
        return cached
    return _download(remote, kind, key, manifest, cache=cache)


def _download(remote: RemoteWorkspace, kind: str, key: str, manifest: dict[str, Any], *, cache: Path) -> Artifact:
    url = remote.artifact_url(kind, key)
    final = artifact_path(cache, kind, key)
    problems = table_problems(None, manifest)
    table = recorded_files(manifest) if not problems else None
    if table is None:
        raise ObjectStoreError(f"{url}/{MANIFEST} is not one tuneline can check files against: "
                               f"{'; '.join(problems) or 'it lists no files'}. The artifact is not served.")
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_downloads(final)
    draft = final.with_name(f".{key}{_DOWNLOAD}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    draft.mkdir(mode=OWNER_ONLY)
    try:
        if problems := _download_files(remote, url, table, draft):
            raise _refused(remote, url, problems)
        seal(draft)  # the files on disk before the manifest that vouches for them, as a writer's
        write_durably(draft / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True, default=str))
        fsync_path(draft)
        if (landed := _same_artifact(cache, kind, key, manifest)) is not None:
            return landed  # another process fetched it meanwhile
        if final.exists():  # an older copy of the key whose files differ: the store's copy replaces it
            set_aside(final)
        try:
            os.replace(draft, final)
        except OSError:  # another process renamed its copy into place between the check and here
            if (landed := _same_artifact(cache, kind, key, manifest)) is None:
                raise
            return landed
        fsync_path(final.parent)
    finally:
        shutil.rmtree(draft, ignore_errors=True)
    return Artifact(final, manifest)


def _download_files(remote: RemoteWorkspace, url: str, table: dict[str, FileRecord], draft: Path) -> list[str]:
    """Download every file of the table into `draft`; what differs from the table (sizes, sha256)."""
    found = {}
    for name, record in table.items():
        (draft / name).parent.mkdir(parents=True, exist_ok=True)
        try:
            found[name] = remote.download(f"{url}/{name}", draft / name, expected_size=record.size)
        except FileNotFoundError:
            return [f"{name}: missing"]
    return compare_files(table, {name: download.size for name, download in found.items()},
                         digest=lambda name: found[name].sha256 or "")


def _refused(remote: RemoteWorkspace, url: str, problems: list[str]) -> ObjectStoreError:
    return ObjectStoreError(f"the artifact {url} differs from its {MANIFEST} in the object store, so it is not served: "
                            f"{'; '.join(problems)}. Run `tuneline verify --workspace {remote.location.url}` to mark it, "
                            "and the next run computes it again.")


def _same_artifact(cache: Path, kind: str, key: str, manifest: dict[str, Any]) -> Artifact | None:
    """The cache's artifact of `key` when it holds the files `manifest` lists, at their sizes."""
    cached = find_artifact(cache, kind, key)
    if cached is None or cached.manifest.get("files") != manifest.get("files") or size_problems(cached.path, cached.manifest):
        return None
    return cached


def _remove_abandoned_downloads(final: Path) -> None:
    """Remove the download folders of this key whose process is gone (killed mid-download)."""
    for folder in final.parent.glob(f".{final.name}{_DOWNLOAD}*"):
        pid = folder.name[len(f".{final.name}{_DOWNLOAD}"):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
