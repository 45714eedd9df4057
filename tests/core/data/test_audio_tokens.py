"""Qwen2-Audio's `<audio>` expansion against LLaMA-Factory 0.9.5's own output (tests/data/media/
qwen2_audio_sounds.json, written by tests/data/make_qwen2_audio_golden.py): the same token counts,
expanded conversations, supervised examples and mel features, from the same generated sounds."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tuneline.core.config import MediaConfig
from tuneline.core.errors import ConfigError
from tuneline.core.templates.catalog import TEMPLATES

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = json.loads((ROOT / "tests/data/media/qwen2_audio_sounds.json").read_text())
AUDIO_TOKENS = ["<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>"]
TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}


def write_sounds(folder: Path) -> None:
    """The golden's sounds, written again as the golden script wrote them."""
    sys.path.insert(0, str(ROOT / "data"))
    from generate_audio_data import tone, write_wave

    folder.mkdir(parents=True, exist_ok=True)
    for name, (seconds, left, right, rate) in GOLDEN["sounds"].items():
        if right is None:
            write_wave(folder / f"{name}.wav", tone(seconds, left, rate=rate), rate=rate)
        else:
            pairs = zip(tone(seconds, left, rate=rate), tone(seconds, right, rate=rate))
            write_wave(folder / f"{name}.wav", [value for pair in pairs for value in pair], rate=rate, channels=2)


@pytest.fixture(scope="module")
def audio_folder(tmp_path_factory, shared_dir: Path) -> tuple[Path, Path]:
    """A Qwen2-Audio processor folder as the golden's (Qwen2.5's tokenizer with the audio tokens, Whisper's
    feature extractor at 128 mel bins) and the golden rows as a dataset."""
    from transformers import AutoTokenizer, Qwen2AudioProcessor, WhisperFeatureExtractor

    root = tmp_path_factory.mktemp("audio")
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/qwen2.5")
    tokenizer.add_special_tokens({"additional_special_tokens": AUDIO_TOKENS})
    extractor = WhisperFeatureExtractor(feature_size=128)
    Qwen2AudioProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(root / "model")
    extractor.save_pretrained(root / "model")
    data = root / "data"
    write_sounds(data / "sounds")
    rows = [{"messages": row["messages"], "audios": [f"sounds/{name}.wav" for name in row["audios"]]} for row in GOLDEN["rows"]]
    (data / "rows.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"sounds": {
        "file_name": "rows.json", "formatting": "sharegpt", "columns": {"messages": "messages", "audios": "audios"},
        "tags": TAGS}}))
    return root / "model", data


def audio_rows(model: Path):
    from tuneline.core.data.media.rows import MediaRows

    return MediaRows.load(TEMPLATES["qwen2_audio"], model, MediaConfig(), datasets={"audios": ["sounds"]})


@pytest.mark.parametrize("row", GOLDEN["rows"], ids=[row["name"] for row in GOLDEN["rows"]])
def test_sounds_expand_to_llamafactorys_tokens_and_features(row: dict, audio_folder):
    """Each clip's tokens come from its length at 16 kHz (the stereo 44.1 kHz one averaged and resampled,
    the 31-second one cut to 30); its mel features are LLaMA-Factory's (to float32 rounding where the
    file is at 16 kHz already, within 1% where another resampler made the samples)."""
    from transformers import AutoTokenizer

    from tuneline.core.templates.conversation import Conversation, encode_turns, fix_tokenizer

    model, data = audio_folder
    rows = audio_rows(model)
    paths = [str(data / "sounds" / f"{name}.wav") for name in row["audios"]]
    in_prompt = len(row["messages"]) - 1
    expanded = rows.expand({"prompt": row["messages"][:in_prompt], "response": row["messages"][in_prompt:], "audios": paths})
    messages = expanded["prompt"] + expanded["response"]
    assert [message["content"].count("<|AUDIO|>") for message in messages] == row["audio_tokens"]
    assert expanded["media_tokens"] == sum(row["audio_tokens"])
    tokenizer = AutoTokenizer.from_pretrained(model)
    template = TEMPLATES["qwen2_audio"]
    fix_tokenizer(template, tokenizer)
    pairs = encode_turns(template, tokenizer, Conversation(prompt=messages[:-1], response=messages[-1:]))
    assert [[list(source), list(target)] for source, target in pairs] == row["pairs"]

    features = rows.audio_features(paths)
    assert list(features["input_features"].shape) == row["input_features_shape"]
    assert features["feature_attention_mask"].sum(-1).tolist() == row["feature_frames"]
    values = features["input_features"].double()
    for index, name in enumerate(row["audios"]):
        tolerance = 1e-5 if GOLDEN["sounds"][name][3] == GOLDEN["audio_sampling_rate"] else 1e-2
        assert float(values[index].sum()) == pytest.approx(row["feature_sums"][index], rel=tolerance)
        assert float(values[index].abs().sum()) == pytest.approx(row["feature_abs_sums"][index], rel=tolerance)


@pytest.mark.parametrize("cutoff_len", [2048, 80])
def test_sound_rows_tokenize_to_llamafactorys_supervised_examples(audio_folder, tmp_path: Path, cutoff_len: int):
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, data = audio_folder
    config = build_stage_config({"model_name_or_path": str(model), "dataset": "sounds", "dataset_dir": str(data),
                                 "template": "qwen2_audio", "cutoff_len": cutoff_len})
    counters = tokenize_stage_data(config, tokenizer_path=model, output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    expected = GOLDEN["supervised_by_cutoff_len"][str(cutoff_len)]
    audio_token = 151667  # <|AUDIO|> in the golden's tokenizer
    kept = [i for i, row in enumerate(GOLDEN["rows"]) if expected[i]["input_ids"].count(audio_token) == sum(row["audio_tokens"])]
    assert kept == ([0, 1, 2, 3] if cutoff_len == 2048 else [0, 2])  # 80 cuts into the two longer rows' sounds
    assert counters.get("rows_dropped_media_tokens_cut", 0) == 4 - len(kept)
    assert train["input_ids"] == [expected[i]["input_ids"] for i in kept]
    assert train["labels"] == [expected[i]["labels"] for i in kept]
    assert train["audios"] == [[str(data / "sounds" / f"{name}.wav") for name in GOLDEN["rows"][i]["audios"]] for i in kept]
    if cutoff_len == 2048:  # the preview counts a sound's tokens instead of repeating them
        from tuneline.core.data.tokenization import PREVIEW_FILE

        assert "<|audio_bos|><|AUDIO|> x 32<|audio_eos|>What is this?" in (tmp_path / "out" / PREVIEW_FILE).read_text()


def test_audio_goes_to_qwen2_audio_only(audio_folder, tmp_path: Path, shared_dir: Path):
    """Sounds through a template that hears none, and images through Qwen2-Audio's, are refused by name."""
    from transformers import Qwen2VLImageProcessor

    from tuneline.core.data.media.rows import MediaRows

    model, _ = audio_folder
    vision = shutil.copytree(shared_dir / "tokenizers/qwen2.5", tmp_path / "vision")
    Qwen2VLImageProcessor().save_pretrained(vision)
    with pytest.raises(ConfigError, match=r"dataset 'sounds' holds audio, and tuneline feeds audio to Qwen2-Audio and "
                                          r"Qwen2.5-Omni so far \('template: qwen2_audio' or 'qwen2_omni'\), not through "
                                          r"'template: qwen2_vl'"):
        MediaRows.load(TEMPLATES["qwen2_vl"], vision, MediaConfig(), datasets={"audios": ["sounds"]})
    with pytest.raises(ConfigError, match="dataset 'pictures' holds images, and 'template: qwen2_audio' is for a model that "
                                          "reads no images"):
        MediaRows.load(TEMPLATES["qwen2_audio"], model, MediaConfig(), datasets={"images": ["pictures"]})
    with pytest.raises(ConfigError, match="'template: qwen' writes text only"):
        MediaRows.load(TEMPLATES["qwen"], model, MediaConfig(), datasets={"audios": ["sounds"]})
