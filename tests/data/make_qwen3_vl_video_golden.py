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
import tempfile
from fractions import Fraction
from pathlib import Path

from PIL import Image
from transformers import AutoTokenizer, Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor
from llamafactory.data.template import TEMPLATES
from golden_rows import CLIPS_DIR, SHARED, clip, pixel_statistics, supervised_examples

out = Path(sys.argv[1])
NTSC = {"width": 80, "height": 64, "rate": Fraction(30000, 1001), "count": 45}
clips = {name: str(CLIPS_DIR / f"{name}.mp4") for name in ("short", "long", "tall", "one_second")}
clips["ntsc"] = clip("ntsc", **NTSC)
IMAGES = {"square": (64, 64)}
image_path = str(Path(tempfile.mkdtemp()) / "square.png")  # drawn again by the test
Image.new("RGB", IMAGES["square"], (30, 90, 220)).save(image_path)

IMAGE_PROCESSOR = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5],
                   "image_std": [0.5, 0.5, 0.5]}
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5")
video_processor = Qwen3VLVideoProcessor()
processor = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**IMAGE_PROCESSOR), tokenizer=tokenizer,
                             video_processor=video_processor)
template = TEMPLATES["qwen3_vl"]
SETTINGS = {"video_max_pixels": 256 * 256, "video_min_pixels": 16 * 16, "video_fps": 2.0, "video_maxlen": 128,
            "image_max_pixels": 768 * 768, "image_min_pixels": 32 * 32}
SETTING_GROUPS = {"defaults": {}, "video_fps 1, video_maxlen 2": {"video_fps": 1.0, "video_maxlen": 2},
                  "video_fps 4, video_maxlen 12": {"video_fps": 4.0, "video_maxlen": 12}}
ONE_VIDEO = ("one short video", "a long video", "an NTSC clip")  # the rows the third group writes


def user(content):
    return {"role": "user", "content": content}


def assistant(content):
    return {"role": "assistant", "content": content}


rows = [
    {"name": "one short video", "videos": ["short"], "images": [], "messages": [user("<video>Where does the square go?"), assistant("Right.")]},
    {"name": "a long video", "videos": ["long"], "images": [], "messages": [user("What moves in <video>?"), assistant("A red square.")]},
    {"name": "two videos", "videos": ["tall", "one_second"], "images": [], "messages": [user("<video> and <video>: which is taller?"), assistant("The first.")]},
    {"name": "an image and a video", "videos": ["short"], "images": ["square"], "messages": [user("<image>Is this colour in <video>?"), assistant("No.")]},
    # the second message's videos take the times of the row's third video (LLaMA-Factory's video_metadata[idx])
    {"name": "three videos over two turns", "videos": ["tall", "one_second", "tall"], "images": [],
     "messages": [user("<video>What is this?"), assistant("A clip."), user("<video> and <video>: which is taller?"), assistant("The second.")]},
    {"name": "an NTSC clip", "videos": ["ntsc"], "images": [], "messages": [user("<video>Which way?"), assistant("Right.")]},
]
golden = []
for group, changes in SETTING_GROUPS.items():
    settings = {**SETTINGS, **changes}
    for key, value in settings.items():  # as LLaMA-Factory's patch_processor sets them
        setattr(processor, key, value)
    for row in rows:
        if group.startswith("video_fps 4") and row["name"] not in ONE_VIDEO:
            continue
        videos, images = [clips[n] for n in row["videos"]], [image_path for _ in row["images"]]
        expanded = template.mm_plugin.process_messages(row["messages"], images, videos, [], processor)
        pairs = template.encode_multiturn(tokenizer, expanded, system=None, tools=None)
        inputs = template.mm_plugin._get_mm_inputs(images, videos, [], processor)
        golden.append({"name": f"{row['name']} ({group})", "settings": settings, "videos": row["videos"], "images": row["images"],
                       "messages": row["messages"], "expanded": [m["content"] for m in expanded],
                       "pairs": [[list(a), list(b)] for a, b in pairs], "video_grid_thw": inputs["video_grid_thw"].tolist(),
                       "pixel_values_videos": pixel_statistics(inputs["pixel_values_videos"])})

for key, value in SETTINGS.items():
    setattr(processor, key, value)
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, rows, {"square": image_path}, cutoff_len, clips)
              for cutoff_len in (2048, 200)}

json.dump({"llamafactory_version": "0.9.5", "transformers_version": "5.6.0", "template": "qwen3_vl", "tokenizer": "qwen2.5",
           "image_processor": {"class": "Qwen2VLImageProcessor", **IMAGE_PROCESSOR},
           "video_processor": json.loads(video_processor.to_json_string()), "images": IMAGES,
           "clips": {"ntsc": {**NTSC, "rate": str(NTSC["rate"])}}, "rows": golden, "supervised_by_cutoff_len": supervised},
          out.open("w"), indent=None)
print("wrote", out, [(g["name"], g["video_grid_thw"]) for g in golden], [len(s["input_ids"]) for s in supervised["2048"]])
