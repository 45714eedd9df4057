"""Moving an artifact through a URL workspace against the same bytes through plain s3fs.

    python benchmarks/object_store.py [--size-mb 1024] [--repeats 3]

Starts SeaweedFS (tests/object_store_server.py, from the `cluster` extra) on 127.0.0.1 with its data
in a temporary folder, and makes an artifact of one `--size-mb` weights file and a small config.
Upload: tuneline's `publish_artifact` (every file, then the manifest) against s3fs's `put_file` of
the same two files with s3fs's defaults. Download: tuneline's `fetch_artifact` into an empty cache
(download, check each file's size and sha256 against the manifest, flush, rename into place)
against s3fs's `get_file` of the same two objects. After one untimed upload (the store's first
volumes grow then), each is timed `--repeats` times, in turn, and the best time of each is kept;
the ratios are plain s3fs's time over tuneline's (the goal is >= 0.8 both ways). Then a second
fetch of the same key from the filled cache, its requests counted from botocore's `before-send`
events (the goal: one manifest read).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# benchmarks/tokenize.py would shadow the standard library's `tokenize`: this folder leaves the
# import path, and the tests' folder (the SeaweedFS starter they use) joins it.
sys.path[:] = [str(REPO_ROOT / "tests")] + [p for p in sys.path if os.path.abspath(p or ".") != str(REPO_ROOT / "benchmarks")]

from object_store_server import RequestCounter, start_object_store

KIND = "sft"
KEY = "sft-0123456789abcdef0123"
_WRITE_BLOCK = 64 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the artifact's weights file (default 1024)")
    parser.add_argument("--repeats", type=int, default=3, help="timings of each transfer; the best is kept (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tuneline-object-store-") as scratch:
        root = Path(scratch)
        store = start_object_store(root / "seaweedfs")
        try:
            os.environ.update(store.env())
            compare(store, root, size_mb=args.size_mb, repeats=args.repeats)
        finally:
            store.stop()


def compare(store, root: Path, *, size_mb: int, repeats: int) -> None:
    import s3fs

    from tuneline.core.store.artifacts import find_artifact, write_artifact
    from tuneline.core.store.location import parse_workspace
    from tuneline.core.store.remote import RemoteWorkspace
    from tuneline.core.store.remote_artifacts import fetch_artifact, publish_artifact

    with write_artifact(root / "writer", KIND, KEY, config={"benchmark": True}) as draft:
        write_random(draft.path / "model.safetensors", size_mb << 20)
        (draft.path / "config.json").write_text('{"hidden_size": 64}')
    artifact = find_artifact(root / "writer", KIND, KEY)
    files = [artifact.path / "model.safetensors", artifact.path / "config.json"]
    bucket = store.make_bucket("benchmark")
    plain = s3fs.S3FileSystem(skip_instance_cache=True)  # s3fs's defaults, from the same AWS variables

    def tuneline_upload(attempt: int) -> None:
        publish_artifact(RemoteWorkspace(parse_workspace(f"{bucket}/tuneline-{attempt}")), artifact)

    def plain_upload(attempt: int) -> None:
        for file in files:
            plain.put_file(str(file), f"{bucket}/plain-{attempt}/{file.name}")

    def tuneline_download(attempt: int) -> None:
        fetch_artifact(RemoteWorkspace(parse_workspace(f"{bucket}/tuneline-0")), KIND, KEY, cache=root / f"cache-{attempt}")

    def plain_download(attempt: int) -> None:  # the very objects tuneline fetches
        target = root / f"plain-download-{attempt}"
        target.mkdir()
        for file in files:
            plain.get_file(f"{bucket}/tuneline-0/artifacts/{KIND}/{KEY}/{file.name}", str(target / file.name))

    print(f"artifact: {size_mb} MiB of weights and a config, SeaweedFS {store.endpoint_url}")
    plain.put_file(str(files[0]), f"{bucket}/warm-up")  # the store's first volumes grow on the first write: not timed
    up_tuneline, up_plain = best_times(tuneline_upload, plain_upload, repeats=repeats)
    down_tuneline, down_plain = best_times(tuneline_download, plain_download, repeats=repeats, cleanup=root)
    for what, ours, theirs in (("upload", up_tuneline, up_plain), ("download", down_tuneline, down_plain)):
        print(f"{what:>8}: tuneline {ours:6.2f} s ({size_mb / ours:6.0f} MiB/s), plain s3fs {theirs:6.2f} s "
              f"({size_mb / theirs:6.0f} MiB/s), ratio {theirs / ours:.2f} (goal >= 0.8)")

    remote = RemoteWorkspace(parse_workspace(f"{bucket}/tuneline-0"))
    fetch_artifact(remote, KIND, KEY, cache=root / "cache-hit")
    with RequestCounter(remote.filesystem) as hit:
        fetch_artifact(remote, KIND, KEY, cache=root / "cache-hit")
    print(f"cache hit: {len(hit.requests)} request(s): " + ", ".join(f"{method} {url}" for method, url in hit.requests)
          + " (goal: one manifest read)")


def best_times(ours: Callable[[int], None], theirs: Callable[[int], None], *, repeats: int,
               cleanup: Path | None = None) -> tuple[float, float]:
    """The best of `repeats` timings of each, taken in turn (ours first, then theirs, then theirs
    first: neither always finds the store or the disk as the other left them)."""
    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    for attempt in range(repeats):
        order = (("ours", ours), ("theirs", theirs))
        for name, run in order if attempt % 2 == 0 else order[::-1]:
            started = time.perf_counter()
            run(attempt)
            times[name].append(time.perf_counter() - started)
        if cleanup is not None:  # downloads: keep the disk from filling up with copies
            for folder in (*cleanup.glob("cache-*"), *cleanup.glob("plain-download-*")):
                shutil.rmtree(folder)
    return min(times["ours"]), min(times["theirs"])


def write_random(path: Path, size: int) -> None:
    with path.open("wb") as handle:
        for offset in range(0, size, _WRITE_BLOCK):
            handle.write(os.urandom(min(_WRITE_BLOCK, size - offset)))


if __name__ == "__main__":
    main()
