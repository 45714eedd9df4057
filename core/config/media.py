"""Keys of the image, video and audio processors of multimodal models; a text model reads none of them."""

from __future__ import annotations

from dataclasses import dataclass

from tuneline.core.config.fields import documented as _doc


@dataclass(frozen=True)
class MediaConfig:
    image_max_pixels: int = _doc("Images larger than this many pixels are scaled down.", default=768 * 768)
    image_min_pixels: int = _doc("Images smaller than this many pixels are scaled up.", default=32 * 32)
    image_do_pan_and_scan: bool = _doc("Gemma 3: crop large images into several views.", default=False)
    crop_to_patches: bool = _doc("InternVL: split images into tiles.", default=False)
    video_max_pixels: int = _doc("Video frames larger than this many pixels are scaled down.", default=256 * 256)
    video_min_pixels: int = _doc("Video frames smaller than this many pixels are scaled up.", default=16 * 16)
    video_fps: float = _doc("Frames sampled per second of video.", default=2.0)
    video_maxlen: int = _doc("Most frames sampled from one video.", default=128)
    use_audio_in_video: bool = _doc("Qwen2.5-Omni: also feed a video's audio track.", default=False)
    audio_sampling_rate: int = _doc("Sampling rate audio is resampled to.", default=16000)
