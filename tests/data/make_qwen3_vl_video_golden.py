"""Golden rows of Qwen3-VL's video placeholder expansion, written by LLaMA-Factory 0.9.5's own `qwen3_vl` template and
`qwen3_vl` mm_plugin with transformers' real Qwen3VLProcessor (the qwen2.5 tokenizer, Qwen2VLImageProcessor as a
Qwen3-VL folder configures it, Qwen3VLVideoProcessor at its defaults) into tests/data/media/, in the format
tests/core/data/test_video_tokens.py reads: the expanded messages, token ids, video grids, the
pixel_values_videos shape and statistics LLaMA-Factory's video inputs give (torchvision resizing), and
supervised examples. The clips are the Qwen2-VL golden's (tests/data/media/clips/) and one at NTSC's
30000/1001 frames a second, written here. Needs torchvision (transformers' video processors do); run with
the LLaMA-Factory venv that has it, from the repository root:

    /work/lfvenv_tv/bin/python tests/data/make_qwen3_vl_video_golden.py tests/data/media/qwen3_vl_videos.json
"""
import json
import sys
from fractions import Fraction
from pathlib import Path

from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

from golden_rows import (
    CLIPS_DIR,
    ONE_VIDEO_ROWS,
    SHARED,
    VIDEO_SETTING_GROUPS,
    VIDEO_SETTINGS,
    assistant,
    clip,
    expanded_row,
    media_inputs,
    pixel_statistics,
    plain_images,
    supervised_examples,
    user,
    with_settings,
    write_golden,
)

out = Path(sys.argv[1])
NTSC = {"width": 80, "height": 64, "rate": Fraction(30000, 1001), "count": 45}
clips = {name: str(CLIPS_DIR / f"{name}.mp4") for name in ("short", "long", "tall", "one_second")}
clips["ntsc"] = clip("ntsc", **NTSC)
IMAGES = {"square": (64, 64)}
image_path = plain_images(IMAGES)["square"]  # drawn again by the test

IMAGE_PROCESSOR = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5],
                   "image_std": [0.5, 0.5, 0.5]}
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5")
video_processor = Qwen3VLVideoProcessor()
processor = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**IMAGE_PROCESSOR), tokenizer=tokenizer,
                             video_processor=video_processor)
template = TEMPLATES["qwen3_vl"]
rows = [
    {"name": "one short video", "videos": ["short"], "images": [],
     "messages": [user("<video>Where does the square go?"), assistant("Right.")]},
    {"name": "a long video", "videos": ["long"], "images": [],
     "messages": [user("What moves in <video>?"), assistant("A red square.")]},
    {"name": "two videos", "videos": ["tall", "one_second"], "images": [],
     "messages": [user("<video> and <video>: which is taller?"), assistant("The first.")]},
    {"name": "an image and a video", "videos": ["short"], "images": ["square"],
     "messages": [user("<image>Is this colour in <video>?"), assistant("No.")]},
    # the second message's videos take the times of the row's third video (LLaMA-Factory's video_metadata[idx])
    {"name": "three videos over two turns", "videos": ["tall", "one_second", "tall"], "images": [],
     "messages": [user("<video>What is this?"), assistant("A clip."),
                  user("<video> and <video>: which is taller?"), assistant("The second.")]},
    {"name": "an NTSC clip", "videos": ["ntsc"], "images": [], "messages": [user("<video>Which way?"), assistant("Right.")]},
]
golden = []
for group, changes in VIDEO_SETTING_GROUPS.items():
    settings = {**VIDEO_SETTINGS, **changes}
    with_settings(processor, settings)
    for row in rows:
        if group.startswith("video_fps 4") and row["name"] not in ONE_VIDEO_ROWS:
            continue
        videos, images = [clips[n] for n in row["videos"]], [image_path for _ in row["images"]]
        expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], images, videos)
        inputs = media_inputs(template, processor, images, videos)
        golden.append({"name": f"{row['name']} ({group})", "settings": settings, "videos": row["videos"], "images": row["images"],
                       "messages": row["messages"], "expanded": [m["content"] for m in expanded],
                       "pairs": pairs, "video_grid_thw": inputs["video_grid_thw"].tolist(),
                       "pixel_values_videos": pixel_statistics(inputs["pixel_values_videos"])})

with_settings(processor, VIDEO_SETTINGS)
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, rows, {"square": image_path}, cutoff_len, clips)
              for cutoff_len in (2048, 200)}

write_golden(out, {"transformers_version": "5.6.0", "template": "qwen3_vl", "tokenizer": "qwen2.5",
                   "image_processor": {"class": "Qwen2VLImageProcessor", **IMAGE_PROCESSOR},
                   "video_processor": json.loads(video_processor.to_json_string()), "images": IMAGES,
                   "clips": {"ntsc": {**NTSC, "rate": str(NTSC["rate"])}}, "rows": golden, "supervised_by_cutoff_len": supervised})
print("wrote", out, [(g["name"], g["video_grid_thw"]) for g in golden], [len(s["input_ids"]) for s in supervised["2048"]])
