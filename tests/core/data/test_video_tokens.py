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
    from tuneline.core.data.media.rows import MediaRows

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

    from tuneline.core.data.media.sizing import sized_image
    from tuneline.core.data.media.video.frames import VideoSampling, frames, probe
    from tuneline.core.data.media.video.layout import VideoPatching, video_features

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
    with pytest.raises(ConfigError, match="dataset 'clips' holds videos, and tuneline feeds videos to Qwen2-VL, .* GLM-4.1V and InternVL "
                                          "so far .* not through 'template: llava'"):
        tokenize_stage_data(build_stage_config({**keys, "template": "llava"}), tokenizer_path=model, output_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match="maps images, videos or audio, and 'stage: pt' does not train on media rows yet"):
        tokenize_stage_data(build_stage_config({**keys, "template": "qwen2_vl", "stage": "pt"}), tokenizer_path=model,
                            output_dir=tmp_path / "b")
    assert not any((tmp_path / name).exists() for name in "ab")


# Qwen3-VL and GLM-4.1V: frames sized as a whole clip, a video written a temporal patch at a time with its time
# (core/data/media/video/layout.py), against LLaMA-Factory 0.9.5's own output with transformers' real processors
# (tests/data/make_qwen3_vl_video_golden.py, make_glm4v_video_golden.py)
TIMED = {family: json.loads((MEDIA / f"{family}_videos.json").read_text()) for family in ("qwen3_vl", "glm4v")}
TIMED_ROWS = [(family, row) for family, golden in TIMED.items() for row in golden["rows"]]
# LLaMA-Factory's video processors resize with torchvision's bicubic filter, tuneline's fallback with Pillow's
# (torchvision does not import beside the CPU torch): a resized frame's pixels differ by a level or so at the
# square's edges, so its statistics agree to 2e-4, while sizes, grids and shapes are exact
PIXEL_TOLERANCE = 2e-4


@pytest.fixture(scope="module")
def timed_folders(tmp_path_factory, shared_dir: Path) -> dict[str, tuple[Path, Path]]:
    """A Qwen3-VL- and a GLM-4.1V-shaped folder as their goldens' (Qwen2.5's tokenizer, with GLM's tokens for
    GLM; the image processor; the video processor's numbers in video_preprocessor_config.json), and each
    golden's default rows as a dataset (clips in media/, the image drawn as the golden's)."""
    from PIL import Image
    from transformers import AutoTokenizer, Glm4vImageProcessor, Qwen2VLImageProcessor

    folders = {}
    for family, golden in TIMED.items():
        root = tmp_path_factory.mktemp(family)
        tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/qwen2.5")
        tokenizer.add_special_tokens({"additional_special_tokens": golden.get("added_tokens", [])})
        tokenizer.save_pretrained(root / "model")
        image_processor = (Glm4vImageProcessor() if family == "glm4v" else
                           Qwen2VLImageProcessor(**{k: v for k, v in golden["image_processor"].items() if k != "class"}))
        image_processor.save_pretrained(root / "model")
        (root / "model" / "video_preprocessor_config.json").write_text(json.dumps(golden["video_processor"]))
        shutil.copytree(MEDIA / "clips", root / "data" / "media")
        Image.new("RGB", (64, 64), (30, 90, 220)).save(root / "data" / "media" / "square.png")
        rows = [{"messages": row["messages"], "videos": [f"{name}.mp4" for name in row["videos"]],
                 "images": [f"{name}.png" for name in row["images"]]} for row in golden["rows"] if row["name"].endswith("(defaults)")]
        (root / "data" / "rows.json").write_text(json.dumps(rows))
        columns = {"messages": "messages", "videos": "videos", **({"images": "images"} if family == "qwen3_vl" else {})}
        (root / "data" / "dataset_info.json").write_text(json.dumps({"clips": {  # GLM-4.1V's model takes no image beside a video
            "file_name": "rows.json", "formatting": "sharegpt", "columns": columns,
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
        folders[family] = (root / "model", root / "data")
    return folders


def timed_rows(family: str, folder: Path, settings: MediaConfig):
    from tuneline.core.data.media.rows import MediaRows

    return MediaRows.load(TEMPLATES[family], folder, settings, datasets={"videos": ["clips"]})


@pytest.fixture(scope="module")
def timed_tokenizers(timed_folders) -> dict:
    """Each folder's tokenizer fixed for its template, loaded once (Qwen2.5's takes a second)."""
    from transformers import AutoTokenizer

    from tuneline.core.templates.conversation import fix_tokenizer

    tokenizers = {family: AutoTokenizer.from_pretrained(model) for family, (model, _) in timed_folders.items()}
    for family, tokenizer in tokenizers.items():
        fix_tokenizer(TEMPLATES[family], tokenizer)
    return tokenizers


@pytest.mark.parametrize(("family", "row"), TIMED_ROWS, ids=[f"{family}: {row['name']}" for family, row in TIMED_ROWS])
def test_timed_videos_expand_to_llamafactorys_tokens(family: str, row: dict, timed_folders, timed_tokenizers):
    """Grids from the clips' headers, the text LLaMA-Factory writes (its quirks included: a second video of a
    message timed as the message's video; GLM's times all 0, its frames those its processor keeps), the token
    ids, and the collator's pixels: the shape exact, the statistics to PIXEL_TOLERANCE."""
    from tuneline.core.templates.conversation import Conversation, encode_turns

    model, data = timed_folders[family]
    rows = timed_rows(family, model, settings_of(row))
    clips = [str(data / "media" / f"{name}.mp4") for name in row["videos"]]
    assert [list(video.grid) for video in rows.timed_videos(clips)] == row["video_grid_thw"]
    expanded = rows.expand({"prompt": row["messages"][:-1], "response": row["messages"][-1:], "videos": clips,
                            "images": [str(data / "media" / f"{name}.png") for name in row["images"]]})
    assert [message["content"] for message in expanded["prompt"] + expanded["response"]] == row["expanded"]
    conversation = Conversation(prompt=expanded["prompt"], response=expanded["response"])
    pairs = encode_turns(TEMPLATES[family], timed_tokenizers[family], conversation)
    assert [[list(source), list(target)] for source, target in pairs] == row["pairs"]

    features = rows.video_features(clips)
    assert features["video_grid_thw"].tolist() == row["video_grid_thw"]
    pixels, expected = features["pixel_values_videos"].double(), row["pixel_values_videos"]
    assert list(pixels.shape) == expected["shape"]
    assert float(pixels.sum()) == pytest.approx(expected["sum"], rel=PIXEL_TOLERANCE)
    assert float(pixels.mean()) == pytest.approx(expected["mean"], abs=PIXEL_TOLERANCE)
    assert float(pixels.std()) == pytest.approx(expected["std"], abs=PIXEL_TOLERANCE)


@pytest.mark.parametrize("family", list(TIMED))
def test_timed_video_rows_tokenize_to_llamafactorys_supervised_examples(family: str, timed_folders, tmp_path: Path):
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, data = timed_folders[family]
    for cutoff_len, expected in TIMED[family]["supervised_by_cutoff_len"].items():
        config = build_stage_config({"model_name_or_path": str(model), "dataset": "clips", "dataset_dir": str(data),
                                     "media_dir": str(data / "media"), "template": family, "cutoff_len": int(cutoff_len)})
        counters = tokenize_stage_data(config, tokenizer_path=model, output_dir=tmp_path / cutoff_len)
        train = load_from_disk(str(tmp_path / cutoff_len))["train"]
        # LLaMA-Factory keeps an example whose cutoff cut into its media tokens (training then fails on it); tuneline drops it
        kept = [i for i, example in enumerate(expected) if len(example["input_ids"]) < int(cutoff_len)]
        assert 0 < len(kept) and (len(kept) < len(expected)) == (cutoff_len != "2048")
        assert counters.get("rows_dropped_media_tokens_cut", 0) == len(expected) - len(kept)
        assert train["input_ids"] == [expected[i]["input_ids"] for i in kept]
        assert train["labels"] == [expected[i]["labels"] for i in kept]


def test_timed_video_rows_llamafactory_cannot_write_are_refused(timed_folders, tmp_path: Path):
    """Rows whose videos LLaMA-Factory writes so that the model would find other counts of tokens and features
    (videos of other lengths in one row), or stops on (Qwen3-VL: a message's number past the row's videos; GLM-4.1V:
    a clip its processor keeps no frame of), and GLM-4.1V's images beside videos, which its model cannot take in
    one batch."""
    import importlib.util

    from PIL import Image

    from tuneline.core.errors import ConfigError, DataError

    spec = importlib.util.spec_from_file_location("generate_video_data",
                                                  Path(__file__).resolve().parents[3] / "data/generate_video_data.py")
    clip_writer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(clip_writer)
    clip_writer.write_clip(tmp_path / "blink.mp4", [Image.new("RGB", (64, 64), (200, 40, 40))] * 2, rate=10)  # 0.2 s
    _, data = timed_folders["qwen3_vl"]
    short, one_second = (str(data / "media" / f"{name}.mp4") for name in ("short", "one_second"))
    uneven = {"prompt": [{"role": "user", "content": "<video> or <video>?"}], "response": [{"role": "assistant", "content": "A."}],
              "videos": [short, one_second]}
    for family in TIMED:
        rows = timed_rows(family, timed_folders[family][0], MediaConfig())
        with pytest.raises(DataError, match=r"short.mp4' \(2 temporal patches\) and .*one_second.mp4' \(1\) are in one row; "
                                            f"LLaMA-Factory's {family} expansion writes every video of a row with its first"):
            rows.expand(uneven)
    later = {"prompt": [{"role": "user", "content": "<video>?"}, {"role": "assistant", "content": "A."},
                        {"role": "user", "content": "<video>?"}],
             "response": [{"role": "assistant", "content": "B."}], "videos": [one_second, one_second]}
    with pytest.raises(DataError, match="is in message 3 of a row of 2 videos; LLaMA-Factory's qwen3_vl expansion times"):
        timed_rows("qwen3_vl", timed_folders["qwen3_vl"][0], MediaConfig()).expand(later)
    chat = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<video>?"}], "response": [],
            "videos": [one_second]}  # as chat writes a conversation: its system message is not counted, as LLaMA-Factory's chat
    expanded = timed_rows("qwen3_vl", timed_folders["qwen3_vl"][0], MediaConfig()).expand(chat)
    assert expanded["prompt"][1]["content"].startswith("<0.4 seconds>")
    assert "seconds>" not in timed_rows("glm4v", timed_folders["glm4v"][0], MediaConfig()).expand(later)["prompt"][2]["content"]
    with pytest.raises(DataError, match="blink.mp4' lasts 0.20 s, and GLM-4.1V's video processor keeps floor"):
        timed_rows("glm4v", timed_folders["glm4v"][0], MediaConfig()).video_token_counts([str(tmp_path / "blink.mp4")])

    from tuneline.core.data.media.rows import MediaRows

    with pytest.raises(ConfigError, match="datasets 'clips' and 'clips' hold images and videos, and GLM-4.1V's model"):
        MediaRows.load(TEMPLATES["glm4v"], timed_folders["glm4v"][0], MediaConfig(), datasets={"images": ["clips"], "videos": ["clips"]})


def test_glm4v_marks_a_videos_image_tokens_as_glm4vprocessor_does(timed_folders, timed_tokenizers):
    """GLM-4.1V's frames are image tokens: `mm_token_type_ids` is 2 on those between a video's markers and 1 on an
    image's, as transformers' Glm4vProcessor.create_mm_token_type_ids marks them (its get_rope_index reads them)."""
    import types

    import torch
    from transformers.models.glm4v.processing_glm4v import Glm4vProcessor

    tokenizer = timed_tokenizers["glm4v"]
    rows = timed_rows("glm4v", timed_folders["glm4v"][0], MediaConfig())
    token_ids = rows.token_ids(tokenizer)
    media = TEMPLATES["glm4v"].media
    image = f"{media.vision_bos}{media.image_token * 3}{media.vision_eos}"
    text = f"{image}a{media.video_bos}{image}0{image}0{media.video_eos}b{image}"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    processor = types.SimpleNamespace(video_start_id=token_ids["video_bos"], video_end_id=token_ids["video_eos"],
                                      image_token_id=token_ids["images"])
    expected = Glm4vProcessor.create_mm_token_type_ids(processor, [ids])
    marked = rows.model_inputs(torch.tensor([ids]), [], token_ids=token_ids)["mm_token_type_ids"]
    assert marked.tolist() == expected and [expected[0].count(kind) for kind in (1, 2)] == [6, 6]
