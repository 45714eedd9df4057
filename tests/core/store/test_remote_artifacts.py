"""Artifacts published to and fetched from a real S3 store (SeaweedFS, tests/object_store_server.py):
bytes equal after a round trip, the manifest uploaded last, damaged objects refused by name, a cache
hit that costs one GET, and a store that goes away mid-upload."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from object_store_server import RequestCounter, restart_object_store, start_object_store
from tuneline.core.errors import ObjectStoreError
from tuneline.core.store.artifacts import MANIFEST, Artifact, find_artifact, write_artifact
from tuneline.core.store.location import parse_workspace
from tuneline.core.store.remote import RemoteWorkspace, RetryPolicy
from tuneline.core.store.remote_artifacts import fetch_artifact, publish_artifact

pytestmark = pytest.mark.slow  # a SeaweedFS process for the session
KIND = "sft"
QUICK = RetryPolicy(attempts=2, first_wait_s=0.05)  # a store that is down is found out in about a second
SMALL_PARTS = {"part_bytes": 64 << 10, "parts_at_once": 2}  # the weights below come down in 5 ranges, 3 windows


def in_parts(remote: RemoteWorkspace) -> RemoteWorkspace:
    """The same workspace, downloading objects over 64 KiB in ranges, as big weights are."""
    return RemoteWorkspace(remote.location, retry=QUICK, **SMALL_PARTS)


class Interrupted(Exception):
    """Raised from the client's own request hook: the upload stops there, as a killed writer's does."""


@pytest.fixture
def remote(s3_store, monkeypatch) -> RemoteWorkspace:
    """A fresh workspace URL in its own bucket, the AWS variables pointing at the store."""
    for name, value in s3_store.env().items():
        monkeypatch.setenv(name, value)
    return RemoteWorkspace(parse_workspace(f"{s3_store.make_bucket()}/team/workspace"), retry=QUICK)


def local_artifact(root: Path, key: str, files: dict[str, bytes]) -> Artifact:
    with write_artifact(root, KIND, key, config={"stage": KIND}) as draft:
        for name, data in files.items():
            (draft.path / name).parent.mkdir(parents=True, exist_ok=True)
            (draft.path / name).write_bytes(data)
    artifact = find_artifact(root, KIND, key)
    assert artifact is not None
    return artifact


FILES = {"adapter_model.safetensors": os.urandom(300_000), "adapter_config.json": b'{"r": 4}',
         "checkpoint-2/trainer_state.json": b'{"global_step": 2}'}


def test_a_published_artifact_is_fetched_with_equal_bytes(remote, tmp_path):
    artifact = local_artifact(tmp_path / "writer", "a1" * 8, FILES)
    url = publish_artifact(remote, artifact)
    assert url == f"{remote.location.url}/artifacts/{KIND}/{'a1' * 8}"

    with RequestCounter(remote.filesystem) as whole, RequestCounter((ranged := in_parts(remote)).filesystem) as parts:
        fetched = fetch_artifact(remote, KIND, "a1" * 8, cache=tmp_path / "reader-cache")
        in_ranges = fetch_artifact(ranged, KIND, "a1" * 8, cache=tmp_path / "other-cache")

    assert {name: (in_ranges.path / name).read_bytes() for name in FILES} == FILES
    assert whole.methods() == ["GET"] * 4  # the manifest and each file, whole
    # the manifest, the config, the weights' size then their 5 ranges, the trainer state
    assert parts.methods() == ["GET", "GET", "HEAD", *["GET"] * 5, "GET"]

    assert fetched.path == tmp_path / "reader-cache/artifacts" / KIND / ("a1" * 8)
    assert {name: (fetched.path / name).read_bytes() for name in FILES} == FILES
    assert (fetched.path / MANIFEST).read_bytes() == (artifact.path / MANIFEST).read_bytes()
    assert find_artifact(tmp_path / "reader-cache", KIND, "a1" * 8).manifest == artifact.manifest
    assert [p.name for p in fetched.path.parent.iterdir()] == ["a1" * 8]  # no download folder left beside it


def test_a_publish_interrupted_before_the_manifest_leaves_nothing_a_reader_trusts(remote, tmp_path):
    artifact = local_artifact(tmp_path / "writer", "b2" * 8, FILES)
    remote.filesystem.connect()

    def stop_at_the_manifest(request, **_):
        if request.method == "PUT" and request.url.split("?")[0].endswith(f"/{MANIFEST}"):
            raise Interrupted(request.url)

    events = remote.filesystem.s3.meta.events
    events.register("before-send.s3", stop_at_the_manifest)
    try:
        with pytest.raises(Interrupted):
            publish_artifact(RemoteWorkspace(remote.location, retry=RetryPolicy(attempts=1), filesystem=remote.filesystem),
                             artifact)
    finally:
        events.unregister("before-send.s3", stop_at_the_manifest)

    assert set(remote.list_files()) == {f"{KIND}/{'b2' * 8}/{name}" for name in FILES}  # the files went up, then it stopped
    assert remote.read_manifest(KIND, "b2" * 8) is None
    assert fetch_artifact(remote, KIND, "b2" * 8, cache=tmp_path / "reader-cache") is None
    assert not (tmp_path / "reader-cache/artifacts" / KIND / ("b2" * 8)).exists()

    publish_artifact(remote, artifact)  # publishing again completes it
    assert fetch_artifact(remote, KIND, "b2" * 8, cache=tmp_path / "reader-cache").manifest == artifact.manifest


@pytest.mark.parametrize("damage", ["truncated", "altered", "deleted"])
def test_a_damaged_object_is_refused_by_name(remote, s3_store, tmp_path, damage):
    key = {"truncated": "c3", "altered": "d4", "deleted": "d5"}[damage] * 8
    publish_artifact(remote, local_artifact(tmp_path / "writer", key, FILES))
    name = "adapter_model.safetensors"
    url = f"{remote.location.url}/artifacts/{KIND}/{key}/{name}"
    original = FILES[name]
    if damage == "deleted":
        s3_store.filesystem().rm_file(url)
    else:
        changed = original[:1000] if damage == "truncated" else original[:500] + bytes([original[500] ^ 1]) + original[501:]
        s3_store.filesystem().pipe_file(url, changed)

    with pytest.raises(ObjectStoreError) as refused:
        fetch_artifact(in_parts(remote), KIND, key, cache=tmp_path / "reader-cache")

    message = str(refused.value)
    assert f"{remote.location.url}/artifacts/{KIND}/{key}" in message
    expected = {"truncated": f"{name}: 1000 bytes, manifest says {len(original)}", "deleted": f"{name}: missing",
                "altered": f"{name}: content changed (same size, sha256 differs from the manifest's)"}[damage]
    assert expected in message
    kind_dir = tmp_path / "reader-cache/artifacts" / KIND
    assert find_artifact(tmp_path / "reader-cache", KIND, key) is None
    assert list(kind_dir.iterdir()) == []  # the download was removed, nothing renamed into place


def test_a_cache_hit_costs_one_manifest_read(remote, s3_store, tmp_path):
    publish_artifact(remote, local_artifact(tmp_path / "writer", "e5" * 8, FILES))
    cache = tmp_path / "reader-cache"
    with RequestCounter(remote.filesystem) as first:
        fetch_artifact(remote, KIND, "e5" * 8, cache=cache)
    with RequestCounter(remote.filesystem) as second:
        again = fetch_artifact(remote, KIND, "e5" * 8, cache=cache)

    assert first.methods() == ["GET"] * (1 + len(FILES))  # the manifest, then each file
    bucket_and_prefix = remote.location.url.removeprefix("s3://")
    assert second.requests == [("GET", f"{s3_store.endpoint_url}/{bucket_and_prefix}/artifacts/{KIND}/{'e5' * 8}/{MANIFEST}")]
    assert again.path == cache / "artifacts" / KIND / ("e5" * 8)
    assert {name: (again.path / name).read_bytes() for name in FILES} == FILES


def test_the_store_stopped_mid_upload_is_a_clear_error_naming_the_url(tmp_path, monkeypatch):
    store = start_object_store(tmp_path / "store")  # its own store: this one is killed
    try:
        for name, value in store.env().items():
            monkeypatch.setenv(name, value)
        remote = RemoteWorkspace(parse_workspace(f"{store.make_bucket()}/ws"), retry=QUICK)
        artifact = local_artifact(tmp_path / "writer", "f6" * 8, FILES)
        remote.filesystem.connect()
        puts = []

        def kill_at_the_second_file(request, **_):
            if request.method == "PUT":
                puts.append(request.url)
                if len(puts) == 2:
                    store.stop()

        remote.filesystem.s3.meta.events.register("before-send.s3", kill_at_the_second_file)
        with pytest.raises(ObjectStoreError) as failed:
            publish_artifact(remote, artifact)
        remote.filesystem.s3.meta.events.unregister("before-send.s3", kill_at_the_second_file)

        message = str(failed.value)
        assert message.startswith("the object store did not answer: uploading "
                                  f"{remote.location.url}/artifacts/{KIND}/{'f6' * 8}/")
        assert "failed 2 times" in message and "\n" not in message
        assert not any(url.endswith(MANIFEST) for url in puts)

        restart_object_store(store)  # the same command, once the store is back, finishes
        publish_artifact(remote, artifact)
        fetched = fetch_artifact(remote, KIND, "f6" * 8, cache=tmp_path / "reader-cache")
        assert {name: (fetched.path / name).read_bytes() for name in FILES} == FILES
    finally:
        store.stop()
