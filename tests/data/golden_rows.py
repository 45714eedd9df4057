"""What the golden scripts (tests/data/make_*_golden.py) share, run with LLaMA-Factory's Python: the
pictures every image golden draws, LLaMA-Factory 0.9.5's own supervised examples of a list of rows, and
the sound reader the sound goldens hand it.

The pictures are the Qwen2-VL golden's: red, with a blue box from a quarter to three quarters of each
side, as PNG files in a new temporary folder (tests/core/data/test_media_tokens.py draws them again).
"""
import json
import tempfile
import types
from pathlib import Path

from PIL import Image, ImageDraw

SHARED = Path(__file__).resolve().parents[3] / "shared"
QWEN_GOLDEN = json.loads((Path(__file__).parent / "media/qwen2_vl_images.json").read_text())
"""The Qwen2-VL golden, whose sizes and rows the other image goldens reuse."""


def drawn_images(sizes: dict) -> dict:
    """{name: path} of a picture of each (width, height) in `sizes`."""
    folder = Path(tempfile.mkdtemp())
    paths = {}
    for name, (width, height) in sizes.items():
        image = Image.new("RGB", (width, height), (200, 40, 40))
        ImageDraw.Draw(image).rectangle([width // 4, height // 4, 3 * width // 4, 3 * height // 4], fill=(30, 90, 220))
        image.save(folder / f"{name}.png")
        paths[name] = str(folder / f"{name}.png")
    return paths


def supervised_examples(template, tokenizer, processor, rows: list, paths: dict, cutoff_len: int, clips: dict | None = None) -> list:
    """LLaMA-Factory's supervised examples ({input_ids, labels}) of `rows` (each with `messages` and the
    names of its `images`, and with `clips` ({name: path}) of its `videos`), its last message the reply."""
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor

    data_args = types.SimpleNamespace(cutoff_len=cutoff_len, train_on_prompt=False, mask_history=False)
    encoder = SupervisedDatasetProcessor(template=template, tokenizer=tokenizer, processor=processor, data_args=data_args)
    batch = {"_prompt": [r["messages"][:-1] for r in rows], "_response": [r["messages"][-1:] for r in rows],
             "_system": [""] * len(rows), "_tools": [""] * len(rows), "_images": [[paths[n] for n in r["images"]] for r in rows],
             "_videos": [[clips[n] for n in r["videos"]] for r in rows] if clips else [None] * len(rows),
             "_audios": [None] * len(rows)}
    encoded = encoder.preprocess_dataset(batch)
    return [{"input_ids": ids, "labels": labels} for ids, labels in zip(encoded["input_ids"], encoded["labels"])]


def read_wave(path):
    """A 16-bit PCM WAV file's samples as torchaudio.load gives them (each sample / 32768, one row a
    channel) and its rate: LLaMA-Factory reads sounds with torchaudio.load, which needs torchcodec, not
    installed beside the CPU torch; the sound goldens put this in its place."""
    import wave

    import numpy as np
    import torch

    with wave.open(str(path), "rb") as sound:
        raw = np.frombuffer(sound.readframes(sound.getnframes()), dtype="<i2").astype(np.float32) / 32768
        return torch.from_numpy(raw.reshape(-1, sound.getnchannels()).T.copy()), sound.getframerate()


CLIPS_DIR = Path(__file__).parent / "media/clips"
"""The video goldens' clips (MPEG-4 in MP4): the Qwen2-VL golden's, and those `clip` writes."""


def clip(name: str, *, width: int, height: int, rate, count: int) -> str:
    """The path of `name`.mp4 in CLIPS_DIR, written as the Qwen2-VL golden draws its clips (a red square crossing
    a (235, 235, 235) background left to right, `count` frames at `rate` a second) with the project's clip writer;
    the same PyAV writes the same bytes."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "data"))
    from generate_video_data import write_clip

    write_clip(CLIPS_DIR / f"{name}.mp4", crossing_frames(width, height, count), rate=rate)
    return str(CLIPS_DIR / f"{name}.mp4")


def crossing_frames(width: int, height: int, count: int, *, fill=(200, 40, 40)) -> list:
    """`count` frames of a square of `fill` crossing a (235, 235, 235) background left to right: the video goldens' clips."""
    frames = []
    for index in range(count):
        image = Image.new("RGB", (width, height), (235, 235, 235))
        side = min(width, height) // 3
        left = (width - side) * index // max(1, count - 1)
        ImageDraw.Draw(image).rectangle([left, (height - side) // 2, left + side, (height + side) // 2], fill=fill)
        frames.append(image)
    return frames


def pixel_statistics(pixels) -> dict:
    """A few numbers of a pixel tensor, to compare with where torchvision and Pillow resize a little apart."""
    values = pixels.double()
    return {"shape": list(pixels.shape), "sum": round(float(values.sum()), 3), "mean": round(float(values.mean()), 6),
            "std": round(float(values.std()), 6)}
