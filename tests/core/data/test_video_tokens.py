"""Qwen2-VL's `<video>` expansion against LLaMA-Factory 0.9.5's own output (tests/data/media/
qwen2_vl_videos.json and the clips beside it, written by tests/data/make_video_golden.py): the same
sampled frames, grids, expanded messages and token ids, and the frames' pixels laid out in time."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from tuneline.core.config import MediaConfig
from tuneline.core.templates.catalog import TEMPLATES

MEDIA = Path(__file__).resolve().parents[2] / "data/media"
GOLDEN = json.loads((MEDIA / "qwen2_vl_videos.json").read_text())


def settings_of(row: dict) -> MediaConfig:
    keys = ("video_max_pixels", "video_min_pixels", "video_fps", "video_maxlen", "image_max_pixels", "image_min_pixels")
    return MediaConfig(**{key: row["settings"][key] for key in keys})


@pytest.fixture(scope="module")
def video_folder(tmp_path_factory, shared_dir: Path) -> tuple[Path, Path]:
    """A Qwen2-VL-shaped folder (the qwen2.5 tokenizer, the image processor at its defaults) and the
    golden rows as a dataset (clips in media/, the image drawn as the golden's)."""
    from PIL import Image
    from transformers import Qwen2VLImageProcessor

    root = tmp_path_factory.mktemp("videos")
    model = shutil.copytree(shared_dir / "tokenizers/qwen2.5", root / "model")
    Qwen2VLImageProcessor().save_pretrained(model)
    data = root / "data"
    shutil.copytree(MEDIA / "clips", data / "media")
    Image.new("RGB", tuple(GOLDEN["images"]["square"]), (30, 90, 220)).save(data / "media" / "square.png")
    rows = [{"messages": row["messages"], "videos": [f"{name}.mp4" for name in row["videos"]],
             "images": [f"{name}.png" for name in row["images"]]} for row in GOLDEN["rows"][:4]]
    (data / "rows.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"clips": {
        "file_name": "rows.json", "formatting": "sharegpt",
        "columns": {"messages": "messages", "videos": "videos", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    return model, data


def media_rows(model: Path, settings: MediaConfig):
    from tuneline.core.data.media_rows import MediaRows

    return MediaRows.load(TEMPLATES["qwen2_vl"], model, settings, datasets={"images": ["clips"], "videos": ["clips"]})


@pytest.mark.parametrize("row", GOLDEN["rows"], ids=[row["name"] for row in GOLDEN["rows"]])
def test_videos_expand_to_llamafactorys_tokens(row: dict, video_folder):
    from transformers import AutoTokenizer

    from tuneline.core.templates.conversation import Conversation, encode_turns, fix_tokenizer

    model, data = video_folder
    rows = media_rows(model, settings_of(row))
    clips = [str(data / "media" / f"{name}.mp4") for name in row["videos"]]
    counts = rows.video_token_counts(clips)
    assert counts == [math.prod(grid) // 4 for grid in row["video_grid_thw"]]
    expanded = rows.expand({"prompt": row["messages"][:-1], "response": row["messages"][-1:], "videos": clips,
                            "images": [str(data / "media" / f"{name}.png") for name in row["images"]]})
    assert [message["content"] for message in expanded["prompt"] + expanded["response"]] == row["expanded"]
    tokenizer = AutoTokenizer.from_pretrained(model)
    fix_tokenizer(TEMPLATES["qwen2_vl"], tokenizer)
    conversation = Conversation(prompt=expanded["prompt"], response=expanded["response"])
    assert [[list(source), list(target)] for source, target in encode_turns(TEMPLATES["qwen2_vl"], tokenizer, conversation)] == row["pairs"]

    features = rows.video_features(clips)  # the collator's inputs: the sampled frames decoded, paired and cut
    assert features["video_grid_thw"].tolist() == row["video_grid_thw"]
    assert features["pixel_values_videos"].shape == (sum(counts) * 4, 3 * 2 * 14 * 14)
    assert "second_per_grid_ts" not in features  # Qwen2-VL's positions take no seconds; Qwen2.5-VL's do (below)


def test_a_videos_temporal_patches_take_consecutive_frames(video_folder):
    """The k-th temporal patch holds frame 2k in its first time slot and frame 2k+1 in its second, as
    transformers' video processor lays them out, each cut as the image processor cuts that frame."""
    import numpy as np
    from transformers import Qwen2VLImageProcessor

    from tuneline.core.data.media_tokens import VideoPatching, sized_image, video_features
    from tuneline.core.data.video_frames import VideoSampling, frames, probe

    _, data = video_folder
    clip = data / "media" / "long.mp4"
    found = probe(clip, VideoSampling())
    taken = [sized_image(frame, max_pixels=256 * 256, min_pixels=16 * 16, plugin="qwen2_vl")
             for frame in frames(clip, found.indices)]
    assert len(taken) == 8 and len({frame.tobytes() for frame in taken}) == 8  # the square moves: every frame differs
    processor = Qwen2VLImageProcessor()
    patching = VideoPatching.of(processor)
    video = video_features([taken], processor, patching)["pixel_values_videos"].reshape(4, -1, 3, 2, 14 * 14)
    for index, frame in enumerate(taken):
        alone = processor([frame], size=patching.size, return_tensors="np")["pixel_values"].reshape(-1, 3, 2, 14 * 14)
        np.testing.assert_array_equal(video[index // 2, :, :, index % 2], alone[:, :, 0])


def test_qwen2_5_vl_spaces_video_positions_by_seconds(video_folder, tmp_path: Path):
    model, _ = video_folder
    folder = shutil.copytree(model, tmp_path / "qwen2_5_vl")
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    for row in GOLDEN["rows"]:
        clips = [str(MEDIA / "clips" / f"{name}.mp4") for name in row["videos"]]
        seconds = media_rows(folder, settings_of(row)).video_features(clips)["second_per_grid_ts"]
        assert seconds.tolist() == pytest.approx(row["second_per_grid_ts"])


@pytest.mark.parametrize("cutoff_len", [1024, 60])
def test_video_rows_tokenize_to_llamafactorys_supervised_examples(video_folder, tmp_path: Path, cutoff_len: int):
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, data = video_folder
    config = build_stage_config({"model_name_or_path": str(model), "dataset": "clips", "dataset_dir": str(data),
                                 "media_dir": str(data / "media"), "template": "qwen2_vl", "cutoff_len": cutoff_len})
    counters = tokenize_stage_data(config, tokenizer_path=model, output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    expected = GOLDEN["supervised_by_cutoff_len"][str(cutoff_len)]
    # LLaMA-Factory keeps an example whose cutoff cut into its media tokens (training then fails on it); tuneline drops it
    kept = [i for i in range(len(expected)) if cutoff_len == 1024 or len(expected[i]["input_ids"]) < cutoff_len]
    assert kept == ([0, 1, 2, 3] if cutoff_len == 1024 else [0, 3])  # 60 cuts into the long video and the second of two
    assert counters.get("rows_dropped_media_tokens_cut", 0) == len(expected) - len(kept)
    assert train["input_ids"] == [expected[i]["input_ids"] for i in kept]
    assert train["labels"] == [expected[i]["labels"] for i in kept]
    assert train["videos"] == [[str(data / "media" / f"{name}.mp4") for name in GOLDEN["rows"][i]["videos"]] for i in kept]


def test_video_rows_need_a_family_that_takes_videos(video_folder, tmp_path: Path):
    from tuneline.core.errors import ConfigError
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, data = video_folder
    keys = {"model_name_or_path": str(model), "dataset": "clips", "dataset_dir": str(data), "media_dir": str(data / "media")}
    with pytest.raises(ConfigError, match="dataset 'clips' holds videos, and tuneline feeds videos to the Qwen2-VL family "
                                          "so far .* not through 'template: qwen3_vl'"):
        tokenize_stage_data(build_stage_config({**keys, "template": "qwen3_vl"}), tokenizer_path=model, output_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match="maps images, videos or audio, and 'stage: pt' does not train on media rows yet"):
        tokenize_stage_data(build_stage_config({**keys, "template": "qwen2_vl", "stage": "pt"}), tokenizer_path=model,
                            output_dir=tmp_path / "b")
    assert not any((tmp_path / name).exists() for name in "ab")
