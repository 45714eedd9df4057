"""The reasoning chain (data/reasoning_pipeline.yaml) through `tuneline run`: base -> pt -> sft -> grpo
-> export -> register, on the project's arithmetic demo. Real Prefect, real MLflow, real training.

Workspace A first registers the fine-tuned (sft) policy: the chain with a grpo stage that does not
move it (one step at learning rate 0), whose held-out pass rate is the sft model's. Then it runs the
chain as shipped, uninterrupted (base, pt and sft served from cache): GRPO raises the held-out pass
rate above the fine-tuned model's and its training reward rises; the completions table is in MLflow;
the version with the higher `eval_pass_rate` becomes champion. Workspace B starts with A's MLflow
store and the artifacts before grpo; the run is SIGKILLed once grpo has a checkpoint, and the rerun
serves the earlier stages from cache, resumes grpo from its checkpoint and ends with A's weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

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
CHAIN = REPO / "data/reasoning_pipeline.yaml"
STAGES = ["base", "pt/tokenize", "pt", "sft/tokenize", "sft", "grpo/tokenize", "grpo", "grpo/export", "register"]
PASS_RATE_MARGIN = 0.1  # four of the 40 held-out problems
FORMAT_RATE_AFTER = 0.9  # 1.0 after grpo in every measured run; the sft model: 0.025 to 0.325


def write_chain(path: Path, **grpo_values) -> Path:
    """The demo chain, its grpo stage logging every step and saving a checkpoint every 10 steps."""
    chain = yaml.safe_load(CHAIN.read_text())
    chain["defaults"]["dataset_dir"] = str(REPO / "data/reasoning_demo")
    [grpo] = [stage for stage in chain["stages"] if stage["name"] == "grpo"]
    grpo.update(logging_steps=1, save_steps=10, **grpo_values)
    path.write_text(yaml.safe_dump(chain, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, prefect_server) -> dict:
    folder = tmp_path_factory.mktemp("reasoning")
    unmoved = write_chain(folder / "sft_policy.yaml", learning_rate=0.0, max_steps=1)
    sft_output = run_to_end(unmoved, folder / "A", folder / "A0.log")
    chain = write_chain(folder / "chain.yaml")
    return {**run_uninterrupted(chain, folder, what="reasoning chain"), "sft_policy_rows": stage_rows(sft_output),
            "sft_policy_output": sft_output}


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
    shape, shape_before = metrics["eval_reward_think_answer_format"], metrics["eval_reward_think_answer_format_before"]
    print(f"held-out answers in the checkable shape: sft model {shape_before:.3f}, after grpo {shape:.3f}")
    assert shape >= FORMAT_RATE_AFTER > shape_before  # the problems were never seen; the shape is what grpo taught

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

    # version 1: the sft policy (grpo at learning rate 0 leaves its weights as sft wrote them); version 2: grpo's
    unmoved = manifest(uninterrupted["sft_policy_rows"], "grpo")
    sft_weights = weights(Path(rows["sft"][1]))
    assert max_difference(weights(Path(uninterrupted["sft_policy_rows"]["grpo"][1])), sft_weights) == 0
    sft_rate, grpo_rate = unmoved["metrics"]["eval_pass_rate"], grpo["metrics"]["eval_pass_rate"]
    assert sft_rate == unmoved["metrics"]["eval_pass_rate_before"] == grpo["metrics"]["eval_pass_rate_before"]
    recorded = {v: float(client.get_model_version("tuneline-reasoning", v).tags["tuneline.metric.eval_pass_rate"])
                for v in ("1", "2")}
    print(f"held-out pass rate: version 1 (sft policy) {recorded['1']}, version 2 (grpo policy) {recorded['2']}")
    assert recorded == {"1": sft_rate, "2": grpo_rate}
    assert "version 1 becomes champion: it is the first version" in uninterrupted["sft_policy_output"]
    assert grpo_rate > sft_rate
    assert (f"version 2 becomes champion: eval_pass_rate {grpo_rate:.4g} vs champion version 1's {sft_rate:.4g} "
            f"(higher is better)") in output
    assert str(client.get_model_version_by_alias("tuneline-reasoning", "champion").version) == "2"


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
