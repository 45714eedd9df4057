"""The demo chain end to end, as a machine that has tuneline installed and no checkout runs it: the
wheel (`pip wheel .`) installed in a fresh venv, `tuneline demo` started from an empty directory.
Real Prefect (the session's local server), real MLflow (SQLite), real training.

One demo run is shared by the module; a second run must be served from cache, and a third run with
a changed learning rate must retrain without tokenizing again. `tuneline deploy` from the same
install must register flows that a worker finds in the installed package.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from installed_wheel import build_wheel, install_in_fresh_venv, tracked_files, wheel_files

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]

DEMO_STAGES = ["base", "pt/tokenize", "pt", "sft/tokenize", "sft", "sft/merge", "rm/tokenize", "rm", "dpo/tokenize", "dpo",
               "ppo/tokenize", "ppo", "sft/evaluate", "dpo/merge", "dpo/export", "register"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The wheel, and the fresh venv's site-packages and `tuneline` command."""
    root = tmp_path_factory.mktemp("installed")
    started = time.monotonic()
    wheel = build_wheel(root / "dist")
    site_packages = install_in_fresh_venv(wheel, root / "venv")
    print(f"wheel built and installed in a fresh venv in {time.monotonic() - started:.1f} s")
    return {"wheel": wheel, "site_packages": site_packages, "package": site_packages / "tuneline",
            "tuneline": root / "venv" / "bin" / "tuneline"}


def run_demo(installed: dict, launch_dir: Path, *overrides: str) -> tuple[str, float]:
    """`tuneline demo` of the installed wheel, started in `launch_dir` (its workspace: ./workspace)."""
    started = time.monotonic()
    result = subprocess.run([str(installed["tuneline"]), "demo", *overrides], cwd=launch_dir, capture_output=True, text=True,
                            timeout=900)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout, seconds


def stage_status(stdout: str) -> dict[str, str]:
    """{stage name: 'computed' | 'served from cache'} from the printed summary."""
    return dict(re.findall(r"^  (\S+)\s+(computed|served from cache)\s", stdout, flags=re.M))


@pytest.fixture(scope="module")
def first_run(installed, tmp_path_factory) -> dict:
    launch_dir = tmp_path_factory.mktemp("empty")
    stdout, seconds = run_demo(installed, launch_dir)
    print(stdout)
    return {"launch_dir": launch_dir, "workspace": launch_dir / "workspace", "stdout": stdout, "seconds": seconds}


def test_the_wheel_ships_every_data_and_deployment_file(installed):
    """Demo data and pipelines, harness task files, deployment files: whatever the checkout has under
    data/ and deployments/ is in the wheel, at the same place under the package."""
    shipped = wheel_files(installed["wheel"])
    checkout = tracked_files("data", "deployments")
    assert "data/demo_pipeline.yaml" in checkout and "deployments/prefect.yaml" in checkout
    assert "data/harness_tasks/arith_mc.yaml" in checkout
    assert [path for path in checkout if f"tuneline/{path}" not in shipped] == []


def test_the_fresh_venv_imports_the_wheel_not_the_checkout(installed, tmp_path):
    python = installed["tuneline"].with_name("python")
    probe = "import tuneline.flows.cli as cli, tuneline.core.pipeline.spec as spec; print(cli.__file__, spec.__file__, cli.DEMO_PIPELINE)"
    result = subprocess.run([str(python), "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    cli_file, spec_file, demo_pipeline = result.stdout.split()
    assert cli_file == str(installed["package"] / "flows" / "cli.py")
    assert spec_file == str(installed["package"] / "core" / "pipeline" / "spec.py")
    assert demo_pipeline == str(installed["package"] / "data" / "demo_pipeline.yaml")


def test_deploy_from_the_wheel_points_workers_at_the_installed_package(installed, prefect_server, tmp_path):
    """The flows a worker runs, and the pipeline and data they name, are found in the installed package."""
    result = subprocess.run([str(installed["tuneline"]), "deploy", "--pool", "tuneline-wheel"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    deployments = httpx.post(f"{prefect_server}/deployments/filter", timeout=10,
                             json={"work_pools": {"name": {"any_": ["tuneline-wheel"]}}}).json()
    listed = yaml.safe_load((installed["package"] / "deployments" / "prefect.yaml").read_text(encoding="utf-8"))["deployments"]
    # prefect.yaml's flows, and the one-stage flow a pipeline's stages run as on that pool (by module path, no pull step)
    (stage,) = [d for d in deployments if d["entrypoint"] == "tuneline.flows.stage_flow:stage_flow"]
    assert stage["name"] == "tuneline-wheel" and not stage["pull_steps"]
    deployments = [d for d in deployments if d is not stage]
    assert sorted(d["name"] for d in deployments) == sorted(d["name"] for d in listed)
    for deployment in deployments:
        (step,) = deployment["pull_steps"]
        root = Path(step["prefect.deployments.steps.set_working_directory"]["directory"])
        assert root == installed["package"]
        assert (root / deployment["entrypoint"].split(":")[0]).is_file()
        assert (root / deployment["parameters"]["pipeline_path"]).is_file()
        for folder in (o.split("=", 1)[1] for o in deployment["parameters"]["overrides"] if o.startswith("dataset_dir=")):
            assert (root / folder / "dataset_info.json").is_file()
    assert list(tmp_path.iterdir()) == []


def test_demo_computes_every_stage_and_registers_the_champion(first_run):
    status = stage_status(first_run["stdout"])
    assert list(status) == DEMO_STAGES
    assert set(status.values()) == {"computed"}
    assert "registered model: tuneline-demo version 1 alias @champion" in first_run["stdout"]
    assert [p.name for p in first_run["launch_dir"].iterdir()] == ["workspace"]  # nothing else written where it started


def test_mlflow_store_holds_the_story_of_the_run(first_run):
    from mlflow import MlflowClient

    uri = f"sqlite:///{first_run['workspace'] / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.get_experiment_by_name("tuneline-demo")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id}
    assert set(children) == set(DEMO_STAGES)
    for name in ("pt", "sft"):
        run = children[name]
        assert run.data.params["stage"] == name and "learning_rate" in run.data.params
        losses = [m.value for m in client.get_metric_history(run.info.run_id, "loss")]
        assert len(losses) >= 3 and losses[-1] < losses[0]
    assert children["sft/evaluate"].data.metrics["eval_loss"] > 0
    champion = client.get_model_version_by_alias("tuneline-demo", "champion")
    assert str(champion.version) == "1"
    assert champion.run_id == children["register"].info.run_id
    assert champion.tags["tuneline.export_key"].startswith("export-")


def test_exported_model_answers_like_the_adapter_and_better_than_the_base(installed, first_run):
    """The export is the DPO policy merged: it answers as base plus adapter, and better than the
    pre-trained model the chain fine-tuned: a higher held-out answer F1, and a far lower negative
    log-likelihood of the held-out reference answers."""
    import json

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tuneline.core.evaluation.heldout import answer_score

    export_dir = Path(re.search(r"^exported model:\s+(\S+)", first_run["stdout"], flags=re.M).group(1))
    trained = {name: json.loads((Path(path) / "manifest.json").read_text())
               for name, path in re.findall(r"^  (sft|dpo)\s+computed\s+\S+ s\s+(\S+)", first_run["stdout"], flags=re.M)}
    dpo_dir = Path(re.search(r"^  dpo\s+computed\s+\S+ s\s+(\S+)", first_run["stdout"], flags=re.M).group(1))
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    exported = AutoModelForCausalLM.from_pretrained(export_dir).eval()
    base = AutoModelForCausalLM.from_pretrained(trained["sft"]["start_model"]).eval()
    start = trained["dpo"]["start_model"]
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(start), str(dpo_dir)).eval()

    rows = json.loads((installed["package"] / "data" / "demo_heldout.json").read_text())
    heldout = [{"prompt": [{"role": "user", "content": r["instruction"]}], "response": [{"role": "assistant", "content": r["output"]}]}
               for r in rows]

    def answers(model):
        replies = []
        for row in heldout:
            ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_dict=False)
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
            replies.append(out[0, len(ids):].tolist())
        return replies

    merged_ids, adapter_ids = answers(exported), answers(adapter)
    assert merged_ids == adapter_ids
    decode = lambda ids: [tokenizer.decode(i, skip_special_tokens=True) for i in ids]  # noqa: E731
    tuned_score = answer_score(decode(merged_ids), heldout)
    base_score = answer_score(decode(answers(base)), heldout)
    print(f"held-out answer F1: pre-trained {base_score:.3f}, exported DPO policy {tuned_score:.3f}")
    # F1 of greedy replies to 60 prompts is coarse: its gain over the pre-trained model measured 0.234 (the
    # default seeds, 2 or 1 torch threads), 0.185 (the default seeds on AVX2 kernels instead of AVX-512),
    # 0.289 and 0.083 (every stage seeded 7, or 1). `> base + 0.1` failed at 0.083; strictly better leaves
    # 0.08, and the likelihood check below carries the size of the gain.
    assert tuned_score > base_score

    def answer_nll(model) -> float:
        """Mean negative log-likelihood per reference-answer token, the prompt as the chat template renders it."""
        total, tokens = 0.0, 0
        for row in heldout:
            prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_dict=False)
            full = tokenizer.apply_chat_template(row["prompt"] + row["response"], return_dict=False)
            assert full[:len(prompt)] == prompt
            with torch.no_grad():
                logps = torch.log_softmax(model(torch.tensor([full])).logits[0, :-1].float(), dim=-1)
            targets = torch.tensor(full[1:])
            total -= logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[len(prompt) - 1:].sum().item()
            tokens += len(full) - len(prompt)
        return total / tokens

    tuned_nll, base_nll = answer_nll(exported), answer_nll(base)
    print(f"held-out answer NLL per token: pre-trained {base_nll:.3f}, exported DPO policy {tuned_nll:.3f}")
    # Like with like on the same ~500 answer tokens: the export's NLL measured 0.43, 0.40, 0.44 and 0.42 of
    # the pre-trained model's (default seeds on 2 or 1 threads; AVX2 kernels; seeds 7; seeds 1). 0.6 leaves 0.16.
    assert tuned_nll < 0.6 * base_nll


def test_alignment_stages_meet_their_accuracy_on_held_out_demo_data(first_run):
    """RM accuracy on held-out pairs >= 0.8; DPO implicit-reward accuracy >= 0.75, its likelihood
    margin (chosen over rejected) well above the SFT model's while it keeps SFT's likelihood accuracy
    within a few pairs; PPO's greedy replies to held-out prompts score higher with the reward model
    than the SFT policy's.

    Spreads quoted below: the demo on the frozen code of c4e177d with the default seeds (2 and 1 torch
    threads gave identical numbers), the same on AVX2 kernels instead of AVX-512
    (ATEN_CPU_CAPABILITY=avx2, as on a CPU without AVX-512), every stage seeded 7 and every stage
    seeded 1, and the numbers of the 2-core CI machine where the old assertions failed. 60 held-out
    pairs, so one pair is 0.017."""
    import json

    paths = dict(re.findall(r"^  (rm|dpo|ppo)\s+computed\s+\S+ s\s+(\S+)", first_run["stdout"], flags=re.M))
    rm, dpo, ppo = (json.loads((Path(paths[name]) / "manifest.json").read_text())["metrics"] for name in ("rm", "dpo", "ppo"))
    print(f"rm: held-out pair accuracy {rm['eval_rm_accuracy']:.3f}, margin {rm['eval_rm_margin']:.3f} "
          f"({rm['eval_rm_pairs']:.0f} pairs)")
    print(f"dpo: held-out implicit-reward accuracy {dpo['eval_pref_reward_accuracy']:.3f}, margin "
          f"{dpo['eval_pref_reward_margin']:.3f}; log-prob preference accuracy SFT {dpo['eval_pref_reference_logp_accuracy']:.3f} "
          f"-> DPO {dpo['eval_pref_logp_accuracy']:.3f}, margin {dpo['eval_pref_reference_logp_margin']:.2f} -> "
          f"{dpo['eval_pref_logp_margin']:.2f}")
    print(f"ppo: mean reward of greedy held-out replies SFT {ppo['eval_ppo_reward_before']:.3f} -> PPO "
          f"{ppo['eval_ppo_reward']:.3f} (KL from SFT {ppo['eval_ppo_kl']:.3f}; reply length "
          f"{ppo['eval_ppo_response_length_before']:.1f} -> {ppo['eval_ppo_response_length']:.1f} tokens)")
    # measured 0.900-0.983 (0.933 on the CI machine, 0.900 with 1 thread on a later one); 0.8 leaves 0.10
    assert rm["eval_rm_accuracy"] >= 0.8
    # measured 0.833 (1 thread, a later machine) to 0.967; 0.75 leaves 0.08. A DPO that did nothing scores 0 (ties miss).
    assert dpo["eval_pref_reward_accuracy"] >= 0.75
    # SFT already ranks 90-95% of the pairs by likelihood and DPO moves that by a pair or two either way:
    # measured +1, 0, -1, -2 pairs, and 0 (0.900 -> 0.900) on the CI machine, where the old strict `>` failed.
    # Losing at most 4 pairs leaves 2; that DPO raised the likelihood preference is the margin check below.
    pairs = dpo["eval_pref_pairs"]
    assert round((dpo["eval_pref_reference_logp_accuracy"] - dpo["eval_pref_logp_accuracy"]) * pairs) <= 4
    # mean log p(chosen) - log p(rejected) grew by 16.3, 17.7, 24.4 and 29.8 nats; 5 leaves 11 (unchanged if DPO did nothing)
    assert dpo["eval_pref_logp_margin"] > dpo["eval_pref_reference_logp_margin"] + 5.0
    # gain measured +0.162, +0.026 (AVX2), +0.039 (seeds 7), +0.908 (seeds 1), +0.027 on the CI machine, and on a
    # later AVX-512 machine +0.027 with 2 threads and +0.009 with 1 (1.740 -> 1.749, as the tests run): thin where
    # PPO moves little, but there is no margin to give without dropping the claim (a larger PPO learning rate,
    # tried, collapses replies to 2 tokens and fails the length check below), so it stays strict.
    assert ppo["eval_ppo_reward"] > ppo["eval_ppo_reward_before"]
    assert ppo["eval_ppo_response_length"] >= 0.5 * ppo["eval_ppo_response_length_before"]  # no collapse to empty replies


def test_second_run_trains_nothing_and_is_fast(installed, first_run):
    stdout, seconds = run_demo(installed, first_run["launch_dir"])
    status = stage_status(stdout)
    assert status and set(status.values()) == {"served from cache"}
    print(f"first run {first_run['seconds']:.1f} s, cached rerun {seconds:.1f} s ({seconds / first_run['seconds']:.0%})")
    assert seconds <= 0.25 * first_run["seconds"]


def test_new_learning_rate_retrains_without_tokenizing(installed, first_run):
    """A changed DPO learning rate (and, to keep the test short, fewer steps) retrains dpo and what
    follows it (merge, export, a new model version) from the cached tokenized pairs; no other stage reruns."""
    stdout, _ = run_demo(installed, first_run["launch_dir"], "dpo.learning_rate=5.0e-4", "dpo.max_steps=8")
    status = stage_status(stdout)
    retrained = {"dpo", "dpo/merge", "dpo/export", "register"}
    assert {name for name, state in status.items() if state == "computed"} == retrained
    assert all(status[name] == "served from cache" for name in DEMO_STAGES if name not in retrained)
    assert "registered model: tuneline-demo version 2 alias @champion" in stdout
