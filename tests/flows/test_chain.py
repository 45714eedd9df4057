"""The example alignment chain through `tuneline run`: base -> pt -> sft -> rm, dpo (`ref_model: sft`)
and ppo (`reward_model: rm`), made tiny. Real Prefect (ephemeral API), real MLflow (SQLite), real training.

Workspace A runs it uninterrupted: every stage is computed with its held-out metrics, and a second
run serves every stage from cache. Workspace B starts as a copy of A's MLflow store and of the
artifacts of the stages before the first killed one (so they are served from cache, as they would be
after a kill there); `tuneline run` is SIGKILLed (its whole process group) once each stage of
KILLED_STAGES in turn has saved a checkpoint; every rerun serves the finished stages from cache,
resumes the interrupted one from its checkpoint and marks the killed attempt's MLflow run KILLED.
Every killed stage ends with A's weights.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import yaml

from conftest import assert_output_layout
from pipeline_runs import (
    check_rerun,
    max_difference,
    run_to_end,
    run_uninterrupted,
    run_until_checkpoint,
    seed_workspace,
    stage_rows,
    weights,
)

REPO = Path(__file__).resolve().parents[2]
CHAIN = REPO / "data/chain_pipeline.yaml"
# The stages whose resume only this chain tests: a killed sft run resumes in test_resume.py, a killed
# ppo run in test_ppo.py, a killed grpo stage in test_reasoning_pipeline.py, through the same launcher
# the pipeline's train task uses; rm trains through TRL's trainer as dpo does.
KILLED_STAGES = ["dpo"]
STEPS, SAVE_STEPS = 8, 2  # a checkpoint every 2 of 8 steps (24 examples in batches of 4 cross an epoch)
SMALL = {"dataset_dir": str(REPO / "data"), "cutoff_len": 64, "max_samples": 24, "logging_steps": 1,
         "per_device_train_batch_size": 4, "max_steps": STEPS, "save_steps": SAVE_STEPS}
TINY_BASE = {"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
STAGES = ["base", "pt/tokenize", "pt", "sft/tokenize", "sft", "sft/merge", "rm/tokenize", "rm", "dpo/tokenize", "dpo",
          "ppo/tokenize", "ppo"]


IGNORED_BY_RM = {"packing": True}  # a key stage rm does not read: it trains, warned of and tagged
RM_WARNING = ("rm: warning: 'packing: true' has no effect in stage 'rm' and is ignored: only stages pt and sft read it. "
              "What it does: Pack examples into full-length sequences (default: on for pt).")


def write_small_chain(path: Path) -> Path:
    """The example chain with a tiny base model, and every stage trained for STEPS steps with a
    checkpoint every SAVE_STEPS (the stages' own lengths and batch sizes give way to SMALL); the rm
    stage also sets IGNORED_BY_RM."""
    chain = yaml.safe_load(CHAIN.read_text())
    chain["defaults"].update(SMALL)
    for stage in chain["stages"]:
        for key in (*SMALL, "num_train_epochs"):
            stage.pop(key, None)
        if stage["stage"] == "build_base":
            stage.update(TINY_BASE)
        if stage["stage"] == "rm":
            stage.update(IGNORED_BY_RM)
    assert set(KILLED_STAGES) <= {stage["name"] for stage in chain["stages"]}
    path.write_text(yaml.safe_dump(chain, sort_keys=False))
    return path


def test_pipeline_stages_checkpoint_unless_told_otherwise():
    from tuneline.core.pipeline.stage_runs import DEFAULT_CHECKPOINTING, with_checkpointing

    assert with_checkpointing({"max_steps": 9}) == {**DEFAULT_CHECKPOINTING, "max_steps": 9}
    assert with_checkpointing({"save_total_limit": 5})["save_total_limit"] == 5
    assert with_checkpointing({"save_strategy": "no"}) == {"save_strategy": "no"}
    assert with_checkpointing({"save_steps": 7}) == {"save_steps": 7}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, prefect_server) -> dict:
    folder = tmp_path_factory.mktemp("chain")
    chain = write_small_chain(folder / "chain.yaml")
    return run_uninterrupted(chain, folder, what="chain")


def manifest(rows: dict[str, tuple[str, str]], name: str) -> dict:
    return json.loads((Path(rows[name][1]) / "manifest.json").read_text())


@pytest.mark.slow
def test_chain_computes_every_stage_with_its_held_out_metrics(uninterrupted):
    rows = uninterrupted["rows"]
    assert list(rows) == STAGES
    assert {status for status, _ in rows.values()} == {"computed"}
    rm_metrics, dpo_metrics = manifest(rows, "rm")["metrics"], manifest(rows, "dpo")["metrics"]
    assert 0.0 <= rm_metrics["eval_rm_accuracy"] <= 1.0
    assert any(name.startswith("eval_pref_") for name in dpo_metrics), sorted(dpo_metrics)


@pytest.mark.slow
def test_pipeline_stages_write_the_layout_tuneline_train_writes(uninterrupted):
    """A trained artifact holds what `tuneline train` writes for its kind, plus its manifest and job."""
    for name in ("pt", "sft", "rm", "dpo", "ppo"):
        recorded = manifest(uninterrupted["rows"], name)
        assert_output_layout(Path(uninterrupted["rows"][name][1]), name, extra=frozenset({"manifest.json"}),
                             full_weights=recorded["config"]["finetuning_type"] == "full")


@pytest.mark.slow
def test_dpo_compares_with_the_merged_sft_model_it_starts_from(uninterrupted):
    rows = uninterrupted["rows"]
    dpo, merged = manifest(rows, "dpo"), manifest(rows, "sft/merge")
    assert dpo["config"]["ref_model"] == rows["sft/merge"][1] == dpo["start_model"]
    assert dpo["inputs"]["ref_model"] == merged["key"]
    assert "ref_model" not in manifest(rows, "rm")["inputs"]


@pytest.mark.slow
def test_ppo_scores_with_the_rm_stage_and_reports_reward_before_and_after(uninterrupted):
    rows = uninterrupted["rows"]
    ppo, rm = manifest(rows, "ppo"), manifest(rows, "rm")
    assert ppo["config"]["reward_model"] == rows["rm"][1]
    assert ppo["inputs"]["reward_model"] == rm["key"]
    assert ppo["start_model"] == rows["sft/merge"][1]
    metrics = ppo["metrics"]
    assert {"eval_ppo_reward_before", "eval_ppo_reward", "eval_ppo_kl", "train_reward", "train_kl"} <= set(metrics)


def warnings_of_ignored_keys(output: str) -> tuple[list[str], list[str]]:
    """The warning lines printed, and the Prefect log records of them (shown by `tuneline -v run`)."""
    lines = [line for line in output.splitlines() if "has no effect in stage" in line]
    return [line for line in lines if line.startswith("rm: warning: ")], [line for line in lines if " | INFO " in line]


def ignored_keys_tags(workspace: Path) -> list[tuple[str, str, str]]:
    """(stage, cache hit, tuneline.ignored_keys) of every stage run that carries the tag, oldest first."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, "tags.`tuneline.ignored_keys` LIKE '%'", order_by=["attributes.start_time ASC"])
    return [(r.info.run_name, r.data.tags["tuneline.cache_hit"], r.data.tags["tuneline.ignored_keys"]) for r in runs]


@pytest.mark.slow
def test_a_key_the_rm_stage_ignores_is_printed_once_and_tagged_on_its_run(uninterrupted):
    printed, logged = warnings_of_ignored_keys(uninterrupted["output"])
    assert printed == [RM_WARNING]
    assert len(logged) == 1 and logged[0].endswith(f" - {RM_WARNING}")
    assert ignored_keys_tags(uninterrupted["workspace"])[:1] == [("rm", "false", "packing")]


@pytest.mark.slow
def test_second_run_serves_every_stage_from_cache(uninterrupted, tmp_path: Path):
    output = run_to_end(uninterrupted["chain"], uninterrupted["workspace"], tmp_path / "again.log")
    rows = stage_rows(output)
    assert list(rows) == STAGES
    assert {status for status, _ in rows.values()} == {"served from cache"}
    # the served rm stage says again what it ignores, and its cache-hit run carries the tag too
    assert warnings_of_ignored_keys(output)[0] == [RM_WARNING]
    assert ("rm", "true", "packing") in ignored_keys_tags(uninterrupted["workspace"])


@pytest.mark.slow
def test_every_stage_run_names_the_machine_that_ran_it(uninterrupted):
    """`tuneline.worker` on each stage's child run, computed or served (after the second run above)."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{uninterrupted['workspace'] / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, "tags.`tuneline.stage` LIKE '%'")
    assert {r.data.tags["tuneline.cache_hit"] for r in runs} == {"true", "false"}
    assert {r.data.tags.get("tuneline.worker") for r in runs} == {os.environ.get("TUNELINE_WORKER") or socket.gethostname()}


@pytest.mark.slow
def test_a_chain_killed_in_its_stages_resumes_each_from_its_checkpoint(uninterrupted, tmp_path: Path):
    started = time.monotonic()
    chain, reference = uninterrupted["chain"], uninterrupted["rows"]
    workspace = tmp_path / "B"
    seed_workspace(uninterrupted, workspace, stages=STAGES[:STAGES.index(KILLED_STAGES[0])])
    killed = run_until_checkpoint(chain, workspace, tmp_path / "B0.log", stage=KILLED_STAGES[0])
    for attempt, stage in enumerate([*KILLED_STAGES[1:], None], start=1):
        log = tmp_path / f"B{attempt}.log"
        following = run_until_checkpoint(chain, workspace, log, stage=stage) if stage else None
        output = log.read_text() if stage else run_to_end(chain, workspace, log)
        check_rerun(output, killed)
        print(f"{killed['stage']}: killed, then resumed from checkpoint-{killed['step']}")
        killed = following

    rows = stage_rows(output)
    assert list(rows) == list(reference)
    for name in KILLED_STAGES:
        difference = max_difference(weights(Path(rows[name][1])), weights(Path(reference[name][1])))
        print(f"{name}: killed and resumed vs uninterrupted: max abs weight difference {difference}")
        assert difference <= 1e-5
    for path in [Path(p) for _, p in [*rows.values(), *reference.values()] if "/trained/" in p]:
        assert not list(path.glob("checkpoint-*")), path
    print(f"kills and reruns: {time.monotonic() - started:.0f} s")
