"""The media columns, named once: a row's images, videos and sounds under LLaMA-Factory's names.

The same names are the keys of a dataset_info.json entry's `columns` mapping (which raw column holds
each), the columns of a standard row (the files as written) and of a tokenized example (the files
resolved, in the order of their tokens). Everything outside this package refers to them by these
constants, so a module that handles media says so in its imports.
"""

from __future__ import annotations

IMAGES = "images"
VIDEOS = "videos"
AUDIOS = "audios"
MEDIA_COLUMNS = (IMAGES, VIDEOS, AUDIOS)
"""Every media column, in the order a row's media are fed: images, then videos, then sounds."""

IMAGE_FILES, VIDEO_FILES, AUDIO_FILES = "image_files", "video_files", "audio_files"
"""A preference example's media files under other names: TRL's trainers take `images` (and `videos`) as
media to tokenize themselves, and tuneline's examples come tokenized."""
PAIR_FILE_COLUMNS = {IMAGES: IMAGE_FILES, VIDEOS: VIDEO_FILES, AUDIOS: AUDIO_FILES}

MEDIA_TOKENS = "media_tokens"
"""How many image, video and audio tokens an expanded row's messages hold (checked when it is encoded)."""
