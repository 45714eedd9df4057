"""Qwen2.5-Omni hearing each video's own sound track (`use_audio_in_video: true`) against LLaMA-Factory 0.9.5's
own output (tests/data/media/qwen2_omni_videos.json, written by tests/data/make_qwen2_omni_video_golden.py with
transformers' Qwen2_5OmniProcessor): each `<video><audio>` pair becomes one block of the video's tokens and its
sound's, interleaved two seconds at a time, with the same grids, seconds per temporal patch, mel frames, ids
and supervised examples; the collator tells the thinker to place them so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.core.config import MediaConfig
from tuneline.core.templates.catalog import TEMPLATES

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = json.loads((ROOT / "tests/data/media/qwen2_omni_videos.json").read_text())
CLIPS = ROOT / "tests/data/media/clips"
TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
# transformers' Qwen2VLVideoProcessor() as the golden's processor held it (its video_preprocessor_config.json)
VIDEO_PROCESSOR = {"video_processor_type": "Qwen2VLVideoProcessor", "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                   "size": {"shortest_edge": 100352, "longest_edge": 602112}, "min_pixels": 100352, "max_pixels": 602112,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
                   "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
                   "rescale_factor": 1 / 255, "do_sample_frames": False}


def settings(**changed) -> MediaConfig:
    """The golden's media settings, with `changed` ones."""
    return MediaConfig(**{**{key: value for key, value in GOLDEN["settings"].items() if key != "audio_sampling_rate"}, **changed})


@pytest.fixture(scope="module")
def omni_folder(tmp_path_factory, shared_dir: Path) -> tuple[Path, Path]:
    """A Qwen2.5-Omni processor folder as the golden's (Qwen2.5's tokenizer with Omni's media tokens, Qwen2-VL's
    image processor and Whisper's feature extractor in preprocessor_config.json, Qwen2-VL's video processor in
    video_preprocessor_config.json), and the golden rows as a dataset of its clips, each named twice: as the
    row's video and as its sound."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessor

    from test_media_tokens import drawn
    from tuneline.core.models.tiny.omni import save_qwen2_omni_processors

    root = tmp_path_factory.mktemp("omni_videos")
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/qwen2.5")
    tokenizer.add_special_tokens({"additional_special_tokens": GOLDEN["tokens"]})
    tokenizer.save_pretrained(root / "model")
    save_qwen2_omni_processors(Qwen2VLImageProcessor(), root / "model")
    (root / "model" / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PROCESSOR))
    data = root / "data"
    (data / "media").mkdir(parents=True)
    for name, size in GOLDEN["sizes"].items():
        drawn(size).save(data / "media" / f"{name}.png")
    rows = [{"messages": row["messages"], "images": [f"media/{n}.png" for n in row["images"]],
             "videos": [str(CLIPS / f"{n}.mp4") for n in row["videos"]],
             "audios": [str(CLIPS / f"{n}.mp4") for n in row["videos"]]} for row in GOLDEN["rows"]]
    (data / "rows.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"clips_heard": {
        "file_name": "rows.json", "formatting": "sharegpt", "tags": TAGS,
        "columns": {"messages": "messages", "images": "images", "videos": "videos", "audios": "audios"}}}))
    return root / "model", data


def expands_as_golden(row: dict, omni_folder, *, heard: bool) -> None:
    """The row's messages, ids, video grids and seconds per temporal patch are the golden's, its clips named as its
    videos (and, when `heard`, as its sounds too); with `heard`, its sounds' mel frames as well."""
    from transformers import AutoTokenizer

    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.templates.conversation import Conversation, encode_turns, fix_tokenizer

    model, data = omni_folder
    template = TEMPLATES["qwen2_omni"]
    columns = ("images", "videos", "audios") if heard else ("images", "videos")
    rows = MediaRows.load(template, model, settings(use_audio_in_video=heard), datasets={c: ["clips_heard"] for c in columns})
    images = [str(data / "media" / f"{n}.png") for n in row["images"]]
    clips = [str(CLIPS / f"{n}.mp4") for n in row["videos"]]
    expanded = rows.expand({"prompt": row["messages"][:-1], "response": row["messages"][-1:], "images": images,
                            "videos": clips, "audios": clips if heard else []})
    messages = expanded["prompt"] + expanded["response"]
    assert messages == row["expanded"]
    tokenizer = AutoTokenizer.from_pretrained(model)
    fix_tokenizer(template, tokenizer)
    pairs = encode_turns(template, tokenizer, Conversation(prompt=messages[:-1], response=messages[-1:]))
    assert [[list(source), list(target)] for source, target in pairs] == row["pairs"]
    videos = rows.video_features(clips)
    assert videos["video_grid_thw"].tolist() == row["video_grid_thw"]
    assert list(videos["pixel_values_videos"].shape) == row["pixel_values_videos_shape"]
    assert videos["video_second_per_grid"].tolist() == pytest.approx(row["video_second_per_grid"], abs=1e-6)
    if heard:
        assert rows.audio_features(clips)["feature_attention_mask"].sum(-1).tolist() == row["feature_frames"]


@pytest.mark.parametrize("row", GOLDEN["rows"], ids=[row["name"] for row in GOLDEN["rows"]])
def test_each_clip_and_its_sound_expand_to_llamafactorys_interleaved_block(row: dict, omni_folder):
    expands_as_golden(row, omni_folder, heard=True)


@pytest.mark.parametrize("row", GOLDEN["plain_rows"], ids=[row["name"] for row in GOLDEN["plain_rows"]])
def test_plain_clips_expand_to_llamafactorys_video_runs(row: dict, omni_folder):
    """With `use_audio_in_video` off a clip is Qwen2-VL's run of video tokens under Omni's names, its sound unheard."""
    expands_as_golden(row, omni_folder, heard=False)


@pytest.mark.parametrize("cutoff_len", [int(cutoff) for cutoff in GOLDEN["supervised_by_cutoff_len"]])
def test_supervised_examples_and_the_collators_inputs_match_llamafactory(cutoff_len: int, omni_folder, tmp_path: Path):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.training.collators import build_collator

    model, data = omni_folder
    config = build_stage_config({"model_name_or_path": str(model), "dataset": "clips_heard", "dataset_dir": str(data),
                                 "template": "qwen2_omni", "cutoff_len": cutoff_len, **GOLDEN["settings"]})
    counters = tokenize_stage_data(config, tokenizer_path=model, output_dir=tmp_path / "tokenized")
    train = load_from_disk(str(tmp_path / "tokenized"))["train"]
    expected = GOLDEN["supervised_by_cutoff_len"][str(cutoff_len)]
    kept = [example for example in expected if len(example["input_ids"]) < cutoff_len]  # one cut into its media is dropped
    assert [list(ids) for ids in train["input_ids"]] == [example["input_ids"] for example in kept]
    assert [list(labels) for labels in train["labels"]] == [example["labels"] for example in kept]
    assert counters.get("rows_dropped_media_tokens_cut", 0) == len(expected) - len(kept)
    if not kept:
        return
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    media = MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR)
    batch = build_collator(train, tokenizer=tokenizer, model=None, media_rows=media)([train[i] for i in range(len(train))])
    assert batch["use_audio_in_video"] is True  # the thinker places each block's sound tokens by their seconds
    video, audio = (tokenizer.convert_tokens_to_ids(token) for token in ("<|VIDEO|>", "<|AUDIO|>"))
    grids = batch["video_grid_thw"]
    assert int((batch["input_ids"] == video).sum()) == int((grids.prod(dim=1) // 4).sum())
    lengths = (batch["feature_attention_mask"].sum(-1) - 1) // 2 + 1
    assert int((batch["input_ids"] == audio).sum()) == int(((lengths - 2) // 2 + 1).sum())


def test_a_clip_without_its_sound_placeholder_or_file_is_named(omni_folder):
    """Under `use_audio_in_video` each `<video>` needs the `<audio>` of its sound after it, and each video its
    file in `audios`: otherwise the row is refused naming it and the fix."""
    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.errors import DataError

    model, _ = omni_folder
    rows = MediaRows.load(TEMPLATES["qwen2_omni"], model, settings(), datasets={"videos": ["clips_heard"], "audios": ["clips_heard"]})
    clip = str(CLIPS / "chirp.mp4")
    with pytest.raises(DataError, match=r"the row whose first message begins '<audio>Hear <video>': with 'use_audio_in_video: "
                                        r"true' each <video> must be followed by the <audio> of its sound track"):
        rows.expand({"prompt": [{"role": "user", "content": "<audio>Hear <video>"}], "response": [{"role": "assistant", "content": "."}],
                     "videos": [clip], "audios": [clip]})
    with pytest.raises(DataError, match=r"the row has 1 videos and 0 sounds; give each video's file in `audios` too"):
        rows.expand({"prompt": [{"role": "user", "content": "<video>Hear"}], "response": [{"role": "assistant", "content": "."}],
                     "videos": [clip], "audios": []})


def test_a_row_refused_while_its_media_expand_is_named_by_its_dataset_file_and_row(omni_folder, tmp_path: Path):
    """The expansion refuses a row whose clip's sound is named before it; tokenization names the row's dataset, file
    and row."""
    from tuneline.core.errors import DataError
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, golden_data = omni_folder
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"messages": row["messages"], "videos": [str(CLIPS / f"{n}.mp4") for n in row["videos"]],
             "audios": [str(CLIPS / f"{n}.mp4") for n in row["videos"]]} for row in GOLDEN["rows"] if not row["images"]]
    clip = str(CLIPS / "chirp.mp4")
    rows[1] = {"messages": [{"role": "user", "content": "<audio>Hear <video>"}, {"role": "assistant", "content": "A tone."}],
               "videos": [clip], "audios": [clip]}
    (data / "clips.json").write_text(json.dumps(rows))
    info = json.loads((golden_data / "dataset_info.json").read_text())["clips_heard"]
    (data / "dataset_info.json").write_text(json.dumps({"clips_misplaced": {
        **info, "file_name": "clips.json", "columns": {"messages": "messages", "videos": "videos", "audios": "audios"}}}))
    config = build_stage_config({"model_name_or_path": str(model), "dataset": "clips_misplaced", "dataset_dir": str(data),
                                 "template": "qwen2_omni", "cutoff_len": 4096, **GOLDEN["settings"]})
    with pytest.raises(DataError) as refused:
        tokenize_stage_data(config, tokenizer_path=model, output_dir=tmp_path / "tokenized")
    assert str(refused.value).startswith(f"dataset 'clips_misplaced' in {data / 'dataset_info.json'}: row 2 of "
                                         f"{data / 'clips.json'}: "), str(refused.value)
    assert "each <video> must be followed by the <audio> of its sound track" in str(refused.value)
