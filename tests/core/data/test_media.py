"""Image, video and audio rows as LLaMA-Factory's `images`, `videos` and `audios` columns give them: paths resolved
against media_dir and checked, each bad row named (file and row) or dropped and counted with
on_bad_row: skip."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import pytest

from tuneline.core.data.dataset_info import get_dataset_attrs
from tuneline.core.data.loading import load_rows, load_rows_with_report
from tuneline.core.errors import DataError

CLIPS = Path(__file__).resolve().parents[2] / "data/media/clips"
ENTRY = {"file_name": "rows.json", "formatting": "sharegpt",
         "columns": {"messages": "messages", "images": "images", "videos": "videos", "audios": "audios"},
         "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}


def image_row(question: str, images) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": "A box."}], "images": images}


def video_row(question: str, videos) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": "A box."}], "videos": videos}


def audio_row(question: str, audios) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": "A tone."}], "audios": audios}


def header_only_video(path: Path) -> None:
    """A Matroska file cut where its first cluster of frames begins: a video stream's header, no frame."""
    import av
    from PIL import Image

    whole = path.with_suffix(".whole.mkv")
    with av.open(str(whole), "w") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for packet in [*stream.encode(av.VideoFrame.from_image(Image.new("RGB", (32, 32)))), *stream.encode()]:
            container.mux(packet)
    data = whole.read_bytes()
    path.write_bytes(data[:data.find(bytes.fromhex("1F43B675"))])  # Matroska's cluster id


@pytest.fixture
def dataset(tmp_path: Path):
    from PIL import Image

    media = tmp_path / "media"
    media.mkdir()
    Image.new("RGB", (40, 30), (10, 200, 10)).save(media / "green.png")
    Image.new("RGB", (64, 64), (200, 10, 10)).save(media / "red.jpg")
    (media / "cut.png").write_bytes((media / "green.png").read_bytes()[:60])
    (media / "notes.txt").write_text("not an image\n")
    (media / "empty.png").write_bytes(b"")
    (media / "dangling.png").symlink_to(media / "gone.png")
    (media / "clip.mp4").write_bytes((CLIPS / "short.mp4").read_bytes())
    (media / "cut.mp4").write_bytes((CLIPS / "short.mp4").read_bytes()[:300])
    header_only_video(media / "no_frames.mkv")
    with wave.open(str(media / "tone.wav"), "wb") as sound:
        sound.setnchannels(1), sound.setsampwidth(2), sound.setframerate(8000), sound.writeframes(bytes(1600))
    with wave.open(str(media / "silent.wav"), "wb") as sound:  # a header and no samples
        sound.setnchannels(1), sound.setsampwidth(2), sound.setframerate(8000), sound.writeframes(b"")
    (media / "cut.wav").write_bytes((media / "tone.wav").read_bytes()[:30])

    def write(rows: list[dict]) -> Path:
        """The rows as dataset 'd', whose entry maps the media columns the rows use."""
        (tmp_path / "rows.json").write_text(json.dumps(rows))
        columns = {key: value for key, value in ENTRY["columns"].items() if key == "messages" or any(key in row for row in rows)}
        (tmp_path / "dataset_info.json").write_text(json.dumps({"d": {**ENTRY, "columns": columns}}))
        return tmp_path

    return write, media


def attr(folder: Path):
    return get_dataset_attrs(["d"], folder)[0]


def test_paths_resolve_against_media_dir_or_as_written(dataset):
    write, media = dataset
    folder = write([image_row("<image>What is it?", ["green.png"]),
                    image_row("<image> and <image>?", [str(media / "red.jpg"), "green.png"])])
    rows = load_rows(attr(folder), folder, media_dir=media)
    assert [row["images"] for row in rows] == [[str(media / "green.png")], [str(media / "red.jpg"), str(media / "green.png")]]
    folder = write([image_row("<image>?", [str(media / "red.jpg")])])  # an absolute path needs no media_dir
    assert load_rows(attr(folder), folder)[0]["images"] == [str(media / "red.jpg")]


BAD_ROWS = {
    "missing file": (image_row("<image>?", ["gone.png"]), "media_missing", "images file 'gone.png' is neither in media_dir"),
    "not an image": (image_row("<image>?", ["notes.txt"]), "media_unreadable", "cannot be read as an image"),
    "cut short": (image_row("<image>?", ["cut.png"]), "media_unreadable", "cut.png' cannot be read as an image"),
    "fewer placeholders": (image_row("What?", ["green.png"]), "media_count", "the row has 1 images and 0 <image> placeholder"),
    "more placeholders": (image_row("<image><image>?", ["green.png"]), "media_count", "the row has 1 images and 2 <image>"),
    "url": (image_row("<image>?", ["https://example.com/a.png"]), "media_url", "is a URL or inline data"),
    "inline data": (image_row("<image>?", ["data:image/png;base64,AAAA"]), "media_url", "is a URL or inline data"),
    "not a list": (image_row("<image>?", {"path": "green.png"}), "wrong_type", "must hold a list of file paths"),
    "not text": (image_row("<image>?", [7]), "wrong_type", "must hold a list of file paths"),
    "a folder": (image_row("<image>?", ["."]), "media_missing", "images file '.' is neither in media_dir"),
    "empty file": (image_row("<image>?", ["empty.png"]), "media_unreadable", "empty.png' cannot be read as an image"),
    "dangling link": (image_row("<image>?", ["dangling.png"]), "media_missing", "images file 'dangling.png' is neither"),
    "missing video": (video_row("<video>?", ["gone.mp4"]), "media_missing", "videos file 'gone.mp4' is neither in media_dir"),
    "not a video": (video_row("<video>?", ["notes.txt"]), "media_unreadable", "notes.txt' cannot be read as a video"),
    "video cut short": (video_row("<video>?", ["cut.mp4"]), "media_unreadable", "cut.mp4' cannot be read as a video"),
    "sound, no video": (video_row("<video>?", ["tone.wav"]), "media_unreadable", "tone.wav' holds no video stream"),
    "video without frames": (video_row("<video>?", ["no_frames.mkv"]), "media_unreadable",
                             "no_frames.mkv' ends before its first frame"),
    "video placeholders": (video_row("<video><video>?", ["clip.mp4"]), "media_count", "the row has 1 videos and 2 <video>"),
    "video url": (video_row("<video>?", ["https://example.com/a.mp4"]), "media_url", "is a URL or inline data"),
    "missing sound": (audio_row("<audio>?", ["gone.wav"]), "media_missing", "audios file 'gone.wav' is neither in media_dir"),
    "not a sound": (audio_row("<audio>?", ["notes.txt"]), "media_unreadable", "notes.txt' cannot be read as audio"),
    "sound cut short": (audio_row("<audio>?", ["cut.wav"]), "media_unreadable", "cut.wav' cannot be read as audio"),
    "sound without samples": (audio_row("<audio>?", ["silent.wav"]), "media_unreadable", "silent.wav' holds no samples"),
    "video, no sound": (audio_row("<audio>?", ["clip.mp4"]), "media_unreadable", "clip.mp4' holds no audio stream"),
    "audio placeholders": (audio_row("What?", ["tone.wav"]), "media_count", "the row has 1 audios and 0 <audio>"),
    "audio url": (audio_row("<audio>?", ["https://example.com/a.wav"]), "media_url", "is a URL or inline data"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_bad_media_row_is_named_or_dropped_and_counted(dataset, case: str):
    write, media = dataset
    bad, reason, fragment = BAD_ROWS[case]
    folder = write([image_row("<image>Good?", ["green.png"]), bad])
    with pytest.raises(DataError) as caught:
        load_rows(attr(folder), folder, media_dir=media)
    message = " ".join(str(caught.value).split())
    assert f"row 2 of {folder / 'rows.json'}" in message and fragment in message and f"({reason}: 1)" in message, message
    rows, report = load_rows_with_report(attr(folder), folder, media_dir=media, on_bad_row="skip")
    assert len(rows) == 1 and report.dropped == {reason: 1}


def test_data_preprocess_exits_2_naming_the_bad_image_and_writes_nothing(dataset, tmp_path: Path, shared_dir: Path):
    import shutil

    import yaml
    from transformers import Qwen2VLImageProcessor

    from conftest import assert_refused, run_cli_here

    write, media = dataset
    folder = write([image_row("<image>Good?", ["green.png"]), image_row("<image>?", ["notes.txt"])])
    model = shutil.copytree(shared_dir / "tokenizers/qwen2.5", tmp_path / "model")
    Qwen2VLImageProcessor().save_pretrained(model)
    (tmp_path / "stage.yaml").write_text(yaml.safe_dump({
        "model_name_or_path": str(model), "stage": "sft", "dataset": "d",
        "dataset_dir": str(folder), "media_dir": str(media), "template": "qwen2_vl"}))
    result = run_cli_here("data", "preprocess", str(tmp_path / "stage.yaml"), "--output", str(tmp_path / "out"), cwd=tmp_path)
    assert_refused(result, f"row 2 of {folder / 'rows.json'}", "notes.txt' cannot be read as an image")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
