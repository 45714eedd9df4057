"""Training the vision-language families beyond Qwen2-VL on image rows: a tiny LLaVA-1.5 (a CLIP vision tower,
its projector and a LLaMA language model, with llama2's tokenizer), a tiny LLaVA-NeXT (the same in tiles of 56
pixels on LLaVA-v1.6's five grids), a tiny Qwen3-VL (its deepstack tower in patches of 16 and Qwen3's decoder),
a tiny GLM-4.1V, a tiny InternVL (an InternViT tower, pixel shuffle, Qwen2's decoder), a tiny Gemma 3 (a SigLIP
tower, its pooling projector and Gemma 3's decoder) and a tiny PaliGemma (a SigLIP tower, a linear projector and
Gemma's decoder, its image tokens before the text) and a tiny Llama 3.2 Vision (its tiled vision encoder read by
a cross-attention layer of the decoder) and a tiny Qwen2.5-Omni thinker (Qwen2.5-VL's tower, an audio encoder
and Qwen2's decoder, which finds its media tokens by id) and a tiny MiniCPM-V 4.6 (a NaViT tower with its window
merger, the merger into Qwen3.5's hybrid linear/full-attention decoder), all from core/models/tiny/vision.py,
all with llama2's tokenizer (a vocabulary a fifth of Qwen's, for speed) and their family's media and control
tokens added. Each is tokenized with its family's template, collated with pixels cut by its own image processor,
trained through `tuneline train` and answered through `tuneline chat` as transformers' own generate()
answers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # each trains tiny multimodal models

COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 180, 60)}


@dataclass(frozen=True)
class Family:
    name: str
    tokenizer: str
    template: str
    image_token: str
    tower: str  # a prefix of the vision tower's trained parameters
    projector: str
    model_class: str


FAMILIES = {
    "llava": Family("llava", "llama2", "llava", "<image>", "model.vision_tower.encoder.",
                    "model.multi_modal_projector.", "LlavaForConditionalGeneration"),
    "qwen3_vl": Family("qwen3_vl", "llama2", "qwen3_vl", "<|image_pad|>", "model.visual.blocks.", "model.visual.merger.",
                       "Qwen3VLForConditionalGeneration"),
    "glm4v": Family("glm4v", "llama2", "glm4v", "<|image|>", "model.visual.blocks.", "model.visual.merger.",
                    "Glm4vForConditionalGeneration"),
    "llava_next": Family("llava_next", "llama2", "llava_next", "<image>", "model.vision_tower.encoder.",
                         "model.multi_modal_projector.", "LlavaNextForConditionalGeneration"),
    "internvl": Family("internvl", "llama2", "intern_vl", "<IMG_CONTEXT>", "model.vision_tower.encoder.",
                       "model.multi_modal_projector.", "InternVLForConditionalGeneration"),
    "gemma3": Family("gemma3", "llama2", "gemma3", "<image_soft_token>", "model.vision_tower.encoder.",
                     "model.multi_modal_projector.", "Gemma3ForConditionalGeneration"),
    "mllama": Family("mllama", "llama2", "mllama", "<|image|>", "model.vision_model.transformer.", "model.multi_modal_projector.",
                     "MllamaForConditionalGeneration"),
    "qwen2_5_omni_thinker": Family("qwen2_5_omni_thinker", "llama2", "qwen2_omni", "<|IMAGE|>", "model.visual.blocks.",
                                   "model.visual.merger.", "Qwen2_5OmniThinkerForConditionalGeneration"),
    "paligemma": Family("paligemma", "llama2", "paligemma", "<image>", "model.vision_tower.encoder.",
                        "model.multi_modal_projector.", "PaliGemmaForConditionalGeneration"),
    "minicpmv4_6": Family("minicpmv4_6", "llama2", "minicpm_v_4_6", "<|image_pad|>", "model.vision_tower.encoder.",
                          "model.merger.", "MiniCPMV4_6ForConditionalGeneration"),
}


def image_tokens(family: Family, features: dict, model_dir: Path) -> list[int]:
    """Each image's tokens by the family's own arithmetic: LLaVA's 56-pixel crop is 4 x 4 patches of 14 (the
    class token dropped); LLaVA-NeXT's by image size; Gemma 3's 16 soft tokens; InternVL's 4 a tile; MiniCPM-V's
    by its target sizes; Qwen3-VL's grid of 16-pixel patches and GLM-4V's of 14-pixel ones, merged 2 x 2."""
    if family.name == "mllama":  # one token an image (aspect ratio id 0 pads the image slots of an example)
        return [1] * int((features["aspect_ratio_ids"] > 0).sum())
    if family.name in ("llava", "gemma3", "paligemma"):  # PaliGemma: a SigLIP patch each, 4 x 4
        return [16] * len(features["pixel_values"])
    if family.name == "internvl":  # one 56-pixel tile each: 4 x 4 patches, pixel-shuffled 2 x 2
        return [4] * len(features["pixel_values"])
    if family.name == "minicpmv4_6":  # pictures this small are not sliced: each is one part, a token per 4 x 4 patches
        return (features["target_sizes"].prod(dim=1) // 16).tolist()
    if family.name == "llava_next":  # LlavaNextProcessor's count for each image's size, in 56-pixel tiles, less the class token
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(model_dir)
        return [processor._get_number_of_features(height, width, 56, 56) - 1 for height, width in features["image_sizes"].tolist()]
    return (features["image_grid_thw"].prod(dim=1) // 4).tolist()


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory, shared_dir: Path) -> tuple[Family, Path, Path]:
    from PIL import Image

    from tuneline.core.models.tiny.vision import VisionModelConfig, build_vision_language_model

    family = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(family.name)
    build_vision_language_model(shared_dir / "tokenizers" / family.tokenizer, root / "model",
                                config=VisionModelConfig(family=family.name))
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
    return family, root / "model", data


def test_a_batchs_pixels_fill_its_image_tokens_and_train_the_tower(family, tmp_path: Path):
    """The image tokens of each example are its images' tokens, in order; with `freeze_vision_tower: false`
    the loss reaches the tower through the pixels, and the projector stays frozen (its default)."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.config import FinetuningConfig
    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.models.loading import apply_finetuning, load_model
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.training.collators import build_collator

    family, model_dir, data = family
    config = build_stage_config({"model_name_or_path": str(model_dir), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": family.template, "cutoff_len": 256})
    tokenize_stage_data(config, tokenizer_path=model_dir, output_dir=tmp_path / "tokenized")
    train = load_from_disk(str(tmp_path / "tokenized"))["train"]
    saved = MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR)
    if family.name in ("llava", "llava_next"):  # LlavaProcessor's numbers travel with the data
        assert saved.processor_settings == {"patch_size": 14, "vision_feature_select_strategy": "default",
                                            "num_additional_image_tokens": 1}
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    model = apply_finetuning(load_model(model_dir, trainable=True),
                             FinetuningConfig(finetuning_type="full", freeze_vision_tower=False))
    assert type(model).__name__ == family.model_class
    batch = build_collator(train, tokenizer=tokenizer, model=model, media_rows=saved)([train[i] for i in range(len(train))])
    counts = image_tokens(family, batch, model_dir)
    images_of = [len(row) for row in train["images"]]
    assert len(counts) == sum(images_of) == 5
    starts = [sum(images_of[:i]) for i in range(len(images_of))]
    per_example = (batch["input_ids"] == tokenizer.convert_tokens_to_ids(family.image_token)).sum(dim=1).tolist()
    assert per_example == [sum(counts[start:start + n]) for start, n in zip(starts, images_of)]
    model(**batch).loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    tower = [name for name in grads if name.startswith(family.tower)]
    untrained = [name for name in tower if grads[name] is None or grads[name].abs().sum() == 0]
    assert tower and not untrained, untrained
    assert all(grads[name] is None for name in grads if name.startswith(family.projector))


def test_tuneline_trains_with_lora_and_chat_answers_as_generate_does(family, tmp_path: Path, monkeypatch):
    import torch

    from conftest import run_cli_here, train_in_this_process
    from tuneline.core.config import GeneratingConfig
    from tuneline.core.evaluation.predict import generation_kwargs
    from tuneline.core.inference.chat import ChatSession, chat_media, load_chat_model, resolve_source

    family, model_dir, data = family
    (tmp_path / "train.yaml").write_text(yaml.safe_dump({
        "model_name_or_path": str(model_dir), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_target": "all", "dataset": "pictures", "dataset_dir": str(data), "template": family.template, "cutoff_len": 256,
        "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 2, "max_steps": 2, "learning_rate": 1e-3,
        "report_to": "none"}))
    train_in_this_process(monkeypatch)  # the worker's run, without its start
    result = run_cli_here("train", str(tmp_path / "train.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "out"
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2
    if family.name in ("llava", "llava_next"):  # the processor travels beside the adapter
        assert json.loads((out / "processor_config.json").read_text())["patch_size"] == 14
    if family.name == "gemma3":
        assert json.loads((out / "processor_config.json").read_text())["image_seq_length"] == 16
    assert (out / "preprocessor_config.json").is_file()
    targets = json.loads((out / "adapter_config.json").read_text())["target_modules"]
    tower, projector = family.tower.split(".")[1], family.projector.split(".")[-2]
    assert targets and not any(tower in name or projector in name for name in targets)  # lora_target all: the language model

    picture = str(data / "pictures" / "blue.png")
    source = resolve_source(out)
    model, tokenizer = load_chat_model(source)
    session = ChatSession(model, tokenizer, GeneratingConfig(max_new_tokens=4, do_sample=False), name="t",
                          media=chat_media(source, images=[picture], template=family.template), shown={"images": [picture]})
    answer = session.reply("What colour is this?", write=lambda _: None)
    session.history.pop()  # the prompt the answer was generated from
    prompt, shown = session._prompt()
    paths = shown["images"]
    if family.name == "mllama":  # tiles per example, and the cross-attention mask over the prompt
        features = session.media.model_inputs(torch.tensor([prompt]), paths, token_ids=session.media.token_ids(tokenizer))
    else:
        features = session.media.features(paths)
    image_token = tokenizer.convert_tokens_to_ids(family.image_token)
    count, = image_tokens(family, features, model_dir)
    first = prompt.index(image_token)
    assert prompt[first:first + count] == [image_token] * count and prompt.count(image_token) == count
    assert "What colour is this?" in tokenizer.decode(prompt[first + count:])
    ids = torch.tensor([prompt])
    types = {"qwen3_vl": "mm_token_type_ids", "glm4v": "mm_token_type_ids", "gemma3": "token_type_ids"}
    extra = {types[family.name]: (ids == image_token).long()} if family.name in types else {}
    if family.name == "paligemma":  # 0 on the image prefix, 1 on the text after it
        extra = {"token_type_ids": (ids != image_token).long()}
    output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **features, **extra,
                            **generation_kwargs(GeneratingConfig(max_new_tokens=4, do_sample=False), tokenizer, model))
    assert tokenizer.decode(output[0, len(prompt):], skip_special_tokens=True).strip() == answer


def test_the_reward_model_keeps_the_backbone_and_scores_with_the_pixels(family, tmp_path: Path):
    """Stage rm's model of each family (transformers' own sequence-classification class, or its generic one on
    the family's base model): every weight but the new head is the folder's, and the score of an example
    follows its pixels."""
    import torch
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.data.tokenization import TOKENIZER_DIR
    from tuneline.core.models.loading import load_model
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.training.collators import build_collator

    family, model_dir, data = family
    reward = load_model(model_dir, head="score")
    writer = dict(load_model(model_dir).named_parameters())
    kept = {name: torch.equal(parameter, writer[name]) for name, parameter in reward.named_parameters() if name in writer}
    assert [name for name, _ in reward.named_parameters() if name not in writer] == ["score.weight"] and all(kept.values())
    config = build_stage_config({"model_name_or_path": str(model_dir), "dataset": "pictures", "dataset_dir": str(data),
                                 "template": family.template, "cutoff_len": 256})
    tokenize_stage_data(config, tokenizer_path=model_dir, output_dir=tmp_path / "tokenized")
    train = load_from_disk(str(tmp_path / "tokenized"))["train"].select(range(3))  # one picture each
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenized" / TOKENIZER_DIR)
    reward.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    collate = build_collator(train, tokenizer=tokenizer, model=reward, media_rows=MediaRows.read(tmp_path / "tokenized" / TOKENIZER_DIR))

    def scores(rows) -> torch.Tensor:
        batch = {key: value for key, value in collate([rows[i] for i in range(len(rows))]).items() if key != "labels"}
        with torch.no_grad():
            return reward(**batch).logits[:, 0]

    from PIL import Image

    whitened = []
    for files in train["images"]:
        with Image.open(files[0]) as image:
            Image.new("RGB", image.size, (250, 250, 250)).save(tmp_path / Path(files[0]).name)
        whitened.append([str(tmp_path / Path(files[0]).name)])
    original = scores(train)
    assert original.shape == (3,) and not torch.allclose(original, scores(train.remove_columns("images").add_column("images", whitened)))
