"""Golden rows of Qwen2.5-Omni's images and sounds, written by LLaMA-Factory 0.9.5's own `qwen2_omni` template
and mm_plugin into tests/data/media/, in the format tests/core/data/test_omni_tokens.py reads: rows with
pictures, with sounds, and with both, their expanded messages, ids, image grids and mel frames, and the
supervised examples at two cutoffs.

LLaMA-Factory reads the processor's parts by name; Qwen2_5OmniProcessor itself also builds a video
processor, which needs torchvision (not importable beside the CPU torch here), so the script hands the
plugin the parts these rows use, as transformers' classes: Qwen2-VL's image processor and Whisper's
feature extractor at 128 mel bins. The sounds are tones read as torchaudio reads them (see
make_qwen2_audio_golden.py); the pictures are the Qwen2-VL golden's. The tokenizer is Qwen2.5's with
Qwen2.5-Omni's media tokens added. Run with LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_qwen2_omni_golden.py tests/data/media/qwen2_omni_media.json
"""
import json
import sys
import tempfile
import types
from pathlib import Path

import torchaudio
from transformers import AutoTokenizer, Qwen2VLImageProcessor, WhisperFeatureExtractor

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "data"))
from generate_audio_data import tone, write_wave  # noqa: E402

from golden_rows import QWEN_GOLDEN, SHARED, drawn_images, read_wave  # noqa: E402
from llamafactory.data.template import TEMPLATES  # noqa: E402


torchaudio.load = read_wave
out = Path(sys.argv[1])
sounds_dir = Path(tempfile.mkdtemp())
SOUNDS = {"short": 1.3, "beep": 0.5}  # seconds of a 440 Hz tone at 16 kHz
TOKENS = ["<|vision_bos|>", "<|vision_eos|>", "<|IMAGE|>", "<|VIDEO|>", "<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>"]
sounds = {}
for name, seconds in SOUNDS.items():
    write_wave(sounds_dir / f"{name}.wav", tone(seconds, 440.0, rate=16000), rate=16000)
    sounds[name] = str(sounds_dir / f"{name}.wav")
pictures = drawn_images(QWEN_GOLDEN["sizes"])
ROWS = [
    {"name": "one picture", "images": ["small"], "audios": [],
     "messages": [{"role": "user", "content": "<image>What colour is the box?"}, {"role": "assistant", "content": "Blue."}]},
    {"name": "one sound", "images": [], "audios": ["short"],
     "messages": [{"role": "user", "content": "<audio>What is this?"}, {"role": "assistant", "content": "A tone."}]},
    {"name": "a picture and two sounds", "images": ["wide"], "audios": ["beep", "short"],
     "messages": [{"role": "user", "content": "<audio>Does <image> fit this sound?"}, {"role": "assistant", "content": "No."},
                  {"role": "user", "content": "And <audio>?"}, {"role": "assistant", "content": "Neither."}]},
]
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5")
tokenizer.add_special_tokens({"additional_special_tokens": TOKENS})
processor = types.SimpleNamespace(image_processor=Qwen2VLImageProcessor(), feature_extractor=WhisperFeatureExtractor(feature_size=128),
                                  image_max_pixels=768 * 768, image_min_pixels=32 * 32, audio_sampling_rate=16000)
template = TEMPLATES["qwen2_omni"]
template.fix_special_tokens(tokenizer)
golden = []
for row in ROWS:
    images, audios = [pictures[n] for n in row["images"]], [sounds[n] for n in row["audios"]]
    expanded = template.mm_plugin.process_messages(row["messages"], images, [], audios, processor)
    pairs = template.encode_multiturn(tokenizer, expanded, system=None, tools=None)
    mm = template.mm_plugin._get_mm_inputs(images, [], audios, processor)
    golden.append({"name": row["name"], "images": row["images"], "audios": row["audios"], "messages": row["messages"],
                   "expanded": expanded, "pairs": [[list(a), list(b)] for a, b in pairs],
                   "image_grid_thw": mm["image_grid_thw"].tolist() if "image_grid_thw" in mm else [],
                   "feature_frames": mm["feature_attention_mask"].sum(-1).tolist() if "feature_attention_mask" in mm else []})


def with_files(rows):
    return [{**r, "images": [pictures[n] for n in r["images"]], "audios": [sounds[n] for n in r["audios"]]} for r in rows]


# golden_rows' helper reads `images` as names into `paths`; these rows also carry sounds, so encode them here
def supervised(cutoff_len):
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor

    data_args = types.SimpleNamespace(cutoff_len=cutoff_len, train_on_prompt=False, mask_history=False)
    encoder = SupervisedDatasetProcessor(template=template, tokenizer=tokenizer, processor=processor, data_args=data_args)
    rows = with_files(ROWS)
    encoded = encoder.preprocess_dataset({
        "_prompt": [r["messages"][:-1] for r in rows], "_response": [r["messages"][-1:] for r in rows],
        "_system": [""] * len(rows), "_tools": [""] * len(rows), "_images": [r["images"] or None for r in rows],
        "_videos": [None] * len(rows), "_audios": [r["audios"] or None for r in rows]})
    return [{"input_ids": ids, "labels": labels} for ids, labels in zip(encoded["input_ids"], encoded["labels"])]


json.dump({"llamafactory_version": "0.9.5", "template": "qwen2_omni", "tokenizer": "qwen2.5 with Qwen2.5-Omni's media tokens added",
           "tokens": TOKENS, "image_processor": "Qwen2VLImageProcessor()", "feature_extractor": "WhisperFeatureExtractor(feature_size=128)",
           "image_max_pixels": 768 * 768, "image_min_pixels": 32 * 32, "audio_sampling_rate": 16000, "sounds": SOUNDS,
           "sizes": QWEN_GOLDEN["sizes"], "rows": golden,
           "supervised_by_cutoff_len": {str(cutoff): supervised(cutoff) for cutoff in (2048, 60)}}, out.open("w"), indent=None)
print("wrote", out, [(g["name"], g["image_grid_thw"], g["feature_frames"]) for g in golden])
