"""`tuneline export` with LLaMA-Factory's export keys: `export_hub_model_id` pushes the finished
export to the Hugging Face Hub, and fails as a clear error (exit 2) that leaves the export complete
when the hub cannot be reached; `export_quantization_bit` (GPTQ) is refused before any work on a
machine without its packages or a CUDA GPU, and its calibration rows are drawn as LLaMA-Factory draws them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

TOKEN = "hf_pushTok3n"


def run_export(tmp_path: Path, **keys) -> subprocess.CompletedProcess:
    """`tuneline export export.yaml` offline, in this process (no interpreter start and imports to pay for)."""
    from conftest import run_cli_here

    assert os.environ["HF_HUB_OFFLINE"] == "1"  # conftest's default, read by huggingface_hub as it is imported
    (tmp_path / "export.yaml").write_text(yaml.safe_dump({"template": "chatml", **keys}))
    return run_cli_here("export", "export.yaml", cwd=tmp_path)


@pytest.mark.slow
def test_an_offline_push_is_a_clear_error_after_a_complete_export(tiny_base: Path, tmp_path: Path):
    result = run_export(tmp_path, model_name_or_path=str(tiny_base), export_dir="exported",
                        export_hub_model_id="someone/tiny-export", hf_hub_token=TOKEN)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr and TOKEN not in result.stdout + result.stderr
    message = " ".join(result.stderr.split())
    assert "'export_hub_model_id: someone/tiny-export'" in message and "offline here (HF_HUB_OFFLINE=1)" in message
    assert f"the export is complete in {tmp_path / 'exported'}" in message and "hf upload someone/tiny-export" in message

    from tuneline.core.models.loading import load_model, load_tokenizer

    exported = tmp_path / "exported"
    written = set(json.loads((exported / "tuneline_files.json").read_text())["entries"])
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= written
    assert load_model(exported).num_parameters() == load_model(tiny_base).num_parameters()
    assert len(load_tokenizer(exported)) == len(load_tokenizer(tiny_base))


def test_gptq_export_is_refused_before_any_work_without_its_packages(tiny_base: Path, tmp_path: Path):
    import importlib.util

    if all(importlib.util.find_spec(name) for name in ("optimum", "gptqmodel")):
        pytest.skip("optimum and gptqmodel are installed here: the refusal is of a machine without them")
    (tmp_path / "calibration.jsonl").write_text(json.dumps({"text": "words " * 50}) + "\n")
    result = run_export(tmp_path, model_name_or_path=str(tiny_base), export_dir="exported", export_quantization_bit=4,
                        export_quantization_dataset="calibration.jsonl")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    message = " ".join(result.stderr.split())
    assert "'export_quantization_bit: 4' (GPTQ quantization of the export) needs the packages" in message
    assert 'pip install -e ".[gptq]"' in message
    assert not (tmp_path / "exported").exists()


def test_calibration_samples_are_windows_of_rows_longer_than_maxlen(tiny_base: Path, tmp_path: Path):
    from transformers import AutoTokenizer

    from tuneline.core.config import ExportConfig, ModelConfig
    from tuneline.core.errors import ConfigError
    from tuneline.core.models.gptq import calibration_samples

    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    texts = ["a short row", "The capital of France is Paris. " * 8, "Two plus two is four, and " * 10]
    (tmp_path / "calibration.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    export = ExportConfig(export_quantization_bit=4, export_quantization_dataset=str(tmp_path / "calibration.jsonl"),
                          export_quantization_nsamples=5, export_quantization_maxlen=16)
    samples = calibration_samples(tokenizer, export, ModelConfig())
    assert samples == calibration_samples(tokenizer, export, ModelConfig())  # drawn with a fixed seed
    rows = [tokenizer(text)["input_ids"] for text in texts[1:]]
    assert len(samples) == 5
    for sample in samples:
        window = sample["input_ids"][0]
        assert len(window) == 16 and sample["attention_mask"] == [[1] * 16]
        assert any(window == row[i:i + 16] for row in rows for i in range(len(row) - 16))
    with pytest.raises(ConfigError, match="'export_quantization_maxlen: 4096'"):
        calibration_samples(tokenizer, ExportConfig(export_quantization_bit=4,
                                                    export_quantization_dataset=export.export_quantization_dataset,
                                                    export_quantization_maxlen=4096), ModelConfig())


@pytest.mark.gpu
def test_gptq_export_writes_a_quantized_model(tiny_base: Path, tmp_path: Path):
    pytest.importorskip("gptqmodel")
    (tmp_path / "calibration.jsonl").write_text("".join(json.dumps({"text": "The capital of France is Paris. " * 20}) + "\n"
                                                        for _ in range(4)))
    result = run_export(tmp_path, model_name_or_path=str(tiny_base), export_dir="exported", export_quantization_bit=4,
                        export_quantization_dataset="calibration.jsonl", export_quantization_nsamples=4,
                        export_quantization_maxlen=64)
    assert result.returncode == 0, result.stderr[-3000:]
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert config["quantization_config"]["bits"] == 4 and config["quantization_config"]["quant_method"] == "gptq"
