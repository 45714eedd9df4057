"""Artifacts: directories under `<workspace>/artifacts/<kind>/<key>/` with a manifest written last.

A writer fills a temporary sibling (`.<key>.partial`) and renames it into place after writing
`manifest.json`; a directory without a manifest does not exist for any reader. The partial
directory is kept when the work fails only for writers that resume (training checkpoints). Before
the rename every file and folder of the draft is made owner-only and flushed to disk
(`core.store.durable`), so a power loss never leaves an empty manifest under the final name.

Several processes may share a workspace: `artifact_lock` holds an exclusive `flock` on
`.<key>.lock` beside the artifact while one of them computes it, so the others wait and then find
it finished instead of writing the same draft at once.

The manifest records every file's size and sha256 (`core.store.integrity`). An artifact found
damaged (a file missing or of another size, a manifest that is empty, not JSON, not an object, or
names another folder or a file outside its own) is never served: it is moved aside to
`.<key>.damaged` (kept for inspection until `tuneline gc`) and computed again. `tuneline verify` marks the damaged artifacts it finds by
replacing their manifest with `damage.json` (what it found): for every reader they no longer
exist, and the next run sets them aside and says why it recomputes them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from tuneline.core.store.durable import OWNER_ONLY, fsync_path, seal, write_durably
from tuneline.core.store.integrity import record_files
from tuneline.core.store.locks import file_lock

MANIFEST = "manifest.json"
DAMAGE_NOTE = "damage.json"  # what `tuneline verify` found, in place of the manifest


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: Mapping[str, Any]

    @property
    def key(self) -> str:
        return self.manifest["key"]


@dataclass
class ArtifactDraft:
    """What a writer fills in: files go under `path`, results into `metrics` and `extra`."""

    path: Path
    metrics: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def artifact_path(workspace: str | Path, kind: str, key: str) -> Path:
    return Path(workspace) / "artifacts" / kind / key


def partial_path(workspace: str | Path, kind: str, key: str) -> Path:
    return Path(workspace) / "artifacts" / kind / f".{key}.partial"


def lock_path(workspace: str | Path, kind: str, key: str) -> Path:
    return Path(workspace) / "artifacts" / kind / f".{key}.lock"


def damaged_path(workspace: str | Path, kind: str, key: str) -> Path:
    return Path(workspace) / "artifacts" / kind / f".{key}.damaged"


def readers_path(folder: Path) -> Path:
    """The lock file that processes reading the artifact `folder` share (`core.store.readers`)."""
    return folder.with_name(f".{folder.name}.readers")


def artifact_lock(
    workspace: str | Path, kind: str, key: str, *, on_wait: Callable[[], None] | None = None
) -> AbstractContextManager[None]:
    """Hold the exclusive lock on one artifact key across processes (see `core.locks`); `on_wait`
    is called once if another process holds it."""
    return file_lock(lock_path(workspace, kind, key), on_wait=on_wait)


def read_manifest(path: str | Path) -> dict[str, Any] | None:
    file = Path(path) / MANIFEST
    if not file.is_file():
        return None
    return json.loads(file.read_text(encoding="utf-8"))


def own_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest if it is one tuneline wrote for it; None for none, for one that does not
    parse or is not an object, or for another program's (a shared cache may hold any folder)."""
    try:
        manifest = read_manifest(folder)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and names_itself(folder, manifest) else None


def manifest_damage(folder: Path) -> str | None:
    """Why the folder's `manifest.json` is not a manifest of this folder (empty, cut short, not an
    object, naming another kind or key); None when it is one, or when there is none."""
    file = folder / MANIFEST
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"{MANIFEST} cannot be read ({e})"
    judged = judge_manifest(text, folder)
    return judged if isinstance(judged, str) else None


def judge_manifest(text: str, folder: PurePath) -> dict[str, Any] | str:
    """The manifest that `text` holds for `folder` (local, or `kind/key` of an object store), or why
    it is not one (empty, cut short, not an object, naming another kind or key)."""
    if not text.strip():
        return f"{MANIFEST} is empty ({len(text.encode())} bytes)"
    try:
        manifest = json.loads(text)
    except ValueError as e:
        return f"{MANIFEST} is not JSON, cut short or overwritten ({e})"
    if not isinstance(manifest, dict):
        return f"{MANIFEST} holds a JSON {type(manifest).__name__}, not an object"
    if not names_itself(folder, manifest):
        return f"{MANIFEST} names kind {manifest.get('kind')!r} and key {manifest.get('key')!r}, not this folder"
    return manifest


def names_itself(folder: PurePath, manifest: Mapping[str, Any]) -> bool:
    """Whether `manifest` is one tuneline wrote for `folder`: it names the folder's kind and key
    (another program's `manifest.json` in a shared cache folder does not)."""
    return manifest.get("kind") == folder.parent.name and manifest.get("key") == folder.name


def find_artifact(workspace: str | Path, kind: str, key: str) -> Artifact | None:
    """The artifact of `key`, or None when its folder holds no manifest written for it (a damaged
    manifest hides the artifact from readers as a missing one does)."""
    path = artifact_path(workspace, kind, key)
    manifest = own_manifest(path)
    return Artifact(path, manifest) if manifest is not None else None


@contextmanager
def write_artifact(
    workspace: str | Path,
    kind: str,
    key: str,
    *,
    config: Mapping[str, Any],
    inputs: Mapping[str, str] | None = None,
    keep_partial: bool = False,
) -> Iterator[ArtifactDraft]:
    """Yield a draft directory; on success write the manifest last and rename it into place.

    `keep_partial` leaves files of an earlier interrupted attempt (checkpoints) for the writer
    to resume from; otherwise the draft starts empty.
    """
    final = artifact_path(workspace, kind, key)
    draft_dir = partial_path(workspace, kind, key)
    if draft_dir.exists() and not keep_partial:
        shutil.rmtree(draft_dir)
    draft_dir.mkdir(parents=True, exist_ok=True)
    draft_dir.chmod(OWNER_ONLY)  # private while it fills, whatever the umask
    draft = ArtifactDraft(draft_dir)
    try:
        yield draft
    except BaseException:
        if not keep_partial:  # nothing worth resuming from: leave no half-written files behind
            shutil.rmtree(draft_dir, ignore_errors=True)
        raise
    tmp_manifest = draft_dir / f".{MANIFEST}.tmp"
    for leftover in (tmp_manifest, draft_dir / MANIFEST):  # an attempt killed while finishing: not files of the artifact
        leftover.unlink(missing_ok=True)
    manifest = {
        "kind": kind,
        "key": key,
        "inputs": dict(inputs or {}),
        "config": dict(config),
        "metrics": draft.metrics,
        **draft.extra,
        "files": record_files(draft_dir),  # hashed once, here; cache hits compare sizes only
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    seal(draft_dir)  # the files' contents on disk before the manifest that vouches for them
    write_durably(tmp_manifest, json.dumps(manifest, indent=2, sort_keys=True, default=str))
    os.replace(tmp_manifest, draft_dir / MANIFEST)
    fsync_path(draft_dir)  # its entries, the manifest's included
    if own_manifest(final) is not None:  # an equal artifact landed meanwhile (same key, same content): keep it
        shutil.rmtree(draft_dir)
        return
    if final.exists():  # a folder `tuneline verify` marked damaged, or one with a damaged manifest: it gives way
        set_aside(final)
    os.replace(draft_dir, final)
    fsync_path(final.parent)


def set_aside(path: Path) -> Path:
    """Move a damaged artifact folder to `.<key>.damaged` beside it (replacing an older one there),
    out of every reader's sight; return where it went."""
    target = path.with_name(f".{path.name}.damaged")
    if target.exists():
        shutil.rmtree(target)
    os.replace(path, target)
    return target


def mark_damaged(path: Path, problems: list[str], *, manifest: Mapping[str, Any] | None) -> None:
    """Replace the manifest of the artifact folder `path` with a note of `problems` (and of the
    `manifest`, when it could be read): the artifact stops existing for readers, and the run that
    recomputes it reads why. The note is written before the manifest goes, so an interrupted mark
    leaves the artifact as it was, never unmarked and unlisted."""
    tmp_note = path / f".{DAMAGE_NOTE}.tmp"
    tmp_note.write_text(damage_note(problems, manifest=manifest), encoding="utf-8")
    os.replace(tmp_note, path / DAMAGE_NOTE)
    (path / MANIFEST).unlink()


def damage_note(problems: list[str], *, manifest: Mapping[str, Any] | None) -> str:
    """The text of `damage.json`: what was found, and the manifest that vouched for the files."""
    return json.dumps({"problems": problems, "manifest": dict(manifest) if manifest is not None else None},
                      indent=2, default=str)


def damage_noted(path: Path) -> list[str] | None:
    """The problems `mark_damaged` noted in the folder `path`, or None when it holds no note."""
    file = path / DAMAGE_NOTE
    if not file.is_file():
        return None
    try:
        note = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [f"marked damaged ({DAMAGE_NOTE} unreadable)"]
    problems = note.get("problems") if isinstance(note, dict) else None
    return [str(p) for p in problems] if isinstance(problems, list) and problems else ["marked damaged"]
