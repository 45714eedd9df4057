"""LLaMA-Factory's own dataset_info.json and demo data, loaded by name from the shared folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import missing_asset
from tuneline.core.data.dataset_info import (
    dataset_file_paths,
    get_dataset_attrs,
    iter_rows,
    load_rows,
    read_dataset_info,
)
from tuneline.core.errors import DataError

ROLES = {"user", "assistant", "observation", "function"}
# name: (raw row count, response roles of every row)
TEXT_DATASETS = {
    "identity": (91, ["assistant"]),
    "alpaca_en_demo": (999, ["assistant"]),
    "alpaca_zh_demo": (1000, ["assistant"]),
    "glaive_toolcall_en_demo": (300, ["assistant"]),
    "glaive_toolcall_zh_demo": (300, ["assistant"]),
    "dpo_en_demo": (300, ["assistant", "assistant"]),
    "dpo_zh_demo": (300, ["assistant", "assistant"]),
    "kto_en_demo": (300, ["assistant"]),
    "c4_demo": (300, []),
    "wiki_demo": (30, []),
}
HUB_ONLY = ["alpaca_en", "lima", "ultrachat_200k", "dpo_mix_en", "kto_mix_en", "adgen_eval", "llava_1k_en", "pokemon_cap",
            "rlhf_v"]


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The hub unreachable and the caches empty, whatever the environment says."""
    import datasets
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")


@pytest.fixture(scope="module")
def lf_data(shared_dir: Path) -> Path:
    folder = shared_dir / "llamafactory" / "data"
    if not (folder / "dataset_info.json").is_file():
        missing_asset(f"LLaMA-Factory demo data not found: no dataset_info.json in {folder}")
    return folder


@pytest.fixture(scope="module")
def info(lf_data: Path) -> dict:
    return read_dataset_info(lf_data)


def raw_count(path: Path) -> int:
    if path.suffix == ".json":
        return len(json.loads(path.read_text(encoding="utf-8")))
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def assert_standard(row: dict, *, kto: bool) -> None:
    assert set(row) == {"prompt", "response", "system", "tools"} | ({"kto_tag"} if kto else set())
    assert isinstance(row["system"], str) and isinstance(row["tools"], str)
    for message in row["prompt"] + row["response"]:
        assert set(message) == {"role", "content"}
        assert message["role"] in ROLES
        assert isinstance(message["content"], str) and message["content"].strip()
    roles = [m["role"] for m in row["prompt"]]
    assert roles[0] == "user" and len(roles) % 2 == 1
    assert all(r in ("user", "observation") for r in roles[::2])
    assert all(r in ("assistant", "function") for r in roles[1::2])


def test_whole_official_file_validates(info: dict) -> None:
    assert len(info) > 90
    assert set(TEXT_DATASETS) | {"mllm_demo", "mllm_video_demo", "mllm_audio_demo", "mllm_video_audio_demo"} <= set(info)
    assert info["alpaca_en"].load_from == "hf_hub" and info["deepctrl"].load_from == "ms_hub"
    assert info["llava_1k_en"].subset == "en" and info["starcoder_python"].folder == "python"


@pytest.mark.parametrize("name", sorted(TEXT_DATASETS))
def test_text_dataset_loads_by_name(lf_data: Path, name: str) -> None:
    count, response_roles = TEXT_DATASETS[name]
    (attr,) = get_dataset_attrs([name], lf_data)
    (path,) = dataset_file_paths(attr, lf_data)
    assert raw_count(path) == count
    rows = load_rows(attr, lf_data)
    assert len(rows) == count
    for row in rows:
        assert_standard(row, kto=name == "kto_en_demo")
        assert [m["role"] for m in row["response"]] == response_roles
    json.dumps(rows)


def test_alpaca_rows_match_the_file(lf_data: Path) -> None:
    raw = json.loads((lf_data / "alpaca_en_demo.json").read_text(encoding="utf-8"))
    rows = load_rows(get_dataset_attrs(["alpaca_en_demo"], lf_data)[0], lf_data)
    for source, row in zip(raw, rows):
        expected = "\n".join(t for t in (source["instruction"], source["input"]) if t)
        assert row["prompt"] == [{"role": "user", "content": expected}]
        assert row["response"] == [{"role": "assistant", "content": source["output"]}]
    assert sum(1 for r in raw if r["input"]) > 100


def test_tool_calls_keep_roles_and_tools(lf_data: Path) -> None:
    raw = json.loads((lf_data / "glaive_toolcall_en_demo.json").read_text(encoding="utf-8"))
    rows = load_rows(get_dataset_attrs(["glaive_toolcall_en_demo"], lf_data)[0], lf_data)
    first = raw[0]["conversations"]
    assert rows[0]["prompt"] + rows[0]["response"] == [
        {"role": {"human": "user", "gpt": "assistant", "function_call": "function",
                  "observation": "observation"}[m["from"]], "content": m["value"]} for m in first]
    assert rows[0]["tools"] == raw[0]["tools"] and json.loads(rows[0]["tools"])
    assert sum(1 for r in rows if any(m["role"] == "function" for m in r["prompt"])) > 100


def test_pairwise_rows_are_chosen_then_rejected(lf_data: Path) -> None:
    raw = json.loads((lf_data / "dpo_en_demo.json").read_text(encoding="utf-8"))
    rows = load_rows(get_dataset_attrs(["dpo_en_demo"], lf_data)[0], lf_data)
    for source, row in zip(raw, rows):
        assert [m["content"] for m in row["response"]] == [source["chosen"]["value"],
                                                           source["rejected"]["value"]]
        has_system = source["conversations"][0]["from"] == "system"
        assert bool(row["system"]) == has_system
    assert any(r["system"] for r in rows)


def test_kto_rows_carry_the_label(lf_data: Path) -> None:
    raw = json.loads((lf_data / "kto_en_demo.json").read_text(encoding="utf-8"))
    rows = load_rows(get_dataset_attrs(["kto_en_demo"], lf_data)[0], lf_data)
    assert [r["kto_tag"] for r in rows] == [r["label"] for r in raw]
    assert 0 < sum(r["kto_tag"] for r in rows) < len(rows)
    assert rows[0]["response"][0]["content"] == raw[0]["messages"][-1]["content"]


def test_text_file_is_one_row_per_line(lf_data: Path) -> None:
    lines = (lf_data / "wiki_demo.txt").read_text(encoding="utf-8").splitlines()
    rows = load_rows(get_dataset_attrs(["wiki_demo"], lf_data)[0], lf_data)
    assert [r["prompt"][0]["content"] for r in rows] == lines


@pytest.mark.parametrize("name", ["c4_demo", "wiki_demo", "kto_en_demo", "dpo_zh_demo"])
def test_streaming_gives_the_same_rows(lf_data: Path, name: str) -> None:
    (attr,) = get_dataset_attrs([name], lf_data)
    assert list(iter_rows(attr, lf_data)) == load_rows(attr, lf_data)


@pytest.mark.parametrize("name, rows, first", [("mllm_demo", 6, "images file 'mllm_demo_data/1.jpg'"),
                                               ("mllm_video_demo", 3, "videos file 'mllm_demo_data/1.mp4'"),
                                               ("mllm_audio_demo", 3, "audios file 'mllm_demo_data/1.mp3'"),
                                               ("mllm_video_audio_demo", 3, "videos file 'mllm_demo_data/4.mp4'")])
def test_the_media_demos_name_their_missing_files(info: dict, lf_data: Path, name: str, rows: int, first: str) -> None:
    """The shared copy of LLaMA-Factory's data holds its four media demos' rows without their
    mllm_demo_data/ images, clips and sounds."""
    with pytest.raises(DataError) as error:
        load_rows(info[name], lf_data)
    message = " ".join(str(error.value).split())
    assert f"{rows} row(s) cannot be used (media_missing: {rows})" in message
    assert f"row 1 of {lf_data / (name + '.json')}: {first} is neither in media_dir ({lf_data}) nor at that path" in message


@pytest.mark.parametrize("name", HUB_ONLY)
def test_hub_datasets_fail_clearly_offline(info: dict, lf_data: Path, name: str,
                                           offline_hub: None) -> None:
    attr = info[name]
    token = "hf_datasetTok3n"  # hf_hub_token reaches load_dataset, never the message
    for load in (load_rows, dataset_file_paths, lambda a, d, **kw: list(iter_rows(a, d, **kw))):
        with pytest.raises(DataError) as error:
            load(attr, lf_data, token=token)
        message = str(error.value)
        assert token not in message
        assert f"dataset '{name}' in {lf_data / 'dataset_info.json'}" in message
        assert f"cannot load hf_hub_url '{attr.hf_hub_url}': the hub is offline" in message
        assert f'replace hf_hub_url with "file_name": "{name}.jsonl"' in message


def test_modelscope_only_entry_is_refused(info: dict, lf_data: Path) -> None:
    with pytest.raises(DataError, match="loads from ms_hub_url 'deepctrl/deepctrl-sft-data', "
                                        "which tuneline does not support"):
        load_rows(info["deepctrl"], lf_data)
