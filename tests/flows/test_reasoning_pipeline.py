"""The reasoning chain (data/reasoning_pipeline.yaml) through `tuneline run`: base -> pt -> sft -> grpo
-> export -> register, on the project's arithmetic demo. Real Prefect, real MLflow, real training.

Workspace A runs it uninterrupted: GRPO raises the held-out pass rate above the fine-tuned model's
and its training reward rises; the completions table is in MLflow; the champion is chosen by
`eval_pass_rate`. Workspace B starts with A's MLflow store and the artifacts before grpo; the run is
SIGKILLed once grpo has a checkpoint, and the rerun serves the earlier stages from cache, resumes
grpo from its checkpoint and ends with A's weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pipeline_runs import (check_rerun, max_difference, run_to_end, run_uninterrupted, run_until_checkpoint, seed_workspace,
                           stage_rows, weights)

REPO = Path(__file__).resolve().parents[2]
CHAIN = REPO / "data/reasoning_pipeline.yaml"
STAGES = ["base", "pt/tokenize", "pt", "sft/tokenize", "sft", "grpo/tokenize", "grpo", "grpo/export", "register"]
PASS_RATE_MARGIN = 0.1  # four of the 40 held-out problems


def write_chain(path: Path) -> Path:
    """The demo chain, its grpo stage logging every step and saving a checkpoint every 10 steps."""
    chain = yaml.safe_load(CHAIN.read_text())
    chain["defaults"]["dataset_dir"] = str(REPO / "data/reasoning_demo")
    [grpo] = [stage for stage in chain["stages"] if stage["name"] == "grpo"]
    grpo.update(logging_steps=1, save_steps=10)
    path.write_text(yaml.safe_dump(chain, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, prefect_server) -> dict:
    folder = tmp_path_factory.mktemp("reasoning")
    chain = write_chain(folder / "chain.yaml")
    return run_uninterrupted(chain, folder, what="reasoning chain")


def manifest(rows: dict[str, tuple[str, str]], name: str) -> dict:
    return json.loads((Path(rows[name][1]) / "manifest.json").read_text())


@pytest.mark.slow
def test_grpo_raises_the_held_out_pass_rate_and_its_reward(uninterrupted):
    rows = uninterrupted["rows"]
    assert list(rows) == STAGES
    metrics = manifest(rows, "grpo")["metrics"]
    before, after = metrics["eval_pass_rate_before"], metrics["eval_pass_rate"]
    print(f"held-out pass rate: sft model {before:.3f}, after grpo {after:.3f}; mean reward "
          f"{metrics['eval_mean_reward_before']:.3f} -> {metrics['eval_mean_reward']:.3f}")
    assert after >= before + PASS_RATE_MARGIN
    assert metrics["eval_mean_reward"] > metrics["eval_mean_reward_before"]

    log = [json.loads(line) for line in (Path(rows["grpo"][1]) / "trainer_log.jsonl").read_text().splitlines()]
    rewards = [record["reward"] for record in log if "reward" in record]
    tenth = max(len(rewards) // 10, 1)
    first, last = sum(rewards[:tenth]) / tenth, sum(rewards[-tenth:]) / tenth
    print(f"mean training reward: first tenth {first:.3f}, last tenth {last:.3f} ({len(rewards)} steps)")
    assert last > first
    assert {"reward_std", "kl", "completions/mean_length", "rewards/answer_match/mean",
            "rewards/think_answer_format/std"} <= set(log[0])


@pytest.mark.slow
def test_the_completions_table_and_the_champion_by_pass_rate(uninterrupted):
    from mlflow.tracking import MlflowClient

    rows, output = uninterrupted["rows"], uninterrupted["output"]
    grpo = manifest(rows, "grpo")
    client = MlflowClient(f"sqlite:///{uninterrupted['workspace'] / 'mlflow.db'}")
    table = json.loads(Path(client.download_artifacts(grpo["mlflow_run_id"], "completions.json")).read_text())
    assert {"step", "prompt", "completion", "reward_answer_match", "reward_think_answer_format",
            "advantage"} <= set(table["columns"])
    assert len(table["data"]) >= 60  # a sample of every logged step
    assert "[eval_pass_rate read from stage 'grpo' manifest]" in output
    version = client.get_model_version_by_alias("tuneline-reasoning", "champion")
    assert float(version.tags["tuneline.metric.eval_pass_rate"]) == grpo["metrics"]["eval_pass_rate"]


@pytest.mark.slow
def test_a_chain_killed_in_grpo_resumes_from_its_checkpoint(uninterrupted, tmp_path: Path):
    chain, reference = uninterrupted["chain"], uninterrupted["rows"]
    workspace = tmp_path / "B"
    seed_workspace(uninterrupted, workspace, stages=STAGES[:STAGES.index("grpo")])
    killed = run_until_checkpoint(chain, workspace, tmp_path / "B0.log", stage="grpo")
    output = run_to_end(chain, workspace, tmp_path / "B1.log")
    check_rerun(output, killed)
    rows = stage_rows(output)
    difference = max_difference(weights(Path(rows["grpo"][1])), weights(Path(reference["grpo"][1])))
    print(f"grpo killed at step {killed['step']}'s checkpoint and resumed vs uninterrupted: max abs weight difference "
          f"{difference}")
    assert difference <= 1e-5
