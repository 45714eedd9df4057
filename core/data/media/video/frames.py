"""A video file's frames, sampled as LLaMA-Factory 0.9.5 samples them, decoded with PyAV.

A video of `total` frames lasting `duration` seconds gives floor(duration x video_fps) frames (at least
one, at most `video_maxlen` and `total`), spread evenly over it (`sample_indices`). Qwen2-VL's
family pairs frames in time, so an odd count gets its last frame repeated (`paired`).

`probe` reads what counting a video's tokens needs (its size and the sampled indices) from the
container's header without decoding a frame; `frames` decodes only the sampled ones, one at a time,
so a long video is never held in memory whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL.Image import Image


class VideoError(ValueError):
    """A video file that cannot be used, said in a phrase that names it."""


@dataclass(frozen=True)
class VideoSampling:
    fps: float = 2.0
    """Frames taken per second of video (`video_fps`)."""
    maxlen: int = 128
    """Most frames taken from one video (`video_maxlen`)."""


@dataclass(frozen=True)
class VideoProbe:
    width: int
    height: int
    indices: tuple[int, ...]
    """The sampled frames' numbers, in order."""
    duration: float
    """Seconds."""
    average_fps: float
    """The stream's frames a second (its header's average rate), which Qwen3-VL's frame times divide by."""

    @property
    def sampled_fps(self) -> float:
        """Frames sampled per second of video: what Qwen2.5-VL spaces its temporal positions by."""
        return len(self.indices) / self.duration


def sample_indices(total: int, duration: float, sampling: VideoSampling) -> list[int]:
    """The numbers of the frames taken from a video of `total` frames and `duration` seconds."""
    count = min(total, sampling.maxlen, max(1, math.floor(duration * sampling.fps)))
    step = (total - 1) / (count - 1) if count > 1 else 0.0
    return [int(i * step) for i in range(count)]  # numpy's linspace truncated to integers, as LLaMA-Factory takes it


def paired(count: int) -> int:
    """Frames fed for `count` sampled ones in a family that pairs them in time: an odd count repeats its last."""
    return count + count % 2


def probe(path: str | Path, sampling: VideoSampling) -> VideoProbe:
    """The size, sampled frames and duration of the video at `path`; a VideoError when it has no video
    stream or no frames, or PyAV cannot open it."""
    import av

    try:
        with av.open(str(path), "r") as container:
            stream = _video_stream(container, path)
            total = stream.frames or _counted_frames(container, stream)
            if total == 0:
                raise VideoError(f"video file {str(path)!r} has no frames")
            duration = _duration(container, stream, total)
            return VideoProbe(width=stream.width, height=stream.height, duration=duration,
                              indices=tuple(sample_indices(total, duration, sampling)),
                              average_fps=float(stream.average_rate or (total / duration if duration else 1)))
    except av.FFmpegError as e:
        raise _unreadable(path, e) from None


def frames(path: str | Path, indices: tuple[int, ...]) -> list[Image]:
    """The frames numbered `indices` of the video at `path`, as RGB-convertible Pillow images."""
    import av

    wanted, taken = set(indices), []
    with av.open(str(path), "r") as container:
        stream = _video_stream(container, path)
        for number, frame in enumerate(container.decode(stream)):
            if number in wanted:
                taken.append(frame.to_image())
            if number >= indices[-1]:
                break
    if len(taken) != len(wanted):
        raise VideoError(f"video file {str(path)!r} gave {len(taken)} of the {len(wanted)} frames its header promised")
    return taken


def check(path: str | Path) -> None:
    """Raise a VideoError unless the file at `path` is a video whose first frame decodes."""
    import av

    try:
        with av.open(str(path), "r") as container:
            stream = _video_stream(container, path)
            if next(container.decode(stream), None) is None:
                raise VideoError(f"video file {str(path)!r} has no frames")
    except av.FFmpegError as e:
        raise _unreadable(path, e) from None


def _unreadable(path: str | Path, error: Exception) -> VideoError:
    import av

    if isinstance(error, av.error.EOFError):  # a header, or less, whose frames never come
        return VideoError(f"video file {str(path)!r} ends before its first frame")
    return VideoError(f"video file {str(path)!r} cannot be read as a video ({error})")


def _video_stream(container, path: str | Path):
    stream = next((stream for stream in container.streams if stream.type == "video"), None)
    if stream is None:
        raise VideoError(f"file {str(path)!r} holds no video stream")
    return stream


def _counted_frames(container, stream) -> int:
    # a header without a frame count (some WebM and MKV files): count the stream's packets, which decodes
    # nothing; LLaMA-Factory assumes video_maxlen frames there, more than such a file may hold
    count = sum(1 for packet in container.demux(stream) if packet.size)
    container.seek(0)
    return count


def _duration(container, stream, total: int) -> float:
    import av

    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return total / float(stream.average_rate or 1)
