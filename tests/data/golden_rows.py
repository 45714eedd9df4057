"""What the multimodal golden scripts (tests/data/make_*_golden.py) share, run with LLaMA-Factory's
Python: the pictures, clips and sounds they draw, LLaMA-Factory 0.9.5's expansion of a row's media
placeholders and its own supervised examples of a list of rows, the processor settings and added
tokens several of them use, and the file they write.

The pictures are the Qwen2-VL golden's: red, with a blue box from a quarter to three quarters of each
side, as PNG files in a new temporary folder (tests/core/data/test_media_tokens.py draws them again).
"""
import json
import sys
import tempfile
import types
from pathlib import Path

from PIL import Image, ImageDraw

SHARED = Path(__file__).resolve().parents[3] / "shared"
DATA_SCRIPTS = Path(__file__).resolve().parents[2] / "data"
"""The project's data scripts (generate_video_data.py, generate_audio_data.py), whose writers draw the clips and sounds."""
sys.path.insert(0, str(DATA_SCRIPTS))
QWEN_GOLDEN = json.loads((Path(__file__).parent / "media/qwen2_vl_images.json").read_text())
"""The Qwen2-VL golden, whose sizes and rows the other image goldens reuse."""
LLAMAFACTORY_VERSION = "0.9.5"
PIXEL_LIMITS = {"image_max_pixels": 768 * 768, "image_min_pixels": 32 * 32}
"""LLaMA-Factory's default image pixel limits, which every golden's processor carries."""
VIDEO_SETTINGS = {"video_max_pixels": 256 * 256, "video_min_pixels": 16 * 16, "video_fps": 2.0, "video_maxlen": 128,
                  **PIXEL_LIMITS}
"""The video goldens' processor settings (LLaMA-Factory's keys, at its defaults but the video pixel limits)."""
VIDEO_SETTING_GROUPS = {"defaults": {}, "video_fps 1, video_maxlen 2": {"video_fps": 1.0, "video_maxlen": 2},
                        "video_fps 4, video_maxlen 12": {"video_fps": 4.0, "video_maxlen": 12}}
"""The Qwen3-VL and GLM-4.1V video goldens' groups of rows: the changes to VIDEO_SETTINGS each is written with."""
ONE_VIDEO_ROWS = ("one short video", "a long video", "an NTSC clip")
"""The rows the third of VIDEO_SETTING_GROUPS writes."""
PANORAMA_SIZE = [1100, 400]
PANORAMA_ROW = {"name": "panorama and square", "images": ["panorama", "square"],
                "messages": [{"role": "user", "content": "<image>Is it wide? <image>"},
                             {"role": "assistant", "content": "The first is."}]}
"""The row the tiling goldens (Gemma 3's pan and scan, InternVL's tiles) add to the Qwen2-VL golden's: a wide picture."""
GLM_TOKENS = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_image|>",
              "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|video|>"]
"""GLM's control and media tokens, added to Qwen2.5's tokenizer for the GLM-4.1V goldens."""
INTERN_TOKENS = ["<img>", "</img>", "<IMG_CONTEXT>"]
"""InternVL's image tokens, added to Qwen2.5's tokenizer for the InternVL goldens."""
OMNI_TOKENS = ["<|vision_bos|>", "<|vision_eos|>", "<|IMAGE|>", "<|VIDEO|>", "<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>"]
"""Qwen2.5-Omni's media tokens, added to Qwen2.5's tokenizer for the Omni goldens."""


def user(content: str) -> dict:
    return {"role": "user", "content": content}


def assistant(content: str) -> dict:
    return {"role": "assistant", "content": content}


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


def plain_images(sizes: dict, colour=(30, 90, 220)) -> dict:
    """{name: path} of a picture of one `colour` of each (width, height) in `sizes`, in a new temporary folder."""
    folder = Path(tempfile.mkdtemp())
    for name, size in sizes.items():
        Image.new("RGB", tuple(size), colour).save(folder / f"{name}.png")
    return {name: str(folder / f"{name}.png") for name in sizes}


def written_sounds(sounds: dict) -> dict:
    """{name: path} of a WAV file of each name: (seconds, left pitch, right pitch or None, rate) in `sounds`,
    tones written by data/generate_audio_data.py's `write_wave` in a new temporary folder."""
    from generate_audio_data import tone, write_wave

    folder = Path(tempfile.mkdtemp())
    for name, (seconds, left, right, rate) in sounds.items():
        if right is None:
            write_wave(folder / f"{name}.wav", tone(seconds, left, rate=rate), rate=rate)
        else:
            pairs = zip(tone(seconds, left, rate=rate), tone(seconds, right, rate=rate))
            write_wave(folder / f"{name}.wav", [value for pair in pairs for value in pair], rate=rate, channels=2)
    return {name: str(folder / f"{name}.wav") for name in sounds}


def with_settings(processor, settings: dict):
    """`processor` with LLaMA-Factory's processor keys in `settings` set on it, as its patch_processor sets them."""
    for key, value in settings.items():
        setattr(processor, key, value)
    return processor


def expanded_row(template, tokenizer, processor, messages: list, images=(), videos=(), audios=()) -> tuple[list, list]:
    """LLaMA-Factory's own expansion of a row's media placeholders (`template.mm_plugin`) and the
    row encoded turn by turn: (the expanded messages, [[prompt ids, reply ids], ...])."""
    expanded = template.mm_plugin.process_messages(messages, list(images), list(videos), list(audios), processor)
    pairs = template.encode_multiturn(tokenizer, expanded, system=None, tools=None)
    return expanded, [[list(prompt), list(reply)] for prompt, reply in pairs]


def media_inputs(template, processor, images=(), videos=(), audios=()) -> dict:
    """The model inputs LLaMA-Factory's plugin makes of one row's media files (pixel values, grids, mel features)."""
    return template.mm_plugin._get_mm_inputs(list(images), list(videos), list(audios), processor)


def supervised_examples(template, tokenizer, processor, rows: list, paths: dict, cutoff_len: int, clips: dict | None = None,
                        sounds: dict | None = None) -> list:
    """LLaMA-Factory's supervised examples ({input_ids, labels}) of `rows` (each with `messages` and the
    names of its `images` in `paths`, of its `videos` in `clips` and of its `audios` in `sounds`, each
    {name: path}), its last message the reply. A row without media of a kind gives LLaMA-Factory []
    or None alike: it reads either as no files."""
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor

    data_args = types.SimpleNamespace(cutoff_len=cutoff_len, train_on_prompt=False, mask_history=False)
    encoder = SupervisedDatasetProcessor(template=template, tokenizer=tokenizer, processor=processor, data_args=data_args)
    batch = {"_prompt": [r["messages"][:-1] for r in rows], "_response": [r["messages"][-1:] for r in rows],
             "_system": [""] * len(rows), "_tools": [""] * len(rows),
             "_images": [[paths[n] for n in r.get("images", ())] for r in rows],
             "_videos": [[clips[n] for n in r["videos"]] for r in rows] if clips else [None] * len(rows),
             "_audios": [[sounds[n] for n in r["audios"]] for r in rows] if sounds else [None] * len(rows)}
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


def clip(name: str, *, width: int, height: int, rate, count: int, folder: Path = CLIPS_DIR) -> str:
    """The path of `name`.mp4 in `folder`, written as the Qwen2-VL golden draws its clips (a red square crossing
    a (235, 235, 235) background left to right, `count` frames at `rate` a second) with the project's clip writer;
    the same PyAV writes the same bytes."""
    from generate_video_data import write_clip

    folder.mkdir(exist_ok=True)
    write_clip(folder / f"{name}.mp4", crossing_frames(width, height, count), rate=rate)
    return str(folder / f"{name}.mp4")


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


def write_golden(out: Path, golden: dict, *, indent: int | None = None) -> None:
    """`golden` as JSON in `out`, after the LLaMA-Factory version that wrote it."""
    with out.open("w") as file:
        json.dump({"llamafactory_version": LLAMAFACTORY_VERSION, **golden}, file, indent=indent)
