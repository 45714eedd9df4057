"""data/multimodal_pipeline.yaml end to end: a tiny Qwen2-VL built from the picture demo's words, fine-tuned
and aligned on generated pictures, exported with its image processor and registered. The exported model
names the colour in held-out pictures it never saw far better than the untrained one, and loads with
transformers' own classes (AutoModelForImageTextToText, AutoImageProcessor, AutoTokenizer: AutoProcessor
also builds a video processor, which needs torchvision, whose wheel for torch 2.13 does not import on a
CPU build) to give the answers tuneline's chat gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PICTURES = REPO / "data/picture_demo"


def plain_transformers_answers(folder: Path, rows: list[dict]) -> list[str]:
    """Greedy answers through transformers alone: its processor cuts the pixels, the prompt's image
    tokens are counted from its grid, the tokenizer's chat template renders the question."""
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    processor, tokenizer = AutoImageProcessor.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    image_token = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    answers = []
    for row in rows:
        features = processor([Image.open(PICTURES / row["images"][0]).convert("RGB")], return_tensors="pt")
        tokens = int(features["image_grid_thw"].prod()) // processor.merge_size ** 2
        question = row["messages"][0]["content"].replace("<image>", "<|vision_start|>" + "<|image_pad|>" * tokens + "<|vision_end|>")
        ids = torch.tensor([tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                                          tokenize=True, return_dict=False)])
        output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=(ids == image_token).long(),
                                max_new_tokens=4, do_sample=False, **features)
        answers.append(tokenizer.decode(output[0, ids.shape[1]:], skip_special_tokens=True).strip())
    return answers


def chat_answers(folder: Path, rows: list[dict]) -> list[str]:
    from tuneline.core.config import GeneratingConfig
    from tuneline.core.inference.chat import ChatSession, chat_media, load_chat_model, resolve_source

    source = resolve_source(folder)
    model, tokenizer = load_chat_model(source)
    answers = []
    for row in rows:
        picture = str(PICTURES / row["images"][0])
        session = ChatSession(model, tokenizer, GeneratingConfig(max_new_tokens=4, do_sample=False), name="t",
                              media=chat_media(source, images=[picture], template=None), shown={"images": [picture]})
        answers.append(session.reply(row["messages"][0]["content"].replace("<image>", ""), write=lambda _: None))
    return answers


def right_share(answers: list[str], rows: list[dict]) -> float:
    return sum(answer.split()[:1] == [row["messages"][1]["content"]] for answer, row in zip(answers, rows)) / len(rows)


@pytest.mark.slow
def test_the_picture_pipeline_teaches_colours_and_exports_a_loadable_model(tmp_path: Path, prefect_server):
    pipeline = yaml.safe_load((REPO / "data/multimodal_pipeline.yaml").read_text())
    pipeline["defaults"]["dataset_dir"] = str(PICTURES)
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    result = subprocess.run([sys.executable, "-m", "tuneline.flows.cli", "run", str(tmp_path / "pipeline.yaml"),
                             "--workspace", str(tmp_path / "workspace")], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "registered model: tuneline-pictures version 1 alias @champion" in result.stdout
    artifacts = tmp_path / "workspace" / "artifacts"
    base, = (artifacts / "base").glob("base-*")
    export, = (artifacts / "export").glob("export-*")
    assert (export / "preprocessor_config.json").is_file()

    rows = json.loads((PICTURES / "picture_heldout.json").read_text())
    before = right_share(plain_transformers_answers(base, rows), rows)
    exported = plain_transformers_answers(export, rows)
    after = right_share(exported, rows)
    print(f"held-out pictures named right: before fine-tuning {before:.2f}, after {after:.2f} (chance 0.25)")
    # measured: 0.73 (seed 42, two threads), 0.48 and 1.00 (seeds 1 and 7, one thread); chance 0.25, untrained 0.00
    assert after >= 0.4 and after - before >= 0.35
    assert chat_answers(export, rows[:8]) == exported[:8]  # tuneline's chat shows the model what transformers does
