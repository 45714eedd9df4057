"""`tuneline verify` and `tuneline gc` on the tokenized-data cache that `tuneline train` fills under
$TUNELINE_CACHE: real tokenized data, verified like a workspace's artifacts, and collected by
recent use, leaving alone every file tuneline did not write there."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tuneline.core.stages.registry import build_stage_config
from tuneline.core.store.artifacts import partial_path, set_aside, write_artifact
from tuneline.flows.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]


def tuneline(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def listed(stdout: str) -> dict[Path, str]:
    """gc's rows: each folder and why it goes."""
    return {Path(path): reason for path, reason in re.findall(r"^\s*[\d.]+ [KMGT]?B  (\S+)  \((.*)\)$", stdout, flags=re.M)}


@pytest.fixture
def cache(shared_dir: Path, tmp_path: Path, monkeypatch) -> dict[str, Path]:
    """Two tokenized artifacts in the cache (`first` tokenized by `tuneline train`'s own path, then
    served from the cache after `second` was written); a stale draft, a set-aside damaged artifact,
    and three things tuneline did not write."""
    from tuneline.flows.single import tokenized_dataset

    root = tmp_path / "cache"
    monkeypatch.setenv("TUNELINE_CACHE", str(root))
    monkeypatch.chdir(tmp_path)  # no ./workspace here

    def config(samples: int):
        return build_stage_config({"model_name_or_path": str(shared_dir / "tokenizers/gpt2"), "stage": "sft",
                                   "dataset": "demo_alpaca", "dataset_dir": str(REPO_ROOT / "data"),
                                   "template": "default", "cutoff_len": 32, "max_samples": samples})

    first = tokenized_dataset(config(4))
    tokens = first.parent
    with write_artifact(root, "tokenized", "tokenize-bbbbbbbbbbbbbbbbbbbb", config={}) as draft:
        (draft.path / "train").mkdir()
        (draft.path / "train" / "data-00000-of-00001.arrow").write_bytes(bytes(range(256)) * 4)
    second = tokens / "tokenize-bbbbbbbbbbbbbbbbbbbb"
    assert tokenized_dataset(config(4)) == first  # a hit: `first` is the most recently used again
    stale = partial_path(root, "tokenized", "tokenize-0123456789abcdef0123")
    stale.mkdir()
    with write_artifact(root, "tokenized", "tokenize-aaaaaaaaaaaaaaaaaaaa", config={}) as draft:
        (draft.path / "train.arrow").write_bytes(b"0" * 10)
    damaged = set_aside(tokens / "tokenize-aaaaaaaaaaaaaaaaaaaa")
    (tokens / "notes").mkdir()  # foreign: no manifest, no note of verify's
    (tokens / "notes" / "todo.txt").write_text("mine")
    (tokens / "copied").mkdir()  # foreign: a manifest that names another folder
    (tokens / "copied" / "manifest.json").write_text(json.dumps({"kind": "tokenized", "key": "elsewhere", "files": {}}))
    (root / "artifacts" / "other").mkdir()  # a kind tuneline does not cache
    (root / "artifacts" / "other" / "x").mkdir()
    return {"root": root, "first": first, "second": second, "stale": stale, "damaged": damaged,
            "foreign": [tokens / "notes", tokens / "copied", root / "artifacts" / "other" / "x"]}


def test_verify_and_gc_cover_the_tokenized_data_cache(cache: dict[str, Path], capsys):
    code, out, _ = tuneline(capsys, "verify")
    assert code == 0, out
    assert f"tokenized-data cache {cache['root']}: 2 artifact(s) verified, 0 damaged" in out

    arrow = next(cache["second"].rglob("*.arrow"))
    data = bytearray(arrow.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the re-hash sees it
    arrow.write_bytes(bytes(data))
    code, out, _ = tuneline(capsys, "verify")
    assert code == 1, out
    assert f"damaged: {cache['second']}" in out and "content changed (same size" in out
    assert f"tokenized-data cache {cache['root']}: 2 artifact(s) verified, 1 damaged" in out
    assert not (cache["second"] / "manifest.json").exists() and (cache["second"] / "damage.json").is_file()

    code, out, _ = tuneline(capsys, "gc", "--keep-runs", "1")
    assert code == 0, out
    assert listed(out) == {cache["second"]: "artifact marked damaged by tuneline verify",
                           cache["stale"]: "draft that no recent run references",
                           cache["damaged"]: "damaged artifact, set aside"}
    _, out, _ = tuneline(capsys, "gc", "--keep-runs", "0")
    assert listed(out)[cache["first"]] == "tokenized data not among the 0 most recently used"

    code, out, _ = tuneline(capsys, "gc", "--keep-runs", "1", "--yes")
    assert code == 0 and "removed 3 folder(s)" in out, out
    assert not any(cache[name].exists() for name in ("second", "stale", "damaged"))
    assert (cache["first"] / "manifest.json").is_file()  # the most recently used stays
    assert all(path.is_dir() for path in cache["foreign"])  # never a file tuneline did not write
    assert (cache["foreign"][0] / "todo.txt").read_text() == "mine"


def test_a_named_workspace_must_exist_and_some_store_must(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("TUNELINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    code, _, err = tuneline(capsys, "verify", "--workspace", "missing")
    assert code == 2 and "--workspace missing: no artifacts/ folder" in err
    code, _, err = tuneline(capsys, "gc")
    assert code == 2 and "nor in the tokenized-data cache" in err and "Traceback" not in err


def test_gc_names_what_a_process_reads_and_keeps_it(tmp_path: Path, monkeypatch, capsys):
    from tuneline.core.store.readers import reading_artifact

    monkeypatch.setenv("TUNELINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    with write_artifact(tmp_path / "cache", "tokenized", "tokenize-cccccccccccccccccccc", config={}) as draft:
        (draft.path / "train.arrow").write_bytes(b"0" * 10)
    read = tmp_path / "cache" / "artifacts" / "tokenized" / "tokenize-cccccccccccccccccccc"
    with reading_artifact(read):
        code, out, _ = tuneline(capsys, "gc", "--keep-runs", "0", "--yes")
        assert code == 0 and (read / "manifest.json").is_file(), out
        assert listed(out) == {read: "tokenized data not among the 0 most recently used; kept while a process reads it"}
        assert "removed 0 folder(s), 0 B; 1 kept: in use by a process that reads them" in out
    code, out, _ = tuneline(capsys, "gc", "--keep-runs", "0", "--yes")
    assert code == 0 and "removed 1 folder(s)" in out and not read.exists(), out
