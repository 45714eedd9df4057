"""Golden rows of Qwen2-Audio's audio placeholder expansion, written by LLaMA-Factory 0.9.5's own
`qwen2_audio` template and mm_plugin with transformers' Qwen2AudioProcessor (Whisper's feature extractor
at 128 mel bins) into tests/data/media/, in the format tests/core/data/test_audio_tokens.py reads.
The tokenizer is Qwen2.5's with Qwen2-Audio's three audio tokens added. The sounds are tones written
by data/generate_audio_data.py's `write_wave` (drawn again by the test): 16 kHz mono ones, a 44.1 kHz
stereo one (LLaMA-Factory averages the channels and resamples) and one of 31 seconds (cut to 30).

LLaMA-Factory reads a sound file with torchaudio.load, which needs torchcodec; for these 16-bit PCM
WAV files this script hands it the samples as torchaudio gives them (each sample / 32768, one row a
channel) read with Python's `wave` module. Run with LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_qwen2_audio_golden.py tests/data/media/qwen2_audio_sounds.json
"""
import sys
from pathlib import Path

import torchaudio
from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, Qwen2AudioProcessor, WhisperFeatureExtractor

from golden_rows import SHARED, expanded_row, media_inputs, read_wave, supervised_examples, write_golden, written_sounds

torchaudio.load = read_wave
out = Path(sys.argv[1])
SOUNDS = {  # name: (seconds, left pitch, right pitch or None, rate)
    "short": (1.3, 440.0, None, 16000), "beep": (0.5, 880.0, None, 16000), "blip": (0.05, 660.0, None, 16000),
    "long": (31.0, 330.0, None, 16000), "stereo": (2.2, 440.0, 660.0, 44100)}

paths = written_sounds(SOUNDS)
ROWS = [
    {"name": "one sound", "audios": ["short"], "messages": [{"role": "user", "content": "<audio>What is this?"},
                                                            {"role": "assistant", "content": "A tone."}]},
    {"name": "two sounds, one resampled", "audios": ["beep", "stereo"],
     "messages": [{"role": "user", "content": "Compare <audio> and <audio>."},
                  {"role": "assistant", "content": "The second is longer."}]},
    {"name": "two turns", "audios": ["blip", "short"],
     "messages": [{"role": "user", "content": "<audio>"}, {"role": "assistant", "content": "A blip."},
                  {"role": "user", "content": "And <audio>?"}, {"role": "assistant", "content": "A tone."}]},
    {"name": "longer than 30 seconds", "audios": ["long"], "messages": [{"role": "user", "content": "<audio>Describe."},
                                                                       {"role": "assistant", "content": "A long hum."}]},
]
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5")
tokenizer.add_special_tokens({"additional_special_tokens": ["<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>"]})
processor = Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tokenizer)
processor.audio_sampling_rate = 16000
template = TEMPLATES["qwen2_audio"]
template.fix_special_tokens(tokenizer)
golden = []
for row in ROWS:
    audios = [paths[n] for n in row["audios"]]
    expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], audios=audios)
    mm = media_inputs(template, processor, audios=audios)
    features = mm["input_features"].double()
    golden.append({"name": row["name"], "audios": row["audios"], "messages": row["messages"],
                   "audio_tokens": [m["content"].count("<|AUDIO|>") for m in expanded], "pairs": pairs,
                   "input_features_shape": list(mm["input_features"].shape),
                   "feature_frames": mm["feature_attention_mask"].sum(-1).tolist(),
                   "feature_sums": features.sum(dim=(1, 2)).tolist(), "feature_abs_sums": features.abs().sum(dim=(1, 2)).tolist()})
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, ROWS, {}, cutoff_len, sounds=paths)
              for cutoff_len in (2048, 80)}

write_golden(out, {"template": "qwen2_audio", "tokenizer": "qwen2.5 with Qwen2-Audio's audio tokens added",
                   "feature_extractor": "WhisperFeatureExtractor(feature_size=128)", "audio_sampling_rate": 16000,
                   "sounds": {name: list(spec) for name, spec in SOUNDS.items()}, "rows": golden,
                   "supervised_by_cutoff_len": supervised})
print("wrote", out, [(g["name"], g["audio_tokens"], g["feature_frames"]) for g in golden])
