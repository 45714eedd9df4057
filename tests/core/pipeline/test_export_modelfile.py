"""The export's Ollama Modelfile step (`write_modelfile`, run by `tuneline export` and the pipeline's export
stage): the file over the exported tokenizer with the stage's template keys, or one warning line and the reason
when Ollama cannot express the template, and then no file."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tuneline.core.pipeline.stage_runs import write_modelfile
from tuneline.core.stages.registry import build_stage_config


@pytest.fixture
def exported_tokenizer(tmp_path: Path) -> Path:
    """A folder holding what an export's tokenizer files are (the rest of the export is not read)."""
    from tuneline.core.models.tiny.text import train_tokenizer

    train_tokenizer(["a small corpus for a small vocabulary"], vocab_size=300).save_pretrained(tmp_path)
    return tmp_path


def test_the_modelfile_takes_the_stages_template_keys(exported_tokenizer: Path):
    config = build_stage_config({"stage": "sft", "template": "qwen", "default_system": "Answer briefly."})
    assert write_modelfile(exported_tokenizer, template="qwen", config=config) is None
    modelfile = (exported_tokenizer / "Modelfile").read_text(encoding="utf-8")
    assert '\n\nSYSTEM """Answer briefly."""\n\n' in modelfile and "<|im_start|>assistant\n" in modelfile
    assert 'PARAMETER stop "<|im_end|>"' in modelfile


def test_a_template_ollama_cannot_express_gets_one_line_and_no_file(exported_tokenizer: Path, caplog):
    config = build_stage_config({"stage": "sft", "template": "qwen3"})
    with caplog.at_level(logging.WARNING):
        obstacle = write_modelfile(exported_tokenizer, template="qwen3", config=config)
    assert obstacle is not None and obstacle.startswith("template 'qwen3' drops the thought")
    assert not (exported_tokenizer / "Modelfile").exists()
    lines = [record.getMessage() for record in caplog.records if "Modelfile" in record.getMessage()]
    assert lines == [f"No Ollama Modelfile in the export: {obstacle}."] and "\n" not in lines[0]
    # keeping the thoughts (LLaMA-Factory's preserve_thinking) makes the same template expressible
    kept = build_stage_config({"stage": "sft", "template": "qwen3", "preserve_thinking": True})
    assert write_modelfile(exported_tokenizer, template="qwen3", config=kept) is None
    assert (exported_tokenizer / "Modelfile").is_file()
