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


def video_positions(grid: Sequence[int], *, merge_size: int, second_per_grid: float) -> list[int]:
    """The temporal position of each of a video's tokens: `grid` (t, h, w) in patches, each temporal
    patch's (h / merge) x (w / merge) tokens at t x seconds per patch x 25. Computed in float32 and
    truncated, as transformers' tensors compute them."""
    frames, height, width = grid
    per_frame = (height // merge_size) * (width // merge_size)
    times = np.arange(frames, dtype=np.float32) * np.float32(second_per_grid) * np.float32(POSITIONS_PER_SECOND)
    return np.repeat(times.astype(np.int64), per_frame).tolist()


def interleaved_counts(grid: Sequence[int], audio_tokens: int, *, merge_size: int, second_per_grid: float) -> list[tuple[int, int]]:
    """(video tokens, sound tokens) of each two-second chunk of a video block, in order."""
    per_chunk = POSITIONS_PER_SECOND * CHUNK_SECONDS
    video = chunk_bounds(video_positions(grid, merge_size=merge_size, second_per_grid=second_per_grid), per_chunk)
    sound = chunk_bounds(list(range(audio_tokens)), per_chunk)
    def size(bounds: list[tuple[int, int]], index: int) -> int:
        return bounds[index][1] - bounds[index][0] if index < len(bounds) else 0

    return [(size(video, index), size(sound, index)) for index in range(max(len(video), len(sound)))]


def block_text(chunks: Sequence[tuple[int, int]], *, video_token: str, audio_token: str, vision_bos: str, vision_eos: str,
               audio_bos: str, audio_eos: str) -> str:
    """The text of a video block whose chunks hold `chunks` (video tokens, sound tokens)."""
    inner = "".join(video_token * video + audio_token * sound for video, sound in chunks)
    return f"{vision_bos}{audio_bos}{inner}{audio_eos}{vision_eos}"
