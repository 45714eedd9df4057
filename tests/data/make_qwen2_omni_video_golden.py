"""Golden rows of Qwen2.5-Omni hearing each video's own sound track (`use_audio_in_video: true`), written by
LLaMA-Factory 0.9.5's own `qwen2_omni` template and mm_plugin into tests/data/media/, in the format
tests/core/data/test_omni_tokens.py reads: rows whose `<video><audio>` pairs become one block of the
video's tokens and its sound's, interleaved two seconds at a time, their ids, grids, mel frames and
seconds per temporal patch, and the supervised examples at two cutoffs; and, with `use_audio_in_video`
off, rows of plain clips (`plain_rows`).

This one runs in a LLaMA-Factory environment that has torchvision (a CUDA build of torch 2.14.1 and
torchvision 0.29.1, which run on the CPU), so the processor is transformers' own Qwen2_5OmniProcessor
with its Qwen2-VL video processor; its other parts are Qwen2-VL's image processor and Whisper's feature
extractor at 128 mel bins. LLaMA-Factory reads sounds with torchaudio.load, whose decoders for an MP4's
AAC track are not installed here: it is handed PyAV's decoding of the track instead (one channel, the
samples as decoded, as tuneline reads them). The clips (a square crossing the frame with a tone, MPEG-4
and AAC in MP4) are written into tests/data/media/clips/ and kept with the golden. Run from the
repository root:

    /work/lfvenv_tv/bin/python tests/data/make_qwen2_omni_video_golden.py tests/data/media/qwen2_omni_videos.json
"""
import sys
from pathlib import Path

import av
import numpy as np
import torch
import torchaudio
from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, Qwen2_5OmniProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor, WhisperFeatureExtractor

from golden_rows import (
    OMNI_TOKENS,
    QWEN_GOLDEN,
    SHARED,
    crossing_frames,
    drawn_images,
    expanded_row,
    media_inputs,
    supervised_examples,
    with_settings,
    write_golden,
)

# isort: split
from generate_audio_data import tone, write_sounding_clip  # golden_rows puts data/ on sys.path first


def decoded_track(path):
    """The file's first sound track as PyAV decodes it: [channels, samples] float32 and its rate."""
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        chunks = [frame.to_ndarray() for frame in container.decode(stream)]
        return torch.from_numpy(np.concatenate(chunks, axis=1).astype(np.float32)), stream.rate


torchaudio.load = decoded_track
out = Path(sys.argv[1])
clips_dir = out.parent / "clips"
clips_dir.mkdir(exist_ok=True)
# name: (width, height, frames per second, frames, seconds of tone, pitch)
CLIPS = {"chirp": (64, 48, 4, 10, 2.5, 440.0), "long_hum": (96, 72, 5, 28, 5.6, 220.0)}


def draw_clip(path, width, height, rate, count, seconds, pitch):
    write_sounding_clip(path, crossing_frames(width, height, count, fill=(40, 90, 200)), tone(seconds, pitch), frame_rate=rate)


clips = {}
for name, spec in CLIPS.items():
    clips[name] = str(clips_dir / f"{name}.mp4")
    draw_clip(clips[name], *spec)
pictures = drawn_images(QWEN_GOLDEN["sizes"])
ROWS = [
    {"name": "a clip and its sound", "images": [], "videos": ["chirp"],
     "messages": [{"role": "user", "content": "<video><audio>What do you see and hear?"},
                  {"role": "assistant", "content": "A blue square and a tone."}]},
    {"name": "two clips over two turns", "images": [], "videos": ["long_hum", "chirp"],
     "messages": [{"role": "user", "content": "<video><audio>Is the tone low?"}, {"role": "assistant", "content": "Yes."},
                  {"role": "user", "content": "And here: <video><audio>?"}, {"role": "assistant", "content": "No, higher."}]},
    {"name": "a picture, then a clip and its sound", "images": ["small"], "videos": ["long_hum"],
     "messages": [{"role": "user", "content": "<image>Same colour as in <video><audio>?"},
                  {"role": "assistant", "content": "Yes."}]},
]
SETTINGS = {"image_max_pixels": 768 * 768, "image_min_pixels": 32 * 32, "video_max_pixels": 128 * 128,
            "video_min_pixels": 16 * 16, "video_fps": 2.0, "video_maxlen": 128, "audio_sampling_rate": 16000,
            "use_audio_in_video": True}
# the names Qwen2.5-Omni's tokenizer gives its media tokens, which its processor reads
NAMED = {"image_token": "<|IMAGE|>", "video_token": "<|VIDEO|>", "audio_token": "<|AUDIO|>", "vision_bos_token": "<|vision_bos|>",
         "vision_eos_token": "<|vision_eos|>", "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"}
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5", extra_special_tokens=NAMED)
tokenizer.add_special_tokens({"additional_special_tokens": OMNI_TOKENS})
processor = with_settings(Qwen2_5OmniProcessor(image_processor=Qwen2VLImageProcessor(), video_processor=Qwen2VLVideoProcessor(),
                                               feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tokenizer),
                          SETTINGS)
template = TEMPLATES["qwen2_omni"]
template.fix_special_tokens(tokenizer)


def files(row):
    # LLaMA-Factory's use_audio_in_video reads each video's sound from the row's `audios`, the same files
    return [pictures[n] for n in row["images"]], [clips[n] for n in row["videos"]], [clips[n] for n in row["videos"]]


golden = []
for row in ROWS:
    images, videos, audios = files(row)
    expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images, videos, audios)
    mm = media_inputs(template, processor, images, videos, audios)
    golden.append({"name": row["name"], "images": row["images"], "videos": row["videos"], "messages": row["messages"],
                   "expanded": expanded, "pairs": pairs,
                   "image_grid_thw": mm["image_grid_thw"].tolist() if "image_grid_thw" in mm else [],
                   "video_grid_thw": mm["video_grid_thw"].tolist(),
                   "video_second_per_grid": [round(float(v), 6) for v in mm["video_second_per_grid"]],
                   "pixel_values_videos_shape": list(mm["pixel_values_videos"].shape),
                   "feature_frames": mm["feature_attention_mask"].sum(-1).tolist()})


# without use_audio_in_video a video is Qwen2-VL's run of video tokens under Omni's names, its sound unheard
PLAIN_ROWS = [
    {"name": "a clip", "images": [], "videos": ["chirp"],
     "messages": [{"role": "user", "content": "<video>Which way does it move?"}, {"role": "assistant", "content": "Right."}]},
    {"name": "two clips and a picture", "images": ["small"], "videos": ["long_hum", "chirp"],
     "messages": [{"role": "user", "content": "<image>Which of <video> and <video> shows it?"},
                  {"role": "assistant", "content": "Both."}]},
]
processor.use_audio_in_video = False
plain = []
for row in PLAIN_ROWS:
    images, videos, _ = files(row)
    expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images, videos)
    mm = media_inputs(template, processor, images, videos)
    plain.append({"name": row["name"], "images": row["images"], "videos": row["videos"], "messages": row["messages"],
                  "expanded": expanded, "pairs": pairs,
                  "video_grid_thw": mm["video_grid_thw"].tolist(),
                  "video_second_per_grid": [round(float(v), 6) for v in mm["video_second_per_grid"]],
                  "pixel_values_videos_shape": list(mm["pixel_values_videos"].shape)})
processor.use_audio_in_video = True
# each video's sound is read from the same file, as files() hands LLaMA-Factory the row's `audios`
hearing = [{**row, "audios": row["videos"]} for row in ROWS]
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, hearing, pictures, cutoff_len, clips, clips)
              for cutoff_len in (4096, 1100)}

write_golden(out, {"template": "qwen2_omni", "tokenizer": "qwen2.5 with Qwen2.5-Omni's media tokens added",
                   "tokens": sorted(OMNI_TOKENS, key=tokenizer.convert_tokens_to_ids),
                   "processor": "Qwen2_5OmniProcessor(Qwen2VLImageProcessor(), Qwen2VLVideoProcessor(), "
                                "WhisperFeatureExtractor(feature_size=128))",
                   "settings": SETTINGS, "clips": CLIPS, "sizes": QWEN_GOLDEN["sizes"], "rows": golden, "plain_rows": plain,
                   "supervised_by_cutoff_len": supervised})
print("wrote", out, [(g["name"], g["video_grid_thw"], g["feature_frames"]) for g in golden])
