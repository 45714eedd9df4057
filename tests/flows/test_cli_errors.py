"""Bad configuration or input: exit status 2, one clear message, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import run_cli


def test_misspelled_key_exits_2_and_suggests_the_right_one(tmp_path: Path):
    config = tmp_path / "train.yaml"
    config.write_text("stage: sft\nlearning_rat: 1.0e-4\n")
    result = run_cli("train", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown key 'learning_rat'; did you mean 'learning_rate'?" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_dataset_file_exits_2_naming_the_file_and_the_entry(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "dataset_info.json").write_text(json.dumps({"my_set": {"file_name": "missing.json"}}))
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "model_name_or_path": str(tmp_path / "model"), "stage": "sft", "dataset": "my_set",
        "dataset_dir": str(data), "output_dir": str(tmp_path / "out"),
    }))
    result = run_cli("train", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert "missing.json" in result.stderr
    assert "my_set" in result.stderr and "dataset_info.json" in result.stderr
    assert "Traceback" not in result.stderr


def test_malformed_token_file_exits_2_naming_the_file_and_the_key(tmp_path: Path):
    (tmp_path / "tokens.yaml").write_text('"<|a|>": "one"\n"<|b|>: "unclosed\n')
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"stage": "sft", "new_special_tokens_config": "tokens.yaml", "add_tokens": "<think>"}))
    result = run_cli("train", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert "'new_special_tokens_config: tokens.yaml' is not valid YAML" in result.stderr
    assert '"tokens.yaml", line 2' in result.stderr
    assert "Traceback" not in result.stderr


def test_pipeline_with_a_cycle_exits_2_naming_the_stages(tmp_path: Path):
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(yaml.safe_dump({"name": "p", "stages": [
        {"name": "a", "stage": "sft", "from": "b"}, {"name": "b", "stage": "sft", "from": "a"}]}))
    result = run_cli("run", str(pipeline), cwd=tmp_path)
    assert result.returncode == 2
    assert "a -> b -> a" in result.stderr
    assert "Traceback" not in result.stderr


def test_preprocess_of_bad_data_exits_2_and_leaves_no_partial_output(tmp_path: Path, shared_dir: Path):
    shared = shared_dir
    data = tmp_path / "data"
    data.mkdir()
    (data / "d.jsonl").write_text('{"instruction": "Hi", "input": "", "output": "Hello"}\n{"instruction": "Hi", "output": \n')
    (data / "dataset_info.json").write_text(json.dumps({"d": {"file_name": "d.jsonl"}}))
    config = tmp_path / "stage.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(shared / "tokenizers/gpt2"), "stage": "sft", "dataset": "d",
                                      "dataset_dir": str(data), "template": "default"}))
    result = run_cli("data", "preprocess", str(config), "--output", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 2
    assert "d.jsonl" in result.stderr and "line 2" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.partial").exists()


def test_overrides_may_follow_options():
    from tuneline.flows.cli import build_parser, parse_arguments

    parser = build_parser()
    for argv in (["run", "p.yaml", "--workspace", "w", "a=1", "sft.b=2"], ["run", "p.yaml", "a=1", "--workspace", "w", "sft.b=2"]):
        args = parse_arguments(parser, argv)
        assert (args.pipeline, args.workspace, args.overrides) == ("p.yaml", "w", ["a=1", "sft.b=2"])
    with pytest.raises(SystemExit) as error:
        parse_arguments(parser, ["run", "p.yaml", "--workspace", "w", "--bogus"])
    assert error.value.code == 2


def test_train_with_a_missing_deepspeed_file_exits_2_before_any_work(tmp_path: Path):
    """The launch settings are checked once, before tokenizing: nothing is cached or written."""
    from conftest import run_cli_here

    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "model_name_or_path": str(tmp_path / "model"), "stage": "sft", "dataset": "demo_alpaca",
        "dataset_dir": str(Path(__file__).resolve().parents[2] / "data"), "output_dir": str(tmp_path / "out"),
        "deepspeed": "ds_missing.json",
    }))
    result = run_cli_here("train", str(config), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: Invalid configuration in {config}")
    assert "'deepspeed: ds_missing.json' names no file" in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache" / "artifacts").exists()
