"""Training on video rows: tiny Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V and InternVL models (core/models/tiny/vision.py; llama2's
tokenizer with chatml's and the vision tokens added) take clips written by data/generate_video_data.py, their
sampled frames decoded and cut per batch with the processor and settings the tokenized data was counted with."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tuneline.core.templates.catalog import TEMPLATES

pytestmark = pytest.mark.slow  # each trains tiny multimodal models

DATA_DIR = Path(__file__).resolve().parents[2] / "data"


def clip_writer():
    spec = importlib.util.spec_from_file_location("generate_video_data", DATA_DIR / "generate_video_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def clip_data(tmp_path_factory) -> Path:
    """The clip demo, small: 6 training clips (12 rows), and a row with a picture and a clip."""
    from PIL import Image

    data = tmp_path_factory.mktemp("clip_demo")
    clip_writer().main(["--out-dir", str(data), "--clips", "6"])
    Image.new("RGB", (56, 56), (40, 70, 210)).save(data / "blue.png")
    rows = json.loads((data / "clip_questions.json").read_text())
    rows.append({"messages": [{"role": "user", "content": "<image>Is this the colour of the square in <video>?"},
                              {"role": "assistant", "content": "maybe"}], "images": ["blue.png"], "videos": [rows[0]["videos"][0]]})
    (data / "mixed.json").write_text(json.dumps(rows))
    info = json.loads((data / "dataset_info.json").read_text())
    info["mixed"] = {**info["clip_questions"], "file_name": "mixed.json",
                     "columns": {"messages": "messages", "videos": "videos", "images": "images"}}
    (data / "dataset_info.json").write_text(json.dumps(info))
    return data


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def family_model(request, tmp_path_factory, shared_dir: Path) -> tuple[str, Path]:
    from tuneline.core.models.tiny.vision import VisionModelConfig, build_vision_language_model

    folder = tmp_path_factory.mktemp(request.param) / "model"
    build_vision_language_model(shared_dir / "tokenizers/llama2", folder, config=VisionModelConfig(family=request.param))
    return request.param, folder


def collated(model_dir: Path, data: Path, tmp_path: Path, *, model=None, template: str = "qwen2_vl", dataset: str = "mixed"):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.training.collators import build_collator

    config = build_stage_config({"model_name_or_path": str(model_dir), "dataset": dataset, "dataset_dir": str(data),
                                 "template": template, "video_fps": 2.0})
    tokenize_stage_data(config, tokenizer_path=model_dir, output_dir=tmp_path / "tokenized")
    train = load_from_disk(str(tmp_path / "tokenized"))["train"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    collator = build_collator(train, tokenizer=tokenizer, model=model, media_rows=MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR))
    return train, tokenizer, collator([train[i] for i in range(len(train))])


def test_a_batchs_frames_fill_its_video_tokens_in_order(family_model, clip_data: Path, tmp_path: Path):
    family, model_dir = family_model
    train, tokenizer, batch = collated(model_dir, clip_data, tmp_path)
    video_token, image_token = tokenizer.convert_tokens_to_ids(["<|video_pad|>", "<|image_pad|>"])
    grids = batch["video_grid_thw"]
    assert grids.shape[0] == sum(len(row) for row in train["videos"]) == 13
    assert grids[:, 0].tolist() == [2] * 13  # 2 s at video_fps 2: four frames, two temporal patches
    assert batch["pixel_values_videos"].shape[0] == int(grids.prod(dim=1).sum())
    assert (batch["input_ids"] == video_token).sum().item() == int(grids.prod(dim=1).sum()) // 4
    assert (batch["input_ids"] == image_token).sum().item() == int(batch["image_grid_thw"].prod(dim=1).sum()) // 4 > 0
    types = (batch["input_ids"] == image_token).long() + 2 * (batch["input_ids"] == video_token).long()
    assert batch["mm_token_type_ids"].tolist() == types.tolist()
    # Qwen2.5-VL spaces a video's temporal positions by its seconds per temporal patch: 2 frames / 2 frames a second
    assert ("second_per_grid_ts" in batch) == (family == "qwen2_5_vl")
    if family == "qwen2_5_vl":
        assert batch["second_per_grid_ts"].tolist() == [1.0] * 13


def test_the_vision_towers_gradients_come_from_the_frames(family_model, clip_data: Path, tmp_path: Path):
    """Full tuning with the tower unfrozen: the loss reaches every vision block through the frames."""
    from tuneline.core.config import FinetuningConfig
    from tuneline.core.models.loading import apply_finetuning, load_model

    _, model_dir = family_model
    model = apply_finetuning(load_model(model_dir, trainable=True), FinetuningConfig(finetuning_type="full", freeze_vision_tower=False))
    _, _, batch = collated(model_dir, clip_data, tmp_path, model=model)
    model(**batch).loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if name.startswith("model.visual.blocks.")}
    assert grads and all(grad is not None and grad.abs().sum() > 0 for grad in grads.values())


def test_tuneline_train_fits_clips(shared_dir: Path, clip_data: Path, tmp_path: Path, monkeypatch):
    """`tuneline train` (LoRA sft) on the clip questions: the loss falls, and the trained folder keeps
    the processor beside the adapter."""
    import yaml

    from conftest import run_cli_here, train_in_this_process
    from tuneline.core.models.tiny.vision import VisionModelConfig, build_vision_language_model

    model_dir = tmp_path / "model"
    build_vision_language_model(shared_dir / "tokenizers/llama2", model_dir, config=VisionModelConfig(family="qwen2_5_vl"))
    stage = {"model_name_or_path": str(model_dir), "stage": "sft", "do_train": True, "finetuning_type": "lora",
             "lora_target": "all", "lora_rank": 8, "dataset": "clip_questions", "dataset_dir": str(clip_data),
             "template": "qwen2_vl", "cutoff_len": 256, "per_device_train_batch_size": 4, "learning_rate": 5e-3,
             "num_train_epochs": 3, "logging_steps": 1, "output_dir": str(tmp_path / "out"), "report_to": "none"}
    (tmp_path / "stage.yaml").write_text(yaml.safe_dump(stage))
    train_in_this_process(monkeypatch)  # the worker's run, without its start
    result = run_cli_here("train", str(tmp_path / "stage.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    losses = [entry["loss"] for entry in map(json.loads, (tmp_path / "out" / "trainer_log.jsonl").read_text().splitlines())
              if "loss" in entry]
    # a random model of a 32k-token vocabulary starts near ln(32k) = 10.4
    assert len(losses) == 9 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses
    assert (tmp_path / "out" / "preprocessor_config.json").is_file()

    # `tuneline chat --video`: the clip's tokens in the first message, and the answer transformers' own generate() gives
    import torch

    from conftest import chat_turn

    clip = str(clip_data / json.loads((clip_data / "clip_questions.json").read_text())[0]["videos"][0])
    turn = chat_turn(tmp_path / "out", "Which way does the square move?", template="qwen2_vl", videos=[clip])
    assert turn.first_message == "<video>Which way does the square move?"
    features = turn.media.video_features(turn.shown["videos"])
    video_token = turn.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert turn.prompt.count(video_token) == int(features["video_grid_thw"].prod()) // 4 > 0
    types = 2 * (torch.tensor([turn.prompt]) == video_token).long()
    assert turn.generated(**features, mm_token_type_ids=types) == turn.answer


def test_a_qwen2_5_omni_thinker_reads_clips_with_its_seconds_per_grid(shared_dir: Path, clip_data: Path, tmp_path: Path):
    """Qwen2.5-Omni's thinker (template qwen2_omni): Qwen2-VL's video tokens under Omni's names, the seconds per
    temporal patch as `video_second_per_grid`, no token types (Omni finds its media tokens by id), and a loss."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.models.loading import load_model
    from tuneline.core.models.tiny.vision import VisionModelConfig, build_vision_language_model
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.training.collators import build_collator

    model_dir = tmp_path / "model"
    build_vision_language_model(shared_dir / "tokenizers/llama2", model_dir, config=VisionModelConfig(family="qwen2_5_omni_thinker"))
    config = build_stage_config({"model_name_or_path": str(model_dir), "dataset": "clip_questions", "dataset_dir": str(clip_data),
                                 "template": "qwen2_omni", "max_samples": 4})
    tokenize_stage_data(config, tokenizer_path=model_dir, output_dir=tmp_path / "tokenized")
    train = load_from_disk(str(tmp_path / "tokenized"))["train"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    model = load_model(model_dir)
    batch = build_collator(train, tokenizer=tokenizer, model=model,
                           media_rows=MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR))([train[i] for i in range(4)])
    grids = batch["video_grid_thw"]
    assert (batch["input_ids"] == tokenizer.convert_tokens_to_ids("<|VIDEO|>")).sum(dim=1).tolist() == (grids.prod(dim=1) // 4).tolist()
    assert batch["video_second_per_grid"].tolist() == [1.0] * 4 and "mm_token_type_ids" not in batch
    assert model(**batch).loss.isfinite()


def test_a_qwen2_5_omni_thinker_hears_each_clips_own_sound(shared_dir: Path, tmp_path: Path):
    """`use_audio_in_video: true`: clips with a sound track, each named as a row's video and its sound, become
    blocks interleaving their video and sound tokens two seconds at a time; the collator tells the tiny
    thinker so, which places the tokens by their seconds and gives a loss."""
    import sys

    from datasets import load_from_disk
    from PIL import Image
    from transformers import AutoTokenizer

    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.models.loading import load_model
    from tuneline.core.models.tiny.vision import VisionModelConfig, build_vision_language_model
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.training.collators import build_collator

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "data"))
    from generate_audio_data import tone, write_sounding_clip

    data = tmp_path / "data"
    data.mkdir()
    rows = []
    for name, (colour, pitch, seconds) in {"red": ((210, 40, 40), 220.0, 2.5), "blue": ((40, 70, 210), 880.0, 4.5)}.items():
        frames = [Image.new("RGB", (56, 56), colour) for _ in range(round(seconds * 4))]
        write_sounding_clip(data / f"{name}.mp4", frames, tone(seconds, pitch), frame_rate=4)
        rows.append({"messages": [{"role": "user", "content": "<video><audio>What do you see and hear?"},
                                  {"role": "assistant", "content": f"{name}, {'low' if pitch < 440 else 'high'}"}],
                     "videos": [f"{name}.mp4"], "audios": [f"{name}.mp4"]})
    (data / "rows.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"heard": {
        "file_name": "rows.json", "formatting": "sharegpt", "columns": {"messages": "messages", "videos": "videos", "audios": "audios"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    model_dir = tmp_path / "model"
    build_vision_language_model(shared_dir / "tokenizers/llama2", model_dir, config=VisionModelConfig(family="qwen2_5_omni_thinker"))
    config = build_stage_config({"model_name_or_path": str(model_dir), "dataset": "heard", "dataset_dir": str(data),
                                 "template": "qwen2_omni", "use_audio_in_video": True, "cutoff_len": 1024})
    tokenize_stage_data(config, tokenizer_path=model_dir, output_dir=tmp_path / "tokenized")
    train = load_from_disk(str(tmp_path / "tokenized"))["train"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    video, audio = (tokenizer.convert_tokens_to_ids(token) for token in ("<|VIDEO|>", "<|AUDIO|>"))
    first = train[0]["input_ids"]
    start = first.index(video)
    assert audio in first[start:first.index(audio) + 1] and video in first[first.index(audio):]  # interleaved: video, sound, video
    model = load_model(model_dir)
    batch = build_collator(train, tokenizer=tokenizer, model=model,
                           media_rows=MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR))([train[i] for i in range(2)])
    assert batch["use_audio_in_video"] is True and batch["video_grid_thw"].shape[0] == batch["input_features"].shape[0] == 2
    assert model(**batch).loss.isfinite()


def trained_on_clips(family: str, template: str, *, shared_dir: Path, clip_data: Path, tmp_path: Path, patch) -> Path:
    """A tiny `family` model (its folder returned) trained by `tuneline train` (LoRA sft, two steps, in this process)
    on the clip questions into tmp_path/out: both steps logged, the adapter moved (lora_B is zero at the start)."""
    import yaml
    from safetensors.torch import load_file

    from conftest import run_cli_here, train_in_this_process
    from tuneline.core.models.tiny.vision import VisionModelConfig, build_vision_language_model

    model_dir = tmp_path / "model"
    build_vision_language_model(shared_dir / "tokenizers/llama2", model_dir, config=VisionModelConfig(family=family))
    stage = {"model_name_or_path": str(model_dir), "stage": "sft", "do_train": True, "finetuning_type": "lora",
             "lora_target": "all", "lora_rank": 4, "dataset": "clip_questions", "dataset_dir": str(clip_data),
             "template": template, "cutoff_len": 256, "per_device_train_batch_size": 2, "learning_rate": 5e-3, "max_steps": 2,
             "logging_steps": 1, "output_dir": str(tmp_path / "out"), "report_to": "none"}
    (tmp_path / "stage.yaml").write_text(yaml.safe_dump(stage))
    train_in_this_process(patch)
    result = run_cli_here("train", str(tmp_path / "stage.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "out" / "trainer_log.jsonl").read_text().splitlines()]
    assert [entry["current_steps"] for entry in logged if "loss" in entry] == [1, 2]
    adapter = load_file(tmp_path / "out" / "adapter_model.safetensors")
    assert any(name.endswith("lora_B.weight") and weight.abs().sum() > 0 for name, weight in adapter.items())
    return model_dir


@pytest.mark.parametrize("family", ["qwen3_vl", "glm4v"])
def test_tuneline_train_takes_timed_videos(family: str, shared_dir: Path, clip_data: Path, tmp_path: Path, monkeypatch):
    """`tuneline train` (LoRA sft, two steps) on the clip questions for a tiny Qwen3-VL and GLM-4.1V, whose videos are
    sized as whole clips and written a temporal patch at a time with its time (core/data/media/video/layout.py): the model
    finds as many video tokens as features in every batch (transformers checks), and the adapter moves."""
    model_dir = trained_on_clips(family, family, shared_dir=shared_dir, clip_data=clip_data, tmp_path=tmp_path, patch=monkeypatch)
    # the video processor's numbers beside the adapter, as the model folder held them: chat sizes clips as training did
    saved = (tmp_path / "out" / "video_preprocessor_config.json", model_dir / "video_preprocessor_config.json")
    assert json.loads(saved[0].read_text()) == json.loads(saved[1].read_text())

    # `tuneline chat --video`: the clip written as training writes it, and the answer transformers' own generate() gives
    import torch

    from conftest import chat_turn

    clip = str(clip_data / json.loads((clip_data / "clip_questions.json").read_text())[0]["videos"][0])
    turn = chat_turn(tmp_path / "out", "Which way does the square move?", template=family, videos=[clip])
    features = turn.media.video_features(turn.shown["videos"])
    inputs = turn.media.model_inputs(torch.tensor([turn.prompt]), [], token_ids=turn.media.token_ids(turn.tokenizer))
    assert (inputs["mm_token_type_ids"] == 2).sum().item() == int(features["video_grid_thw"].prod()) // 4 > 0
    assert turn.generated(**features, **inputs) == turn.answer


@pytest.mark.parametrize("family", ["qwen3_vl", "glm4v"])
def test_a_timed_video_batch_fills_its_tokens_with_its_frames(family: str, shared_dir: Path, clip_data: Path, tmp_path: Path):
    """The collated batch of a tiny Qwen3-VL or GLM-4.1V: each video a temporal patch at a time, the token types
    (2 on a video's tokens; GLM's are image tokens within its video markers), and a loss the model computes over
    the frames (it refuses a batch whose tokens and features differ)."""
    from tuneline.core.models.loading import load_model
    from tuneline.core.models.tiny.vision import VisionModelConfig, build_vision_language_model

    model_dir = tmp_path / "model"
    build_vision_language_model(shared_dir / "tokenizers/llama2", model_dir, config=VisionModelConfig(family=family))
    model = load_model(model_dir)
    train, tokenizer, batch = collated(model_dir, clip_data, tmp_path, model=model, template=family, dataset="clip_questions")
    grids = batch["video_grid_thw"]
    assert grids.tolist() == [[2, 4, 4]] * 12  # 2 s at video_fps 2: four frames; 56 x 56 pixels a whole patch grid of 4 x 4
    video_token = tokenizer.convert_tokens_to_ids(TEMPLATES[family].media.video_token if family == "qwen3_vl" else "<|image|>")
    assert (batch["mm_token_type_ids"] == 2).sum().item() == (batch["input_ids"] == video_token).sum().item() == 12 * 2 * 4
    assert (batch["mm_token_type_ids"] == 1).sum().item() == 0
    text = tokenizer.decode(train[0]["input_ids"])
    # Qwen3-VL: the first temporal patch's frames at 0 and 0.5 s; GLM-4.1V: every time 0, as LLaMA-Factory writes it
    assert ("<0.2 seconds><|vision_start|>" in text) if family == "qwen3_vl" else ("0<|begin_of_image|>" in text)
    assert model(**batch).loss.isfinite()


def test_tuneline_train_takes_internvl_videos(shared_dir: Path, clip_data: Path, tmp_path: Path, monkeypatch):
    """`tuneline train` (LoRA sft, two steps) on the clip questions for a tiny InternVL, each sampled frame one image
    tile written `FrameN: <img>...</img>` (core/data/media/video/frame_tiles.py): the model finds as many image tokens as tiles'
    features in every batch (transformers checks), and the adapter moves."""
    trained_on_clips("internvl", "intern_vl", shared_dir=shared_dir, clip_data=clip_data, tmp_path=tmp_path, patch=monkeypatch)

    import torch

    from conftest import chat_turn

    clip = str(clip_data / json.loads((clip_data / "clip_questions.json").read_text())[0]["videos"][0])
    turn = chat_turn(tmp_path / "out", "Which way does the square move?", template="intern_vl", videos=[clip])
    inputs = turn.media.model_inputs(torch.tensor([turn.prompt]), [], turn.shown["videos"], token_ids=turn.media.token_ids(turn.tokenizer))
    tile_tokens = turn.media.processor_settings["image_seq_length"]
    assert inputs["pixel_values"].shape[0] == 4 and turn.prompt.count(turn.media.token_ids(turn.tokenizer)["images"]) == 4 * tile_tokens
    assert turn.generated(**inputs) == turn.answer  # 2 s at video_fps 2: four frames, a tile each
