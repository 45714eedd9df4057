"""The trainer keys a config may set, read from transformers' source: the same table the imported
`Seq2SeqTrainingArguments` gives, without importing it (a config check in a new process with an empty
cache would otherwise import peft and accelerate first)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest

from tuneline.core.config.trainer_fields import (
    SourceNotReadable,
    fields_from_source,
    imported_fields,
    simple_kind,
    transformers_folder,
)


def test_the_source_gives_the_imported_dataclasses_table():
    from_source = fields_from_source(transformers_folder())
    assert from_source == imported_fields()
    assert from_source["learning_rate"] == "float" and from_source["per_device_train_batch_size"] == "int"
    assert from_source["lr_scheduler_type"] == "any" and from_source["predict_with_generate"] == "bool"
    assert "_n_gpu" not in from_source  # field(init=False)


@pytest.mark.parametrize(("hint", "kind"), [
    (int, "int"), (int | None, "int"), (str | bool, "any"), (list[str], "str"), (dict[str, bool] | None, "any"),
    (str | None | Literal[False], "any"), (Any, "any"),
])
def test_a_hint_is_classified_as_get_type_hints_has_it(hint, kind):
    assert simple_kind(hint) == kind


def test_source_in_a_form_not_known_is_refused_for_the_import(tmp_path: Path):
    folder = transformers_folder()
    for name in ("training_args.py", "training_args_seq2seq.py"):
        (tmp_path / name).write_text((folder / name).read_text(encoding="utf-8"), encoding="utf-8")
    source = (tmp_path / "training_args.py").read_text(encoding="utf-8")
    (tmp_path / "training_args.py").write_text(source.replace("    output_dir: str | None", "    output_dir: enum.Thing | None", 1))
    with pytest.raises(SourceNotReadable, match="names an attribute"):
        fields_from_source(tmp_path)
    (tmp_path / "training_args.py").write_text(source.replace("class TrainingArguments", "class RenamedArguments", 1))
    with pytest.raises(SourceNotReadable, match="defines TrainingArguments 0 times"):
        fields_from_source(tmp_path)


def test_checking_a_config_in_a_new_process_with_an_empty_cache_imports_no_trainer(tmp_path: Path):
    probe = ("import sys; from tuneline.core.config import read_stage_config; "
             "config, problems = read_stage_config({'stage': 'sft', 'learning_rat': 1.0e-4, 'seed': 3}); "
             "print(problems, config.training, 'transformers.training_args' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TUNELINE_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    assert "did you mean 'learning_rate'" in result.stdout and "{'seed': 3}" in result.stdout
    assert result.stdout.rstrip().endswith("False"), result.stdout
    assert not (tmp_path / "cache").exists()
