"""Training LLaVA-1.5 on image rows: a tiny LLaVA (core/models/vision_base_model.py: a CLIP vision tower,
its projector and a LLaMA language model, with llama2's tokenizer) tokenized with `template: llava`,
collated with pixels cut by CLIP's image processor, trained through `tuneline train` and answered through
`tuneline chat` as transformers' own generate() answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 180, 60)}
TOKENS_PER_IMAGE = 16  # 56 pixels in patches of 14: 4 x 4 patches, the class token dropped


@pytest.fixture(scope="module")
def llava(tmp_path_factory, shared_dir: Path) -> tuple[Path, Path]:
    from PIL import Image

    from tuneline.core.models.vision_base_model import VisionModelConfig, build_vision_language_model

    root = tmp_path_factory.mktemp("llava")
    build_vision_language_model(shared_dir / "tokenizers/llama2", root / "model", config=VisionModelConfig(family="llava"))
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


def test_a_llava_batchs_pixels_fill_its_image_tokens_and_train_the_tower(llava, tmp_path: Path):
    """Each image is 16 `<image>` tokens and one [3, 56, 56] crop, in order; with `freeze_vision_tower: false`
    the loss reaches the CLIP tower through those pixels, and the projector stays frozen (its default)."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.config import FinetuningConfig
    from tuneline.core.data.image_rows import ImageRows
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.models.loading import apply_finetuning, load_model
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.training.collators import build_collator

    model_dir, data = llava
    config = build_stage_config({"model_name_or_path": str(model_dir), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": "llava", "cutoff_len": 256})
    tokenize_stage_data(config, tokenizer_path=model_dir, output_dir=tmp_path / "tokenized")
    train = load_from_disk(str(tmp_path / "tokenized"))["train"]
    saved = ImageRows.read(tmp_path / "tokenized" / TOKENIZER_DIR)
    assert saved.processor_settings == {"patch_size": 14, "vision_feature_select_strategy": "default",
                                        "num_additional_image_tokens": 1}
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    model = apply_finetuning(load_model(model_dir, trainable=True),
                             FinetuningConfig(finetuning_type="full", freeze_vision_tower=False))
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    batch = build_collator(train, tokenizer=tokenizer, model=model, image_rows=saved)([train[i] for i in range(len(train))])
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    assert list(batch["pixel_values"].shape) == [5, 3, 56, 56]
    assert (batch["input_ids"] == image_token).sum(dim=1).tolist() == [TOKENS_PER_IMAGE * len(row) for row in train["images"]]
    model(**batch).loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(grads[name] is not None and grads[name].abs().sum() > 0
               for name in grads if name.startswith("model.vision_tower.vision_model.encoder."))
    assert all(grads[name] is None for name in grads if name.startswith("model.multi_modal_projector."))


def test_tuneline_trains_llava_with_lora_and_chat_answers_as_generate_does(llava, tmp_path: Path):
    import torch
    from conftest import run_cli_here
    from PIL import Image

    from tuneline.core.config import GeneratingConfig
    from tuneline.core.evaluation.predict import generation_kwargs
    from tuneline.core.inference.chat import ChatSession, chat_images, load_chat_model, resolve_source

    model_dir, data = llava
    (tmp_path / "train.yaml").write_text(yaml.safe_dump({
        "model_name_or_path": str(model_dir), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_target": "all", "dataset": "pictures", "dataset_dir": str(data), "template": "llava", "cutoff_len": 256,
        "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 2, "max_steps": 2, "learning_rate": 1e-3,
        "report_to": "none"}))
    result = run_cli_here("train", str(tmp_path / "train.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "out"
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2
    assert json.loads((out / "processor_config.json").read_text())["patch_size"] == 14  # the processor travels
    targets = json.loads((out / "adapter_config.json").read_text())["target_modules"]
    assert targets and not any("vision_tower" in name or "multi_modal_projector" in name for name in targets)

    picture = str(data / "pictures" / "blue.png")
    source = resolve_source(out)
    model, tokenizer = load_chat_model(source)
    session = ChatSession(model, tokenizer, GeneratingConfig(max_new_tokens=4, do_sample=False), name="t",
                          images=chat_images(source, [picture], template="llava"), image_paths=[picture])
    answer = session.reply("What colour is this?", write=lambda _: None)
    session.history.pop()  # the prompt the answer was generated from
    prompt, _ = session._prompt()
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    first = prompt.index(image_token)
    assert prompt[first:first + TOKENS_PER_IMAGE] == [image_token] * TOKENS_PER_IMAGE and prompt.count(image_token) == TOKENS_PER_IMAGE
    assert tokenizer.decode(prompt[first + TOKENS_PER_IMAGE:]).strip() == "What colour is this? ASSISTANT:"
    processor = session.images.image_processor
    ids = torch.tensor([prompt])
    output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                            pixel_values=processor([Image.open(picture).convert("RGB")], return_tensors="pt")["pixel_values"],
                            **generation_kwargs(GeneratingConfig(max_new_tokens=4, do_sample=False), tokenizer, model))
    assert tokenizer.decode(output[0, len(prompt):], skip_special_tokens=True).strip() == answer
