"""Golden rows of InternVL's video placeholder expansion, written by LLaMA-Factory 0.9.5's own `intern_vl` and
`intern_s1` templates and InternVLPlugin with transformers' real InternVLProcessor (Qwen2.5's tokenizer with
InternVL's `<img>`, `</img>` and `<IMG_CONTEXT>` added; GotOcr2ImageProcessor at 112 pixels, 16 tokens a tile as
InternVL's arithmetic gives for that size; InternVLVideoProcessor at its defaults) into tests/data/media/, in the
format tests/core/data/test_internvl_videos.py reads: the expanded messages, token ids, frames and tiles, the
pixel_values shape and statistics (torchvision resizing), and supervised examples at two cutoffs.

LLaMA-Factory hands a video's sampled frames (its base `_regularize_videos`: floor(seconds x video_fps) frames, at
most video_maxlen, no pairing, each scaled into the video pixel limits) to the processor's *image* processor with
`crop_to_patches` off, so every frame is one tile, written `FrameN: <img>` and its tile's tokens `</img>`, the
frames of a video joined by newlines; pixel_values holds the images' tiles first, then every video's frames.
The clips are the Qwen2-VL golden's (tests/data/media/clips/). Needs torchvision (InternVLProcessor wants its video
processor); run with the LLaMA-Factory venv that has it, from the repository root:

    /work/lfvenv_tv/bin/python tests/data/make_internvl_video_golden.py tests/data/media/internvl_videos.json
"""
import sys
from pathlib import Path

from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, GotOcr2ImageProcessor, InternVLProcessor, InternVLVideoProcessor

from golden_rows import (
    CLIPS_DIR,
    INTERN_TOKENS,
    SHARED,
    VIDEO_SETTINGS,
    assistant,
    drawn_images,
    expanded_row,
    media_inputs,
    pixel_statistics,
    supervised_examples,
    user,
    with_settings,
    write_golden,
)

out = Path(sys.argv[1])
clips = {name: str(CLIPS_DIR / f"{name}.mp4") for name in ("short", "long", "tall", "one_second")}
IMAGES = {"square": (64, 64), "wide": (200, 100)}  # drawn again by the test
images = drawn_images(IMAGES)
IMAGE_PROCESSOR = {"size": {"height": 112, "width": 112}, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
IMAGE_SEQ_LENGTH = 16  # (112 / 14)^2 patches, pixel-shuffled 2 x 2

NAMED = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>"}
# InternVLProcessor reads its tokens by these names (InternVL's tokenizers name them); <video> is only named, never written
tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5", extra_special_tokens={**NAMED, "video_token": "<video>"})
tokenizer.add_special_tokens({"additional_special_tokens": INTERN_TOKENS})
processor = InternVLProcessor(image_processor=GotOcr2ImageProcessor(**IMAGE_PROCESSOR), tokenizer=tokenizer,
                              video_processor=InternVLVideoProcessor(), image_seq_length=IMAGE_SEQ_LENGTH)
SETTINGS = {**VIDEO_SETTINGS, "crop_to_patches": False}
SETTING_GROUPS = {"defaults": {}, "video_fps 1, video_maxlen 3": {"video_fps": 1.0, "video_maxlen": 3},
                  "crop_to_patches": {"crop_to_patches": True}}
rows = [
    {"name": "one video", "videos": ["short"], "images": [], "messages": [user("<video>Where does the square go?"), assistant("Right.")]},
    {"name": "a long video", "videos": ["long"], "images": [], "messages": [user("What moves in <video>?"), assistant("A red square.")]},
    {"name": "a video with an image", "videos": ["short"], "images": ["wide"],
     "messages": [user("<image>Is this colour in <video>?"), assistant("Yes.")]},
    {"name": "two videos over two turns", "videos": ["tall", "one_second"], "images": [],
     "messages": [user("<video>What is this?"), assistant("A clip."), user("And <video>?"), assistant("Another.")]},
]
for template_name in ("intern_vl", "intern_s1"):
    TEMPLATES[template_name].fix_special_tokens(tokenizer)
golden = []
for group, changes in SETTING_GROUPS.items():
    settings = {**SETTINGS, **changes}
    with_settings(processor, settings)
    for template_name in ("intern_vl", "intern_s1"):
        template = TEMPLATES[template_name]
        for row in rows:
            if (template_name == "intern_s1" or group == "crop_to_patches") and row["name"] != "a video with an image":
                continue
            videos, row_images = [clips[n] for n in row["videos"]], [images[n] for n in row["images"]]
            expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], row_images, videos)
            inputs = media_inputs(template, processor, row_images, videos)
            golden.append({"name": f"{row['name']} ({template_name}, {group})", "template": template_name, "settings": settings,
                           "videos": row["videos"], "images": row["images"], "messages": row["messages"],
                           "expanded": [m["content"] for m in expanded], "pairs": pairs,
                           "image_num_patches": [int(n) for n in inputs.get("image_num_patches", [])],
                           "video_frames": [int(n) for n in inputs["video_patch_indices"]],
                           "video_num_patches": [int(n) for n in inputs["video_num_patches"]],
                           "pixel_values": pixel_statistics(inputs["pixel_values"])})

with_settings(processor, SETTINGS)
supervised = {str(cutoff_len): supervised_examples(TEMPLATES["intern_vl"], tokenizer, processor, rows, images, cutoff_len, clips)
              for cutoff_len in (1024, 130)}

write_golden(out, {"transformers_version": "5.6.0", "tokenizer": "qwen2.5 with InternVL's image tokens added",
                   "added_tokens": INTERN_TOKENS, "image_processor": {"class": "GotOcr2ImageProcessor", **IMAGE_PROCESSOR},
                   "image_seq_length": IMAGE_SEQ_LENGTH, "images": IMAGES, "rows": golden, "supervised_by_cutoff_len": supervised})
print("wrote", out, [(g["name"], g["video_num_patches"], g["pixel_values"]["shape"]) for g in golden],
      {c: [len(s["input_ids"]) for s in e] for c, e in supervised.items()})
