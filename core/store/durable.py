"""Making a finished draft durable and private before it is renamed into place.

A rename is atomic, but without fsync a power loss can leave the new name pointing at files whose
contents never reached the disk (an empty `manifest.json` under the final name). So the files'
contents are flushed first, then the folders' entries, and after the rename the parent's entry.
One fsync per file and per folder: the cost is small next to writing the files.

Everything below an artifact is made owner-only whatever the umask (folders 0700, files without
group and other bits): artifacts hold trained weights and the configs they came from.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

OWNER_ONLY = 0o700


def seal(root: Path) -> None:
    """Make every file and folder under `root` (itself included) owner-only and flush it to disk,
    files before the folders that hold them. `root`'s own entries are left for the caller to flush
    once it has added the last one (the manifest). Symlinks are left as they are."""
    for folder, _, names in os.walk(root, topdown=False):
        for name in names:
            path = os.path.join(folder, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                os.chmod(path, stat.S_IMODE(mode) & OWNER_ONLY)
                fsync_path(path)
        os.chmod(folder, OWNER_ONLY)
        if folder != str(root):
            fsync_path(folder)


def write_durably(path: Path, text: str) -> None:
    """Write `text` to `path` (owner-only) and flush it to disk before returning."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT


def fsync_path(path: str | Path) -> None:
    """Flush a file's contents, or a folder's entries, to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
