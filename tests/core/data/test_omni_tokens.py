"""Qwen2.5-Omni's images and sounds against LLaMA-Factory 0.9.5's own output (tests/data/media/qwen2_omni_media.json,
written by tests/data/make_qwen2_omni_golden.py): Qwen2-VL's image grids and Qwen2-Audio's mel frames under
Omni's token names, the same expanded messages, ids and supervised examples."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tuneline.core.config import MediaConfig
from tuneline.core.templates.catalog import TEMPLATES

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = json.loads((ROOT / "tests/data/media/qwen2_omni_media.json").read_text())
TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}


@pytest.fixture(scope="module")
def omni_folder(tmp_path_factory, shared_dir: Path) -> tuple[Path, Path]:
    """A Qwen2.5-Omni processor folder as the golden's (Qwen2.5's tokenizer with Omni's media tokens, Qwen2-VL's
    image processor and Whisper's feature extractor in one preprocessor_config.json, as Omni's folders keep
    them), and the golden rows as a dataset of the golden's pictures and tones."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessor

    from tuneline.core.models.tiny.omni import save_qwen2_omni_processors

    sys.path.insert(0, str(ROOT / "data"))
    from generate_audio_data import tone, write_wave
    from test_media_tokens import drawn

    root = tmp_path_factory.mktemp("omni")
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/qwen2.5")
    tokenizer.add_special_tokens({"additional_special_tokens": GOLDEN["tokens"]})
    tokenizer.save_pretrained(root / "model")
    save_qwen2_omni_processors(Qwen2VLImageProcessor(), root / "model")
    data = root / "data"
    (data / "media").mkdir(parents=True)
    for name, size in GOLDEN["sizes"].items():
        drawn(size).save(data / "media" / f"{name}.png")
    for name, seconds in GOLDEN["sounds"].items():
        write_wave(data / "media" / f"{name}.wav", tone(seconds, 440.0, rate=16000), rate=16000)
    rows = [{"messages": row["messages"], "images": [f"media/{n}.png" for n in row["images"]],
             "audios": [f"media/{n}.wav" for n in row["audios"]]} for row in GOLDEN["rows"]]
    (data / "rows.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"omni": {
        "file_name": "rows.json", "formatting": "sharegpt", "tags": TAGS,
        "columns": {"messages": "messages", "images": "images", "audios": "audios"}}}))
    return root / "model", data


@pytest.mark.parametrize("row", GOLDEN["rows"], ids=[row["name"] for row in GOLDEN["rows"]])
def test_images_and_sounds_expand_to_llamafactorys_tokens(row: dict, omni_folder):
    from transformers import AutoTokenizer

    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.templates.conversation import Conversation, encode_turns, fix_tokenizer

    model, data = omni_folder
    template = TEMPLATES["qwen2_omni"]
    settings = MediaConfig(image_max_pixels=GOLDEN["image_max_pixels"], image_min_pixels=GOLDEN["image_min_pixels"])
    rows = MediaRows.load(template, model, settings, datasets={"images": ["omni"], "audios": ["omni"]})
    images = [str(data / "media" / f"{n}.png") for n in row["images"]]
    audios = [str(data / "media" / f"{n}.wav") for n in row["audios"]]
    in_prompt = len(row["messages"]) - 1
    expanded = rows.expand({"prompt": row["messages"][:in_prompt], "response": row["messages"][in_prompt:],
                            "images": images, "audios": audios})
    messages = expanded["prompt"] + expanded["response"]
    assert messages == row["expanded"]
    tokenizer = AutoTokenizer.from_pretrained(model)
    fix_tokenizer(template, tokenizer)
    pairs = encode_turns(template, tokenizer, Conversation(prompt=messages[:-1], response=messages[-1:]))
    assert [[list(source), list(target)] for source, target in pairs] == row["pairs"]
    if images:
        assert rows.features(images)["image_grid_thw"].tolist() == row["image_grid_thw"]
    if audios:
        assert rows.audio_features(audios)["feature_attention_mask"].sum(-1).tolist() == row["feature_frames"]


@pytest.mark.parametrize("cutoff_len", [2048, 60])
def test_omni_rows_tokenize_to_llamafactorys_supervised_examples(omni_folder, tmp_path: Path, cutoff_len: int):
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, data = omni_folder
    config = build_stage_config({"model_name_or_path": str(model), "dataset": "omni", "dataset_dir": str(data),
                                 "template": "qwen2_omni", "cutoff_len": cutoff_len})
    counters = tokenize_stage_data(config, tokenizer_path=model, output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    expected, whole = GOLDEN["supervised_by_cutoff_len"][str(cutoff_len)], GOLDEN["supervised_by_cutoff_len"]["2048"]
    from transformers import AutoTokenizer

    media = AutoTokenizer.from_pretrained(model).convert_tokens_to_ids(["<|IMAGE|>", "<|AUDIO|>"])
    # kept: the examples whose cutoff left all their media tokens (LLaMA-Factory keeps the others too)
    kept = [i for i, (cut, full) in enumerate(zip(expected, whole))
            if sum(cut["input_ids"].count(t) for t in media) == sum(full["input_ids"].count(t) for t in media)]
    assert counters.get("rows_dropped_media_tokens_cut", 0) == len(expected) - len(kept)
    assert train["input_ids"] == [expected[i]["input_ids"] for i in kept]
    assert train["labels"] == [expected[i]["labels"] for i in kept]
