"""`tuneline gc`: the artifacts and drafts of a workspace (or of the tokenized-data cache, whose
store has a workspace's layout) that nothing needs, and removing them.

Needed (kept): every artifact whose key `referenced` names (the caller gathers the keys of recent
runs' stages and of registered model versions, `core.tracking.references`), and every draft
(`.<key>.partial`) that a running process holds the lock of, or that a recent run references
(a killed run resumes from it). Garbage: unreferenced artifacts, drafts whose artifact is finished
or that nothing references and no process holds, folders set aside as damaged (`.<key>.damaged`),
artifact folders without a manifest that `tuneline verify` marked damaged, and folders named like a
stage key whose `manifest.json` is damaged (empty, cut short, not an object). What tuneline did not
write (a folder without its manifest or verify's note, another program's `manifest.json` in a
folder not named like a key) is left alone. Lock files stay: see `core.store.locks`.

Garbage that a process is reading (`core.store.readers`) is listed as in use and kept until its
readers are gone. Removal takes each key's lock and its reader lock first, without waiting
(skipping what a process took meanwhile), and deletes an artifact's manifest before its files, so
no reader ever sees half an artifact.

A URL workspace (`find_remote_garbage`) is judged by the same rules (`judge_folder`) from one
listing and a read of each manifest; its readers hold no lock there (they fetch into their own
cache, `core.store.remote_artifacts`), and its manifests are removed before their files too.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Collection, Iterator, Set
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tuneline.core.store.artifacts import DAMAGE_NOTE, MANIFEST, damage_noted, judge_manifest, lock_path, manifest_damage, own_manifest
from tuneline.core.store.fingerprints import looks_like_key
from tuneline.core.store.locks import lock_if_free
from tuneline.core.store.readers import without_readers
from tuneline.core.store.remote import RemoteWorkspace
from tuneline.core.store.verify import remote_folders

_PARTIAL, _DAMAGED, _LOCK = ".partial", ".damaged", ".lock"
UNREFERENCED = "artifact that no recent run or registered model references"


@dataclass(frozen=True)
class Garbage:
    """One folder `tuneline gc` would remove."""

    path: Path | str  # a folder, or its URL in an object store
    kind: str
    key: str
    size: int  # bytes, all files below
    reason: str
    in_use: bool = False  # a process reads it (`core.store.readers`): listed, kept until it stops


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def find_garbage(workspace: str | Path, *, referenced: Set[str], kinds: Collection[str] | None = None,
                 unreferenced: str = UNREFERENCED) -> list[Garbage]:
    """What nothing needs, kind by kind (only `kinds` when given), key by key (nothing is removed);
    `unreferenced` says why a finished artifact whose key `referenced` lacks goes."""
    found = []
    for kind_dir in sorted(p for p in (Path(workspace) / "artifacts").glob("*") if p.is_dir()):
        if kinds is not None and kind_dir.name not in kinds:
            continue
        for entry in sorted(p for p in kind_dir.iterdir() if p.is_dir()):
            key, reason = _judge(entry, referenced=referenced, unreferenced=unreferenced)
            if reason is not None and _lock_is_free(workspace, kind_dir.name, key):
                found.append(Garbage(path=entry, kind=kind_dir.name, key=key, size=folder_size(entry), reason=reason,
                                     in_use=not _unread(kind_dir / key)))
    return found


def _judge(entry: Path, *, referenced: Set[str], unreferenced: str) -> tuple[str, str | None]:
    """The folder's key, and why it is garbage (None: it is kept)."""
    return judge_folder(entry.name, finished=lambda name: own_manifest(entry.with_name(name)) is not None,
                        noted=lambda: damage_noted(entry) is not None, unusable=lambda: manifest_damage(entry),
                        referenced=referenced, unreferenced=unreferenced)


def judge_folder(name: str, *, finished: Callable[[str], bool], noted: Callable[[], bool],
                 unusable: Callable[[], str | None], referenced: Set[str], unreferenced: str) -> tuple[str, str | None]:
    """The key of the folder `name` of a kind, and why it is garbage (None: it is kept), wherever it
    lies: `finished(name)` says whether a folder of that kind holds the manifest tuneline wrote for
    it, `noted()` whether `tuneline verify` marked this one damaged, `unusable()` why its
    manifest.json is not one."""
    if name.startswith(".") and name.endswith(_PARTIAL):
        key = name[1 : -len(_PARTIAL)]
        if finished(key):
            return key, "draft superseded by its finished artifact"
        return key, None if key in referenced else "draft that no recent run references"
    if name.startswith(".") and name.endswith(_DAMAGED):
        return name[1 : -len(_DAMAGED)], "damaged artifact, set aside"
    if name.startswith("."):
        return name, None  # nothing tuneline writes: left alone
    if not finished(name):  # no manifest, or not tuneline's for this folder: left alone unless verify marked it
        if noted():
            return name, "artifact marked damaged by tuneline verify"
        why = unusable() if looks_like_key(name) else None
        return name, f"damaged artifact: {why}" if why else None
    return name, None if name in referenced else unreferenced


def _lock_is_free(workspace: str | Path, kind: str, key: str) -> bool:
    with lock_if_free(lock_path(workspace, kind, key)) as free:
        return free


def _unread(artifact: Path) -> bool:
    with without_readers(artifact) as unread:
        return unread


def remove_garbage(workspace: str | Path, garbage: list[Garbage]) -> Iterator[Garbage]:
    """Remove each folder that no process reads, under its key's lock and its reader lock; yield
    those removed (one that a process took or started reading meanwhile stays)."""
    for item in garbage:
        if item.in_use:
            continue
        with (lock_if_free(lock_path(workspace, item.kind, item.key)) as free,
              without_readers(item.path.with_name(item.key)) as unread):
            if not free or not unread or not item.path.exists():
                continue
            (item.path / MANIFEST).unlink(missing_ok=True)  # first: readers stop seeing it at once
            shutil.rmtree(item.path)
            yield item


def find_remote_garbage(remote: RemoteWorkspace, *, referenced: Set[str], kinds: Collection[str] | None = None,
                        unreferenced: str = UNREFERENCED) -> list[Garbage]:
    """`find_garbage` for a URL workspace: the same judgement of each folder, from the store."""
    folders = remote_folders(remote.list_files())
    judged: dict[tuple[str, str], dict | str | None] = {}

    def manifest(kind: str, name: str) -> dict | str | None:
        """The folder's manifest, why it is not one, or None when it has none (read once)."""
        if (kind, name) not in judged:
            objects = folders.get((kind, name), {})
            text = remote.read_text(remote.artifact_url(kind, name, MANIFEST)) if MANIFEST in objects else None
            judged[kind, name] = judge_manifest(text, PurePosixPath(kind, name)) if text is not None else None
        return judged[kind, name]

    found = []
    for (kind, name), objects in sorted(folders.items()):
        if kinds is not None and kind not in kinds:
            continue
        key, reason = judge_folder(
            name, finished=lambda other, kind=kind: isinstance(manifest(kind, other), dict),
            noted=lambda objects=objects: DAMAGE_NOTE in objects,
            unusable=lambda kind=kind, name=name: why if isinstance(why := manifest(kind, name), str) else None,
            referenced=referenced, unreferenced=unreferenced)
        if reason is not None:
            found.append(Garbage(path=remote.artifact_url(kind, name), kind=kind, key=key, size=sum(objects.values()),
                                 reason=reason))
    return found


def remove_remote_garbage(remote: RemoteWorkspace, garbage: list[Garbage]) -> Iterator[Garbage]:
    """Remove each folder's objects from the store, its manifest first; yield those removed."""
    listing = remote_folders(remote.list_files())
    for item in garbage:
        name = str(item.path).rsplit("/", 1)[-1]
        objects = sorted(listing.get((item.kind, name), {}), key=lambda object_name: object_name != MANIFEST)
        remote.remove([remote.artifact_url(item.kind, name, object_name) for object_name in objects])
        yield item
