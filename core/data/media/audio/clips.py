"""An audio file's samples as LLaMA-Factory feeds them to a model: one channel (the channels' mean), at
`audio_sampling_rate`.

Files are decoded with PyAV (the `media` extra), which reads WAV, FLAC, MP3, Ogg and the sound track
of a video alike. A file at another rate is resampled by FFmpeg's resampler and given the length
LLaMA-Factory's resampler gives (the input's samples times the rate ratio, rounded up), so the
audio's tokens, which are counted from its length, are LLaMA-Factory's; the samples themselves may
differ from its in the last digits there (another filter). One clip is decoded at a time, when its
row is tokenized (to count its tokens) and when its batch is collated (to make its features).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


class AudioError(ValueError):
    """A file that gives no audio; the message names the file and what is wrong."""


def samples(path: str | Path, rate: int) -> Any:
    """The file's sound as float32 samples in [-1, 1], one channel, at `rate` per second."""
    import av
    import numpy as np

    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise AudioError(f"audio file {str(path)!r} holds no audio stream")
            stream = container.streams.audio[0]
            source_rate = stream.rate or stream.codec_context.sample_rate
            chunks = [_mono(frame.to_ndarray(), frame.format.is_planar, len(frame.layout.channels))
                      for frame in container.decode(stream)]
    except AudioError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as e:
        raise AudioError(f"audio file {str(path)!r} cannot be read as audio ({type(e).__name__}: {e})") from None
    sound = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
    if not len(sound):
        raise AudioError(f"audio file {str(path)!r} holds no samples")
    if source_rate != rate:
        sound = _resampled(sound, source_rate, rate)
    return sound


def _mono(array: Any, planar: bool, channels: int) -> Any:
    """One channel of float32 from a decoded frame: integer samples scaled to [-1, 1], channels averaged."""
    import numpy as np

    if np.issubdtype(array.dtype, np.integer):
        array = array.astype(np.float32) / float(-np.iinfo(array.dtype).min)
    array = array.astype(np.float32)
    # planar: one row per channel; packed: one row of interleaved samples
    by_channel = array if planar else array.reshape(-1, channels).T
    return by_channel.mean(axis=0)


def _resampled(sound: Any, source_rate: int, rate: int) -> Any:
    import av
    import numpy as np

    frame = av.AudioFrame.from_ndarray(sound[None, :], format="flt", layout="mono")
    frame.sample_rate = source_rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    out = [piece.to_ndarray()[0] for piece in [*resampler.resample(frame), *resampler.resample(None)]]
    resampled = np.concatenate(out) if out else np.zeros(0, dtype=np.float32)
    length = math.ceil(len(sound) * rate / source_rate)
    return np.pad(resampled[:length], (0, max(0, length - len(resampled))))


def check(path: str | Path, rate: int = 16000) -> None:
    """Raise AudioError unless the file decodes to at least one sample."""
    samples(path, rate)
