"""`tuneline train` writes LLaMA-Factory 0.9.5's output layout, file for file.

tests/data/output_layout.json holds what LLaMA-Factory's `llamafactory-cli train` leaves in output_dir for
each stage it runs (file names, checkpoint included, and trainer_log.jsonl keys; written by
tests/data/make_output_layout.py with LLaMA-Factory's Python), and, under `tuneline`, what tuneline writes
besides and what it does not write, each with its reason, and the layout of the kinds LLaMA-Factory does not run there. The runs other
tests make are compared with it by `assert_output_layout` (conftest): sft in test_single_stage, rm, dpo and
kto in test_llamafactory_examples, ppo in test_ppo, grpo and rloo in test_grpo, every kind of a pipeline in
test_chain. Here LLaMA-Factory's recorded pt run itself goes through `tuneline train`: its arguments on the
same tiny model, with a validation split, a checkpoint and the loss plots.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from conftest import STEP_KEYS, assert_output_layout

REPO = Path(__file__).resolve().parents[2]
LAYOUT = json.loads((REPO / "tests/data/output_layout.json").read_text(encoding="utf-8"))
LLAMAFACTORY_STAGES = {"pt", "sft", "rm", "ppo", "dpo", "kto"}


def recording_script():
    """tests/data/make_output_layout.py as a module, for the tiny model it trains LLaMA-Factory with."""
    spec = importlib.util.spec_from_file_location("make_output_layout", REPO / "tests/data/make_output_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_tuneline_train_writes_llamafactorys_layout_of_its_recorded_pt_run(tmp_path: Path, shared_dir: Path, monkeypatch,
                                                                          one_torch_thread):
    from conftest import run_cli_here, train_in_this_process

    recorded = LAYOUT["kinds"]["pt"]
    model = recording_script().build_tiny_model(shared_dir / "tokenizers" / LAYOUT["tokenizer"], tmp_path / "tiny")
    places = {"model": str(model), "dataset_dir": str(shared_dir / "llamafactory/data"), "output_dir": str(tmp_path / "pt")}
    config = tmp_path / "pt.yaml"
    config.write_text(yaml.safe_dump({key: value.format(**places) if isinstance(value, str) else value
                                      for key, value in recorded["arguments"].items()}))
    train_in_this_process(monkeypatch)  # the worker's run, without a process to start and import torch in
    result = run_cli_here("train", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    # the run reaches the files that only a checkpoint and an evaluation write
    assert {"checkpoint-2/optimizer.pt", "eval_results.json", "training_eval_loss.png"} <= set(recorded["files"])
    assert (tmp_path / "pt/checkpoint-2").is_dir()
    assert_output_layout(tmp_path / "pt", "pt")


def test_the_layout_is_llamafactorys_where_it_runs_and_tunelines_own_elsewhere():
    from tuneline.core.stages.registry import STAGE_NAMES

    ours = LAYOUT["tuneline"]
    assert LAYOUT["command"].startswith("/work/lfvenv/bin/python tests/data/make_output_layout.py ")
    assert set(LAYOUT["kinds"]) | set(LAYOUT["not_run"]) == LLAMAFACTORY_STAGES
    assert set(ours["kinds"]) == set(STAGE_NAMES) - set(LAYOUT["kinds"])
    for section in ("extra_files", "extra_checkpoint_files", "extra_log_keys"):  # each extra says why
        assert all(isinstance(reason, str) and len(reason.split()) >= 5 for reason in ours[section].values()), section
    for kind, names in ours["not_written"].items():  # each one LLaMA-Factory writes, and says why
        assert set(names) <= {name.rsplit("/", 1)[-1] for name in LAYOUT["kinds"][kind]["files"]}, kind
        assert all(len(reason.split()) >= 5 for reason in names.values()), kind
    written_by_llamafactory = {name.rsplit("/", 1)[-1] for kind in LAYOUT["kinds"].values() for name in kind["files"]}
    assert not written_by_llamafactory & (set(ours["extra_files"]) | set(ours["extra_checkpoint_files"]))
    assert not {key for kind in LAYOUT["kinds"].values() for key in kind["log_keys"]} & set(ours["extra_log_keys"])


def write_layout(folder: Path, kind: str) -> None:
    """Empty files where LLaMA-Factory's evaluated run of `kind` and tuneline's declared extras put theirs, and
    the log, state and results that say a loss and an evaluation were logged."""
    names = set(LAYOUT["kinds"][kind]["files"]) | set(LAYOUT["tuneline"]["extra_files"])
    names |= {f"checkpoint-2/{name}" for name in LAYOUT["tuneline"]["extra_checkpoint_files"]}
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("")
    step = dict.fromkeys(STEP_KEYS, 1)
    (folder / "trainer_log.jsonl").write_text(json.dumps(step) + "\n" + json.dumps({**step, "eval_loss": 1.0}) + "\n")
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": [{"loss": 1.0, "step": 1}, {"eval_loss": 1.0, "step": 1}]}))
    (folder / "all_results.json").write_text(json.dumps({"train_loss": 1.0, "eval_loss": 1.0}))


@pytest.mark.parametrize("change", ["missing", "undeclared", "missing_in_checkpoint", "undeclared_in_checkpoint"])
def test_the_comparison_fails_on_a_missing_file_and_on_an_undeclared_one(tmp_path: Path, change: str):
    write_layout(tmp_path, "sft")
    assert_output_layout(tmp_path, "sft")
    {"missing": lambda: (tmp_path / "training_args.bin").unlink(),
     "undeclared": lambda: (tmp_path / "notes.txt").write_text("x"),
     "missing_in_checkpoint": lambda: (tmp_path / "checkpoint-2/scheduler.pt").unlink(),
     "undeclared_in_checkpoint": lambda: (tmp_path / "checkpoint-2/notes.txt").write_text("x")}[change]()
    with pytest.raises(AssertionError, match="missing \\['(training_args.bin|scheduler.pt)'\\]|unexpected \\['notes.txt'\\]"):
        assert_output_layout(tmp_path, "sft")
