"""Training on image rows: a tiny Qwen2-VL (core/models/tiny/vision.py, the Qwen2.5 tokenizer) learns
from generated pictures through `tuneline train`, its pixels cut per batch by the image processor the
tokenized data was counted with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the module builds a tiny Qwen2-VL and trains it in most of its tests

COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 180, 60)}


@pytest.fixture(scope="module")
def pictures(tmp_path_factory, shared_dir: Path) -> tuple[Path, Path]:
    """A tiny Qwen2-VL folder and a dataset of one-colour pictures (of three sizes), one row with two of them."""
    from PIL import Image

    from tuneline.core.models.tiny.vision import VisionModelConfig, build_vision_language_model

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
    names = list(COLOURS)
    pairs = [{"messages": [{"role": "user", "content": "<image>What colour is this?"}],
              "chosen": {"role": "assistant", "content": name}, "rejected": {"role": "assistant", "content": names[i - 1]},
              "images": [f"pictures/{name}.png"]} for i, name in enumerate(names)]
    (data / "pairs.json").write_text(json.dumps(pairs))
    feedback = [{"messages": [{"role": "user", "content": "<image>What colour is this?"},
                              {"role": "assistant", "content": name if right else names[i - 1]}],
                 "right": right, "images": [f"pictures/{name}.png"]} for i, name in enumerate(names) for right in (True, False)]
    (data / "feedback.json").write_text(json.dumps(feedback))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    (data / "dataset_info.json").write_text(json.dumps({
        "pictures": {"file_name": "rows.json", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
                     "tags": tags},
        "picture_pairs": {"file_name": "pairs.json", "formatting": "sharegpt", "ranking": True, "tags": tags,
                          "columns": {"messages": "messages", "chosen": "chosen", "rejected": "rejected", "images": "images"}},
        "picture_feedback": {"file_name": "feedback.json", "formatting": "sharegpt", "tags": tags,
                             "columns": {"messages": "messages", "kto_tag": "right", "images": "images"}}}))
    return root / "model", data


def test_a_batchs_pixels_fill_its_image_tokens_in_order(pictures, tmp_path: Path):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.training.collators import build_collator

    model, data = pictures
    config = build_stage_config({"model_name_or_path": str(model), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": "qwen2_vl", "image_max_pixels": 56 * 56})
    tokenize_stage_data(config, tokenizer_path=model, output_dir=tmp_path / "tokenized")
    train = load_from_disk(str(tmp_path / "tokenized"))["train"]
    saved = MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR)
    assert saved.settings.image_max_pixels == 56 * 56  # the sizes tokenizing counted with travel with the data
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    collator = build_collator(train, tokenizer=tokenizer, model=None, media_rows=saved)
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


def test_the_vision_towers_gradients_come_from_the_pixels(pictures, tmp_path: Path):
    """Full tuning with `freeze_vision_tower: false`: a batch's loss reaches the vision blocks through the
    pixels the collator cut, while the projector stays frozen (freeze_multi_modal_projector's default)."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.config import FinetuningConfig
    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.models.loading import apply_finetuning, load_model
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.training.collators import build_collator

    model_dir, data = pictures
    config = build_stage_config({"model_name_or_path": str(model_dir), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": "qwen2_vl"})
    tokenize_stage_data(config, tokenizer_path=model_dir, output_dir=tmp_path / "tokenized")
    train = load_from_disk(str(tmp_path / "tokenized"))["train"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    model = apply_finetuning(load_model(model_dir, trainable=True),
                             FinetuningConfig(finetuning_type="full", freeze_vision_tower=False))
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"  # the image-text-to-text class, not a causal LM
    collator = build_collator(train, tokenizer=tokenizer, model=model, media_rows=MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR))
    model(**collator([train[i] for i in range(len(train))])).loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(grads[name] is not None and grads[name].abs().sum() > 0 for name in grads if name.startswith("model.visual.blocks."))
    assert all(grads[name] is None for name in grads if name.startswith("model.visual.merger."))


def test_chat_shows_the_image_as_training_expands_it(pictures, tmp_path: Path):
    import torch
    from PIL import Image

    from tuneline.core.config import GeneratingConfig
    from tuneline.core.data.media.sizing import sized_image
    from tuneline.core.evaluation.predict import generation_kwargs
    from tuneline.core.inference.chat import ChatSession, chat_media, load_chat_model, resolve_source

    model_dir, data = pictures
    picture = data / "pictures" / "blue.png"
    source = resolve_source(model_dir)
    media = chat_media(source, images=[str(picture)], template=None)
    model, tokenizer = load_chat_model(source)
    session = ChatSession(model, tokenizer, GeneratingConfig(max_new_tokens=4, do_sample=False), name="t", media=media,
                          shown={"images": [str(picture)]})
    answer = session.reply("What colour is this?", write=lambda _: None)
    assert session.history[0]["content"] == "<image>What colour is this?"
    session.history.pop()  # the prompt the answer was generated from
    prompt, shown = session._prompt()
    paths = shown["images"]
    assert paths == [str(picture)]
    # blue.png is 84 x 56: a 6 x 4 patch grid, 6 image tokens after the 2 x 2 merge
    assert "<|vision_start|>" + "<|image_pad|>" * 6 + "<|vision_end|>What colour is this?" in tokenizer.decode(prompt)

    # the same answer from the model's own generate() on pixels cut here by its processor
    processor = media.image_processor
    features = processor([sized_image(Image.open(picture), max_pixels=768 * 768, min_pixels=32 * 32, plugin="qwen2_vl")],
                         return_tensors="pt")
    session.clear()
    ids = torch.tensor([prompt])
    output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=features["pixel_values"],
                            image_grid_thw=features["image_grid_thw"],
                            mm_token_type_ids=(ids == tokenizer.convert_tokens_to_ids("<|image_pad|>")).long(),
                            **generation_kwargs(GeneratingConfig(max_new_tokens=4, do_sample=False), tokenizer, model))
    assert tokenizer.decode(output[0, len(prompt):], skip_special_tokens=True).strip() == answer
    with torch.no_grad():  # and the pixels reach the answer: other pixels, other logits
        logits = [model(input_ids=ids, pixel_values=pixels, image_grid_thw=features["image_grid_thw"],
                        mm_token_type_ids=(ids == tokenizer.convert_tokens_to_ids("<|image_pad|>")).long()).logits[0, -1]
                  for pixels in (features["pixel_values"], torch.zeros_like(features["pixel_values"]))]
    assert not torch.allclose(*logits)


def test_chat_refuses_an_image_for_a_text_model_and_an_unreadable_one(pictures, tiny_base: Path, tmp_path: Path):
    import importlib.util

    from PIL import Image

    from conftest import REPO_ROOT as REPO
    from conftest import assert_refused, run_cli_here

    model_dir, data = pictures
    picture = str(data / "pictures" / "red.png")
    assert_refused(run_cli_here("chat", str(tiny_base), "--image", picture, cwd=tmp_path), "is a llama model, which reads no images")
    (tmp_path / "notes.png").write_text("not an image")
    assert_refused(run_cli_here("chat", str(model_dir), "--image", str(tmp_path / "notes.png"), cwd=tmp_path),
                   "notes.png: not a readable image")
    # videos and sound: a file PyAV cannot read, a model of another family, a text model
    assert_refused(run_cli_here("chat", str(model_dir), "--video", str(tmp_path / "notes.png"), cwd=tmp_path),
                   "--video", "notes.png", "cannot be")
    assert_refused(run_cli_here("chat", str(model_dir), "--audio", str(tmp_path / "notes.png"), cwd=tmp_path),
                   "--audio", "notes.png")
    clip = tmp_path / "clip.mp4"
    spec = importlib.util.spec_from_file_location("generate_video_data", REPO / "data/generate_video_data.py")
    clips = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(clips)
    clips.write_clip(clip, [Image.new("RGB", (32, 32), (200, 30, 30))] * 4)
    assert_refused(run_cli_here("chat", str(tiny_base), "--video", str(clip), cwd=tmp_path),
                   "is a llama model, which hears and sees no media")


def test_image_pairs_carry_their_pixels_into_both_halves_of_a_batch(pictures, tmp_path: Path):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.data.media.batching import PairedMediaCollator
    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.preference_columns import dpo_pairs
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, data = pictures
    keys = {"model_name_or_path": str(model), "stage": "dpo", "dataset": "picture_pairs", "dataset_dir": str(data),
            "template": "qwen2_vl", "cutoff_len": 256}
    tokenize_stage_data(build_stage_config(keys), tokenizer_path=model, output_dir=tmp_path / "tokenized")
    train = load_from_disk(str(tmp_path / "tokenized"))["train"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    image_token = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert [row.count(image_token) for row in train["chosen_input_ids"]] == [row.count(image_token) for row in
                                                                             train["rejected_input_ids"]] == [4, 6, 8]
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    media = MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR)
    collator = PairedMediaCollator(DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id), media,
                                   token_ids=media.token_ids(tokenizer))
    pairs = dpo_pairs(train)
    batch = collator([pairs[i] for i in range(len(pairs))])
    grids = batch["image_grid_thw"]
    assert grids.shape[0] == 6  # three pairs' images, for the chosen half and again for the rejected half
    assert (batch["input_ids"] == image_token).sum(dim=1).tolist() == (grids.prod(dim=1) // 4).tolist()
    # trained end to end by the picture pipeline (tests/flows/test_multimodal_pipeline.py)


def test_kto_feeds_each_examples_pixels_to_its_sequence_and_its_kl_sequence(pictures, tmp_path: Path, monkeypatch):
    """KTO on picture rows tagged right or wrong: a batch holds every example's pixels once, its KL sequence
    (its prompt, with the picture, and another row's reply) gets its own token types, and `tuneline train`
    runs kto on them."""
    import yaml
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from conftest import run_cli_here, train_in_this_process
    from tuneline.core.data.media.batching import FeedbackMediaCollator
    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.preference_columns import kto_examples
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.stages.preference_trainers import OwnKLPromptCollator
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, data = pictures
    keys = {"model_name_or_path": str(model), "stage": "kto", "dataset": "picture_feedback", "dataset_dir": str(data),
            "template": "qwen2_vl", "cutoff_len": 256}
    tokenize_stage_data(build_stage_config(keys), tokenizer_path=model, output_dir=tmp_path / "tokenized")
    train = load_from_disk(str(tmp_path / "tokenized"))["train"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    media = MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR)
    collator = FeedbackMediaCollator(OwnKLPromptCollator(pad_token_id=tokenizer.pad_token_id), media,
                                     token_ids=media.token_ids(tokenizer))
    examples = kto_examples(train)
    batch = collator([examples[i] for i in range(len(examples))])
    image_token = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    tokens = (batch["input_ids"] == image_token).sum(dim=1)
    assert batch["image_grid_thw"].shape[0] == len(examples) == 6 and tokens.tolist() == [4, 4, 6, 6, 8, 8]
    assert (batch["KL_input_ids"] == image_token).sum(dim=1).tolist() == tokens.tolist()  # the same picture, in the same prompt
    assert batch["KL_mm_token_type_ids"].tolist() == (batch["KL_input_ids"] == image_token).long().tolist()
    assert batch["label"].tolist() == [True, False] * 3

    (tmp_path / "kto.yaml").write_text(yaml.safe_dump({
        **keys, "do_train": True, "finetuning_type": "lora", "lora_target": "all", "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 2, "max_steps": 2, "learning_rate": 1e-3, "logging_steps": 1, "report_to": "none"}))
    train_in_this_process(monkeypatch)  # the worker's run, without its start
    result = run_cli_here("train", str(tmp_path / "kto.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "out" / "trainer_log.jsonl").read_text().splitlines()]
    assert [entry["current_steps"] for entry in logged if "loss" in entry] == [1, 2]


def test_data_preview_names_each_examples_images_and_counts_their_tokens(pictures, tmp_path: Path):
    import yaml

    from conftest import run_cli_here

    model_dir, data = pictures
    (tmp_path / "preview.yaml").write_text(yaml.safe_dump({
        "model_name_or_path": str(model_dir), "stage": "sft", "dataset": "pictures", "dataset_dir": str(data),
        "template": "qwen2_vl", "cutoff_len": 256}))
    result = run_cli_here("data", "preview", str(tmp_path / "preview.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    first = result.stdout.split("--- example 1")[0]
    assert f"images: {data / 'pictures' / 'red.png'}\n" in first
    assert "<|vision_start|><|image_pad|> x 4<|vision_end|>What colour is this?" in first  # 56 x 56: a 4 x 4 grid


@pytest.mark.parametrize("method", ["qlora", "full"])
def test_rm_trains_a_scoring_head_on_image_pairs_that_reads_their_pixels(pictures, tmp_path: Path, monkeypatch, method: str):
    """Stage rm on picture pairs: Qwen2-VL has no sequence-classification class in transformers, so the
    reward model is its base model with tuneline's scoring head. With QLoRA `lora_target: all` leaves the
    vision tower alone and the head trains in full inside the adapter (in the hidden states' dtype,
    where TRL makes a quantized model's trainable weights bfloat16); full tuning saves the whole model.
    The held-out pair accuracy is measured with the pixels, and the saved reward model, loaded back,
    scores a pair differently when its picture changes."""
    import torch
    import yaml
    from datasets import load_from_disk
    from safetensors.torch import load_file

    from conftest import run_cli_here, train_in_this_process
    from tuneline.core.data.media.batching import PairedMediaCollator
    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.evaluation.reward import score_media_pairs
    from tuneline.core.models.loading import load_reward_model
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, data = pictures
    keys = {"model_name_or_path": str(model), "stage": "rm", "dataset": "picture_pairs", "dataset_dir": str(data),
            "template": "qwen2_vl", "cutoff_len": 256}
    (tmp_path / "rm.yaml").write_text(yaml.safe_dump({
        **keys, "do_train": True, "output_dir": str(tmp_path / "out"),
        **({"finetuning_type": "lora", "lora_target": "all", "quantization_bit": 4} if method == "qlora" else {"finetuning_type": "full"}),
        "per_device_train_batch_size": 2, "max_steps": 2, "learning_rate": 1e-2, "logging_steps": 1, "report_to": "none",
        "eval_dataset": "picture_pairs", "do_eval": True}))
    train_in_this_process(monkeypatch)
    result = run_cli_here("train", str(tmp_path / "rm.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    metrics = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert metrics["eval_rm_pairs"] == 3.0 and 0.0 <= metrics["eval_rm_accuracy"] <= 1.0
    if method == "qlora":
        saved = load_file(tmp_path / "out" / "adapter_model.safetensors")
        assert any(".score." in name for name in saved)  # the head, trained in full inside the adapter
        assert not any(".visual." in name for name in saved)  # no adapter on the vision tower
    else:
        assert "score.weight" in load_file(tmp_path / "out" / "model.safetensors")

    reward, tokenizer = load_reward_model(tmp_path / "out")
    assert type(reward).__name__ == "Qwen2VLForSequenceClassification"
    tokenize_stage_data(build_stage_config(keys), tokenizer_path=model, output_dir=tmp_path / "tokenized")
    pairs = load_from_disk(str(tmp_path / "tokenized"))["train"]
    media = MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR)
    from trl.trainer.reward_trainer import DataCollatorForPreference

    collator = PairedMediaCollator(DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id), media,
                                   token_ids=media.token_ids(tokenizer))
    chosen, rejected = score_media_pairs(reward, pairs, media_collator=collator)
    # the same pairs with each picture whitened (its size, and so its tokens, kept)
    recoloured = tmp_path / "recoloured"
    recoloured.mkdir()
    from PIL import Image

    swapped = []
    for files in pairs["images"]:
        image = Image.open(files[0])
        Image.new("RGB", image.size, (250, 250, 250)).save(recoloured / Path(files[0]).name)
        swapped.append([str(recoloured / Path(files[0]).name)])
    other_chosen, _ = score_media_pairs(reward, pairs.remove_columns("images").add_column("images", swapped),
                                        media_collator=collator)
    assert chosen.shape == rejected.shape == (3,)
    assert not torch.allclose(chosen, other_chosen)  # the pixels reach the score


def test_packed_picture_rows_keep_each_examples_images_whole_and_in_order(pictures, tmp_path: Path, monkeypatch):
    """`packing: true` on picture rows: each pack holds whole examples and their images in the order of
    its image tokens; Qwen2-VL's rotary positions are the model's own over the pack (no packed
    position_ids reach it), and `tuneline train` trains on the packs."""
    import yaml
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from conftest import run_cli_here, train_in_this_process
    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.training.collators import build_collator

    model, data = pictures
    keys = {"model_name_or_path": str(model), "stage": "sft", "dataset": "pictures", "dataset_dir": str(data),
            "template": "qwen2_vl", "cutoff_len": 96, "packing": True}
    tokenize_stage_data(build_stage_config(keys), tokenizer_path=model, output_dir=tmp_path / "tokenized")
    packs = load_from_disk(str(tmp_path / "tokenized"))["train"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    image_token = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    tokens_of = {"red.png": 4, "blue.png": 6, "green.png": 8}  # 56, 84 and 112 pixels wide: 2x2, 2x3 and 2x4 merged patches
    assert len(packs) < 4 and sorted(Path(f).name for files in packs["images"] for f in files) == sorted(
        ["red.png", "blue.png", "green.png", "red.png", "blue.png"])  # every example once, with all its images
    for ids, files in zip(packs["input_ids"], packs["images"]):
        assert len(ids) == 96 and ids.count(image_token) == sum(tokens_of[Path(f).name] for f in files)
    collator = build_collator(packs, tokenizer=tokenizer, model=None, media_rows=MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR))
    batch = collator([packs[i] for i in range(len(packs))])
    assert "position_ids" not in batch and batch["attention_mask"].min() == 1
    runs = [(row == image_token).nonzero().flatten().tolist() for row in batch["input_ids"]]
    counts = (batch["image_grid_thw"].prod(dim=1) // 4).tolist()
    assert sum(len(run) for run in runs) == sum(counts)  # the grids fill the packs' image tokens, pack by pack

    (tmp_path / "sft.yaml").write_text(yaml.safe_dump({
        **keys, "do_train": True, "finetuning_type": "lora", "lora_target": "all", "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 1, "max_steps": 2, "learning_rate": 1e-3, "logging_steps": 1, "report_to": "none"}))
    train_in_this_process(monkeypatch)
    result = run_cli_here("train", str(tmp_path / "sft.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "out" / "trainer_log.jsonl").read_text().splitlines()]
    assert [entry["current_steps"] for entry in logged if "loss" in entry] == [1, 2]


@pytest.mark.parametrize("pref_loss", ["orpo", "simpo"])
def test_orpo_and_simpo_feed_each_pairs_pixels_into_their_concatenated_pass(pictures, tmp_path: Path, monkeypatch,
                                                                            pref_loss: str):
    """TRL's ORPO and CPO (SimPO) trainers concatenate chosen and rejected inside their forward pass, which
    takes ids and mask alone: tuneline hands the model each pair's pixels, twice, for that pass. The loss of
    a batch moves when its pictures change, and `tuneline train` trains on picture pairs."""
    import torch
    import yaml
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from conftest import run_cli_here, train_in_this_process
    from tuneline.core.config import FinetuningConfig
    from tuneline.core.data.media.batching import ConcatenatedPairMedia, RowMedia
    from tuneline.core.data.media.columns import IMAGE_FILES
    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.preference_columns import odds_ratio_pairs
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.models.loading import apply_finetuning, load_model
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model_dir, data = pictures
    keys = {"model_name_or_path": str(model_dir), "stage": "dpo", "pref_loss": pref_loss, "dataset": "picture_pairs",
            "dataset_dir": str(data), "template": "qwen2_vl", "cutoff_len": 256}
    tokenize_stage_data(build_stage_config(keys), tokenizer_path=model_dir, output_dir=tmp_path / "tokenized")
    pairs = odds_ratio_pairs(load_from_disk(str(tmp_path / "tokenized"))["train"])
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    media = MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR)
    feeding = ConcatenatedPairMedia(media, token_ids=media.token_ids(tokenizer))
    model = apply_finetuning(load_model(model_dir), FinetuningConfig(finetuning_type="full"))
    seen = {}
    ids = torch.tensor([pairs[0]["chosen_input_ids"], pairs[0]["rejected_input_ids"]])  # same length: one-word replies
    batch = {IMAGE_FILES: [pairs[0][IMAGE_FILES]]}
    with feeding.feeding(model, batch):
        watch = model.register_forward_pre_hook(lambda module, args, kwargs: seen.update(kwargs), with_kwargs=True)
        fed = model(ids, attention_mask=torch.ones_like(ids)).logits
        watch.remove()
    assert IMAGE_FILES not in batch and seen["image_grid_thw"].shape[0] == 2  # the pair's picture, for both sequences
    assert seen["mm_token_type_ids"].tolist() == (ids == tokenizer.convert_tokens_to_ids("<|image_pad|>")).long().tolist()
    assert not torch.allclose(fed, model(ids, attention_mask=torch.ones_like(ids)).logits)  # without pixels: other logits

    (tmp_path / "dpo.yaml").write_text(yaml.safe_dump({
        **keys, "do_train": True, "finetuning_type": "lora", "lora_target": "all", "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 2, "max_steps": 2, "learning_rate": 1e-3, "logging_steps": 1, "report_to": "none",
        "eval_dataset": "picture_pairs", "do_eval": True}))
    fed_files, held_out = [], []
    real_feeding, real_inputs = ConcatenatedPairMedia.feeding, RowMedia.inputs

    def counted(self, model, batch):  # the real feeding, its batches' picture counts recorded
        fed_files.append(sum(len(paths) for paths in batch.get(IMAGE_FILES) or ()))
        return real_feeding(self, model, batch)

    def held_out_inputs(self, input_ids, rows, **kwargs):  # the real cut, the held-out pictures recorded
        held_out.append(sum(len(row["images"]) for row in rows))
        return real_inputs(self, input_ids, rows, **kwargs)

    monkeypatch.setattr(ConcatenatedPairMedia, "feeding", counted)
    monkeypatch.setattr(RowMedia, "inputs", held_out_inputs)
    train_in_this_process(monkeypatch)
    result = run_cli_here("train", str(tmp_path / "dpo.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "out" / "trainer_log.jsonl").read_text().splitlines()]
    assert [entry["current_steps"] for entry in logged if "loss" in entry] == [1, 2]
    assert fed_files[:2] and all(count > 0 for count in fed_files)  # every training pass got its pairs' pictures
    metrics = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert metrics["eval_pref_pairs"] == 3.0 and held_out == [3, 3, 3, 3]  # policy and adapter-off reference, both replies


def test_do_predict_answers_each_held_out_picture_row_with_its_pictures(pictures, tmp_path: Path, monkeypatch):
    """sft with `do_predict` on picture rows: every held-out row's answer is generated with its own pictures
    (the tokenized data's processor cutting them), and written with its prompt and label."""
    import yaml

    from conftest import run_cli_here, train_in_this_process
    from tuneline.core.data.media.batching import RowMedia

    model, data = pictures
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump({
        "model_name_or_path": str(model), "stage": "sft", "dataset": "pictures", "eval_dataset": "pictures",
        "dataset_dir": str(data), "template": "qwen2_vl", "cutoff_len": 256, "do_train": True, "do_predict": True,
        "predict_with_generate": True, "max_new_tokens": 3, "finetuning_type": "lora", "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 2, "per_device_eval_batch_size": 2, "max_steps": 1, "report_to": "none"}))
    answered = []
    real_inputs = RowMedia.inputs

    def recorded(self, input_ids, rows, **kwargs):  # the real cut, each batch's pictures recorded
        answered.append([len(row["images"]) for row in rows])
        inputs = real_inputs(self, input_ids, rows, **kwargs)
        assert int((inputs["image_grid_thw"].prod(dim=1) // 4).sum()) == int((input_ids == self.token_ids["images"]).sum())
        return inputs

    monkeypatch.setattr(RowMedia, "inputs", recorded)
    train_in_this_process(monkeypatch)
    result = run_cli_here("train", str(tmp_path / "sft.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    predictions = [json.loads(line) for line in (tmp_path / "out" / "generated_predictions.jsonl").read_text().splitlines()]
    assert [p["label"].strip() for p in predictions] == ["red", "blue", "green", "red and blue"]
    assert answered == [[1, 1], [1, 2]]  # two batches of two rows, the last row's two pictures


def test_the_pipelines_evaluation_reads_held_out_picture_rows_with_their_pictures(pictures, tmp_path: Path):
    """A pipeline's evaluate stage (`score_model`) on picture rows: the validation loss is computed with the
    rows' pixels (it differs from the loss of the same tokens without them) and the held-out answers are
    generated from the pictures, expanded as training expanded them."""
    from transformers import AutoTokenizer

    from tuneline.core.data.media.batching import RowMedia
    from tuneline.core.data.tokenization import TOKENIZER_DIR, read_rows
    from tuneline.core.evaluation.heldout import load_for_inference, score_model, validation_loss
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    model, data = pictures
    config = build_stage_config({"model_name_or_path": str(model), "dataset": "pictures", "eval_dataset": "pictures",
                                 "dataset_dir": str(data), "template": "qwen2_vl", "cutoff_len": 256})
    tokenize_stage_data(config, tokenizer_path=model, output_dir=tmp_path / "tokenized")
    rows = read_rows(["pictures"], config)
    score = score_model(model, adapter_path=None, config=config, tokenized_path=tmp_path / "tokenized", rows=rows,
                        max_new_tokens=2)
    assert score.metrics["eval_tokens"] > 0 and 0.0 <= score.metrics["answer_f1"] <= 1.0
    assert [p["label"] for p in score.predictions] == ["red", "blue", "green", "red and blue"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    media = RowMedia.of_tokenized(tmp_path / "tokenized", tokenizer)
    assert media is not None and RowMedia.of_tokenized(tmp_path / "elsewhere", tokenizer) is None
    loaded = load_for_inference(model)
    with_pixels = validation_loss(loaded, tmp_path / "tokenized", tokenizer=tokenizer, media=media)
    assert with_pixels == {key: value for key, value in score.metrics.items() if key.startswith("eval_")}
    assert with_pixels["eval_loss"] != validation_loss(loaded, tmp_path / "tokenized", tokenizer=tokenizer)["eval_loss"]
