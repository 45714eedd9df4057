"""Training on audio rows: a tiny Qwen2-Audio (core/models/tiny/audio.py; llama2's tokenizer with chatml's
and the audio tokens added) takes sounds written by data/generate_audio_data.py, each decoded at 16 kHz and
cut into Whisper mel frames per batch by the feature extractor the tokenized data was counted with."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each trains tiny multimodal models

DATA_DIR = Path(__file__).resolve().parents[2] / "data"


@pytest.fixture(scope="module")
def sound_data(tmp_path_factory) -> Path:
    """The sound demo, small: 8 training sounds (16 rows)."""
    spec = importlib.util.spec_from_file_location("generate_audio_data", DATA_DIR / "generate_audio_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = tmp_path_factory.mktemp("sound_demo")
    module.main(["--out-dir", str(data), "--sounds", "8"])
    return data


@pytest.fixture(scope="module")
def audio_model(tmp_path_factory, shared_dir: Path) -> Path:
    from tuneline.core.models.tiny.vision import VisionModelConfig, build_vision_language_model

    folder = tmp_path_factory.mktemp("qwen2_audio") / "model"
    build_vision_language_model(shared_dir / "tokenizers/llama2", folder, config=VisionModelConfig(family="qwen2_audio"))
    return folder


def test_a_batchs_features_fill_its_audio_tokens_and_train_the_tower(audio_model: Path, sound_data: Path, tmp_path: Path):
    """Every sound is 1.5 s: 150 mel frames of the 3000 a 30-second chunk holds, 37 audio tokens, which
    is also what the model makes of the features; with the tower unfrozen the loss reaches all of it."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.config import FinetuningConfig
    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.models.loading import apply_finetuning, load_model
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.training.collators import build_collator

    config = build_stage_config({"model_name_or_path": str(audio_model), "dataset": "sound_questions",
                                 "dataset_dir": str(sound_data), "template": "qwen2_audio", "cutoff_len": 128})
    tokenize_stage_data(config, tokenizer_path=audio_model, output_dir=tmp_path / "tokenized")
    train = load_from_disk(str(tmp_path / "tokenized"))["train"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    model = apply_finetuning(load_model(audio_model, trainable=True),
                             FinetuningConfig(finetuning_type="full", freeze_vision_tower=False))
    assert type(model).__name__ == "Qwen2AudioForConditionalGeneration"
    collator = build_collator(train, tokenizer=tokenizer, model=model, media_rows=MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR))
    batch = collator([train[i] for i in range(4)])
    assert list(batch["input_features"].shape) == [4, 128, 3000]
    assert batch["feature_attention_mask"].sum(-1).tolist() == [150] * 4
    audio_token = tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    assert (batch["input_ids"] == audio_token).sum(dim=1).tolist() == [37] * 4
    model(**batch).loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if name.startswith("model.audio_tower.layers.")}
    assert grads and all(grad is not None and grad.abs().sum() > 0 for grad in grads.values())


def test_tuneline_train_fits_sounds(audio_model: Path, sound_data: Path, tmp_path: Path, monkeypatch):
    """`tuneline train` (LoRA sft) on the sound questions: the loss falls, LoRA leaves the audio tower alone,
    and the trained folder keeps the feature extractor beside the adapter."""
    import yaml

    from conftest import run_cli_here, train_in_this_process

    stage = {"model_name_or_path": str(audio_model), "stage": "sft", "do_train": True, "finetuning_type": "lora",
             "lora_target": "all", "lora_rank": 8, "dataset": "sound_questions", "dataset_dir": str(sound_data),
             "template": "qwen2_audio", "cutoff_len": 128, "per_device_train_batch_size": 4, "learning_rate": 5e-3,
             "num_train_epochs": 2, "logging_steps": 1, "output_dir": str(tmp_path / "out"), "report_to": "none"}
    (tmp_path / "stage.yaml").write_text(yaml.safe_dump(stage))
    train_in_this_process(monkeypatch)  # the worker's run, without its start
    result = run_cli_here("train", str(tmp_path / "stage.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    out = tmp_path / "out"
    losses = [entry["loss"] for entry in map(json.loads, (out / "trainer_log.jsonl").read_text().splitlines()) if "loss" in entry]
    assert len(losses) == 8 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses
    targets = json.loads((out / "adapter_config.json").read_text())["target_modules"]
    assert targets and not any("audio_tower" in name or "multi_modal_projector" in name for name in targets)
    assert json.loads((out / "preprocessor_config.json").read_text())["feature_size"] == 128

    # `tuneline chat --audio`: the sound's 37 tokens in the first message, and the answer transformers' own generate() gives
    from conftest import chat_turn

    sound = str(sound_data / json.loads((sound_data / "sound_questions.json").read_text())[0]["audios"][0])
    turn = chat_turn(out, "Is this tone high or low?", template="qwen2_audio", audios=[sound])
    assert turn.first_message == "<audio>Is this tone high or low?"
    assert turn.prompt.count(turn.tokenizer.convert_tokens_to_ids("<|AUDIO|>")) == 37
    assert turn.generated(**turn.media.audio_features(turn.shown["audios"])) == turn.answer


def test_dpo_trains_on_sound_pairs(audio_model: Path, sound_data: Path, tmp_path: Path, monkeypatch):
    """A ranking dataset with `audios` (the right answer chosen, the other rejected): each pair's sound
    is fed for its chosen and its rejected sequence, and `tuneline train` runs dpo on it."""
    import yaml

    from conftest import run_cli_here, train_in_this_process

    rows = json.loads((sound_data / "sound_questions.json").read_text())
    other = {"high": "low", "low": "high", "one": "two", "two": "three", "three": "one"}
    pairs = [{"messages": row["messages"][:1], "chosen": row["messages"][1],
              "rejected": {**row["messages"][1], "content": other[row["messages"][1]["content"]]}, "audios": row["audios"]}
             for row in rows[:8]]
    (sound_data / "sound_pairs.json").write_text(json.dumps(pairs))
    info = json.loads((sound_data / "dataset_info.json").read_text())
    info["sound_pairs"] = {**info["sound_questions"], "file_name": "sound_pairs.json", "ranking": True,
                           "columns": {"messages": "messages", "chosen": "chosen", "rejected": "rejected", "audios": "audios"}}
    (sound_data / "dataset_info.json").write_text(json.dumps(info))
    stage = {"model_name_or_path": str(audio_model), "stage": "dpo", "do_train": True, "finetuning_type": "lora",
             "lora_target": "all", "dataset": "sound_pairs", "dataset_dir": str(sound_data), "template": "qwen2_audio",
             "cutoff_len": 128, "per_device_train_batch_size": 4, "max_steps": 2, "logging_steps": 1,
             "output_dir": str(tmp_path / "out"), "report_to": "none"}
    (tmp_path / "stage.yaml").write_text(yaml.safe_dump(stage))
    train_in_this_process(monkeypatch)  # the worker's run, without its start
    result = run_cli_here("train", str(tmp_path / "stage.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "out" / "trainer_log.jsonl").read_text().splitlines()]
    assert json.loads((tmp_path / "out" / "trainer_state.json").read_text())["global_step"] == 2
    assert [entry["loss"] for entry in logged if "loss" in entry][0] == pytest.approx(0.6931, abs=1e-3)  # ln 2: policy = reference
    assert all("accuracy" in entry for entry in logged if "loss" in entry)


def test_data_preview_names_each_examples_sounds_and_counts_their_tokens(audio_model: Path, sound_data: Path, tmp_path: Path):
    import yaml

    from conftest import run_cli_here

    (tmp_path / "preview.yaml").write_text(yaml.safe_dump({
        "model_name_or_path": str(audio_model), "stage": "sft", "dataset": "sound_questions", "dataset_dir": str(sound_data),
        "template": "qwen2_audio", "cutoff_len": 128}))
    result = run_cli_here("data", "preview", str(tmp_path / "preview.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    first = result.stdout.split("--- example 1")[0]
    assert f"audios: {sound_data / 'sounds' / 'train_000.wav'}\n" in first
    assert "<|audio_bos|><|AUDIO|> x 37<|audio_eos|>" in first  # 1.5 s: 150 mel frames


def test_a_qwen2_5_omni_thinker_trains_and_answers_on_sounds(sound_data: Path, tmp_path: Path, monkeypatch, shared_dir: Path):
    """A tiny Qwen2.5-Omni thinker (template qwen2_omni: Qwen2-Audio's sounds under Omni's tokens) trains on the
    sound questions through `tuneline train`, and `tuneline chat --audio` answers as its own generate() does."""
    import yaml

    from conftest import chat_turn, run_cli_here, train_in_this_process
    from tuneline.core.models.tiny.vision import VisionModelConfig, build_vision_language_model

    model_dir = tmp_path / "model"
    build_vision_language_model(shared_dir / "tokenizers/llama2", model_dir, config=VisionModelConfig(family="qwen2_5_omni_thinker"))
    stage = {"model_name_or_path": str(model_dir), "stage": "sft", "do_train": True, "finetuning_type": "lora",
             "lora_target": "all", "dataset": "sound_questions", "dataset_dir": str(sound_data), "template": "qwen2_omni",
             "cutoff_len": 128, "per_device_train_batch_size": 4, "max_steps": 2, "learning_rate": 1e-3,
             "output_dir": str(tmp_path / "out"), "report_to": "none"}
    (tmp_path / "stage.yaml").write_text(yaml.safe_dump(stage))
    train_in_this_process(monkeypatch)  # the worker's run, without its start
    result = run_cli_here("train", str(tmp_path / "stage.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "trainer_state.json").read_text())["global_step"] == 2
    targets = json.loads((tmp_path / "out" / "adapter_config.json").read_text())["target_modules"]
    assert targets and not any("audio_tower" in name or "visual" in name for name in targets)

    sound = str(sound_data / json.loads((sound_data / "sound_questions.json").read_text())[0]["audios"][0])
    turn = chat_turn(tmp_path / "out", "Is this tone high or low?", template="qwen2_omni", audios=[sound])
    assert turn.prompt.count(turn.tokenizer.convert_tokens_to_ids("<|AUDIO|>")) == 37
    assert turn.generated(**turn.media.audio_features(turn.shown["audios"])) == turn.answer
