"""The media files of a multimodal row: LLaMA-Factory's `images`, `videos` and `audios` columns, resolved and
checked.

A path is read as LLaMA-Factory reads it: relative to `media_dir` (which defaults to `dataset_dir`)
when the file is there, else as written. A URL or an inline image is refused: tuneline reads media
from files, so that their content can key the cache. Each problem is a `RowProblem`, so a bad row
stops tokenizing with its dataset and row named, or is dropped and counted with `on_bad_row: skip`.
An image must open with Pillow, a video with PyAV, with a video stream whose first frame decodes, and
an audio clip with PyAV, with an audio stream that decodes to at least one sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuneline.core.data.converters import RowProblem
from tuneline.core.data.media.columns import AUDIOS, IMAGES, MEDIA_COLUMNS, VIDEOS
from tuneline.core.data.media.expansion import PLACEHOLDERS, placeholder_counts

URL_PREFIXES = ("http://", "https://", "data:")


def resolved_media(row: Mapping[str, Any], *, media_dir: Path) -> dict[str, list[str]]:
    """The row's media files, each checked to exist and, for images, to be an image Pillow reads;
    the count of each kind checked against the `<image>`, `<video>` and `<audio>` placeholders."""
    media = {key: row[key] for key in MEDIA_COLUMNS if key in row}
    counts = placeholder_counts([*row["prompt"], *row["response"]])
    for key, references in media.items():
        if len(references) != counts[key]:
            raise RowProblem(f"the row has {len(references)} {key} and {counts[key]} {PLACEHOLDERS[key]} placeholder(s) "
                             "in its messages; give one file per placeholder", reason="media_count")
    return {key: [_file(reference, key=key, media_dir=media_dir) for reference in references]
            for key, references in media.items()}


def _file(reference: str, *, key: str, media_dir: Path) -> str:
    if reference.startswith(URL_PREFIXES):
        raise RowProblem(f"{key} entry {reference[:60]!r} is a URL or inline data; tuneline reads media from files "
                         "(their content keys the cache): save it and give its path", reason="media_url")
    joined = media_dir / reference
    path = joined if joined.is_file() else Path(reference)
    if not path.is_file():
        raise RowProblem(f"{key} file {reference!r} is neither in media_dir ({media_dir}) nor at that path",
                         reason="media_missing")
    if key == IMAGES:
        _check_image(path)
    if key == VIDEOS:
        _check_video(path)
    if key == AUDIOS:
        _check_audio(path)
    return str(path)


def _check_image(path: Path) -> None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.verify()  # reads the whole file: a truncated one fails here, not in training
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise RowProblem(f"image file {str(path)!r} cannot be read as an image ({e})", reason="media_unreadable") from None


def _check_video(path: Path) -> None:
    from tuneline.core.data.media.video.frames import VideoError, check

    try:
        check(path)
    except VideoError as e:
        raise RowProblem(str(e), reason="media_unreadable") from None


def _check_audio(path: Path) -> None:
    from tuneline.core.data.media.audio.clips import AudioError, check

    try:
        check(path)
    except AudioError as e:
        raise RowProblem(str(e), reason="media_unreadable") from None

