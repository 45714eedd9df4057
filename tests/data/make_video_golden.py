"""Golden rows of Qwen2-VL's video placeholder expansion, written by LLaMA-Factory 0.9.5's own
`qwen2_vl` template and mm_plugin into tests/data/media/, in the format
tests/core/data/test_video_tokens.py reads. The clips (a square crossing a plain background, MPEG-4 in
MP4) are written here into tests/data/media/clips/ and kept with the golden. LLaMA-Factory counts a
video's tokens from the container's header; its processor here holds transformers' Qwen2VLImageProcessor
and no video processor (which needs torchvision), so its video numbers come from the image processor, as
LLaMA-Factory falls back; transformers' `smart_resize`, which LLaMA-Factory imports from the torchvision
image processor's module, is given to it from the Pillow image processor's (the same function). Run with
LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_video_golden.py tests/data/media/qwen2_vl_videos.json
"""
import sys
import types
from pathlib import Path

import av
from transformers import AutoTokenizer, Qwen2VLImageProcessor
from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl

sys.modules["transformers.models.qwen2_vl.image_processing_qwen2_vl"] = types.SimpleNamespace(
    smart_resize=image_processing_pil_qwen2_vl.smart_resize)
from llamafactory.data.template import TEMPLATES  # noqa: E402  (after the module it imports smart_resize from is given)

from golden_rows import SHARED, VIDEO_SETTINGS, clip, expanded_row, plain_images, supervised_examples, write_golden  # noqa: E402

out = Path(sys.argv[1])
# name: (width, height, frames per second, frames)
CLIPS = {"short": (64, 48, 10, 15), "long": (320, 240, 25, 100), "tall": (96, 304, 5, 7), "one_second": (112, 112, 8, 8)}

paths = {name: clip(name, width=width, height=height, rate=rate, count=count, folder=out.parent / "clips")
         for name, (width, height, rate, count) in CLIPS.items()}
IMAGES = {"square": (64, 64)}
image_path = plain_images(IMAGES)["square"]  # drawn again by the test

tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5")
template = TEMPLATES["qwen2_vl"]
SETTINGS = VIDEO_SETTINGS
processor = types.SimpleNamespace(image_processor=Qwen2VLImageProcessor(), **SETTINGS,
                                  model_input_names=["input_ids", "attention_mask", "pixel_values", "image_grid_thw"])
few = types.SimpleNamespace(**{**vars(processor), "video_fps": 1.0, "video_maxlen": 2})
rows = [
    {"name": "one short video", "videos": ["short"], "images": [],
     "messages": [{"role": "user", "content": "<video>Where does the square go?"}, {"role": "assistant", "content": "Right."}]},
    {"name": "a long video", "videos": ["long"], "images": [],
     "messages": [{"role": "user", "content": "What moves in <video>?"}, {"role": "assistant", "content": "A red square."}]},
    {"name": "two videos", "videos": ["tall", "one_second"], "images": [],
     "messages": [{"role": "user", "content": "<video> and <video>: which is taller?"}, {"role": "assistant", "content": "The first."}]},
    {"name": "an image and a video", "videos": ["short"], "images": ["square"],
     "messages": [{"role": "user", "content": "<image>Is this colour in <video>?"}, {"role": "assistant", "content": "No."}]},
]
golden = []
for settings_name, proc in (("defaults", processor), ("video_fps 1, video_maxlen 2", few)):
    for row in rows:
        videos = [paths[n] for n in row["videos"]]
        images = [image_path for _ in row["images"]]
        expanded, pairs = expanded_row(template, tokenizer, proc, row["messages"], images, videos)
        metadata = template.mm_plugin._get_qwen_video_grid_metadata(videos, proc)
        # what Qwen2.5-VL spaces its temporal positions by: the sampled frames over the video's seconds
        fps_per_video = []
        for video in videos:
            with av.open(video) as container:
                stream = container.video.streams[0] if hasattr(container, "video") else container.streams.video[0]
                indices = template.mm_plugin._get_video_sample_indices(stream, video_fps=proc.video_fps, video_maxlen=proc.video_maxlen)
                fps_per_video.append(len(indices) / float(stream.duration * stream.time_base))
        golden.append({"name": f"{row['name']} ({settings_name})", "settings": {k: getattr(proc, k) for k in SETTINGS},
                       "videos": row["videos"], "images": row["images"], "messages": row["messages"],
                       "expanded": [m["content"] for m in expanded], "pairs": pairs,
                       "video_grid_thw": metadata["video_grid_thw"].tolist(),
                       "second_per_grid_ts": [2 / fps for fps in fps_per_video]})
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, rows, {"square": image_path}, cutoff_len, paths)
              for cutoff_len in (1024, 60)}

write_golden(out, {"template": "qwen2_vl", "tokenizer": "qwen2.5",
                   "image_processor": "Qwen2VLImageProcessor() defaults, no video processor", "clips": CLIPS, "images": IMAGES,
                   "clip": "MPEG-4 in MP4, yuv420p: a red square crossing a (235, 235, 235) background left to right",
                   "image": "RGB (30, 90, 220), PNG", "rows": golden, "supervised_by_cutoff_len": supervised}, indent=1)
print("wrote", out, [(g["name"], g["video_grid_thw"]) for g in golden])
