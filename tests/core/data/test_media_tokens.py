"""Qwen2-VL's `<image>` expansion against LLaMA-Factory 0.9.5's own output (tests/data/media/, written
by tests/data/make_media_golden.py): the same sizing, grids, expanded messages and token ids."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from tuneline.core.data.media.expansion import expand_images, image_features, image_token_counts, patch_token_counts, placeholder_counts
from tuneline.core.data.media.sizing import sized_image
from tuneline.core.templates.catalog import TEMPLATES


@functools.cache
def fixed_tokenizer(folder: Path, template) -> Any:
    """The tokenizer of `folder` as `template` fixes it (its eos, its stop words), loaded once for the
    module: Qwen's 151k-token tokenizer takes most of a second to load, and the tests only read it."""
    from transformers import AutoTokenizer

    from tuneline.core.templates.conversation import fix_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    fix_tokenizer(template, tokenizer)
    return tokenizer


GOLDEN = json.loads((Path(__file__).resolve().parents[2] / "data/media/qwen2_vl_images.json").read_text())


def drawn(size: list[int]):
    """The golden file's image of `size`: red, with a blue box in its middle."""
    from PIL import Image, ImageDraw

    width, height = size
    image = Image.new("RGB", (width, height), (200, 40, 40))
    ImageDraw.Draw(image).rectangle([width // 4, height // 4, 3 * width // 4, 3 * height // 4], fill=(30, 90, 220))
    return image


def picture_dataset(data: Path, sizes: dict, rows: list[dict]) -> Path:
    """`data` holding the golden's pictures of `sizes` (drawn again) and `rows` (messages and picture names)
    as dataset `pictures`."""
    (data / "pictures").mkdir(parents=True)
    for name, size in sizes.items():
        drawn(size).save(data / "pictures" / f"{name}.png")
    rows = [{"messages": row["messages"], "images": [f"pictures/{name}.png" for name in row["images"]]} for row in rows]
    (data / "rows.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"pictures": {
        "file_name": "rows.json", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    return data


@pytest.fixture(scope="module")
def image_processor():
    from transformers import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor()  # the class AutoImageProcessor picks for a Qwen2-VL folder


@pytest.mark.parametrize("row", GOLDEN["rows"], ids=[row["name"] for row in GOLDEN["rows"]])
def test_images_expand_to_llamafactorys_tokens(row: dict, image_processor, shared_dir: Path):
    from tuneline.core.templates.conversation import Conversation, encode_turns

    template = TEMPLATES["qwen2_vl"]
    images = [sized_image(drawn(GOLDEN["sizes"][name]), max_pixels=GOLDEN["image_max_pixels"],
                          min_pixels=GOLDEN["image_min_pixels"], plugin="qwen2_vl") for name in row["images"]]
    features = image_features(images, image_processor)
    assert features["image_grid_thw"].tolist() == row["image_grid_thw"]
    assert list(features["pixel_values"].shape) == row["pixel_values_shape"]
    assert placeholder_counts(row["messages"])["images"] == len(images)

    counts = image_token_counts(features, image_processor)
    assert patch_token_counts(images, image_processor) == counts  # what tokenizing uses, without the pixels
    expanded = expand_images(row["messages"], counts, template.media)
    assert [message["content"] for message in expanded] == row["expanded"]
    tokenizer = fixed_tokenizer(shared_dir / "tokenizers/qwen2.5", template)
    conversation = Conversation(prompt=expanded[:-1], response=expanded[-1:])
    assert [[list(source), list(target)] for source, target in encode_turns(template, tokenizer, conversation)] == row["pairs"]


def test_sizing_keeps_qwens_limits():
    from PIL import Image

    # scaled up to min_pixels; a side below 28 widened to 28; an aspect beyond 200:1 narrowed to 180:1
    for size, expected in [((10, 10), (32, 32)), ((5000, 20), (5000, 28)), ((6000, 20), (5040, 28)), ((20, 6000), (28, 5040))]:
        sized = sized_image(Image.new("L", size), max_pixels=768 * 768, min_pixels=32 * 32, plugin="qwen2_vl")
        assert sized.mode == "RGB" and sized.size == expected, (size, sized.size)


@pytest.fixture(scope="module")
def image_dataset(tmp_path_factory, shared_dir: Path, image_processor) -> tuple[Path, Path]:
    """A Qwen2-VL-shaped folder (the qwen2.5 tokenizer, the image processor) and the golden rows as a dataset."""
    import shutil

    root = tmp_path_factory.mktemp("images")
    model = root / "model"
    shutil.copytree(shared_dir / "tokenizers/qwen2.5", model)
    image_processor.save_pretrained(model)
    data = picture_dataset(root / "data", GOLDEN["sizes"], GOLDEN["rows"])
    return model, data


@pytest.mark.parametrize("cutoff_len", [1024, 96])
def test_image_rows_tokenize_to_llamafactorys_supervised_examples(image_dataset, tmp_path: Path, cutoff_len: int):
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, data = image_dataset
    config = build_stage_config({"model_name_or_path": str(model), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": "qwen2_vl", "cutoff_len": cutoff_len})
    counters = tokenize_stage_data(config, tokenizer_path=model, output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    expected = GOLDEN["supervised_by_cutoff_len"][str(cutoff_len)]
    # LLaMA-Factory keeps an example whose cutoff cut into its image tokens (training then fails on it); tuneline drops it
    kept = [i for i, row in enumerate(GOLDEN["rows"]) if len(expected[i]["input_ids"]) < cutoff_len or cutoff_len == 1024]
    assert counters.get("rows_dropped_media_tokens_cut", 0) == len(GOLDEN["rows"]) - len(kept)
    assert train["input_ids"] == [expected[i]["input_ids"] for i in kept]
    assert train["labels"] == [expected[i]["labels"] for i in kept]
    assert train["images"] == [[str(data / "pictures" / f"{name}.png") for name in GOLDEN["rows"][i]["images"]] for i in kept]
    if cutoff_len == 1024:  # the preview counts an image's tokens instead of repeating them
        from tuneline.core.data.tokenization import PREVIEW_FILE

        assert "<|vision_start|><|image_pad|> x 6<|vision_end|>What colour" in (tmp_path / "out" / PREVIEW_FILE).read_text()


def test_image_rows_need_a_multimodal_template_and_an_image_processor(image_dataset, shared_dir: Path, tmp_path: Path):
    from tuneline.core.errors import ConfigError
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, data = image_dataset
    keys = {"dataset": "pictures", "dataset_dir": str(data)}
    with pytest.raises(ConfigError, match="dataset 'pictures' holds images, videos or audio, and 'template: qwen' writes text only"):
        tokenize_stage_data(build_stage_config({**keys, "model_name_or_path": str(model), "template": "qwen"}),
                            tokenizer_path=model, output_dir=tmp_path / "a")
    tokenizer_only = shared_dir / "tokenizers/qwen2.5"
    with pytest.raises(ConfigError, match=r"has no image processor \(no preprocessor_config.json\)"):
        tokenize_stage_data(build_stage_config({**keys, "model_name_or_path": str(tokenizer_only), "template": "qwen2_vl"}),
                            tokenizer_path=tokenizer_only, output_dir=tmp_path / "b")
    with pytest.raises(ConfigError, match="'neat_packing' with image, video or audio rows is not offered yet"):
        tokenize_stage_data(build_stage_config({**keys, "model_name_or_path": str(model), "template": "qwen2_vl", "neat_packing": True}),
                            tokenizer_path=model, output_dir=tmp_path / "c")
    with pytest.raises(ConfigError, match="maps images, videos or audio, and 'stage: pt' does not train on media rows yet"):
        tokenize_stage_data(build_stage_config({**keys, "model_name_or_path": str(model), "template": "qwen2_vl", "stage": "pt"}),
                            tokenizer_path=model, output_dir=tmp_path / "d")
    assert not any((tmp_path / name).exists() for name in "abcd")


LLAVA = json.loads((Path(__file__).resolve().parents[2] / "data/media/llava_images.json").read_text())


@pytest.fixture(scope="module")
def llava_folder(tmp_path_factory, shared_dir: Path) -> Path:
    """A LLaVA-1.5-shaped processor folder as the golden's: llama2's tokenizer with `<image>`, CLIP's image
    processor at 336 pixels, LlavaProcessor's numbers (patch 14, the default strategy, one class token)."""
    from transformers import AutoTokenizer, CLIPImageProcessor, LlavaProcessor

    folder = tmp_path_factory.mktemp("llava")
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/llama2")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_processor = CLIPImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer,
                   **{key: value for key, value in LLAVA["processor"].items() if key != "class"}).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("row", LLAVA["rows"], ids=[row["name"] for row in LLAVA["rows"]])
def test_llava_images_expand_to_llamafactorys_tokens(row: dict, llava_folder: Path):
    from tuneline.core.config import MediaConfig
    from tuneline.core.data.media.rows import media_rows_for_model
    from tuneline.core.templates.conversation import Conversation, encode_turns

    template = TEMPLATES["llava"]
    rows = media_rows_for_model(llava_folder, template=template, settings=MediaConfig())
    images = [sized_image(drawn(GOLDEN["sizes"][name]), max_pixels=LLAVA["image_max_pixels"],
                          min_pixels=LLAVA["image_min_pixels"], plugin="llava") for name in row["images"]]
    features = image_features(images, rows.image_processor)
    assert list(features["pixel_values"].shape) == row["pixel_values_shape"]
    counts = patch_token_counts(images, rows.image_processor, plugin="llava", processor_settings=rows.processor_settings)
    expanded = expand_images(row["messages"], counts, template.media)
    assert [message["content"].count("<image>") for message in expanded] == row["image_tokens"]
    tokenizer = fixed_tokenizer(llava_folder, template)
    conversation = Conversation(prompt=expanded[:-1], response=expanded[-1:])
    assert [[list(source), list(target)] for source, target in encode_turns(template, tokenizer, conversation)] == row["pairs"]


@pytest.mark.parametrize("cutoff_len", [2048, 700])
def test_llava_rows_tokenize_to_llamafactorys_supervised_examples(llava_folder: Path, image_dataset, tmp_path: Path,
                                                                   cutoff_len: int):
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    _, data = image_dataset
    config = build_stage_config({"model_name_or_path": str(llava_folder), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": "llava", "cutoff_len": cutoff_len})
    counters = tokenize_stage_data(config, tokenizer_path=llava_folder, output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    expected = LLAVA["supervised_by_cutoff_len"][str(cutoff_len)]
    kept = [i for i, row in enumerate(LLAVA["rows"]) if len(expected[i]["input_ids"]) < cutoff_len]
    assert kept == ([0, 1, 2, 3] if cutoff_len == 2048 else [0, 3])  # 700 cuts into the two-image rows' second image
    assert counters.get("rows_dropped_media_tokens_cut", 0) == len(LLAVA["rows"]) - len(kept)
    assert train["input_ids"] == [expected[i]["input_ids"] for i in kept]
    assert train["labels"] == [expected[i]["labels"] for i in kept]


def test_a_llava_folder_without_its_processor_numbers_is_refused(llava_folder: Path, tmp_path: Path):
    import shutil

    from tuneline.core.config import MediaConfig
    from tuneline.core.data.media.rows import media_rows_for_model
    from tuneline.core.errors import ConfigError

    folder = tmp_path / "llava"
    shutil.copytree(llava_folder, folder)
    saved = json.loads((folder / "processor_config.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps(saved["image_processor"]))
    (folder / "processor_config.json").write_text(json.dumps({k: v for k, v in saved.items() if k != "patch_size"}))
    with pytest.raises(ConfigError, match="processor_config.json sets no patch_size"):
        media_rows_for_model(folder, template=TEMPLATES["llava"], settings=MediaConfig())
    (folder / "processor_config.json").unlink()
    with pytest.raises(ConfigError, match="has no readable processor_config.json"):
        media_rows_for_model(folder, template=TEMPLATES["llava"], settings=MediaConfig())


QWEN3 = json.loads((Path(__file__).resolve().parents[2] / "data/media/qwen3_vl_images.json").read_text())


@pytest.mark.parametrize("row", QWEN3["rows"], ids=[row["name"] for row in QWEN3["rows"]])
def test_qwen3_vl_images_expand_to_llamafactorys_tokens(row: dict, shared_dir: Path):
    """Qwen3-VL: Qwen2-VL's sizing and expansion in patches of 16, through the reasoning template `qwen3_vl`."""
    from transformers import Qwen2VLImageProcessor

    from tuneline.core.templates.conversation import Conversation, encode_turns

    template = TEMPLATES["qwen3_vl"]
    processor = Qwen2VLImageProcessor(**{k: v for k, v in QWEN3["image_processor"].items() if k != "class"})
    images = [sized_image(drawn(GOLDEN["sizes"][name]), max_pixels=QWEN3["image_max_pixels"],
                          min_pixels=QWEN3["image_min_pixels"], plugin="qwen3_vl") for name in row["images"]]
    features = image_features(images, processor)
    assert features["image_grid_thw"].tolist() == row["image_grid_thw"]
    assert list(features["pixel_values"].shape) == row["pixel_values_shape"]
    counts = patch_token_counts(images, processor, plugin="qwen3_vl")
    assert counts == image_token_counts(features, processor)
    expanded = expand_images(row["messages"], counts, template.media)
    assert [message["content"] for message in expanded] == row["expanded"]
    tokenizer = fixed_tokenizer(shared_dir / "tokenizers/qwen2.5", template)
    conversation = Conversation(prompt=expanded[:-1], response=expanded[-1:])
    assert [[list(source), list(target)] for source, target in encode_turns(template, tokenizer, conversation)] == row["pairs"]


@pytest.mark.parametrize("cutoff_len", [1024, 96])
def test_qwen3_vl_rows_tokenize_to_llamafactorys_supervised_examples(image_dataset, shared_dir: Path, tmp_path: Path,
                                                                     cutoff_len: int):
    import shutil

    from datasets import load_from_disk
    from transformers import Qwen2VLImageProcessor

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    _, data = image_dataset
    model = tmp_path / "qwen3_vl"
    shutil.copytree(shared_dir / "tokenizers/qwen2.5", model)
    Qwen2VLImageProcessor(**{k: v for k, v in QWEN3["image_processor"].items() if k != "class"}).save_pretrained(model)
    config = build_stage_config({"model_name_or_path": str(model), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": "qwen3_vl", "cutoff_len": cutoff_len})
    tokenize_stage_data(config, tokenizer_path=model, output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    expected = QWEN3["supervised_by_cutoff_len"][str(cutoff_len)]
    kept = [i for i, row in enumerate(QWEN3["rows"]) if len(expected[i]["input_ids"]) < cutoff_len or cutoff_len == 1024]
    assert len(kept) < len(QWEN3["rows"]) or cutoff_len == 1024
    assert train["input_ids"] == [expected[i]["input_ids"] for i in kept]
    assert train["labels"] == [expected[i]["labels"] for i in kept]


GEMMA3 = json.loads((Path(__file__).resolve().parents[2] / "data/media/gemma3_images.json").read_text())
GEMMA3_CASES = [(setting, row) for setting, golden in GEMMA3["by_setting"].items() for row in golden["rows"]]


@pytest.fixture(scope="module")
def gemma3_dataset(tmp_path_factory, shared_dir: Path) -> tuple[Path, Path]:
    """A Gemma 3 processor folder as the golden's (llama2's tokenizer with Gemma 3's image tokens by their
    names, and its turn markers; the image processor at 64 pixels, 16 soft tokens an image) and the golden rows as a dataset."""
    from transformers import AutoTokenizer, Gemma3ImageProcessor, Gemma3Processor

    root = tmp_path_factory.mktemp("gemma3")
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/llama2", **GEMMA3["tokens"])
    tokenizer.add_special_tokens({"additional_special_tokens": list(GEMMA3["tokens"].values()) + GEMMA3["turn_tokens"]})
    Gemma3Processor(image_processor=Gemma3ImageProcessor(size={"height": 64, "width": 64}), tokenizer=tokenizer,
                    image_seq_length=GEMMA3["processor"]["image_seq_length"]).save_pretrained(root / "model")
    data = picture_dataset(root / "data", GEMMA3["sizes"], GEMMA3["by_setting"]["plain"]["rows"])
    return root / "model", data


@pytest.mark.parametrize(("setting", "row"), GEMMA3_CASES, ids=[f"{setting}: {row['name']}" for setting, row in GEMMA3_CASES])
def test_gemma3_images_expand_to_llamafactorys_tokens(setting: str, row: dict, gemma3_dataset):
    """Gemma 3: each image is Gemma3Processor's full image sequence of 16 soft tokens; under pan and scan a
    wide picture also shows its crops (the panorama: 3), and the token types mark every soft token."""
    import torch

    from tuneline.core.config import MediaConfig
    from tuneline.core.data.media.rows import media_rows_for_model
    from tuneline.core.templates.conversation import Conversation, encode_turns

    folder, data = gemma3_dataset
    template = TEMPLATES["gemma3"]
    settings = MediaConfig(image_max_pixels=GEMMA3["image_max_pixels"], image_min_pixels=GEMMA3["image_min_pixels"],
                           image_do_pan_and_scan=setting == "pan_and_scan")
    rows = media_rows_for_model(folder, template=template, settings=settings)
    paths = [str(data / "pictures" / f"{name}.png") for name in row["images"]]
    assert rows.crops(paths) == (row["num_crops"] if setting == "pan_and_scan" else None)
    expanded = rows.expand_messages(row["messages"], paths)
    assert expanded == row["expanded"]
    tokenizer = fixed_tokenizer(folder, template)
    conversation = Conversation(prompt=expanded[:-1], response=expanded[-1:])
    pairs = [[list(source), list(target)] for source, target in encode_turns(template, tokenizer, conversation)]
    assert pairs == row["pairs"]
    input_ids = torch.tensor([[token for source, target in pairs for token in source + target]])
    inputs = rows.model_inputs(input_ids, paths, token_ids=rows.token_ids(tokenizer))
    assert list(inputs["pixel_values"].shape) == row["pixel_values_shape"] and "num_crops" not in inputs
    assert inputs["token_type_ids"][0].tolist() == row["token_type_ids"]


@pytest.mark.parametrize("setting", list(GEMMA3["by_setting"]))
@pytest.mark.parametrize("cutoff_len", [2048, 50])
def test_gemma3_rows_tokenize_to_llamafactorys_supervised_examples(gemma3_dataset, tmp_path: Path, cutoff_len: int,
                                                                   setting: str):
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    folder, data = gemma3_dataset
    config = build_stage_config({"model_name_or_path": str(folder), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": "gemma3", "cutoff_len": cutoff_len,
                                 "image_do_pan_and_scan": setting == "pan_and_scan"})
    counters = tokenize_stage_data(config, tokenizer_path=folder, output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    golden = GEMMA3["by_setting"][setting]["supervised_by_cutoff_len"]
    soft_token = 32002  # <image_soft_token> in the golden's tokenizer
    # kept: the examples whose cutoff left all their soft tokens (LLaMA-Factory keeps the others too)
    kept = [i for i, (cut, whole) in enumerate(zip(golden[str(cutoff_len)], golden["2048"]))
            if cut["input_ids"].count(soft_token) == whole["input_ids"].count(soft_token)]
    assert len(kept) == (5 if cutoff_len == 2048 else 2)
    assert counters.get("rows_dropped_media_tokens_cut", 0) == 5 - len(kept)
    assert train["input_ids"] == [golden[str(cutoff_len)][i]["input_ids"] for i in kept]
    assert train["labels"] == [golden[str(cutoff_len)][i]["labels"] for i in kept]


LLAVA_NEXT = json.loads((Path(__file__).resolve().parents[2] / "data/media/llava_next_images.json").read_text())


@pytest.fixture(scope="module")
def llava_next_folder(tmp_path_factory, shared_dir: Path) -> Path:
    """A LLaVA-NeXT processor folder as the golden's: llama2's tokenizer with `<image>`, LLaVA-v1.6's image
    processor (336-pixel tiles on five grids) and LlavaNextProcessor's numbers."""
    from transformers import AutoTokenizer, LlavaNextImageProcessor, LlavaNextProcessor

    folder = tmp_path_factory.mktemp("llava_next")
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/llama2")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    LlavaNextProcessor(image_processor=LlavaNextImageProcessor(**LLAVA_NEXT["image_processor"]), tokenizer=tokenizer,
                       **{key: value for key, value in LLAVA_NEXT["processor"].items() if key != "class"}).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("row", LLAVA_NEXT["rows"], ids=[row["name"] for row in LLAVA_NEXT["rows"]])
def test_llava_next_images_expand_to_llamafactorys_tokens(row: dict, llava_next_folder: Path):
    """Each image's tokens depend on its size (its best grid of tiles, the padding off, a newline a row)."""

    from tuneline.core.config import MediaConfig
    from tuneline.core.data.media.rows import media_rows_for_model
    from tuneline.core.templates.conversation import Conversation, encode_turns

    template = TEMPLATES["llava_next"]
    rows = media_rows_for_model(llava_next_folder, template=template, settings=MediaConfig())
    images = [sized_image(drawn(GOLDEN["sizes"][name]), max_pixels=LLAVA_NEXT["image_max_pixels"],
                          min_pixels=LLAVA_NEXT["image_min_pixels"], plugin="llava_next") for name in row["images"]]
    features = image_features(images, rows.image_processor)
    assert list(features["pixel_values"].shape) == row["pixel_values_shape"]
    assert features["image_sizes"].tolist() == row["image_sizes"]
    counts = patch_token_counts(images, rows.image_processor, plugin="llava_next", processor_settings=rows.processor_settings,
                                multimodal_processor=rows.multimodal_processor)
    expanded = expand_images(row["messages"], counts, template.media)
    assert [message["content"].count("<image>") for message in expanded] == row["image_tokens"]
    tokenizer = fixed_tokenizer(llava_next_folder, template)
    conversation = Conversation(prompt=expanded[:-1], response=expanded[-1:])
    assert [[list(source), list(target)] for source, target in encode_turns(template, tokenizer, conversation)] == row["pairs"]


@pytest.mark.parametrize("cutoff_len", [4096, 1400])
def test_llava_next_rows_tokenize_to_llamafactorys_supervised_examples(llava_next_folder: Path, image_dataset, tmp_path: Path,
                                                                        cutoff_len: int):
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    _, data = image_dataset
    config = build_stage_config({"model_name_or_path": str(llava_next_folder), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": "llava_next", "cutoff_len": cutoff_len})
    counters = tokenize_stage_data(config, tokenizer_path=llava_next_folder, output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    expected = LLAVA_NEXT["supervised_by_cutoff_len"][str(cutoff_len)]
    kept = [i for i, row in enumerate(LLAVA_NEXT["rows"]) if expected[i]["input_ids"].count(32000) == sum(row["image_tokens"])]
    assert kept == ([0, 1, 2, 3] if cutoff_len == 4096 else [0, 3])  # 1400 cuts into the two-image rows' images
    assert counters.get("rows_dropped_media_tokens_cut", 0) == len(LLAVA_NEXT["rows"]) - len(kept)
    assert train["input_ids"] == [expected[i]["input_ids"] for i in kept]
    assert train["labels"] == [expected[i]["labels"] for i in kept]


GLM4V = json.loads((Path(__file__).resolve().parents[2] / "data/media/glm4v_images.json").read_text())


@pytest.fixture(scope="module")
def glm4v_folder(tmp_path_factory, shared_dir: Path) -> Path:
    """A GLM-4V-shaped folder as the golden's: Qwen2.5's tokenizer with GLM's control and image tokens, and
    Glm4vImageProcessor at its defaults."""
    from transformers import AutoTokenizer, Glm4vImageProcessor

    folder = tmp_path_factory.mktemp("glm4v")
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/qwen2.5")
    tokenizer.add_special_tokens({"additional_special_tokens": GLM4V["added_tokens"]})
    tokenizer.save_pretrained(folder)
    Glm4vImageProcessor().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("row", GLM4V["rows"], ids=[row["name"] for row in GLM4V["rows"]])
def test_glm4v_images_expand_to_llamafactorys_tokens(row: dict, glm4v_folder: Path):
    """GLM-4V: Qwen2-VL's sizing, its own image processor's grid, GLM's image markers, the reasoning template."""

    from tuneline.core.config import MediaConfig
    from tuneline.core.data.media.rows import media_rows_for_model
    from tuneline.core.templates.conversation import Conversation, encode_turns

    template = TEMPLATES["glm4v"]
    rows = media_rows_for_model(glm4v_folder, template=template, settings=MediaConfig())
    images = [sized_image(drawn(GOLDEN["sizes"][name]), max_pixels=GLM4V["image_max_pixels"],
                          min_pixels=GLM4V["image_min_pixels"], plugin="glm4v") for name in row["images"]]
    features = image_features(images, rows.image_processor)
    assert features["image_grid_thw"].tolist() == row["image_grid_thw"]
    assert list(features["pixel_values"].shape) == row["pixel_values_shape"]
    counts = patch_token_counts(images, rows.image_processor, plugin="glm4v")
    assert counts == image_token_counts(features, rows.image_processor)
    expanded = expand_images(row["messages"], counts, template.media)
    assert [message["content"].count("<|image|>") for message in expanded] == row["image_tokens"]
    tokenizer = fixed_tokenizer(glm4v_folder, template)
    conversation = Conversation(prompt=expanded[:-1], response=expanded[-1:])
    assert [[list(source), list(target)] for source, target in encode_turns(template, tokenizer, conversation)] == row["pairs"]


@pytest.mark.parametrize("cutoff_len", [4096, 200])
def test_glm4v_rows_tokenize_to_llamafactorys_supervised_examples(glm4v_folder: Path, image_dataset, tmp_path: Path,
                                                                   cutoff_len: int):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    _, data = image_dataset
    config = build_stage_config({"model_name_or_path": str(glm4v_folder), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": "glm4v", "cutoff_len": cutoff_len})
    counters = tokenize_stage_data(config, tokenizer_path=glm4v_folder, output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    expected = GLM4V["supervised_by_cutoff_len"][str(cutoff_len)]
    image_token = AutoTokenizer.from_pretrained(glm4v_folder).convert_tokens_to_ids("<|image|>")
    kept = [i for i, row in enumerate(GLM4V["rows"]) if expected[i]["input_ids"].count(image_token) == sum(row["image_tokens"])]
    assert kept == ([0, 1, 2, 3] if cutoff_len == 4096 else [0, 1, 3])  # 200 cuts into the large image's tokens
    assert counters.get("rows_dropped_media_tokens_cut", 0) == len(GLM4V["rows"]) - len(kept)
    assert train["input_ids"] == [expected[i]["input_ids"] for i in kept]
    assert train["labels"] == [expected[i]["labels"] for i in kept]


INTERNVL = json.loads((Path(__file__).resolve().parents[2] / "data/media/internvl_images.json").read_text())
INTERNVL_CASES = [(setting, row) for setting, golden in INTERNVL["by_setting"].items() for row in golden["rows"]]


@pytest.fixture(scope="module")
def internvl_dataset(tmp_path_factory, shared_dir: Path) -> tuple[Path, Path]:
    """An InternVL folder as the golden's (Qwen2.5's tokenizer with `<img>`, `</img>`, `<IMG_CONTEXT>`;
    GotOcr2ImageProcessor at 448 pixels; InternVLProcessor's image_seq_length, 256) and the golden rows."""
    from transformers import AutoTokenizer, GotOcr2ImageProcessor

    root = tmp_path_factory.mktemp("internvl")
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/qwen2.5")
    tokenizer.add_special_tokens({"additional_special_tokens": INTERNVL["added_tokens"]})
    tokenizer.save_pretrained(root / "model")
    GotOcr2ImageProcessor(**INTERNVL["image_processor"]).save_pretrained(root / "model")
    (root / "model" / "processor_config.json").write_text(json.dumps({
        "image_seq_length": INTERNVL["image_seq_length"], "processor_class": "InternVLProcessor"}))
    data = picture_dataset(root / "data", INTERNVL["sizes"], INTERNVL["by_setting"]["plain"]["rows"])
    return root / "model", data


@pytest.mark.parametrize(("setting", "row"), INTERNVL_CASES, ids=[f"{setting}: {row['name']}" for setting, row in INTERNVL_CASES])
def test_internvl_images_expand_to_llamafactorys_tokens(setting: str, row: dict, internvl_dataset):
    """InternVL: 256 `<IMG_CONTEXT>` a tile between `<img>` and `</img>`; with crop_to_patches an image is
    the tiles of its best grid and a thumbnail, as its image processor cuts it."""

    from tuneline.core.config import MediaConfig
    from tuneline.core.data.media.rows import media_rows_for_model
    from tuneline.core.templates.conversation import Conversation, encode_turns

    folder, data = internvl_dataset
    template = TEMPLATES["intern_vl"]
    rows = media_rows_for_model(folder, template=template, settings=MediaConfig(crop_to_patches=setting == "crop_to_patches"))
    paths = [str(data / "pictures" / f"{name}.png") for name in row["images"]]
    assert list(rows.features(paths)["pixel_values"].shape) == row["pixel_values_shape"]
    expanded = rows.expand_messages(row["messages"], paths)
    assert [message["content"].count("<IMG_CONTEXT>") for message in expanded] == row["image_tokens"]
    if row["pairs"] is not None:
        tokenizer = fixed_tokenizer(folder, template)
        conversation = Conversation(prompt=expanded[:-1], response=expanded[-1:])
        assert [[list(source), list(target)] for source, target in encode_turns(template, tokenizer, conversation)] == row["pairs"]


@pytest.mark.parametrize(("setting", "cutoff_len"), [("plain", 8192), ("plain", 400), ("crop_to_patches", 1500)])
def test_internvl_rows_tokenize_to_llamafactorys_supervised_examples(internvl_dataset, tmp_path: Path, setting: str,
                                                                     cutoff_len: int):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    folder, data = internvl_dataset
    config = build_stage_config({"model_name_or_path": str(folder), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": "intern_vl", "cutoff_len": cutoff_len,
                                 "crop_to_patches": setting == "crop_to_patches"})
    counters = tokenize_stage_data(config, tokenizer_path=folder, output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    golden = INTERNVL["by_setting"][setting]
    expected = golden["supervised_by_cutoff_len"][str(cutoff_len)]
    image_token = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids("<IMG_CONTEXT>")
    kept = [i for i, row in enumerate(golden["rows"]) if expected[i]["input_ids"].count(image_token) == sum(row["image_tokens"])]
    assert kept == {8192: [0, 1, 2, 3, 4], 400: [0, 3], 1500: [4]}[cutoff_len]
    assert counters.get("rows_dropped_media_tokens_cut", 0) == 5 - len(kept)
    assert train["input_ids"] == [expected[i]["input_ids"] for i in kept]
    assert train["labels"] == [expected[i]["labels"] for i in kept]


PALIGEMMA = json.loads((Path(__file__).resolve().parents[2] / "data/media/paligemma_images.json").read_text())
PALIGEMMA_CASES = [(name, row) for name, golden in PALIGEMMA["templates"].items() for row in golden["rows"]]


@pytest.fixture(scope="module")
def paligemma_folders(tmp_path_factory, shared_dir: Path) -> dict[str, Path]:
    """A PaliGemma processor folder per template as the golden's (llama2's tokenizer, Gemma's turn markers
    first for `paligemma_chat`, then PaliGemmaProcessor's `<image>` and location tokens; SigLIP's image
    processor at 64 pixels, 16 tokens an image), and `data`: the golden rows and pairs as datasets."""
    from transformers import AutoTokenizer, PaliGemmaProcessor, SiglipImageProcessor

    root = tmp_path_factory.mktemp("paligemma")
    folders = {}
    for name, golden in PALIGEMMA["templates"].items():
        tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/llama2")
        if name == "paligemma_chat":
            tokenizer.add_special_tokens({"additional_special_tokens": PALIGEMMA["turn_tokens"]})
        image_processor = SiglipImageProcessor(size={"height": 64, "width": 64},
                                               image_seq_length=PALIGEMMA["image_processor"]["image_seq_length"])
        PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(root / name)
        assert len(tokenizer) == golden["vocabulary"] and tokenizer.convert_tokens_to_ids("<image>") == golden["image_token_id"]
        folders[name] = root / name
    data = root / "data"
    (data / "pictures").mkdir(parents=True)
    for name, size in PALIGEMMA["sizes"].items():
        drawn(size).save(data / "pictures" / f"{name}.png")
    rows = [{"messages": row["messages"], "images": [f"pictures/{n}.png" for n in row["images"]]}
            for row in PALIGEMMA["templates"]["paligemma"]["rows"]]
    pairs = [{"conversations": pair["messages"], "chosen": pair["replies"][0], "rejected": pair["replies"][1],
              "images": [f"pictures/{n}.png" for n in pair["images"]]} for pair in PALIGEMMA["pairs"]]
    (data / "rows.json").write_text(json.dumps(rows))
    (data / "pairs.json").write_text(json.dumps(pairs))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    (data / "dataset_info.json").write_text(json.dumps({
        "pictures": {"file_name": "rows.json", "formatting": "sharegpt", "tags": tags,
                     "columns": {"messages": "messages", "images": "images"}},
        "picture_pairs": {"file_name": "pairs.json", "formatting": "sharegpt", "ranking": True, "tags": tags,
                          "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected", "images": "images"}}}))
    return {**folders, "data": data}


@pytest.mark.parametrize(("name", "row"), PALIGEMMA_CASES, ids=[f"{name}: {row['name']}" for name, row in PALIGEMMA_CASES])
def test_paligemma_images_go_before_the_conversation_as_llamafactory_writes_them(name: str, row: dict, paligemma_folders):
    """PaliGemma: the `<image>` placeholders leave the text, 16 image tokens an image go before everything
    (BOS included), and the token types are 0 on them and 1 after."""
    import torch

    from tuneline.core.config import MediaConfig
    from tuneline.core.data.media.rows import media_rows_for_model
    from tuneline.core.templates.conversation import Conversation, encode_turns

    template = TEMPLATES[name]
    settings = MediaConfig(image_max_pixels=PALIGEMMA["image_max_pixels"], image_min_pixels=PALIGEMMA["image_min_pixels"])
    rows = media_rows_for_model(paligemma_folders[name], template=template, settings=settings)
    paths = [str(paligemma_folders["data"] / "pictures" / f"{n}.png") for n in row["images"]]
    expanded = rows.expand_messages(row["messages"], paths)
    assert expanded == row["expanded"]
    tokenizer = fixed_tokenizer(paligemma_folders[name], template)
    prefix = rows.prefix_ids(paths, tokenizer)
    assert prefix == row["prefix"]
    conversation = Conversation(prompt=expanded[:-1], response=expanded[-1:])
    pairs = [[list(source), list(target)] for source, target in encode_turns(template, tokenizer, conversation)]
    assert pairs == row["pairs"]
    input_ids = torch.tensor([prefix + [token for source, target in pairs for token in source + target]])
    inputs = rows.model_inputs(input_ids, paths, token_ids=rows.token_ids(tokenizer))
    assert list(inputs["pixel_values"].shape) == row["pixel_values_shape"]
    # the same pixels up to float32 rounding (LLaMA-Factory's processor returns torch tensors, ours numpy arrays)
    assert float(inputs["pixel_values"].double().sum()) == pytest.approx(row["pixel_values_sum"], rel=1e-4)
    assert inputs["token_type_ids"][0].tolist() == row["token_type_ids"]
    padded = torch.cat([input_ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)  # right padding: type 0, as LLaMA-Factory pads
    mask = torch.cat([torch.ones_like(input_ids), torch.zeros(1, 3, dtype=torch.long)], dim=1)
    types = rows.model_inputs(padded, paths, token_ids=rows.token_ids(tokenizer), attention_mask=mask)["token_type_ids"]
    assert types[0].tolist() == row["token_type_ids"] + [0, 0, 0]


@pytest.mark.parametrize("name", list(PALIGEMMA["templates"]))
@pytest.mark.parametrize("cutoff_len", [2048, 40])
def test_paligemma_rows_tokenize_to_llamafactorys_supervised_examples(paligemma_folders, tmp_path: Path, cutoff_len: int,
                                                                      name: str):
    """The image prefix counts against cutoff_len first and is never cut: at 40 tokens a two-image row keeps
    its 32 image tokens and 8 of its text."""
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    config = build_stage_config({"model_name_or_path": str(paligemma_folders[name]), "dataset": "pictures",
                                 "dataset_dir": str(paligemma_folders["data"]), "template": name, "cutoff_len": cutoff_len})
    tokenize_stage_data(config, tokenizer_path=paligemma_folders[name], output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    golden = PALIGEMMA["templates"][name]["supervised_by_cutoff_len"][str(cutoff_len)]
    trained = [example for example in golden if set(example["labels"]) != {-100}]  # tuneline drops a row with nothing to train
    assert train["input_ids"] == [example["input_ids"] for example in trained]
    assert train["labels"] == [example["labels"] for example in trained]
    assert all(ids[:16] == [PALIGEMMA["templates"][name]["image_token_id"]] * 16 for ids in train["input_ids"])


@pytest.mark.parametrize("name", list(PALIGEMMA["templates"]))
def test_paligemma_pairs_tokenize_to_llamafactorys_pairwise_examples(paligemma_folders, tmp_path: Path, name: str):
    """Chosen and rejected share the prompt with the image prefix in front of it, cut as one prompt."""
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    config = build_stage_config({"model_name_or_path": str(paligemma_folders[name]), "stage": "dpo", "dataset": "picture_pairs",
                                 "dataset_dir": str(paligemma_folders["data"]), "template": name, "cutoff_len": 60})
    tokenize_stage_data(config, tokenizer_path=paligemma_folders[name], output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    golden = PALIGEMMA["templates"][name]["pairwise_cutoff_len_60"]
    for key in ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels"):
        assert train[key] == [example[key] for example in golden], key


MLLAMA = json.loads((Path(__file__).resolve().parents[2] / "data/media/mllama_images.json").read_text())


@pytest.fixture(scope="module")
def mllama_folders(tmp_path_factory, shared_dir: Path) -> dict[str, Path]:
    """A Llama 3.2 Vision processor folder as the golden's (llama3's tokenizer with `<|image|>`, the image
    processor in tiles of 28 pixels, at most 2 an image), and `data`: the golden rows as a dataset."""
    from transformers import AutoTokenizer, MllamaImageProcessor

    root = tmp_path_factory.mktemp("mllama")
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/llama3")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|image|>"]})
    assert tokenizer.convert_tokens_to_ids("<|image|>") == MLLAMA["image_token_id"]
    tokenizer.save_pretrained(root / "model")
    tile = MLLAMA["image_processor"]["tile"]
    MllamaImageProcessor(size={"height": tile, "width": tile},
                         max_image_tiles=MLLAMA["image_processor"]["max_image_tiles"]).save_pretrained(root / "model")
    data = picture_dataset(root / "data", MLLAMA["sizes"], MLLAMA["rows"])
    return {"model": root / "model", "data": data}


def test_mllama_images_become_one_token_and_cross_attention_inputs_as_llamafactory_makes_them(mllama_folders):
    """Llama 3.2 Vision: each `<image>` is one `<|image|>`; the four rows as one right-padded batch get the
    golden's tiles, aspect ratio ids and masks, and the cross-attention mask by which each text token sees the
    tiles of the images before it (per image, up to the next image or the example's end)."""
    import torch

    from tuneline.core.config import MediaConfig
    from tuneline.core.data.media.rows import media_rows_for_model
    from tuneline.core.templates.conversation import Conversation, encode_turns

    template = TEMPLATES["mllama"]
    settings = MediaConfig(image_max_pixels=MLLAMA["image_max_pixels"], image_min_pixels=MLLAMA["image_min_pixels"])
    rows = media_rows_for_model(mllama_folders["model"], template=template, settings=settings)
    tokenizer = fixed_tokenizer(mllama_folders["model"], template)
    batch_ids, paths = [], []
    for row in MLLAMA["rows"]:
        row_paths = [str(mllama_folders["data"] / "pictures" / f"{n}.png") for n in row["images"]]
        expanded = rows.expand_messages(row["messages"], row_paths)
        assert expanded == row["expanded"]
        conversation = Conversation(prompt=expanded[:-1], response=expanded[-1:])
        pairs = [[list(source), list(target)] for source, target in encode_turns(template, tokenizer, conversation)]
        assert pairs == row["pairs"]
        batch_ids.append([token for source, target in pairs for token in source + target])
        paths += row_paths
    assert batch_ids == MLLAMA["batch"]["input_ids"]
    length = max(len(ids) for ids in batch_ids)
    input_ids = torch.tensor([ids + [tokenizer.pad_token_id] * (length - len(ids)) for ids in batch_ids])
    mask = torch.tensor([[1] * len(ids) + [0] * (length - len(ids)) for ids in batch_ids])
    inputs = rows.model_inputs(input_ids, paths, token_ids=rows.token_ids(tokenizer), attention_mask=mask)
    golden = MLLAMA["batch"]
    assert list(inputs["pixel_values"].shape) == golden["pixel_values_shape"]
    assert float(inputs["pixel_values"].double().sum()) == pytest.approx(golden["pixel_values_sum"], rel=1e-4)
    assert inputs["aspect_ratio_ids"].tolist() == golden["aspect_ratio_ids"]
    assert inputs["aspect_ratio_mask"].tolist() == golden["aspect_ratio_mask"]
    assert inputs["cross_attention_mask"].tolist() == golden["cross_attention_mask"]


@pytest.mark.parametrize("cutoff_len", [2048, 30])
def test_mllama_rows_tokenize_to_llamafactorys_supervised_examples(mllama_folders, tmp_path: Path, cutoff_len: int):
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    config = build_stage_config({"model_name_or_path": str(mllama_folders["model"]), "dataset": "pictures",
                                 "dataset_dir": str(mllama_folders["data"]), "template": "mllama", "cutoff_len": cutoff_len})
    counters = tokenize_stage_data(config, tokenizer_path=mllama_folders["model"], output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    golden, whole = MLLAMA["supervised_by_cutoff_len"][str(cutoff_len)], MLLAMA["supervised_by_cutoff_len"]["2048"]
    image = MLLAMA["image_token_id"]
    # kept: the examples whose cutoff left every <|image|> (LLaMA-Factory keeps the others too)
    kept = [i for i, (cut, full) in enumerate(zip(golden, whole))
            if cut["input_ids"].count(image) == full["input_ids"].count(image)]
    assert counters.get("rows_dropped_media_tokens_cut", 0) == len(golden) - len(kept)
    assert train["input_ids"] == [golden[i]["input_ids"] for i in kept]
    assert train["labels"] == [golden[i]["labels"] for i in kept]


LLAVA_VARIANTS = json.loads((Path(__file__).resolve().parents[2] / "data/media/llava_variants.json").read_text())


@pytest.mark.parametrize("name", list(LLAVA_VARIANTS["variants"]))
def test_llava_format_copies_tokenize_to_llamafactorys_supervised_examples(name: str, tmp_path: Path, shared_dir: Path):
    """LLaVA-NeXT's images in Llama 3's, Mistral's, Qwen's and Yi's formats, and LLaVA's in Yi-VL's, each on its
    family's tokenizer: the whole tokenize path writes LLaMA-Factory's ids and labels."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer, CLIPImageProcessor, LlavaNextImageProcessor, LlavaNextProcessor, LlavaProcessor

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    golden = LLAVA_VARIANTS["variants"][name]
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / golden["tokenizer"])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    if name == "yi_vl":
        processor = LlavaProcessor(image_processor=CLIPImageProcessor(**LLAVA_VARIANTS["plain_image_processor"]),
                                   tokenizer=tokenizer, **LLAVA_VARIANTS["processor"])
    else:
        processor = LlavaNextProcessor(image_processor=LlavaNextImageProcessor(**LLAVA_VARIANTS["next_image_processor"]),
                                       tokenizer=tokenizer, **LLAVA_VARIANTS["processor"])
    processor.save_pretrained(tmp_path / "model")
    data = picture_dataset(tmp_path / "data", GOLDEN["sizes"], GOLDEN["rows"])
    config = build_stage_config({"model_name_or_path": str(tmp_path / "model"), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": name, "cutoff_len": 4096,
                                 # Yi-VL's stop word `###` is new to llama2's vocabulary, as LLaMA-Factory adds it
                                 "resize_vocab": name == "yi_vl"})
    tokenize_stage_data(config, tokenizer_path=tmp_path / "model", output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    assert train["input_ids"] == [example["input_ids"] for example in golden["supervised"]]
    assert train["labels"] == [example["labels"] for example in golden["supervised"]]
