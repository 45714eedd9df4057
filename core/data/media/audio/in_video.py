"""Qwen2.5-Omni hearing a video's own sound track (`use_audio_in_video: true`): one block of the video's
tokens and its sound's, interleaved in stretches of two seconds.

Each temporal patch of the video sits at `t x seconds per patch x 25` positions (25 rotary positions a
second), each sound token at its own index (Whisper's frames are 40 ms apart after the encoder's
pooling: 25 a second). Both runs of positions are cut into chunks of 50 (two seconds) as transformers'
`Qwen2_5OmniProcessor.get_chunked_index` cuts them, and the block is `<|vision_bos|><|audio_bos|>`, then
for each chunk its video tokens and its sound tokens, then `<|audio_eos|><|vision_eos|>`, as
LLaMA-Factory's `qwen2_omni` plugin writes it. The video's own `<video>` placeholder is replaced by the
block and the `<audio>` after it, which names the sound, by nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tuneline.core.data.media.expansion import AUDIO_PLACEHOLDER as AUDIO
from tuneline.core.data.media.expansion import VIDEO_PLACEHOLDER as VIDEO
from tuneline.core.errors import DataError

POSITIONS_PER_SECOND = 25
"""Qwen2.5-Omni's rotary positions a second (its processor's `position_id_per_seconds`)."""
CHUNK_SECONDS = 2


def chunk_bounds(positions: Sequence[int], per_chunk: int) -> list[tuple[int, int]]:
    """[start, end) index ranges of `positions` (non-decreasing), a new range each time a position reaches
    the next multiple of `per_chunk`: at most one new range per position, as transformers counts them."""
    bounds, start, limit = [], 0, per_chunk
    for index, position in enumerate(positions):
        if position >= limit:
            bounds.append((start, index))
            start, limit = index, limit + per_chunk
    bounds.append((start, len(positions)))
    return bounds


def video_positions(patches: int, tokens_per_patch: int, *, second_per_grid: float) -> list[int]:
    """The temporal position of each of a video's tokens: its `patches` temporal patches of `tokens_per_patch`
    tokens each, patch t at t x seconds per patch x 25. Computed in float32 and truncated, as transformers'
    tensors compute them."""
    times = np.arange(patches, dtype=np.float32) * np.float32(second_per_grid) * np.float32(POSITIONS_PER_SECOND)
    return np.repeat(times.astype(np.int64), tokens_per_patch).tolist()


def interleaved_counts(patches: int, tokens_per_patch: int, audio_tokens: int, *, second_per_grid: float) -> list[tuple[int, int]]:
    """(video tokens, sound tokens) of each two-second chunk of a video block, in order."""
    per_chunk = POSITIONS_PER_SECOND * CHUNK_SECONDS
    video = chunk_bounds(video_positions(patches, tokens_per_patch, second_per_grid=second_per_grid), per_chunk)
    sound = chunk_bounds(list(range(audio_tokens)), per_chunk)
    def size(bounds: list[tuple[int, int]], index: int) -> int:
        return bounds[index][1] - bounds[index][0] if index < len(bounds) else 0

    return [(size(video, index), size(sound, index)) for index in range(max(len(video), len(sound)))]


def row_label(row: dict) -> str:
    """A row named by the start of its first message (rows reach expansion without their file and line)."""
    first = (row.get("prompt") or [{"content": ""}])[0]["content"]
    return f"the row whose first message begins {first[:60]!r}"


def heard_video_blocks(messages: Sequence[dict[str, str]], blocks: Sequence[str], *, where: str) -> list[dict[str, str]]:
    """`messages` with each `<video>` replaced by its block (in order) and the first `<audio>` of the message,
    which names that video's sound, removed, as LLaMA-Factory writes them. `where` names the row in the
    DataError raised when a `<video>` has no `<audio>` after it."""
    remaining, written = list(blocks), []
    for message in messages:
        content = message["content"]
        while VIDEO in content:
            if content.find(AUDIO, content.find(VIDEO)) == -1:
                raise DataError(f"{where}: with 'use_audio_in_video: true' each {VIDEO} must be followed by the {AUDIO} of "
                                f"its sound track (the row's `audios` naming the same file), and message {message['content']!r} "
                                f"has a {VIDEO} without one after it; add it, or leave use_audio_in_video out.")
            content = content.replace(VIDEO, remaining.pop(0), 1).replace(AUDIO, "", 1)
        written.append({**message, "content": content})
    return written


def block_text(chunks: Sequence[tuple[int, int]], *, video_token: str, audio_token: str, vision_bos: str, vision_eos: str,
               audio_bos: str, audio_eos: str) -> str:
    """The text of a video block whose chunks hold `chunks` (video tokens, sound tokens)."""
    inner = "".join(video_token * video + audio_token * sound for video, sound in chunks)
    return f"{vision_bos}{audio_bos}{inner}{audio_eos}{vision_eos}"
