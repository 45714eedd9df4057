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
import sys
import types
from pathlib import Path

import torchaudio
from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, Qwen2VLImageProcessor, WhisperFeatureExtractor

from golden_rows import (
    OMNI_TOKENS,
    PIXEL_LIMITS,
    QWEN_GOLDEN,
    SHARED,
    drawn_images,
    expanded_row,
    media_inputs,
    read_wave,
    supervised_examples,
    write_golden,
    written_sounds,
)

torchaudio.load = read_wave
out = Path(sys.argv[1])
SOUNDS = {"short": 1.3, "beep": 0.5}  # seconds of a 440 Hz tone at 16 kHz
sounds = written_sounds({name: (seconds, 440.0, None, 16000) for name, seconds in SOUNDS.items()})
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
tokenizer.add_special_tokens({"additional_special_tokens": OMNI_TOKENS})
processor = types.SimpleNamespace(image_processor=Qwen2VLImageProcessor(), feature_extractor=WhisperFeatureExtractor(feature_size=128),
                                  **PIXEL_LIMITS, audio_sampling_rate=16000)
template = TEMPLATES["qwen2_omni"]
template.fix_special_tokens(tokenizer)
golden = []
for row in ROWS:
    images, audios = [pictures[n] for n in row["images"]], [sounds[n] for n in row["audios"]]
    expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images, audios=audios)
    mm = media_inputs(template, processor, images, audios=audios)
    golden.append({"name": row["name"], "images": row["images"], "audios": row["audios"], "messages": row["messages"],
                   "expanded": expanded, "pairs": pairs,
                   "image_grid_thw": mm["image_grid_thw"].tolist() if "image_grid_thw" in mm else [],
                   "feature_frames": mm["feature_attention_mask"].sum(-1).tolist() if "feature_attention_mask" in mm else []})
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, ROWS, pictures, cutoff_len, sounds=sounds)
              for cutoff_len in (2048, 60)}

write_golden(out, {"template": "qwen2_omni", "tokenizer": "qwen2.5 with Qwen2.5-Omni's media tokens added",
                   "tokens": OMNI_TOKENS, "image_processor": "Qwen2VLImageProcessor()",
                   "feature_extractor": "WhisperFeatureExtractor(feature_size=128)", **PIXEL_LIMITS, "audio_sampling_rate": 16000,
                   "sounds": SOUNDS, "sizes": QWEN_GOLDEN["sizes"], "rows": golden, "supervised_by_cutoff_len": supervised})
print("wrote", out, [(g["name"], g["image_grid_thw"], g["feature_frames"]) for g in golden])
