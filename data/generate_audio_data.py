"""Write tuneline's sound demo: `python data/generate_audio_data.py [--out-dir DIR] [--sounds N]`.

Short sounds (16-bit PCM WAV, 16 kHz, one channel, 1.5 seconds) of one to three beeps of a low or a
high tone over faint noise, and questions about them whose answers a tiny audio-language model can
learn on a CPU: "<audio>Is the tone high or low?" -> "high", "<audio>How many beeps?" -> "two". The
held-out questions ask about sounds no training row plays. The output folder is a dataset_dir of its
own (sounds/, the rows, dataset_info.json); the same seed always draws the same sounds. Written with
Python's own `wave` module.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import struct
import wave
from pathlib import Path

SEED = 4321
RATE, SECONDS = 16000, 1.5
PITCHES = {"low": 220.0, "high": 880.0}
COUNTS = {1: "one", 2: "two", 3: "three"}
QUESTIONS = {"pitch": "<audio>Is the tone high or low?", "count": "<audio>How many beeps?"}


def write_wave(path: Path, samples: list[float], *, rate: int = RATE, channels: int = 1) -> None:
    """`samples` in [-1, 1] (interleaved when `channels` > 1) as a 16-bit PCM WAV file at `rate`."""
    with wave.open(str(path), "wb") as sound:
        sound.setnchannels(channels)
        sound.setsampwidth(2)
        sound.setframerate(rate)
        sound.writeframes(struct.pack(f"<{len(samples)}h", *(round(max(-1.0, min(1.0, s)) * 32767) for s in samples)))


def write_sounding_clip(path: Path, frames: list, samples: list[float], *, frame_rate: int, rate: int = RATE) -> None:
    """`frames` (Pillow images of one size) as MPEG-4 video at `frame_rate` frames a second with `samples`
    (one channel in [-1, 1] at `rate`) as its AAC sound track, in an MP4 file: a clip whose own sound a
    model can hear with `use_audio_in_video` (needs PyAV)."""
    import av
    import numpy as np

    width, height = frames[0].size
    with av.open(str(path), "w") as container:
        video = container.add_stream("mpeg4", rate=frame_rate)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        sound = container.add_stream("aac", rate=rate)
        sound.layout = "mono"
        for frame in frames:
            container.mux(video.encode(av.VideoFrame.from_image(frame)))
        container.mux(video.encode())  # what the encoder still holds
        track = av.AudioFrame.from_ndarray(np.asarray([samples], dtype=np.float32), format="fltp", layout="mono")
        track.sample_rate = rate
        container.mux(sound.encode(track))
        container.mux(sound.encode())


def tone(seconds: float, frequency: float, *, rate: int = RATE, loudness: float = 0.5) -> list[float]:
    return [loudness * math.sin(2 * math.pi * frequency * index / rate) for index in range(round(seconds * rate))]


def beeps(rng: random.Random, pitch: str, count: int) -> list[float]:
    """`count` beeps of `pitch` spread over the sound, over faint noise."""
    length = round(SECONDS * RATE)
    sound = [rng.uniform(-0.02, 0.02) for _ in range(length)]
    beep = tone(0.2, PITCHES[pitch] * rng.uniform(0.97, 1.03), loudness=rng.uniform(0.4, 0.6))
    slot = length // count
    for index in range(count):
        start = index * slot + rng.randint(0, slot - len(beep))
        for offset, value in enumerate(beep):
            sound[start + offset] += value
    return sound


def sounds(rng: random.Random, out_dir: Path, prefix: str, count: int) -> list[tuple[str, str, int]]:
    """(file relative to out_dir, pitch, beeps) of `count` new sounds."""
    written = []
    for index in range(count):
        pitch, beeps_heard = rng.choice(list(PITCHES)), rng.choice(list(COUNTS))
        name = f"sounds/{prefix}_{index:03d}.wav"
        write_wave(out_dir / name, beeps(rng, pitch, beeps_heard))
        written.append((name, pitch, beeps_heard))
    return written


def question_rows(name: str, pitch: str, count: int) -> list[dict]:
    answers = {"pitch": pitch, "count": COUNTS[count]}
    return [{"messages": [{"role": "user", "content": QUESTIONS[kind]}, {"role": "assistant", "content": answers[kind]}],
             "audios": [name]} for kind in QUESTIONS]


def dataset_info() -> dict[str, dict]:
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    columns = {"messages": "messages", "audios": "audios"}
    return {name: {"file_name": f"{name}.json", "formatting": "sharegpt", "columns": columns, "tags": tags}
            for name in ("sound_questions", "sound_heldout")}


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path("sound_demo"))
    parser.add_argument("--sounds", type=int, default=48, help="training sounds (a quarter as many are held out)")
    options = parser.parse_args(argv)
    (options.out_dir / "sounds").mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    train = sounds(rng, options.out_dir, "train", options.sounds)
    heldout = sounds(rng, options.out_dir, "heldout", max(1, options.sounds // 4))
    write_json(options.out_dir / "sound_questions.json", [row for sound in train for row in question_rows(*sound)])
    write_json(options.out_dir / "sound_heldout.json", [row for sound in heldout for row in question_rows(*sound)])
    write_json(options.out_dir / "dataset_info.json", dataset_info())


if __name__ == "__main__":
    main()
