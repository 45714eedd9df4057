"""Write tuneline's picture demo: `python data/generate_picture_data.py [--out-dir DIR]` (needs Pillow).

Small pictures of one shape (circle, square or triangle) in one of four colours, at a random size and
place on a light background, and questions about them whose answers a tiny vision-language model can
learn on a CPU in a few minutes: "What colour is the shape?" -> "red". The held-out questions ask
about pictures no training row shows. Preference pairs put the right colour (chosen) against a wrong
one (rejected). The output folder is a dataset_dir of its own (pictures/, the rows, dataset_info.json);
the same seed always draws the same pictures.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 4321
SIZE = 56  # two merged patches a side: four image tokens a picture for the Qwen2-VL family
TRAIN_PICTURES, HELDOUT_PICTURES, PAIRS = 360, 48, 180
COLOURS = {"red": (210, 40, 40), "green": (40, 160, 60), "blue": (40, 70, 210), "yellow": (230, 200, 40)}
SHAPES = ("circle", "square", "triangle")
QUESTION = "<image>What colour is the shape?"


def draw(rng: random.Random, colour: str, shape: str):
    from PIL import Image, ImageDraw

    shade = rng.randint(225, 250)
    image = Image.new("RGB", (SIZE, SIZE), (shade, shade, shade))
    side = rng.randint(30, 50)
    left, top = rng.randint(2, SIZE - side - 2), rng.randint(2, SIZE - side - 2)
    box = [left, top, left + side, top + side]
    pen = ImageDraw.Draw(image)
    fill = COLOURS[colour]
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape == "square":
        pen.rectangle(box, fill=fill)
    else:
        pen.polygon([(left + side // 2, top), (left, top + side), (left + side, top + side)], fill=fill)
    return image


def pictures(rng: random.Random, out_dir: Path, prefix: str, count: int) -> list[tuple[str, str, str]]:
    """(file relative to out_dir, colour, shape) of `count` new pictures."""
    drawn = []
    for index in range(count):
        colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
        name = f"pictures/{prefix}_{index:03d}.png"
        draw(rng, colour, shape).save(out_dir / name)
        drawn.append((name, colour, shape))
    return drawn


def question_row(name: str, colour: str) -> dict:
    return {"messages": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": colour}], "images": [name]}


def pair_row(rng: random.Random, name: str, colour: str) -> dict:
    wrong = rng.choice([other for other in COLOURS if other != colour])
    return {"messages": [{"role": "user", "content": QUESTION}], "chosen": {"role": "assistant", "content": colour},
            "rejected": {"role": "assistant", "content": wrong}, "images": [name]}


def dataset_info() -> dict[str, dict]:
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    columns = {"messages": "messages", "images": "images"}
    return {
        "picture_questions": {"file_name": "picture_questions.json", "formatting": "sharegpt", "columns": columns, "tags": tags},
        "picture_heldout": {"file_name": "picture_heldout.json", "formatting": "sharegpt", "columns": columns, "tags": tags},
        "picture_pairs": {"file_name": "picture_pairs.json", "formatting": "sharegpt", "ranking": True, "tags": tags,
                          "columns": {**columns, "chosen": "chosen", "rejected": "rejected"}},
    }


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "picture_demo")
    out_dir = parser.parse_args(argv).out_dir
    (out_dir / "pictures").mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    train = pictures(rng, out_dir, "train", TRAIN_PICTURES)
    heldout = pictures(rng, out_dir, "heldout", HELDOUT_PICTURES)
    write_json(out_dir / "picture_questions.json", [question_row(name, colour) for name, colour, _ in train])
    write_json(out_dir / "picture_heldout.json", [question_row(name, colour) for name, colour, _ in heldout])
    write_json(out_dir / "picture_pairs.json", [pair_row(rng, name, colour) for name, colour, _ in train[:PAIRS]])
    write_json(out_dir / "dataset_info.json", dataset_info())


if __name__ == "__main__":
    main()
