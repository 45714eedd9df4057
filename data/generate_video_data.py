"""Write tuneline's clip demo: `python data/generate_video_data.py [--out-dir DIR] [--clips N]` (needs Pillow and PyAV).

Short clips (MPEG-4 in MP4, 56 x 56 pixels, 8 frames at 4 frames a second) of one square in one of
four colours crossing a light background, left to right or right to left, and questions about them
whose answers a tiny vision-language model can learn on a CPU: "<video>What colour is the square?"
-> "red", "<video>Which way does the square move?" -> "right". The held-out questions ask about clips
no training row shows. The output folder is a dataset_dir of its own (clips/, the rows,
dataset_info.json); the same seed always draws the same clips.
"""

from __future__ import annotations

import argparse
import json
import random
from fractions import Fraction
from pathlib import Path

SEED = 8765
SIZE, FRAMES, RATE = 56, 8, 4
COLOURS = {"red": (210, 40, 40), "green": (40, 160, 60), "blue": (40, 70, 210), "yellow": (230, 200, 40)}
DIRECTIONS = ("left", "right")
QUESTIONS = {"colour": "<video>What colour is the square?", "direction": "<video>Which way does the square move?"}


def write_clip(path: Path, frames: list, *, rate: int | Fraction = RATE) -> None:
    """`frames` (Pillow images of one size) as an MPEG-4 video in an MP4 file at `rate` frames a second
    (a Fraction for a rate such as NTSC's 30000/1001)."""
    import av

    width, height = frames[0].size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_image(frame)):
                container.mux(packet)
        for packet in stream.encode():  # what the encoder still holds
            container.mux(packet)


def crossing(rng: random.Random, colour: str, direction: str) -> list:
    """The frames of a square of `colour` crossing the picture towards `direction`."""
    from PIL import Image, ImageDraw

    shade, side = rng.randint(225, 250), rng.randint(16, 24)
    top = rng.randint(2, SIZE - side - 2)
    frames = []
    for index in range(FRAMES):
        left = 2 + (SIZE - side - 4) * index // (FRAMES - 1)
        if direction == "left":
            left = SIZE - side - left
        image = Image.new("RGB", (SIZE, SIZE), (shade, shade, shade))
        ImageDraw.Draw(image).rectangle([left, top, left + side, top + side], fill=COLOURS[colour])
        frames.append(image)
    return frames


def clips(rng: random.Random, out_dir: Path, prefix: str, count: int) -> list[tuple[str, str, str]]:
    """(file relative to out_dir, colour, direction) of `count` new clips."""
    written = []
    for index in range(count):
        colour, direction = rng.choice(list(COLOURS)), rng.choice(DIRECTIONS)
        name = f"clips/{prefix}_{index:03d}.mp4"
        write_clip(out_dir / name, crossing(rng, colour, direction))
        written.append((name, colour, direction))
    return written


def question_rows(name: str, colour: str, direction: str) -> list[dict]:
    answers = {"colour": colour, "direction": direction}
    return [{"messages": [{"role": "user", "content": QUESTIONS[kind]}, {"role": "assistant", "content": answers[kind]}],
             "videos": [name]} for kind in QUESTIONS]


def dataset_info() -> dict[str, dict]:
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    columns = {"messages": "messages", "videos": "videos"}
    return {name: {"file_name": f"{name}.json", "formatting": "sharegpt", "columns": columns, "tags": tags}
            for name in ("clip_questions", "clip_heldout")}


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path("clip_demo"))
    parser.add_argument("--clips", type=int, default=48, help="training clips (a quarter as many are held out)")
    options = parser.parse_args(argv)
    (options.out_dir / "clips").mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    train = clips(rng, options.out_dir, "train", options.clips)
    heldout = clips(rng, options.out_dir, "heldout", max(1, options.clips // 4))
    write_json(options.out_dir / "clip_questions.json", [row for clip in train for row in question_rows(*clip)])
    write_json(options.out_dir / "clip_heldout.json", [row for clip in heldout for row in question_rows(*clip)])
    write_json(options.out_dir / "dataset_info.json", dataset_info())


if __name__ == "__main__":
    main()
