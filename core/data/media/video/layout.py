"""How the Qwen-VL families cut a video's frames into patches and write its tokens, as LLaMA-Factory 0.9.5
writes them and transformers' video processors cut them.

Qwen2-VL, Qwen2.5-VL and Qwen2.5-Omni size each frame alone, as their image processor sizes an image (the
pixel limits bound one frame), and write a video as one run: `<|vision_start|>`, one `<|video_pad|>` per
merged patch of all its temporal patches, `<|vision_end|>`.

Qwen3-VL and GLM-4.1V size a video's frames together: the video processor's pixel limits bound the whole
clip, every frame counted (`VideoPatching.clip_size`, transformers' video smart_resize with the temporal
factor), so a longer video gets smaller frames. They write a video a temporal patch at a time, each with
its time (`timed_video_texts`):

- Qwen3-VL: `<{t:.1f} seconds>`, `<|vision_start|>`, the patch's merged patches in `<|video_pad|>` and
  `<|vision_end|>`; t is the mean time of the patch's first and last frame (`frame_times`).
- GLM-4.1V: `<|begin_of_video|>`, then a patch at a time `<|begin_of_image|>`, its merged patches in
  `<|image|>` (GLM's model finds a video frame's features by the image token) and `<|end_of_image|>`
  followed by its time, and `<|end_of_video|>`. GLM's video processor samples again the frames
  LLaMA-Factory hands it (`glm_kept_frames`).

LLaMA-Factory's quirks, kept:
- Every video of a row is written with as many temporal patches as the row's first video has
  (`num_frames = video_grid_thw[0][0]`, "hard code for now"). A row whose videos differ there is refused:
  the model would find more or fewer video tokens than features (LLaMA-Factory writes the row and
  training fails, or stops on an IndexError).
- Qwen3-VL: the times of the videos in the row's n-th message are those of the row's n-th video
  (`video_metadata[idx]`, idx the message's index in prompt and reply), so two videos of one message
  share the first message's video's times. A video in a message whose number passes the row's video
  count is refused (LLaMA-Factory stops on an IndexError).
- Qwen3-VL: the times pair frames by the video processor's `merge_size`, which LLaMA-Factory passes
  where Qwen3VLProcessor passes `temporal_patch_size` (both 2 in Qwen3-VL's folders).
- GLM-4.1V: every time is 0. LLaMA-Factory reads the times from a `timestamps` output that transformers'
  Glm4vVideoProcessor does not give, and writes 0 for each temporal patch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneline.core.data.media.columns import IMAGES
from tuneline.core.data.media.expansion import VIDEO_PLACEHOLDER
from tuneline.core.errors import ConfigError, DataError

if TYPE_CHECKING:
    from PIL.Image import Image

    from tuneline.core.data.media.video.frames import VideoProbe
    from tuneline.core.templates.spec import MediaTokens

TIMED_PLUGINS = ("qwen3_vl", "glm4v")
"""The families whose videos are sized as a whole clip and written a temporal patch at a time."""
GLM_STATED_FPS = 2  # LLaMA-Factory's GLM4VPlugin tells the video processor every video runs at 2 frames a second
VIDEO_PLUGINS = ("qwen2_vl", "qwen2_omni")
"""The families whose video frames are each sized alone and written as one run."""
VIDEO_PROCESSOR_FILE = "video_preprocessor_config.json"
GLM_TIME = "0"  # the time LLaMA-Factory writes after each of GLM-4.1V's temporal patches (see the module's doc)


@dataclass(frozen=True)
class VideoPatching:
    """How a Qwen-VL family cuts video frames into patches: the numbers of the folder's video processor
    (video_preprocessor_config.json), or of its image processor where it has none (LLaMA-Factory, and
    transformers' AutoVideoProcessor, fall back the same way)."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    whole_clip: bool = False
    """The pixel limits bound the whole clip, every frame counted (Qwen3-VL's and GLM-4.1V's video
    processors); False: each frame alone (Qwen2-VL's)."""
    image_mean: tuple[float, ...] | None = None
    image_std: tuple[float, ...] | None = None
    """The video processor's normalisation, where its folder says; None: the image processor's."""
    fps: float = 2.0
    """GLM-4.1V: the rate its video processor samples the frames it is given at (its `fps`)."""
    max_duration: float = 300
    """GLM-4.1V: past this many seconds its video processor spreads fps x max_duration samples over the video."""
    sample_frames: bool = True
    """GLM-4.1V: its video processor samples again the frames it is given (its `do_sample_frames`, which
    LLaMA-Factory leaves as the folder sets it)."""

    @classmethod
    def of(cls, processor: Any, *, whole_clip: bool = False) -> VideoPatching:
        """From a processor object or its saved dictionary (size in `size` or as min_pixels/max_pixels)."""
        read = processor.get if isinstance(processor, Mapping) else lambda key: getattr(processor, key, None)
        size = dict(read("size") or {})
        mean, std = read("image_mean"), read("image_std")
        return cls(patch_size=int(read("patch_size")), temporal_patch_size=int(read("temporal_patch_size")),
                   merge_size=int(read("merge_size")), min_pixels=int(size.get("shortest_edge") or read("min_pixels")),
                   max_pixels=int(size.get("longest_edge") or read("max_pixels")), whole_clip=whole_clip,
                   image_mean=tuple(mean) if mean else None, image_std=tuple(std) if std else None,
                   fps=float(read("fps") or 2.0), max_duration=float(read("max_duration") or 300),
                   sample_frames=read("do_sample_frames") is not False)

    @classmethod
    def saved(cls, values: Mapping[str, Any]) -> VideoPatching:
        """From `dataclasses.asdict` of one, read back from JSON (its tuples as lists)."""
        return cls(**{key: tuple(value) if isinstance(value, list) else value for key, value in values.items()})

    @property
    def size(self) -> dict[str, int]:
        return {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels}

    def token_count(self, frames: int, width: int, height: int, image_processor: Any) -> int:
        """Tokens of a video of `frames` (paired) sized frames of `width` x `height`: its temporal patches
        times each frame's merged patches, the frame cut by the image processor's own arithmetic (or, for a
        whole clip, by `clip_size`)."""
        if self.whole_clip:
            patches, rows, columns = self.clip_grid(frames, width, height)
            return patches * rows * columns // self.merge_size ** 2
        spatial = int(image_processor.get_number_of_image_patches(height, width, {
            "size": self.size, "patch_size": self.patch_size, "merge_size": self.merge_size}))
        return math.ceil(frames / self.temporal_patch_size) * spatial // self.merge_size ** 2

    def clip_size(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """The (height, width) `frames` frames of `height` x `width` are resized to when the pixel limits bound
        the whole clip: transformers' video smart_resize (Qwen3-VL's and GLM-4.1V's, one arithmetic for an
        even frame count). A side under one merged patch is scaled up first, as GLM's does (Qwen3-VL's in
        transformers 5.6 refuses such frames, and LLaMA-Factory stops on them)."""
        factor = self.patch_size * self.merge_size
        if height < factor or width < factor:
            scale = max(factor / height, factor / width)
            height, width = int(height * scale), int(width * scale)
        if max(height, width) / min(height, width) > 200:
            raise DataError(f"video frames of {width} x {height} pixels are beyond the video processor's 200:1 aspect "
                            "limit; crop the video nearer to square.")
        rounded_height, rounded_width = round(height / factor) * factor, round(width / factor) * factor
        clip = math.ceil(frames / self.temporal_patch_size) * self.temporal_patch_size * rounded_height * rounded_width
        if clip > self.max_pixels:
            beta = math.sqrt(frames * height * width / self.max_pixels)
            return (max(factor, math.floor(height / beta / factor) * factor),
                    max(factor, math.floor(width / beta / factor) * factor))
        if clip < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (frames * height * width))
            return math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
        return rounded_height, rounded_width

    def clip_grid(self, frames: int, width: int, height: int) -> tuple[int, int, int]:
        """(temporal patches, patch rows, patch columns) of a whole-clip-sized video of `frames` frames."""
        clip_height, clip_width = self.clip_size(frames, height, width)
        return math.ceil(frames / self.temporal_patch_size), clip_height // self.patch_size, clip_width // self.patch_size


def frame_times(indices: Sequence[int], *, average_fps: float, fps: float, merge_size: int) -> list[float]:
    """Qwen3-VL's seconds of each temporal patch of a video whose frames numbered `indices` were sampled at
    `fps` (video_fps) from a stream of `average_fps`: LLaMA-Factory's frame times (index / average_fps x fps,
    its stand-in for frames the processor did not sample), over fps, and the mean of the first and last of
    each `merge_size` of them, the last repeated to fill a group (Qwen3VLProcessor._calculate_timestamps)."""
    scaled = [index / average_fps * fps for index in indices]
    scaled += scaled[-1:] * (-len(scaled) % merge_size)
    seconds = [value / fps for value in scaled]
    return [(seconds[start] + seconds[start + merge_size - 1]) / 2 for start in range(0, len(seconds), merge_size)]


def glm_kept_frames(count: int, duration: float, patching: VideoPatching) -> list[int]:
    """Which of the `count` frames LLaMA-Factory hands GLM-4.1V's video processor (sampled, paired) the
    processor keeps, paired again: Glm4vVideoProcessor.sample_frames, told the video runs at 2 frames a
    second and lasts `duration` seconds, takes floor(duration x fps) of them at steps of 2 / fps, so it keeps
    the first ones of those handed over where LLaMA-Factory sampled more than fps a second."""
    import numpy as np

    if not patching.sample_frames:
        return list(range(count))
    last = count - 1
    duration = duration or round(last / GLM_STATED_FPS) + 1
    if duration <= patching.max_duration:
        picked = [min(last, math.ceil(i * GLM_STATED_FPS / patching.fps)) for i in range(math.floor(duration * patching.fps))]
    elif int(patching.max_duration * patching.fps) >= count:
        picked = list(range(count))
    else:
        seconds = np.linspace(0, duration, int(patching.max_duration * patching.fps), endpoint=True)
        picked = [min(last, math.ceil(second * GLM_STATED_FPS)) for second in seconds]
    kept = list(dict.fromkeys(picked))
    return kept + kept[-1:] * (len(kept) % 2)


@dataclass(frozen=True)
class TimedVideo:
    """One video of a timed family as its tokens are written."""

    path: str
    grid: tuple[int, int, int]
    """Temporal patches, and each frame's patch rows and columns."""
    times: tuple[float, ...] = ()
    """Qwen3-VL: the seconds of each temporal patch (`frame_times`); GLM-4.1V writes no times of its own."""

    def tokens_per_patch(self, merge_size: int) -> int:
        return self.grid[1] * self.grid[2] // merge_size ** 2


def timed_video(path: str, found: VideoProbe, *, width: int, height: int, patching: VideoPatching, plugin: str,
                fps: float) -> TimedVideo:
    """The video at `path` (its header `found`, its frames sized to `width` x `height` as LLaMA-Factory sizes
    them, sampled at `fps`) as `plugin` writes it; a DataError for a GLM-4.1V video too short to keep a frame."""
    frames = len(found.indices) + len(found.indices) % 2
    if plugin == "glm4v":
        frames = len(glm_kept_frames(frames, found.duration, patching))
        if frames == 0:
            raise DataError(f"video file {path!r} lasts {found.duration:.2f} s, and GLM-4.1V's video processor keeps "
                            f"floor(seconds x {patching.fps:g}) of the frames it is given: none of this one's; give "
                            f"videos of at least {1 / patching.fps:g} s.")
        return TimedVideo(path=path, grid=patching.clip_grid(frames, width, height))
    times = frame_times(found.indices, average_fps=found.average_fps, fps=fps, merge_size=patching.merge_size)
    return TimedVideo(path=path, grid=patching.clip_grid(frames, width, height), times=tuple(times))


def timed_video_texts(videos: Sequence[TimedVideo], messages: Sequence[int], media: MediaTokens, *,
                      merge_size: int) -> list[str]:
    """The text of each of a row's `videos` as LLaMA-Factory writes it (see the module's doc), `messages[n]`
    the index (in prompt and reply) of the message holding the n-th; a DataError for a row LLaMA-Factory
    cannot write so that the model reads it."""
    patches = videos[0].grid[0]  # LLaMA-Factory: num_frames = video_grid_thw[0][0], the row's first video's
    texts = []
    for video, message in zip(videos, messages, strict=True):
        if video.grid[0] != patches:
            raise DataError(
                f"videos {videos[0].path!r} ({patches} temporal patches) and {video.path!r} ({video.grid[0]}) are in one "
                f"row; LLaMA-Factory's {media.plugin} expansion writes every video of a row with its first video's "
                "temporal patches, so the model would find other counts of video tokens and features: give a row's "
                "videos one length (the same count of frames sampled at video_fps), or one video a row.")
        tokens = video.tokens_per_patch(merge_size)
        if media.plugin == "glm4v":
            frame = f"{media.vision_bos}{media.image_token * tokens}{media.vision_eos}{GLM_TIME}"
            texts.append(f"{media.video_bos}{frame * patches}{media.video_eos}")
            continue
        if message >= len(videos):
            raise DataError(
                f"video {video.path!r} is in message {message + 1} of a row of {len(videos)} videos; LLaMA-Factory's "
                "qwen3_vl expansion times the videos of a row's n-th message by its n-th video and stops on this row "
                "(IndexError): put the row's videos in its first messages, or give one video a row.")
        run = f"{media.vision_bos}{(media.video_token or '') * tokens}{media.vision_eos}"
        texts.append("".join(f"<{time:.1f} seconds>{run}" for time in videos[message].times[:patches]))
    return texts


def video_run_text(tokens: int, media: MediaTokens) -> str:
    """Qwen2-VL's text of a video of `tokens` tokens: one run between the vision markers."""
    return f"{media.vision_bos}{(media.video_token or '') * tokens}{media.vision_eos}"


def video_placements(prompt: Sequence[Mapping[str, str]], response: Sequence[Mapping[str, str]]) -> list[int]:
    """The index of the message holding each `<video>` of a row, in order, as LLaMA-Factory counts messages:
    the prompt's in turn, then each reply after the prompt (it writes a pair's replies each after the prompt);
    a system message (chat puts one first) is not among them."""
    turns = [message for message in prompt if message["role"] != "system"]
    placed = [index for index, message in enumerate(turns) for _ in range(message["content"].count(VIDEO_PLACEHOLDER))]
    return placed + [len(turns) for message in response for _ in range(message["content"].count(VIDEO_PLACEHOLDER))]


def video_features(videos: Sequence[Sequence[Image]], image_processor: Any, patching: VideoPatching) -> dict[str, Any]:
    """`pixel_values_videos` and `video_grid_thw` (numpy) of sized videos, each a paired count of frames.

    A whole-clip family's frames are first resized (Pillow, bicubic) to `clip_size`. The image processor
    then cuts each frame alone, repeating it across the temporal patch; the k-th temporal patch of a video
    takes its t-th time slot from frame k x T + t, which is how transformers' video processor lays out
    consecutive frames. This runs where that class cannot (it needs torchvision), from the same sizes and the
    same normalisation; torchvision resizes with its own bicubic filter, so where a frame is resized the
    pixels differ from its by a little (the sizes, grids and shapes are the same)."""
    import numpy as np
    from PIL import Image as PILImage

    temporal = patching.temporal_patch_size
    pixels, grids = [], []
    settings: dict[str, Any] = {"patch_size": patching.patch_size, "merge_size": patching.merge_size,
                                "temporal_patch_size": temporal, "return_tensors": "np"}
    if patching.image_mean and patching.image_std:
        settings.update(image_mean=list(patching.image_mean), image_std=list(patching.image_std))
    for frames in videos:
        if patching.whole_clip:
            height, width = patching.clip_size(len(frames), frames[0].height, frames[0].width)
            frames = [frame.resize((width, height), PILImage.BICUBIC) for frame in frames]
            cut = image_processor(list(frames), do_resize=False, **settings)
        else:
            cut = image_processor(list(frames), size=patching.size, **settings)
        _, grid_h, grid_w = (int(n) for n in cut["image_grid_thw"][0])
        groups, patches = len(frames) // temporal, grid_h * grid_w
        flat = cut["pixel_values"].reshape(groups, temporal, patches, -1, temporal, patching.patch_size ** 2)
        video = np.stack([flat[:, slot, :, :, slot] for slot in range(temporal)], axis=3)
        pixels.append(video.reshape(groups * patches, -1))
        grids.append([groups, grid_h, grid_w])
    return {"pixel_values_videos": np.concatenate(pixels), "video_grid_thw": np.array(grids, dtype=np.int64)}


VIDEO_PROCESSOR_CLASSES = {"qwen3_vl": "Qwen3VLVideoProcessor", "glm4v": "Glm4vVideoProcessor"}
"""transformers' video processor class of each whole-clip family."""


def video_processor_config(patching: VideoPatching, plugin: str) -> dict[str, Any]:
    """video_preprocessor_config.json of a whole-clip family's `patching`: transformers' class and the numbers that
    size, normalise and cut its frames (its other settings are the class's defaults)."""
    saved: dict[str, Any] = {"video_processor_type": VIDEO_PROCESSOR_CLASSES[plugin], "patch_size": patching.patch_size,
                             "temporal_patch_size": patching.temporal_patch_size, "merge_size": patching.merge_size,
                             "size": patching.size, "fps": patching.fps, "do_sample_frames": patching.sample_frames}
    if patching.image_mean and patching.image_std:
        saved.update(image_mean=list(patching.image_mean), image_std=list(patching.image_std))
    if plugin == "glm4v":
        saved["max_duration"] = patching.max_duration
    return saved


def glm_token_types(input_ids: Any, token_ids: dict[str, int]) -> Any:
    """GLM-4.1V's `mm_token_type_ids` for `input_ids` ([batch, n]): 1 on image tokens, 2 on those within a
    video's markers (its frames), as Glm4vProcessor.create_mm_token_type_ids marks them."""
    images = input_ids == token_ids[IMAGES]
    if "video_bos" not in token_ids:
        return images.long()
    within = (input_ids == token_ids["video_bos"]).cumsum(dim=-1) > (input_ids == token_ids["video_eos"]).cumsum(dim=-1)
    return images.long() + (images & within).long()


def folder_video_patching(media: MediaTokens, model_path: str | Path, image_processor: Any) -> VideoPatching | None:
    """The folder's video numbers (its video processor's, else its image processor's), for the families
    whose videos tuneline feeds (Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni, Qwen3-VL, GLM-4.1V); None for the others."""
    if media.plugin not in (*VIDEO_PLUGINS, *TIMED_PLUGINS) or not media.video_token:
        return None
    whole_clip = media.plugin in TIMED_PLUGINS
    path = Path(model_path) / VIDEO_PROCESSOR_FILE
    if path.is_file():
        try:
            return VideoPatching.of({**vars(image_processor), **json.loads(path.read_text(encoding="utf-8"))},
                                    whole_clip=whole_clip)
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ConfigError(f"{path} cannot be read ({type(e).__name__}: {e}); it sets how the model cuts video "
                              "frames: use the model's own file.") from e
    return VideoPatching.of(image_processor, whole_clip=whole_clip)
