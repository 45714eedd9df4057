"""`tuneline train`, `data preprocess` and `export` on a LLaMA-Factory-style stage YAML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import assert_output_layout, run_cli, run_cli_here

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sft_yaml(tiny_base: Path, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("single")
    config = {
        "model_name_or_path": str(tiny_base), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_rank": 4, "lora_target": "all", "dataset": "demo_alpaca,demo_sharegpt", "dataset_dir": str(REPO_ROOT / "data"),
        "template": "chatml", "cutoff_len": 96, "max_samples": 48, "overwrite_cache": True, "output_dir": "saves/sft",
        "logging_steps": 2, "per_device_train_batch_size": 8, "learning_rate": 5.0e-3, "num_train_epochs": 1.0,
        "lr_scheduler_type": "cosine", "warmup_ratio": 0.1, "report_to": "none", "export_dir": "exported",
    }
    path = folder / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def trained(sft_yaml: Path) -> Path:
    result = run_cli("train", str(sft_yaml), cwd=sft_yaml.parent)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return sft_yaml.parent / "saves/sft"


@pytest.mark.slow
def test_train_writes_llamafactory_output_layout(trained: Path):
    from safetensors.torch import load_file

    for name in ("adapter_model.safetensors", "adapter_config.json", "trainer_state.json", "all_results.json",
                 "trainer_log.jsonl", "tokenizer_config.json", "training_loss.png"):
        assert (trained / name).is_file(), name
    assert_output_layout(trained, "sft")
    log = [json.loads(line) for line in (trained / "trainer_log.jsonl").read_text().splitlines()]
    assert [r["current_steps"] for r in log] == [2, 4, 6, 8, 10, 12]
    assert all(r["total_steps"] == 12 and r["loss"] > 0 for r in log)
    weights = load_file(trained / "adapter_model.safetensors")
    lora_b = [t for name, t in weights.items() if "lora_B" in name]
    assert lora_b and all(t.abs().sum() > 0 for t in lora_b)  # B starts at zero: it moved
    assert json.loads((trained / "all_results.json").read_text())["epoch"] == 1.0


def test_train_refuses_an_output_dir_holding_other_files(sft_yaml: Path, tmp_path: Path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    result = run_cli_here("train", str(sft_yaml), f"output_dir={tmp_path / 'busy'}", cwd=sft_yaml.parent)
    assert result.returncode == 2
    assert "notes.txt" in result.stderr and "overwrite_output_dir" in result.stderr


def test_preprocess_writes_llamafactory_columns_with_masked_prompts(sft_yaml: Path, tiny_base: Path):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    out = sft_yaml.parent / "tokenized"
    result = run_cli_here("data", "preprocess", str(sft_yaml), "--output", str(out), cwd=sft_yaml.parent)
    assert result.returncode == 0, result.stderr[-2000:]
    train = load_from_disk(str(out))["train"]
    assert set(train.column_names) == {"input_ids", "attention_mask", "labels"}
    assert len(train) == 96  # max_samples 48 from each of two datasets
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")
    first = train[0]
    trained_ids = [i for i, label in zip(first["input_ids"], first["labels"]) if label != -100]
    assert first["labels"][0] == -100
    assert tokenizer.decode(trained_ids).endswith("<|im_end|>\n") or tokenizer.decode(trained_ids).endswith("<|im_end|>")
    assert "<|im_start|>user" in tokenizer.decode(first["input_ids"])


@pytest.mark.slow
def test_export_merges_the_adapter_into_a_loadable_folder(trained: Path, sft_yaml: Path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = run_cli_here("export", str(sft_yaml), f"adapter_name_or_path={trained}", cwd=sft_yaml.parent)
    assert result.returncode == 0, result.stderr[-2000:]
    exported = sft_yaml.parent / "exported"
    assert (exported / "model.safetensors").is_file()
    tokenizer = AutoTokenizer.from_pretrained(exported)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True,
                                        return_dict=False)
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    # LLaMA-Factory's Ollama Modelfile beside the model: chatml's, as LLaMA-Factory 0.9.5 writes it (its golden was
    # written over Qwen2.5's tokenizer, whose ids order the two stop lines; the text before them names no token)
    modelfile = (exported / "Modelfile").read_text(encoding="utf-8")
    golden = (REPO_ROOT / "tests/data/golden_modelfiles/qwen2.5__chatml.Modelfile").read_text(encoding="utf-8")
    assert modelfile.split("PARAMETER stop")[0] == golden.split("PARAMETER stop")[0]
    assert sorted(modelfile.splitlines()[-3:]) == sorted(golden.splitlines()[-3:])
    assert "Modelfile" in json.loads((exported / "tuneline_files.json").read_text())["entries"]
    base = AutoModelForCausalLM.from_pretrained(yaml.safe_load(sft_yaml.read_text())["model_name_or_path"])
    with torch.no_grad():
        merged_logits = AutoModelForCausalLM.from_pretrained(exported)(torch.tensor([ids])).logits
        adapter_logits = PeftModel.from_pretrained(base, str(trained))(torch.tensor([ids])).logits
    torch.testing.assert_close(merged_logits, adapter_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_export_of_a_broken_chat_template_fails_at_the_first_differing_token(trained: Path, sft_yaml: Path, tmp_path: Path):
    """The adapter's tokenizer is saved with a chat template that writes 'assistant ' where training's
    chatml writes 'assistant\\n': the parity gate stops the export, naming the token, and writes nothing."""
    import shutil

    broken = tmp_path / "broken_adapter"
    shutil.copytree(trained, broken, ignore=shutil.ignore_patterns("checkpoint-*"))
    jinja = broken / "chat_template.jinja"
    text = jinja.read_text(encoding="utf-8")
    assert "<|im_start|>assistant\\n" in text
    jinja.write_text(text.replace("<|im_start|>assistant\\n", "<|im_start|>assistant "), encoding="utf-8")
    export_dir = tmp_path / "exported"
    result = run_cli_here("export", str(sft_yaml), f"adapter_name_or_path={broken}", f"export_dir={export_dir}",
                          cwd=sft_yaml.parent)
    print(f"tuneline export with a broken chat template -> exit {result.returncode}:\n{result.stderr.strip()}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "failed the train/serve parity check, so it was not written" in result.stderr
    assert "writes other text than training for the prompt with the generation prefix of dataset 'demo_alpaca' in " \
        in result.stderr
    assert "dataset_info.json: row 1 of " in result.stderr
    assert "first differ at token" in result.stderr and "(ids [" in result.stderr
    assert not export_dir.exists() and not list(tmp_path.glob(".exported*"))


def test_data_preview_shows_the_template_warning(shared_dir: Path, tmp_path: Path, monkeypatch, capsys):
    """chatml on Qwen2.5 renders differently from Qwen's own template (no default system prompt):
    LLaMA-Factory trains it, so the preview shows the warning with the first differing tokens, and
    `tuneline train` served from the tokenized-data cache prints it again."""
    from tuneline.core.stages.registry import load_stage_config
    from tuneline.flows.single import preview, tokenized_dataset

    monkeypatch.setenv("TUNELINE_CACHE", str(tmp_path / "cache"))
    config = {"model_name_or_path": str(shared_dir / "tokenizers/qwen2.5"), "stage": "sft", "dataset": "demo_alpaca",
              "dataset_dir": str(REPO_ROOT / "data"), "template": "chatml", "cutoff_len": 64, "max_samples": 4}
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    shown = preview(str(path), [], count=1)
    assert "template warning: template 'chatml' does not write what this tokenizer's own chat template writes" in shown
    assert "first differ at position 1" in shown
    capsys.readouterr()
    tokenized_dataset(load_stage_config(str(path), []))
    assert "tokenize: template 'chatml' does not write what" in capsys.readouterr().out
    assert "template warning" not in preview(str(path), ["template=qwen"], count=1)
