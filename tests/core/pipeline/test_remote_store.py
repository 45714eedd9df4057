"""The stage store of an s3:// workspace (`open_store`), on a real S3 store (SeaweedFS): a hit is
served from its manifest, a miss is computed and published before its lease is let go, an artifact
altered in the store is refused by name when read and recomputed once `tuneline verify` marked it,
and one whose upload was cut short is published from the cache that holds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneline.core.errors import ObjectStoreError
from tuneline.core.pipeline.references import ArtifactRef
from tuneline.core.pipeline.stores import open_store
from tuneline.core.store.artifacts import MANIFEST, find_artifact, write_artifact
from tuneline.core.store.verify import verify_remote

pytestmark = pytest.mark.slow  # a SeaweedFS process for the session
KIND = "trained"
KEY = "sft-" + "5e" * 8


@pytest.fixture
def store(s3_store, monkeypatch, tmp_path):
    for name, value in s3_store.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TUNELINE_CACHE", str(tmp_path / "cache"))
    return open_store(f"{s3_store.make_bucket()}/team")


def compute_into(store, weights: bytes, computed: list):
    def compute(damage):
        computed.append(damage)
        with write_artifact(store.root, KIND, KEY, config={"lr": 1}) as draft:
            (draft.path / "adapter_model.safetensors").write_bytes(weights)
        artifact = find_artifact(store.root, KIND, KEY)
        store.publish(artifact)
        return ArtifactRef.from_artifact(artifact, name="sft", cache_hit=False)
    return compute


def look_up(store, compute, damaged: list | None = None):
    def serve(artifact):
        return ArtifactRef.from_artifact(artifact, name="sft", cache_hit=True)

    return store.serve_or_compute(KIND, KEY, serve=serve, compute=compute, on_wait=lambda: None,
                                  on_damaged=(damaged.append if damaged is not None else lambda _: None))


def test_a_miss_is_published_and_a_hit_is_served_from_its_manifest(store, tmp_path, monkeypatch):
    computed: list = []
    first = look_up(store, compute_into(store, b"w" * 100, computed))
    assert not first.cache_hit and computed == [None]
    assert store.remote.read_manifest(KIND, KEY)["files"]["adapter_model.safetensors"]["size"] == 100

    monkeypatch.setenv("TUNELINE_CACHE", str(tmp_path / "other_machine"))
    elsewhere = open_store(store.remote.location.url)
    hit = look_up(elsewhere, compute_into(elsewhere, b"x", computed))
    assert hit.cache_hit and hit.key == KEY and len(computed) == 1
    assert not (tmp_path / "other_machine").exists()  # served from the manifest: nothing fetched
    assert (elsewhere.folder(hit) / "adapter_model.safetensors").read_bytes() == b"w" * 100


def test_an_altered_object_is_refused_by_name_then_recomputed_once_verify_marked_it(store, tmp_path, monkeypatch):
    look_up(store, compute_into(store, b"w" * 100, []))
    weights_url = store.remote.artifact_url(KIND, KEY, "adapter_model.safetensors")
    store.remote.write_bytes(weights_url, b"v" * 100)  # same size, other bytes

    monkeypatch.setenv("TUNELINE_CACHE", str(tmp_path / "other_machine"))
    elsewhere = open_store(store.remote.location.url)
    hit = look_up(elsewhere, compute_into(elsewhere, b"x", []))
    with pytest.raises(ObjectStoreError, match="adapter_model.safetensors") as refused:
        elsewhere.folder(hit)
    assert store.remote.artifact_url(KIND, KEY) in str(refused.value)

    [verdict] = verify_remote(store.remote)
    assert verdict.problems
    computed, damaged = [], []
    again = look_up(elsewhere, compute_into(elsewhere, b"w" * 100, computed), damaged)
    assert not again.cache_hit and len(computed) == 1 and damaged and damaged[0].problems
    assert "adapter_model.safetensors" in damaged[0].reason
    assert (open_store(store.remote.location.url).folder(again) / "adapter_model.safetensors").read_bytes() == b"w" * 100


def test_an_artifact_whose_upload_was_cut_short_is_published_from_the_cache(store):
    with write_artifact(store.root, KIND, KEY, config={"lr": 1}) as draft:  # computed here; the store went away
        (draft.path / "adapter_model.safetensors").write_bytes(b"w" * 100)
    store.remote.upload(Path(store.root) / "artifacts" / KIND / KEY / "adapter_model.safetensors",
                        store.remote.artifact_url(KIND, KEY, "adapter_model.safetensors"))
    assert store.remote.read_manifest(KIND, KEY) is None

    computed: list = []
    served = look_up(store, compute_into(store, b"x", computed))
    assert served.cache_hit and computed == []
    assert store.remote.read_manifest(KIND, KEY) is not None
    assert store.remote.read_text(store.remote.artifact_url(KIND, KEY, MANIFEST)) is not None
