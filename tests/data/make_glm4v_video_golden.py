"""Golden rows of GLM-4.1V's video placeholder expansion, written by LLaMA-Factory 0.9.5's own `glm4v` template and
GLM4VPlugin with transformers' real Glm4vProcessor (Qwen2.5's tokenizer with GLM's control and media tokens added,
Glm4vImageProcessor and Glm4vVideoProcessor at their defaults) into tests/data/media/, in the format
tests/core/data/test_video_tokens.py reads: the expanded messages, token ids, video grids, the pixel_values_videos
shape and statistics (torchvision resizing), and supervised examples. The clips are the Qwen3-VL video golden's.

LLaMA-Factory 0.9.5 calls the video processor as `video_processor(images=None, videos=..., video_metadata=[{"fps": 2,
"duration": ..., "total_frames": ...}])`, which transformers 5.6 (the newest it supports) refuses: the processor takes
no `images` keyword (TypeError) and VideoMetadata names its frame count `total_num_frames`. So GLM-4.1V videos stop
in LLaMA-Factory 0.9.5 with transformers 5.6. `Glm4vVideoProcessorAsCalled` below takes that call, drops the
`images=None` and passes the frame count under its name; the rest is transformers' class and LLaMA-Factory's code as
they are: the processor samples again the frames LLaMA-Factory hands it (do_sample_frames is its default, True) as
if the video ran at 2 frames a second, it gives no `timestamps`, so LLaMA-Factory writes 0 after every frame, and
every video of a row is written with its first video's temporal patches. Needs torchvision; run with the
LLaMA-Factory venv that has it, from the repository root:

    /work/lfvenv_tv/bin/python tests/data/make_glm4v_video_golden.py tests/data/media/glm4v_videos.json
"""
import json
import sys
from pathlib import Path

from llamafactory.data.template import TEMPLATES
from transformers import AutoTokenizer, Glm4vImageProcessor, Glm4vProcessor, Glm4vVideoProcessor

from golden_rows import (
    CLIPS_DIR,
    GLM_TOKENS,
    ONE_VIDEO_ROWS,
    SHARED,
    VIDEO_SETTING_GROUPS,
    VIDEO_SETTINGS,
    expanded_row,
    media_inputs,
    pixel_statistics,
    supervised_examples,
    with_settings,
    write_golden,
)

out = Path(sys.argv[1])
QWEN3 = json.loads((Path(__file__).parent / "media/qwen3_vl_videos.json").read_text())
clips = {name: str(CLIPS_DIR / f"{name}.mp4") for name in ("short", "long", "tall", "one_second", "ntsc")}


class Glm4vVideoProcessorAsCalled(Glm4vVideoProcessor):
    """transformers' Glm4vVideoProcessor taking LLaMA-Factory 0.9.5's call (see the module's doc)."""

    def __call__(self, images=None, videos=None, video_metadata=None, **kwargs):
        metadata = [{"fps": m["fps"], "duration": m["duration"], "total_num_frames": m["total_frames"]} for m in video_metadata]
        return super().__call__(videos=videos, video_metadata=metadata, **kwargs)


tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers/qwen2.5")
tokenizer.add_special_tokens({"additional_special_tokens": GLM_TOKENS})
template = TEMPLATES["glm4v"]
template.fix_special_tokens(tokenizer)
video_processor = Glm4vVideoProcessorAsCalled()
processor = Glm4vProcessor(image_processor=Glm4vImageProcessor(), tokenizer=tokenizer, video_processor=video_processor)
# the Qwen3-VL golden's rows without its image: GLM-4.1V's model takes no image and video in one batch
rows = [row for row in QWEN3["rows"] if row["name"].endswith("(defaults)") and not row["images"]]
rows = [{"name": row["name"].removesuffix(" (defaults)"), "videos": row["videos"], "messages": row["messages"], "images": []}
        for row in rows]
golden = []
for group, changes in VIDEO_SETTING_GROUPS.items():
    settings = {**VIDEO_SETTINGS, **changes}
    with_settings(processor, settings)
    for row in rows:
        if group.startswith("video_fps 4") and row["name"] not in ONE_VIDEO_ROWS:
            continue
        videos = [clips[n] for n in row["videos"]]
        expanded, pairs = expanded_row(template, tokenizer, processor, row["messages"], videos=videos)
        inputs = media_inputs(template, processor, videos=videos)
        golden.append({"name": f"{row['name']} ({group})", "settings": settings, "videos": row["videos"], "images": [],
                       "messages": row["messages"], "expanded": [m["content"] for m in expanded],
                       "pairs": pairs, "video_grid_thw": inputs["video_grid_thw"].tolist(),
                       "pixel_values_videos": pixel_statistics(inputs["pixel_values_videos"])})

with_settings(processor, VIDEO_SETTINGS)
supervised = {str(cutoff_len): supervised_examples(template, tokenizer, processor, rows, {}, cutoff_len, clips)
              for cutoff_len in (2048, 160)}

write_golden(out, {"transformers_version": "5.6.0", "template": "glm4v", "tokenizer": "qwen2.5 with GLM's control and media tokens added",
                   "added_tokens": GLM_TOKENS, "image_processor": "Glm4vImageProcessor() defaults",
                   "video_processor": json.loads(Glm4vVideoProcessor().to_json_string()), "rows": golden,
                   "supervised_by_cutoff_len": supervised})
print("wrote", out, [(g["name"], g["video_grid_thw"]) for g in golden], [len(s["input_ids"]) for s in supervised["2048"]])
