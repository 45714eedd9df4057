"""Image rows as LLaMA-Factory's `images` column gives them: paths resolved against media_dir and
checked, each bad row named (file and row) or dropped and counted with on_bad_row: skip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.core.data.dataset_info import get_dataset_attrs
from tuneline.core.data.loading import load_rows, load_rows_with_report
from tuneline.core.errors import DataError

ENTRY = {"file_name": "rows.json", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
         "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}


def image_row(question: str, images) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": "A box."}], "images": images}


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

    def write(rows: list[dict]) -> Path:
        (tmp_path / "rows.json").write_text(json.dumps(rows))
        (tmp_path / "dataset_info.json").write_text(json.dumps({"d": ENTRY}))
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
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_bad_image_row_is_named_or_dropped_and_counted(dataset, case: str):
    write, media = dataset
    bad, reason, fragment = BAD_ROWS[case]
    folder = write([image_row("<image>Good?", ["green.png"]), bad])
    with pytest.raises(DataError) as caught:
        load_rows(attr(folder), folder, media_dir=media)
    message = " ".join(str(caught.value).split())
    assert f"row 1 of {folder / 'rows.json'}" in message and fragment in message and f"({reason}: 1)" in message, message
    rows, report = load_rows_with_report(attr(folder), folder, media_dir=media, on_bad_row="skip")
    assert len(rows) == 1 and report.dropped == {reason: 1}


def test_data_preprocess_exits_2_naming_the_bad_image_and_writes_nothing(dataset, tmp_path: Path, shared_dir: Path):
    import yaml
    from conftest import assert_refused, run_cli_here

    import shutil

    from transformers import Qwen2VLImageProcessor

    write, media = dataset
    folder = write([image_row("<image>Good?", ["green.png"]), image_row("<image>?", ["notes.txt"])])
    model = shutil.copytree(shared_dir / "tokenizers/qwen2.5", tmp_path / "model")
    Qwen2VLImageProcessor().save_pretrained(model)
    (tmp_path / "stage.yaml").write_text(yaml.safe_dump({
        "model_name_or_path": str(model), "stage": "sft", "dataset": "d",
        "dataset_dir": str(folder), "media_dir": str(media), "template": "qwen2_vl"}))
    result = run_cli_here("data", "preprocess", str(tmp_path / "stage.yaml"), "--output", str(tmp_path / "out"), cwd=tmp_path)
    assert_refused(result, f"row 1 of {folder / 'rows.json'}", "notes.txt' cannot be read as an image")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
