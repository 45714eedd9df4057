"""MiniCPM-V 4.6's images against LLaMA-Factory 0.9.5's own output (tests/data/media/minicpm_v_images.json, written
by tests/data/make_minicpm_v_golden.py): each image numbered in its row, the whole image and its grid of slices
as MiniCPMV4_6ImageProcessorPil cuts them, the same expanded messages, ids, labels and a batch's model inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.core.config import MediaConfig
from tuneline.core.errors import ConfigError
from tuneline.core.templates.catalog import TEMPLATES

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = json.loads((ROOT / "tests/data/media/minicpm_v_images.json").read_text())
TEMPLATE = TEMPLATES["minicpm_v_4_6"]
# LLaMA-Factory's pixel limits, which this family's images never meet: the large picture is sliced whole
SETTINGS = MediaConfig(image_max_pixels=GOLDEN["image_max_pixels"], image_min_pixels=GOLDEN["image_min_pixels"])


@pytest.fixture(scope="module")
def minicpm_folder(tmp_path_factory, shared_dir: Path) -> tuple[Path, Path]:
    """A MiniCPM-V 4.6 processor folder as the golden's (Qwen2.5's tokenizer with MiniCPM-V's markers,
    MiniCPMV4_6ImageProcessorPil at the checkpoint's settings), and the golden rows as dataset `pictures`."""
    from transformers import AutoTokenizer, MiniCPMV4_6ImageProcessorPil

    from test_media_tokens import picture_dataset

    root = tmp_path_factory.mktemp("minicpm_v")
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/qwen2.5")
    tokenizer.add_special_tokens({"additional_special_tokens": GOLDEN["added_tokens"]})
    tokenizer.save_pretrained(root / "model")
    settings = {key: value for key, value in GOLDEN["image_processor"].items() if key != "class"}
    MiniCPMV4_6ImageProcessorPil(**settings).save_pretrained(root / "model")
    return root / "model", picture_dataset(root / "data", GOLDEN["sizes"], GOLDEN["rows"])


def test_images_expand_to_llamafactorys_tokens_and_a_batch_gets_its_inputs(minicpm_folder):
    """Rows of one image (with and without slices) and of two (in one message, and across two turns, numbered
    0 and 1): LLaMA-Factory's expanded text and ids; the four rows as one batch get its pixels and target sizes."""
    import torch

    from test_media_tokens import fixed_tokenizer
    from tuneline.core.data.media.rows import media_rows_for_model
    from tuneline.core.templates.conversation import Conversation, encode_turns

    folder, data = minicpm_folder
    rows = media_rows_for_model(folder, template=TEMPLATE, settings=SETTINGS)
    tokenizer = fixed_tokenizer(folder, TEMPLATE)
    batch_ids, paths = [], []
    for row in GOLDEN["rows"]:
        row_paths = [str(data / "pictures" / f"{name}.png") for name in row["images"]]
        expanded = rows.expand_messages(row["messages"], row_paths)
        assert expanded == row["expanded"], row["name"]
        conversation = Conversation(prompt=expanded[:-1], response=expanded[-1:])
        pairs = [[list(source), list(target)] for source, target in encode_turns(TEMPLATE, tokenizer, conversation)]
        assert pairs == row["pairs"], row["name"]
        batch_ids.append([token for source, target in pairs for token in source + target])
        paths += row_paths
    golden = GOLDEN["batch"]
    assert batch_ids == golden["input_ids"]
    length = max(len(ids) for ids in batch_ids)
    input_ids = torch.tensor([ids + [tokenizer.pad_token_id] * (length - len(ids)) for ids in batch_ids])
    inputs = rows.model_inputs(input_ids, paths, token_ids=rows.token_ids(tokenizer))
    # LLaMA-Factory also passes the counts (grids, num_patches_per_image) and the processor's downsample_mode,
    # which the model reads from its config when not given
    assert set(golden["inputs"]) - set(inputs) == {"grids", "num_patches_per_image", "downsample_mode"}
    assert golden["downsample_mode"] == rows.image_processor.downsample_mode == "16x"
    assert list(inputs["pixel_values"].shape) == golden["pixel_values_shape"]
    assert float(inputs["pixel_values"].double().sum()) == pytest.approx(golden["pixel_values_sum"], rel=1e-6)
    assert inputs["target_sizes"].tolist() == golden["target_sizes"]
    image_tokens = (input_ids == tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum()
    assert image_tokens == (inputs["target_sizes"].prod(dim=1) // 16).sum()  # one token a merged patch, each filled


@pytest.mark.parametrize("cutoff_len", [4096, 300])
def test_rows_tokenize_to_llamafactorys_supervised_examples(minicpm_folder, tmp_path: Path, cutoff_len: int):
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    folder, data = minicpm_folder
    config = build_stage_config({"model_name_or_path": str(folder), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": "minicpm_v_4_6", "cutoff_len": cutoff_len})
    counters = tokenize_stage_data(config, tokenizer_path=folder, output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    golden, whole = GOLDEN["supervised_by_cutoff_len"][str(cutoff_len)], GOLDEN["supervised_by_cutoff_len"]["4096"]
    kept = [i for i, (cut, full) in enumerate(zip(golden, whole)) if cut["input_ids"] == full["input_ids"]]
    assert kept == ([0, 1, 2, 3] if cutoff_len == 4096 else [0, 1, 3])  # 300 cuts into the large picture's slices
    assert counters.get("rows_dropped_media_tokens_cut", 0) == len(golden) - len(kept)
    assert train["input_ids"] == [golden[i]["input_ids"] for i in kept]
    assert train["labels"] == [golden[i]["labels"] for i in kept]


def test_video_and_audio_rows_are_refused_by_name(minicpm_folder):
    from tuneline.core.data.media.rows import MediaRows

    folder, _ = minicpm_folder
    with pytest.raises(ConfigError, match=r"dataset 'clips' holds videos, and tuneline feeds MiniCPM-V 4.6 \('template: "
                                          r"minicpm_v_4_6'\) images only: .*MiniCPMV4_6VideoProcessor"):
        MediaRows.load(TEMPLATE, folder, SETTINGS, datasets={"videos": ["clips"]})
    with pytest.raises(ConfigError, match="dataset 'sounds' holds audio, .* not through 'template: minicpm_v_4_6'"):
        MediaRows.load(TEMPLATE, folder, SETTINGS, datasets={"audios": ["sounds"]})
