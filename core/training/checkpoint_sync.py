"""A training draft's checkpoints kept in a URL workspace, so that another machine resumes them.

While a stage trains into its local draft (`artifacts/<kind>/.<key>.partial/`), every checkpoint
the trainer completes (its completion record written, `core.training.checkpoint_record`) is
uploaded under the same path in the bucket: its files first, then `checkpoint.json` (every file's
size and sha256, and the MLflow run that trained it), which is the checkpoint's commit. A stage
that starts on a machine whose cache holds no draft downloads the newest committed checkpoint,
verified file by file, into its draft, and the trainer resumes from it as from its own. The
uploads run on a thread of their own beside the training; the draft's objects are removed once the
artifact is published.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneline.core.errors import ObjectStoreError
from tuneline.core.store.integrity import compare_files, record_files, recorded_files
from tuneline.core.store.remote import RemoteWorkspace
from tuneline.core.training.checkpoints import CHECKPOINT_PREFIX, RECORD_FILE, checkpoint_step, checkpoints, incomplete_reason

CHECKPOINT_MANIFEST = "checkpoint.json"
_POLL_S = 0.5  # how soon a completed checkpoint starts uploading
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class UploadedCheckpoint:
    step: int
    run_id: str | None  # the MLflow run that trained it
    manifest: dict[str, Any]


class CheckpointSync:
    """The uploaded checkpoints of one draft: `<url>/artifacts/<kind>/.<key>.partial/checkpoint-N/`."""

    def __init__(self, remote: RemoteWorkspace, draft_below_artifacts: str) -> None:
        self.remote = remote
        self.below = draft_below_artifacts  # `<kind>/.<key>.partial`
        self.url = f"{remote.location.artifacts_url()}/{draft_below_artifacts}"

    def upload(self, checkpoint: Path, *, run_id: str | None) -> None:
        """Upload one complete checkpoint folder, its manifest last."""
        files = record_files(checkpoint)
        for name in files:
            self.remote.upload(checkpoint / name, f"{self.url}/{checkpoint.name}/{name}")
        manifest = {"step": checkpoint_step(checkpoint), "run_id": run_id, "files": files}
        self.remote.write_bytes(f"{self.url}/{checkpoint.name}/{CHECKPOINT_MANIFEST}", json.dumps(manifest, indent=1).encode())

    def committed_steps(self) -> list[int]:
        """The steps whose checkpoint manifest is in the store, newest first (one listing)."""
        steps = []
        for path in self.remote.list_files(self.below):
            folder, _, name = path.removeprefix(f"{self.below}/").partition("/")
            digits = folder.removeprefix(CHECKPOINT_PREFIX)
            if name == CHECKPOINT_MANIFEST and folder.startswith(CHECKPOINT_PREFIX) and digits.isdigit():
                steps.append(int(digits))
        return sorted(steps, reverse=True)

    def restore(self, draft: Path) -> UploadedCheckpoint | None:
        """Download the newest committed checkpoint into `draft` (verified, then renamed into place);
        None when the store holds none."""
        steps = self.committed_steps()
        if not steps:
            return None
        name = f"{CHECKPOINT_PREFIX}{steps[0]}"
        url = f"{self.url}/{name}"
        text = self.remote.read_text(f"{url}/{CHECKPOINT_MANIFEST}")
        manifest = json.loads(text) if text else {}
        table = recorded_files(manifest)
        if not table:
            raise ObjectStoreError(f"{url}/{CHECKPOINT_MANIFEST} lists no files; remove {url} to train from the start.")
        incoming = draft / f".{name}.fetch"
        shutil.rmtree(incoming, ignore_errors=True)
        incoming.mkdir(parents=True)
        found = {}
        for file, record in table.items():
            (incoming / file).parent.mkdir(parents=True, exist_ok=True)
            try:
                found[file] = self.remote.download(f"{url}/{file}", incoming / file, expected_size=record.size)
            except FileNotFoundError:
                found = {}
                problems = [f"{file}: missing"]
                break
        else:
            digests = {f: d.sha256 or "" for f, d in found.items()}
            problems = compare_files(table, {f: d.size for f, d in found.items()}, digest=digests.__getitem__)
        if problems:
            shutil.rmtree(incoming, ignore_errors=True)
            raise ObjectStoreError(f"the uploaded checkpoint {url} differs from its {CHECKPOINT_MANIFEST}, so it is not "
                                   f"resumed from: {'; '.join(problems)}. Remove {url} and run the same command again.")
        shutil.rmtree(draft / name, ignore_errors=True)
        incoming.rename(draft / name)
        return UploadedCheckpoint(step=steps[0], run_id=manifest.get("run_id"), manifest=manifest)

    def discard(self) -> None:
        """Remove the draft's objects (its artifact is published)."""
        files = self.remote.list_files(self.below)
        self.remote.remove([f"{self.remote.location.artifacts_url()}/{path}" for path in sorted(files)])


@contextmanager
def uploading_checkpoints(sync: CheckpointSync, draft: Path, *, run_id: str | None,
                          log: Callable[[str], None] = _LOG.info) -> Iterator[None]:
    """Upload each checkpoint that completes in `draft` while the block runs (a thread polls the
    draft; the trainer never waits for an upload). A failed upload is reported and tried again at
    the next poll: the checkpoints only spare work, the artifact's own publication is what counts.
    A block that ends with an upload still failing tries what is pending once more (or lists the
    store when nothing is), and a store that still does not answer ends the stage with the store's
    error, its URL named: the artifact's upload would fail the same way, and a tracking server whose
    artifacts are in that store would fail the stage's next MLflow upload with a bare HTTP 500."""
    done = set(sync.committed_steps())
    stop = threading.Event()
    failure: list[Exception] = []  # the last upload's error, until an upload goes through

    def upload_new(then: str = "; trying again") -> bool:
        """Upload the completed checkpoints not uploaded yet, oldest first; whether any was tried."""
        tried = False
        for folder in reversed(checkpoints(draft)):  # oldest first
            step = checkpoint_step(folder)
            if step in done or not (folder / RECORD_FILE).is_file() or incomplete_reason(folder) is not None:
                continue
            tried = True
            try:
                sync.upload(folder, run_id=run_id)
            except FileNotFoundError as error:  # rotated away (save_total_limit) while it was uploaded
                done.add(step)
                failure[:] = [error]  # whether the store took it is not known
                continue
            except Exception as error:  # noqa: BLE001 - the store's clients raise their own classes
                failure[:] = [error]
                log(f"checkpoint {folder.name} was not uploaded ({error}){then}")
                return tried
            failure.clear()
            done.add(step)
            log(f"uploaded {folder.name} to {sync.url}/{folder.name}")
        return tried

    def poll() -> None:
        while not stop.wait(_POLL_S):
            upload_new()

    watcher = threading.Thread(target=poll, name=f"checkpoint uploads {sync.url}", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
    if failure:  # the last upload did not go through: what is pending is tried once more
        tried = upload_new(then="")
        if failure and (not tried or isinstance(failure[0], FileNotFoundError)):  # nothing told: is the store back?
            try:
                sync.committed_steps()  # one listing, through the store's retries
                failure.clear()
            except Exception as error:  # noqa: BLE001 - as above
                failure[:] = [error]
    if failure:
        error = failure[0]
        if isinstance(error, ObjectStoreError):
            raise error
        raise ObjectStoreError(f"the checkpoints of {draft.name} could not be uploaded to {sync.url}: {type(error).__name__}: "
                               f"{error}. Check the store and its credentials, then run the same command again.") from error
