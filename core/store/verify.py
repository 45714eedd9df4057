"""`tuneline verify`: re-hash every artifact of a workspace (or of the tokenized-data cache,
whose store has a workspace's layout) against its manifest.

A damaged artifact is marked (`artifacts.mark_damaged`: its manifest gives way to `damage.json`,
which lists what was found) rather than deleted: no run serves it from then on, the next run that
needs its key sets it aside and recomputes it (tagging its MLflow run with the reason), and `tuneline
gc` removes what nothing needs. Marking, not moving, keeps it where a person looking for the
artifact of that key will find it, with the reason beside it. A folder named like a stage key whose
`manifest.json` is damaged (empty, cut short, not an object) is reported and marked the same way.

A URL workspace (`verify_remote`) is checked the same way in the store: one listing gives every
object's size, each object is re-hashed as it streams in (nothing is kept on disk), and a damaged
artifact is marked there (`damage.json` uploaded, then its manifest removed). No run of any host
fetches it from then on.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tuneline.core.store.artifacts import (
    DAMAGE_NOTE,
    MANIFEST,
    Artifact,
    artifact_lock,
    damage_note,
    judge_manifest,
    manifest_damage,
    mark_damaged,
    own_manifest,
)
from tuneline.core.store.fingerprints import looks_like_key
from tuneline.core.store.integrity import compare_files, content_problems, recorded_files, sha256_of_stream, table_problems
from tuneline.core.store.remote import RemoteWorkspace


@dataclass(frozen=True)
class Verdict:
    """What `verify_workspace` found for one artifact."""

    path: Path | str  # a folder, or an artifact's URL in an object store
    problems: list[str]
    checked: bool  # False: its manifest has no file table to check against (written by an older tuneline)

    @property
    def damaged(self) -> bool:
        return bool(self.problems)


def finished_artifacts(workspace: str | Path, *, kinds: Collection[str] | None = None) -> Iterator[Artifact]:
    """Every artifact of the workspace that readers see (a folder with the manifest tuneline wrote
    for it), by kind and key; only those of `kinds` when given."""
    for manifest_file in sorted((Path(workspace) / "artifacts").glob(f"*/*/{MANIFEST}")):
        folder = manifest_file.parent
        if folder.name.startswith(".") or (kinds is not None and folder.parent.name not in kinds):
            continue
        manifest = own_manifest(folder)
        if manifest is not None:
            yield Artifact(folder, manifest)


def damaged_manifests(workspace: str | Path, *, kinds: Collection[str] | None = None) -> Iterator[tuple[Path, str]]:
    """Each folder named like a stage key whose `manifest.json` is not a manifest of it, with why."""
    for manifest_file in sorted((Path(workspace) / "artifacts").glob(f"*/*/{MANIFEST}")):
        folder = manifest_file.parent
        if not looks_like_key(folder.name) or (kinds is not None and folder.parent.name not in kinds):
            continue
        if (why := manifest_damage(folder)) is not None:
            yield folder, why


def verify_artifact(artifact: Artifact) -> Verdict:
    return Verdict(path=artifact.path, problems=content_problems(artifact.path, artifact.manifest, manifest_name=MANIFEST),
                   checked=artifact.manifest.get("files") is not None)


def verify_workspace(workspace: str | Path, *, mark: bool = True, kinds: Collection[str] | None = None) -> list[Verdict]:
    """Re-hash every artifact's files (those of `kinds`, when given); with `mark`, mark the damaged
    ones so no run serves them (under the key's lock, so no run sets it aside or rewrites it meanwhile)."""
    verdicts = []
    for artifact in finished_artifacts(workspace, kinds=kinds):
        verdict = verify_artifact(artifact)
        if verdict.damaged and mark:
            with artifact_lock(workspace, artifact.path.parent.name, artifact.path.name):
                if own_manifest(artifact.path) == artifact.manifest:  # not set aside or replaced meanwhile
                    mark_damaged(artifact.path, verdict.problems, manifest=artifact.manifest)
        verdicts.append(verdict)
    for folder, why in damaged_manifests(workspace, kinds=kinds):
        if mark:
            with artifact_lock(workspace, folder.parent.name, folder.name):
                if manifest_damage(folder) == why:  # not set aside or rewritten meanwhile
                    mark_damaged(folder, [why], manifest=None)
        verdicts.append(Verdict(path=folder, problems=[why], checked=True))
    return sorted(verdicts, key=lambda verdict: verdict.path)


def verify_remote(remote: RemoteWorkspace, *, mark: bool = True, kinds: Collection[str] | None = None) -> list[Verdict]:
    """`verify_workspace` for a URL workspace: every artifact with a manifest (those of `kinds`,
    when given) re-hashed in the store; with `mark`, the damaged ones marked there."""
    verdicts = []
    for (kind, key), sizes in sorted(remote_folders(remote.list_files()).items()):
        if key.startswith(".") or MANIFEST not in sizes or (kinds is not None and kind not in kinds):
            continue
        text = remote.read_text(remote.artifact_url(kind, key, MANIFEST))
        judged = judge_manifest(text, PurePosixPath(kind, key)) if text is not None else None
        if judged is None or (isinstance(judged, str) and not looks_like_key(key)):
            continue  # removed meanwhile, or another program's manifest.json: not tuneline's
        manifest = judged if isinstance(judged, dict) else None
        problems = [judged] if isinstance(judged, str) else _remote_problems(remote, kind, key, judged, sizes)
        if problems and mark:
            remote.write_bytes(remote.artifact_url(kind, key, DAMAGE_NOTE), damage_note(problems, manifest=manifest).encode())
            remote.remove([remote.artifact_url(kind, key, MANIFEST)])
        verdicts.append(Verdict(path=remote.artifact_url(kind, key), problems=problems,
                                checked=manifest is None or manifest.get("files") is not None))
    return verdicts


def remote_folders(files: Mapping[str, int]) -> dict[tuple[str, str], dict[str, int]]:
    """The objects of a listing (`kind/key/name` -> size) grouped by artifact folder, names relative to it."""
    folders: dict[tuple[str, str], dict[str, int]] = {}
    for path, size in files.items():
        parts = path.split("/", 2)
        if len(parts) == 3:
            folders.setdefault((parts[0], parts[1]), {})[parts[2]] = size
    return folders


def _remote_problems(remote: RemoteWorkspace, kind: str, key: str, manifest: dict[str, Any], sizes: dict[str, int]) -> list[str]:
    if problems := table_problems(None, manifest):
        return problems
    table = recorded_files(manifest)
    if table is None:
        return []

    def digest(name: str) -> str:
        url = remote.artifact_url(kind, key, name)

        def read() -> str:
            with remote.filesystem.open(url, "rb", block_size=16 << 20) as handle:
                return sha256_of_stream(handle)

        return remote.attempt("reading", url, read)

    return compare_files(table, sizes, digest=digest, extra=set(sizes) - set(table) - {MANIFEST})
