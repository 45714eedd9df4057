"""InternVL's videos (`intern_vl` plugin): each sampled frame one image tile, as LLaMA-Factory 0.9.5 writes
and feeds them.

LLaMA-Factory samples a video's frames as for every family (`video_frames`: floor(seconds x video_fps), at
most video_maxlen, no pairing), scales each into the video pixel limits, and hands them to the processor's
image processor with `crop_to_patches` off, so each frame is one tile of the processor's size (not
transformers' InternVLVideoProcessor, which it never calls). A video of n frames is written

    Frame1: <img>{<IMG_CONTEXT> x image_seq_length}</img>
    ...
    Framen: <img>{<IMG_CONTEXT> x image_seq_length}</img>

the lines joined by a newline, in place of `<video>`. The model finds a frame's features by the image token,
and LLaMA-Factory's `pixel_values` holds the images' tiles first, then every video's frames ("NOT SUPPORT
IMAGE VIDEO INTERLEAVED"). So a video's tokens must follow every image's: a row with a video before an image
is refused (`check_images_first`), and so is a call mixing images and videos over several sequences
(`check_one_sequence`), whose tokens interleave what the pixels do not (LLaMA-Factory feeds both and the model
reads each feature as another's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tuneline.core.data.media.expansion import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, image_features
from tuneline.core.errors import DataError

if TYPE_CHECKING:
    from PIL.Image import Image

    from tuneline.core.templates.spec import MediaTokens

FRAME_TILED_PLUGINS = ("intern_vl",)
"""The families whose video frames are each one image tile, written `FrameN: <img>...</img>`."""


def frame_tiles_text(frames: int, media: MediaTokens, *, tokens_per_tile: int) -> str:
    """The text of a video of `frames` sampled frames: a line a frame, numbered from 1."""
    tile = f"{media.vision_bos}{(media.image_token or '') * tokens_per_tile}{media.vision_eos}"
    return "\n".join(f"Frame{number}: {tile}" for number in range(1, frames + 1))


def check_images_first(messages: Sequence[Mapping[str, str]], *, where: str) -> None:
    """A DataError when a `<video>` of `messages` (prompt, then reply) comes before an `<image>`: the model
    would read the image's tiles as the video's frames."""
    text = "".join(message["content"] for message in messages)
    video, image = text.find(VIDEO_PLACEHOLDER), text.rfind(IMAGE_PLACEHOLDER)
    if video != -1 and image > video:
        raise DataError(f"{where} shows a video before an image; InternVL's pixel_values hold a row's images first and "
                        "its videos' frames after them (as LLaMA-Factory's InternVLPlugin cuts them), so the model would "
                        "read the image's tiles as the video's frames: put the row's images before its videos.")


def check_one_sequence(sequences: int, *, images: int, videos: int) -> None:
    """A DataError when a call feeds both images and videos to more than one sequence (see the module's doc)."""
    if images and videos and sequences > 1:
        raise DataError(f"a batch of {sequences} InternVL sequences holds {images} images and {videos} videos; its "
                        "pixel_values hold every image before every video's frames, while the sequences' tokens "
                        "interleave them, so the model would read one's features as another's: use "
                        "'per_device_train_batch_size: 1' (and 'per_device_eval_batch_size: 1') without packing, or "
                        "keep images and videos in separate runs.")


def frame_tile_features(videos: Sequence[Sequence[Image]], image_processor: Any) -> dict[str, Any]:
    """`pixel_values` (numpy) of sized videos' frames, a tile each, in order: the image processor at its size,
    tiles off, as LLaMA-Factory calls it on a video."""
    frames = [frame for video in videos for frame in video]
    return {"pixel_values": image_features(frames, image_processor, crop_to_patches=False)["pixel_values"]}
