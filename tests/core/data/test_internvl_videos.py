"""InternVL's `<video>` expansion (core/data/media/video/frame_tiles.py) against LLaMA-Factory 0.9.5's own output with
transformers' real InternVLProcessor (tests/data/media/internvl_videos.json, written by
tests/data/make_internvl_video_golden.py): each sampled frame one tile written `FrameN: <img>...</img>`, the
same token ids and supervised examples, and pixel_values of the images' tiles then the frames."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tuneline.core.config import MediaConfig
from tuneline.core.templates.catalog import TEMPLATES

MEDIA = Path(__file__).resolve().parents[2] / "data/media"
GOLDEN = json.loads((MEDIA / "internvl_videos.json").read_text())
# LLaMA-Factory's GotOcr2ImageProcessor resizes each frame to its 112 x 112 tile with torchvision's bicubic filter,
# tuneline's (GotOcr2ImageProcessorPil: torchvision does not import beside the CPU torch) with Pillow's, which draws
# the square's edges a level or so apart: the statistics agree to 3.1e-5 at worst (checked at 2e-4, as the other
# families' video pixels), while frames, tiles and shapes are exact
PIXEL_TOLERANCE = 2e-4


def settings_of(row: dict) -> MediaConfig:
    keys = ("video_max_pixels", "video_min_pixels", "video_fps", "video_maxlen", "image_max_pixels", "image_min_pixels",
            "crop_to_patches")
    return MediaConfig(**{key: row["settings"][key] for key in keys})


def drawn(name: str, folder: Path) -> Path:
    """The golden's picture `name` (tests/data/golden_rows.py's drawn_images)."""
    from PIL import Image, ImageDraw

    width, height = GOLDEN["images"][name]
    image = Image.new("RGB", (width, height), (200, 40, 40))
    ImageDraw.Draw(image).rectangle([width // 4, height // 4, 3 * width // 4, 3 * height // 4], fill=(30, 90, 220))
    image.save(folder / f"{name}.png")
    return folder / f"{name}.png"


@pytest.fixture(scope="module")
def internvl_folder(tmp_path_factory, shared_dir: Path) -> tuple[Path, Path]:
    """An InternVL-shaped folder as the golden's (Qwen2.5's tokenizer with InternVL's tokens, GotOcr2's image
    processor at 112 pixels, 16 tokens a tile in processor_config.json) and the golden's rows as a dataset."""
    from transformers import AutoTokenizer, GotOcr2ImageProcessorPil

    root = tmp_path_factory.mktemp("internvl")
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/qwen2.5")
    tokenizer.add_special_tokens({"additional_special_tokens": GOLDEN["added_tokens"]})
    tokenizer.save_pretrained(root / "model")
    GotOcr2ImageProcessorPil(**{k: v for k, v in GOLDEN["image_processor"].items() if k != "class"}).save_pretrained(root / "model")
    (root / "model" / "processor_config.json").write_text(json.dumps({"image_seq_length": GOLDEN["image_seq_length"],
                                                                       "processor_class": "InternVLProcessor"}))
    shutil.copytree(MEDIA / "clips", root / "data" / "media")
    for name in GOLDEN["images"]:
        drawn(name, root / "data" / "media")
    rows = [{"messages": row["messages"], "videos": [f"{name}.mp4" for name in row["videos"]],
             "images": [f"{name}.png" for name in row["images"]]} for row in GOLDEN["rows"][:4]]
    (root / "data" / "rows.json").write_text(json.dumps(rows))
    (root / "data" / "dataset_info.json").write_text(json.dumps({"clips": {
        "file_name": "rows.json", "formatting": "sharegpt", "columns": {"messages": "messages", "videos": "videos", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    return root / "model", root / "data"


def media_rows(model: Path, settings: MediaConfig, template: str = "intern_vl"):
    from tuneline.core.data.media.rows import MediaRows

    return MediaRows.load(TEMPLATES[template], model, settings, datasets={"images": ["clips"], "videos": ["clips"]})


@pytest.fixture(scope="module")
def tokenizer(internvl_folder):
    from transformers import AutoTokenizer

    from tuneline.core.templates.conversation import fix_tokenizer

    loaded = AutoTokenizer.from_pretrained(internvl_folder[0])
    fix_tokenizer(TEMPLATES["intern_vl"], loaded)
    return loaded


@pytest.mark.parametrize("row", GOLDEN["rows"], ids=[row["name"] for row in GOLDEN["rows"]])
def test_internvl_videos_expand_to_llamafactorys_tokens(row: dict, internvl_folder, tokenizer):
    """Frames counted from the clips' headers, the text and ids LLaMA-Factory writes, and the collator's
    pixel_values (the images' tiles, then a tile a frame): the shape exact, the statistics to PIXEL_TOLERANCE."""
    import torch

    from tuneline.core.templates.conversation import Conversation, encode_turns

    model, data = internvl_folder
    rows = media_rows(model, settings_of(row), row["template"])
    clips = [str(data / "media" / f"{name}.mp4") for name in row["videos"]]
    images = [str(data / "media" / f"{name}.png") for name in row["images"]]
    frames = [end - start for start, end in zip([0, *row["video_frames"]], row["video_frames"])]
    assert rows.video_token_counts(clips) == [count * GOLDEN["image_seq_length"] for count in frames]
    expanded = rows.expand({"prompt": row["messages"][:-1], "response": row["messages"][-1:], "videos": clips, "images": images})
    assert [message["content"] for message in expanded["prompt"] + expanded["response"]] == row["expanded"]
    pairs = encode_turns(TEMPLATES[row["template"]], tokenizer, Conversation(prompt=expanded["prompt"], response=expanded["response"]))
    assert [[list(source), list(target)] for source, target in pairs] == row["pairs"]

    ids = torch.tensor([[token for source, target in row["pairs"] for token in source + target]])
    inputs = rows.model_inputs(ids, images, clips, token_ids=rows.token_ids(tokenizer))
    pixels, expected = inputs["pixel_values"].double(), row["pixel_values"]
    assert set(inputs) == {"pixel_values"} and list(pixels.shape) == expected["shape"]
    assert len(pixels) * GOLDEN["image_seq_length"] == int((ids == rows.token_ids(tokenizer)["images"]).sum())
    assert float(pixels.sum()) == pytest.approx(expected["sum"], rel=PIXEL_TOLERANCE)
    assert float(pixels.mean()) == pytest.approx(expected["mean"], abs=PIXEL_TOLERANCE)
    assert float(pixels.std()) == pytest.approx(expected["std"], abs=PIXEL_TOLERANCE)


def test_a_videos_frames_follow_the_images_tiles_each_cut_alone(internvl_folder):
    """pixel_values: the image's tiles, then each sampled frame (scaled into the video pixel limits) as the image
    processor cuts that frame alone, in order."""
    import numpy as np
    from transformers import AutoImageProcessor

    from tuneline.core.data.media.sizing import sized_image
    from tuneline.core.data.media.video.frames import VideoSampling, frames, probe

    model, data = internvl_folder
    clip, image = str(data / "media" / "long.mp4"), str(data / "media" / "wide.png")
    rows = media_rows(model, MediaConfig())
    pixels = rows.model_inputs(np.zeros((1, 1)), [image], [clip], token_ids={})["pixel_values"].numpy()
    processor = AutoImageProcessor.from_pretrained(model)
    taken = [sized_image(frame, max_pixels=256 * 256, min_pixels=16 * 16, plugin="intern_vl")
             for frame in frames(clip, probe(clip, VideoSampling()).indices)]
    assert len(pixels) == 1 + 8 and taken[0].size == (295, 221)  # 320 x 240 scaled under 256 x 256 pixels
    np.testing.assert_array_equal(pixels[0], rows.features([image])["pixel_values"][0].numpy())
    for index, frame in enumerate(taken):
        np.testing.assert_array_equal(pixels[1 + index], processor([frame], return_tensors="np")["pixel_values"][0])


@pytest.mark.parametrize("cutoff_len", ["1024", "130"])
def test_internvl_video_rows_tokenize_to_llamafactorys_supervised_examples(internvl_folder, tmp_path: Path, cutoff_len: str):
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, data = internvl_folder
    config = build_stage_config({"model_name_or_path": str(model), "dataset": "clips", "dataset_dir": str(data),
                                 "media_dir": str(data / "media"), "template": "intern_vl", "cutoff_len": int(cutoff_len)})
    counters = tokenize_stage_data(config, tokenizer_path=model, output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    expected = GOLDEN["supervised_by_cutoff_len"][cutoff_len]
    # LLaMA-Factory keeps an example whose cutoff cut into its media tokens (training then fails on it); tuneline drops it
    kept = [i for i, example in enumerate(expected) if len(example["input_ids"]) < int(cutoff_len)]
    assert kept == ([0, 1, 2, 3] if cutoff_len == "1024" else [0])
    assert counters.get("rows_dropped_media_tokens_cut", 0) == len(expected) - len(kept)
    assert train["input_ids"] == [expected[i]["input_ids"] for i in kept]
    assert train["labels"] == [expected[i]["labels"] for i in kept]


def test_internvl_rows_whose_pixels_would_not_follow_their_tokens_are_refused(internvl_folder, tmp_path: Path):
    """A video before an image in a row, images and videos fed to several sequences at once, or packed: the
    model reads the features in token order, and the pixels hold every image before every frame."""
    import torch

    from tuneline.core.errors import ConfigError, DataError
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, data = internvl_folder
    rows = media_rows(model, MediaConfig())
    clip, image = str(data / "media" / "short.mp4"), str(data / "media" / "square.png")
    late = {"prompt": [{"role": "user", "content": "<video>What is it?"}, {"role": "assistant", "content": "A clip."},
                       {"role": "user", "content": "And <image>?"}], "response": [{"role": "assistant", "content": "A box."}],
            "videos": [clip], "images": [image]}
    with pytest.raises(DataError, match="begins '<video>What is it\\?' shows a video before an image; InternVL's pixel_values"):
        rows.expand(late)
    with pytest.raises(DataError, match="a batch of 2 InternVL sequences holds 2 images and 2 videos"):
        rows.model_inputs(torch.zeros((2, 4), dtype=torch.long), [image, image], [clip, clip], token_ids={})
    assert rows.model_inputs(torch.zeros((2, 4), dtype=torch.long), [], [clip, clip], token_ids={})["pixel_values"].shape[0] == 6
    config = build_stage_config({"model_name_or_path": str(model), "dataset": "clips", "dataset_dir": str(data),
                                 "media_dir": str(data / "media"), "template": "intern_vl", "packing": True})
    with pytest.raises(ConfigError, match="'packing' with images \\(dataset 'clips'\\) and videos \\(dataset 'clips'\\) "
                                          "through 'template: intern_vl' is not offered"):
        tokenize_stage_data(config, tokenizer_path=model, output_dir=tmp_path / "packed")
