"""Checks of local tokenizer and model folders before transformers opens them (core/models/folders.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tuneline.core.models.folders import model_folder_problem, tokenizer_folder_problem


def test_shared_tokenizers_and_the_tiny_base_pass(shared_dir: Path, tiny_base: Path) -> None:
    for folder in sorted((shared_dir / "tokenizers").iterdir()):
        if folder.is_dir():
            assert tokenizer_folder_problem(folder, key="k", trust_remote_code=False) is None, folder
    assert model_folder_problem(tiny_base, key="k", trust_remote_code=False) is None


def test_tokenizer_folder_problems(tmp_path: Path, shared_dir: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    assert "is an empty folder" in tokenizer_folder_problem(folder, key="k", trust_remote_code=False)
    (folder / "README.md").write_text("x")
    assert "has no tokenizer files" in tokenizer_folder_problem(folder, key="k", trust_remote_code=False)
    shutil.rmtree(folder)
    shutil.copytree(shared_dir / "tokenizers/gpt2", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "auto_map": {"AutoTokenizer": ["t.Slow", "t.Fast"]}}))
    (folder / "t.py").write_text("raise SystemExit('must not run')\n")
    problem = tokenizer_folder_problem(folder, key="model_name_or_path", trust_remote_code=False)
    assert problem.startswith(f"'model_name_or_path: {folder}' ships its own tokenizer code")
    assert "maps AutoTokenizer to t.py" in problem
    assert tokenizer_folder_problem(folder, key="k", trust_remote_code=True) is None
    (folder / "tokenizer.json").write_text('{"model": ')
    assert "tokenizer.json does not parse" in tokenizer_folder_problem(folder, key="k", trust_remote_code=True)


def test_model_folder_problems(tmp_path: Path, tiny_base: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_base, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "m.Model"}}))
    assert "ships its own model code" in model_folder_problem(folder, key="k", trust_remote_code=False)
    assert model_folder_problem(folder, key="k", trust_remote_code=True) is None
    (folder / "model.safetensors").unlink()
    assert "has a config.json but no weights" in model_folder_problem(folder, key="k", trust_remote_code=True)
    (folder / "config.json").unlink()
    assert "has no config.json" in model_folder_problem(folder, key="k", trust_remote_code=True)
