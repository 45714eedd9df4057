"""Training on image rows: a tiny Qwen2-VL (core/models/vision_base_model.py, the Qwen2.5 tokenizer) learns
from generated pictures through `tuneline train`, its pixels cut per batch by the image processor the
tokenized data was counted with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 180, 60)}


@pytest.fixture(scope="module")
def pictures(tmp_path_factory, shared_dir: Path) -> tuple[Path, Path]:
    """A tiny Qwen2-VL folder and a dataset of one-colour pictures (of three sizes), one row with two of them."""
    from PIL import Image

    from tuneline.core.models.vision_base_model import VisionModelConfig, build_vision_language_model

    root = tmp_path_factory.mktemp("pictures")
    build_vision_language_model(shared_dir / "tokenizers/qwen2.5", root / "model", config=VisionModelConfig())
    data = root / "data"
    (data / "pictures").mkdir(parents=True)
    rows = []
    for index, (name, rgb) in enumerate(COLOURS.items()):
        Image.new("RGB", (56 + 28 * index, 56), rgb).save(data / "pictures" / f"{name}.png")
        rows.append({"messages": [{"role": "user", "content": "<image>What colour is this?"},
                                  {"role": "assistant", "content": name}], "images": [f"pictures/{name}.png"]})
    rows.append({"messages": [{"role": "user", "content": "<image>and <image>: which colours?"},
                              {"role": "assistant", "content": "red and blue"}], "images": ["pictures/red.png", "pictures/blue.png"]})
    (data / "rows.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"pictures": {
        "file_name": "rows.json", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    return root / "model", data


def test_a_batchs_pixels_fill_its_image_tokens_in_order(pictures, tmp_path: Path):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.data.image_rows import ImageRows
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.training.collators import build_collator

    model, data = pictures
    config = build_stage_config({"model_name_or_path": str(model), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": "qwen2_vl", "image_max_pixels": 56 * 56})
    tokenize_stage_data(config, tokenizer_path=model, output_dir=tmp_path / "tokenized")
    train = load_from_disk(str(tmp_path / "tokenized"))["train"]
    saved = ImageRows.read(tmp_path / "tokenized" / TOKENIZER_DIR)
    assert saved.settings.image_max_pixels == 56 * 56  # the sizes tokenizing counted with travel with the data
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    collator = build_collator(train, tokenizer=tokenizer, model=None, image_rows=saved)
    batch = collator([train[i] for i in range(len(train))])
    image_token = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    grids = batch["image_grid_thw"]
    assert grids.shape[0] == sum(len(row) for row in train["images"]) == 5
    assert batch["pixel_values"].shape[0] == int(grids.prod(dim=1).sum())
    per_example = (batch["input_ids"] == image_token).sum(dim=1).tolist()
    images_of = [len(row) for row in train["images"]]
    counts = (grids.prod(dim=1) // 4).tolist()  # merge_size 2: four patches a token
    starts = [sum(images_of[:i]) for i in range(len(images_of))]
    assert per_example == [sum(counts[start:start + n]) for start, n in zip(starts, images_of)]
    assert batch["mm_token_type_ids"].tolist() == (batch["input_ids"] == image_token).long().tolist()


def test_full_tuning_with_the_vision_tower_trains_it_from_the_pixels(pictures, tmp_path: Path):
    import math

    import yaml
    from conftest import run_cli_here
    from transformers import AutoModelForImageTextToText

    model, data = pictures
    (tmp_path / "train.yaml").write_text(yaml.safe_dump({
        "model_name_or_path": str(model), "stage": "sft", "do_train": True, "finetuning_type": "full",
        "freeze_vision_tower": False, "dataset": "pictures", "dataset_dir": str(data), "template": "qwen2_vl",
        "cutoff_len": 256, "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 2, "max_steps": 2,
        "learning_rate": 1e-3, "logging_steps": 1, "report_to": "none"}))
    result = run_cli_here("train", str(tmp_path / "train.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = tmp_path / "out"
    assert (out / "preprocessor_config.json").is_file()  # the folder loads as a vision-language model again
    losses = [json.loads(line)["loss"] for line in (out / "trainer_log.jsonl").read_text().splitlines() if "loss" in line]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    before, after = (dict(AutoModelForImageTextToText.from_pretrained(folder).named_parameters()) for folder in (model, out))
    changed = {name for name in before if not (before[name] == after[name]).all()}
    assert any(name.startswith("model.visual.blocks.") for name in changed)  # its gradients came from the pixels
    assert not any(name.startswith("model.visual.merger.") for name in changed)  # freeze_multi_modal_projector's default
    assert any(name.startswith("model.language_model.") for name in changed)
