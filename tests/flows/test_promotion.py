"""Retraining, promotion and the model registry through `tuneline run`, `tuneline promote` and
`tuneline rollback`: real Prefect (ephemeral API), real MLflow (SQLite), a tiny base → sft chain.

One story per module: the first run registers version 1 as champion; appending rows to the SFT
data retrains sft (base is served from cache) and version 2 wins on an lm-evaluation-harness score
(the project's local `arith_mc` task, run by the `evaluate` section) with a lenient threshold;
appending more rows gives version 3 a lower score, and at a real threshold (`REAL_THRESHOLD`) it
becomes challenger; an unchanged rerun registers nothing and evaluates nothing again. Then the champion loads through MLflow's own API, and
promote/rollback move it by hand.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmark_files import write_mmlu
from conftest import run_cli_here, stop_process

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]

REPO_DATA = Path(__file__).resolve().parents[2] / "data"
MODEL = "promo-demo"
FIRST_ROWS, APPENDED_ROWS = 24, 8
METRIC = "arith_mc_acc"
REAL_THRESHOLD = 0.05  # under one document of the 12 the score is the mean of: any higher score wins


def pipeline(data_dir: Path, *, min_improvement: float) -> dict:
    task_dir = data_dir.parent / "evaluation"
    return {
        "name": "promo",
        "defaults": {"dataset_dir": str(data_dir), "template": "default", "cutoff_len": 64, "seed": 7, "logging_steps": 1},
        "stages": [
            {"name": "base", "stage": "build_base", "corpus": "demo_pretrain", "vocab_size": 512, "hidden_size": 32,
             "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1},
            {"name": "sft", "stage": "sft", "from": "base", "finetuning_type": "lora", "lora_rank": 4, "lora_target": "all",
             "dataset": "demo_alpaca", "val_size": 0.25, "per_device_train_batch_size": 4, "learning_rate": 5.0e-3,
             "max_steps": 3},
        ],
        "evaluate": {"stage": "sft", "harness_tasks": "arith_mc", "harness_include_path": str(REPO_DATA / "harness_tasks"),
                     "harness_limit": 12, "benchmarks": "mmlu_test", "task_dir": str(task_dir), "n_shot": 2},
        "export": {"stage": "sft"},
        "register": {"model_name": MODEL, "promote_metric": METRIC, "min_improvement": min_improvement},
    }


def tuneline(*args: str, cwd: Path, timeout: float = 600, input: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TUNELINE_CACHE": str(cwd / "cache")}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "tuneline.flows.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env, input=input)


def stage_status(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^  (\S+)\s+(computed|served from cache)\s", stdout, flags=re.M))


def decision(stdout: str) -> str:
    return re.search(r"^promotion:\s+(.*)$", stdout, flags=re.M).group(1)


def append_rows(data_dir: Path, rows: list[dict]) -> None:
    path = data_dir / "demo_alpaca.json"
    path.write_text(json.dumps(json.loads(path.read_text()) + rows, ensure_ascii=False))


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def story(tmp_path_factory) -> dict:
    project = tmp_path_factory.mktemp("promotion")
    data_dir = project / "data"
    data_dir.mkdir()
    shutil.copy(REPO_DATA / "dataset_info.json", data_dir)
    shutil.copy(REPO_DATA / "demo_pretrain.jsonl", data_dir)
    rows = json.loads((REPO_DATA / "demo_alpaca.json").read_text())
    (data_dir / "demo_alpaca.json").write_text(json.dumps(rows[:FIRST_ROWS], ensure_ascii=False))
    write_mmlu(project / "evaluation")  # LLaMA-Factory's layout: 3 subjects of 8 test questions
    yaml_path = project / "pipeline.yaml"
    commit = None
    if shutil.which("git"):
        git("init", "-q", cwd=project)
        (project / ".gitignore").write_text("workspace/\ncache/\n")
        git("add", ".gitignore", cwd=project)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start", cwd=project)
        commit = git("rev-parse", "HEAD", cwd=project)
    runs = []
    steps = [(0.0, []), (-1000.0, rows[FIRST_ROWS:FIRST_ROWS + APPENDED_ROWS]),
             (REAL_THRESHOLD, rows[FIRST_ROWS + APPENDED_ROWS:FIRST_ROWS + 2 * APPENDED_ROWS]), (REAL_THRESHOLD, [])]
    for number, (threshold, new_rows) in enumerate(steps, start=1):
        if new_rows:
            append_rows(data_dir, new_rows)
        yaml_path.write_text(yaml.safe_dump(pipeline(data_dir, min_improvement=threshold)))
        # in this process, as `tuneline run` runs it: one interpreter and one warm worker for the four runs
        result = run_cli_here("run", str(yaml_path), "--workspace", "workspace", cwd=project)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        status = stage_status(result.stdout)
        print(f"run {number} (min_improvement {threshold:g}, {len(new_rows)} rows appended): {status}")
        print(f"run {number}: {decision(result.stdout)}")
        runs.append({"status": status, "decision": decision(result.stdout), "stdout": result.stdout})
    workspace = project / "workspace"
    return {"project": project, "workspace": workspace, "uri": f"sqlite:///{workspace / 'mlflow.db'}", "runs": runs,
            "commit": commit}


def client(story):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=story["uri"], registry_uri=story["uri"])


def test_retraining_reruns_what_read_the_data_and_promotes_only_a_winner(story):
    first, better, worse, unchanged = story["runs"]
    assert set(first["status"].values()) == {"computed"}
    assert "version 1 becomes champion: it is the first version" in first["decision"]
    for run in (better, worse):  # rows appended to demo_alpaca: sft and what follows rerun, base does not
        assert run["status"]["base"] == "served from cache"
        assert {run["status"][s] for s in ("sft/tokenize", "sft", "sft/evaluate", "sft/merge", "sft/export", "register")} \
            == {"computed"}
    assert re.search(rf"version 2 becomes champion: {METRIC} \S+ vs champion version 1's \S+ \(higher is better, needs -1000 better\)",
                     better["decision"])
    assert f"[{METRIC} read from 'sft/evaluate' (evaluate section)]" in worse["stdout"]
    assert set(unchanged["status"].values()) == {"served from cache"}
    assert "version 3 becomes challenger" in unchanged["decision"]

    registry = client(story)
    assert sorted(int(v.version) for v in registry.search_model_versions(f"name='{MODEL}'")) == [1, 2, 3]
    assert str(registry.get_model_version_by_alias(MODEL, "champion").version) == "2"
    assert str(registry.get_model_version_by_alias(MODEL, "challenger").version) == "3"
    assert json.loads(registry.get_registered_model(MODEL).tags["tuneline.champion_history"]) == ["1", "2"]


def test_the_lower_real_score_loses_and_the_decision_quotes_both_versions_scores(story):
    """Run 3 compares version 3 with champion version 2 at `REAL_THRESHOLD`: their real scores decide,
    and the scores the decision prints and logs (the register run's tag) are each version's score as
    the registry and its evaluate run hold it in MLflow."""
    registry = client(story)
    score = {v: float(registry.get_model_version(MODEL, v).tags[f"tuneline.metric.{METRIC}"]) for v in ("1", "2", "3")}
    print(f"{METRIC} of versions 1, 2, 3: {score}")
    runs = registry.search_runs([registry.get_experiment_by_name("promo").experiment_id],
                                filter_string="tags.mlflow.runName = 'sft/evaluate'", order_by=["attributes.start_time ASC"])
    assert [run.data.metrics[METRIC] for run in runs if run.data.tags.get("tuneline.cache_hit") != "true"] == \
        [score["1"], score["2"], score["3"]]
    assert score["3"] < score["2"]  # the appended rows cost version 3 at least one document
    worse, unchanged = story["runs"][2], story["runs"][3]
    pattern = (rf"version 3 becomes challenger: {METRIC} (\S+) vs champion version 2's (\S+) "
               rf"\(higher is better, needs {REAL_THRESHOLD:g} better\)")
    for run in (worse, unchanged):
        decided = re.search(pattern, run["decision"])
        assert decided, run["decision"]
        assert decided.groups() == (f"{score['3']:.4g}", f"{score['2']:.4g}"), run["decision"]
    better = re.search(rf"version 2 becomes champion: {METRIC} (\S+) vs champion version 1's (\S+) ", story["runs"][1]["decision"])
    assert better and better.groups() == (f"{score['2']:.4g}", f"{score['1']:.4g}"), story["runs"][1]["decision"]
    registering = registry.search_runs([registry.get_experiment_by_name("promo").experiment_id],
                                       filter_string="tags.mlflow.runName = 'register'", order_by=["attributes.start_time ASC"])
    logged = [run.data.tags["tuneline.promotion"] for run in registering]
    assert len(logged) == 4 and all(run["decision"].startswith(tag) for run, tag in zip(story["runs"], logged))
    assert str(registry.get_model_version_by_alias(MODEL, "champion").version) == "2"


def test_the_benchmark_scores_are_logged_by_the_evaluate_stage(story):
    """Each computed evaluation logs the harness metrics and the multiple-choice benchmark's accuracies
    to its MLflow run and its manifest; the harness score is the mean over the task's first
    `harness_limit` documents (a multiple of 1/12), MMLU's over 24 questions, 16 of them STEM."""
    runs = client(story).search_runs(
        [client(story).get_experiment_by_name("promo").experiment_id], filter_string="tags.mlflow.runName = 'sft/evaluate'")
    computed = [run for run in runs if run.data.tags.get("tuneline.cache_hit") != "true"]
    assert len(computed) == 3  # runs 1 to 3; run 4 served it from cache
    for run in computed:
        score = run.data.metrics[METRIC]
        assert {f"{METRIC}_stderr", "arith_mc_acc_norm"} <= set(run.data.metrics)
        assert abs(score * 12 - round(score * 12)) < 1e-9
        mmlu = {k: v for k, v in run.data.metrics.items() if k.startswith("mmlu_")}
        assert set(mmlu) == {"mmlu_accuracy", "mmlu_stem_accuracy", "mmlu_humanities_accuracy"}
        assert abs(mmlu["mmlu_accuracy"] * 24 - round(mmlu["mmlu_accuracy"] * 24)) < 1e-9
        assert abs(mmlu["mmlu_stem_accuracy"] * 16 - round(mmlu["mmlu_stem_accuracy"] * 16)) < 1e-9
    latest = max(computed, key=lambda run: run.info.start_time)  # run 3's, which run 4 was served
    manifest = json.loads((Path(stage_path(story, "sft/evaluate")) / "manifest.json").read_text())
    assert manifest["metrics"][METRIC] == latest.data.metrics[METRIC]


def test_each_version_carries_its_lineage(story):
    from tuneline.core.store.fingerprints import package_version

    tags = client(story).get_model_version(MODEL, "3").tags
    lineage = {k: v for k, v in tags.items() if k.startswith("tuneline.") and not k.startswith("tuneline.metric.")}
    print(json.dumps(lineage, indent=1))
    assert {"tuneline.key.base", "tuneline.key.sft/tokenize", "tuneline.key.sft", "tuneline.key.sft/merge",
            "tuneline.key.sft/export"} <= set(tags)
    assert tags["tuneline.key.sft/export"] == tags["tuneline.export_key"]
    assert {"tuneline.data.demo_alpaca", "tuneline.data.demo_pretrain"} <= set(tags)
    assert tags["tuneline.data.demo_alpaca"] != client(story).get_model_version(MODEL, "2").tags["tuneline.data.demo_alpaca"]
    assert tags["tuneline.version"] == package_version()
    assert tags["tuneline.mlflow_flavor"] == "transformers"
    if story["commit"]:
        assert tags["tuneline.git_commit"] == story["commit"]


def test_champion_loads_through_mlflow_and_answers_a_demo_prompt(story, monkeypatch):
    import mlflow
    from transformers import AutoTokenizer

    # through the environment, undone after the test: mlflow.set_tracking_uri would also set
    # MLFLOW_TRACKING_URI for good, and every later store of the process would be this one
    monkeypatch.setenv("MLFLOW_TRACKING_URI", story["uri"])
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", story["uri"])
    question = json.loads((REPO_DATA / "demo_heldout.json").read_text())[0]
    messages = [{"role": "user", "content": question.get("instruction") or question["messages"][0]["content"]}]
    chat = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    answer = chat.predict({"messages": messages, "max_tokens": 12})[0]
    reply = answer["choices"][0]["message"]["content"]
    print(f"prompt: {messages[0]['content']!r}\nreply from models:/{MODEL}@champion (pyfunc): {reply!r}")
    assert answer["choices"][0]["message"]["role"] == "assistant" and isinstance(reply, str) and reply
    pipe = mlflow.transformers.load_model(f"models:/{MODEL}@champion")
    exported = AutoTokenizer.from_pretrained(stage_path(story, "sft/export"))
    assert pipe.tokenizer.chat_template == exported.chat_template
    rendered = exported.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert answer["usage"]["prompt_tokens"] == len(rendered)  # the prompt went through the chat template
    generated = pipe(messages, max_new_tokens=12, do_sample=False)[0]["generated_text"][-1]
    print(f"reply (mlflow.transformers pipeline): {generated['content']!r}")
    assert generated["role"] == "assistant"


def test_the_champion_is_served_from_the_registry_as_training_rendered_it(story):
    """`tuneline api models:/promo-demo@champion` serves version 2's exported folder; the answer equals the
    exported model's greedy generate() on the prompt ids training's template encoder writes, and the usage
    block counts exactly those ids (the export's parity gate made its chat template write them)."""
    from openai import OpenAI

    from serving_server import exported_greedy, start_server

    server = start_server("api", f"models:/{MODEL}@champion", folder=story["project"]).wait()
    try:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "Give three tips for staying healthy."}]
        completion = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=10)
    finally:
        stop_process(server.process)
    log = server.log.read_text()
    assert "version 2" in log and "exported folder" in log, log[-2000:]
    prompt, expected = exported_greedy(stage_path_of_version(story, "2"), messages, template="default", max_new_tokens=10)
    print(f"served champion (version 2) answered {completion.choices[0].message.content!r}")
    assert completion.usage.prompt_tokens == len(prompt)
    assert completion.choices[0].message.content.strip() == expected.strip()
    chat = tuneline("chat", f"models:/{MODEL}@champion", "--workspace", "workspace", "--no-do-sample", "--max-new-tokens", "10",
                    cwd=story["project"], input=messages[0]["content"] + "\n")
    assert chat.returncode == 0, chat.stderr[-2000:]
    assert f"Assistant: {expected.strip()}" in chat.stdout, chat.stdout  # `tuneline chat` talks to the same champion


def stage_path_of_version(story, version: str) -> Path:
    """The exported folder a registered version came from (its registering run's `export` parameter)."""
    registry = client(story)
    run = registry.get_run(registry.get_model_version(MODEL, version).run_id)
    return Path(run.data.params["export"])


def stage_path(story, name: str) -> str:
    rows = re.findall(rf"^  {re.escape(name)}\s+(?:computed|served from cache)\s+(?:\S+ s)?\s+(\S+)$",
                      story["runs"][-1]["stdout"], flags=re.M)
    return rows[0]


def test_promote_and_rollback_move_the_champion_by_hand(story):
    project, registry = story["project"], client(story)

    def cli(*args: str) -> subprocess.CompletedProcess:
        result = run_cli_here(*args, cwd=project)  # in this process: eight commands, no interpreter start each
        print(f"$ tuneline {' '.join(args)} -> {result.returncode}: {(result.stdout + result.stderr).strip()}")
        return result

    assert cli("promote", MODEL, "3", "--workspace", "workspace").returncode == 0
    assert str(registry.get_model_version_by_alias(MODEL, "champion").version) == "3"
    assert "challenger" not in registry.get_registered_model(MODEL).aliases  # version 3 is champion now
    assert cli("rollback", MODEL, "--tracking-uri", story["uri"]).returncode == 0
    assert str(registry.get_model_version_by_alias(MODEL, "champion").version) == "2"
    assert cli("rollback", MODEL, "--workspace", "workspace").returncode == 0
    assert str(registry.get_model_version_by_alias(MODEL, "champion").version) == "1"

    nothing = cli("rollback", MODEL, "--workspace", "workspace")
    assert nothing.returncode == 2 and "nothing to roll back to" in nothing.stderr and "Traceback" not in nothing.stderr
    missing_version = cli("promote", MODEL, "99", "--workspace", "workspace")
    assert missing_version.returncode == 2 and "no version '99'" in missing_version.stderr and "1, 2, 3" in missing_version.stderr
    missing_model = cli("promote", "promo-dmeo", "1", "--workspace", "workspace")
    assert missing_model.returncode == 2 and "did you mean 'promo-demo'" in missing_model.stderr
    no_store = cli("rollback", MODEL, "--workspace", "elsewhere")
    assert no_store.returncode == 2 and "no MLflow store" in no_store.stderr
    assert str(registry.get_model_version_by_alias(MODEL, "champion").version) == "1"
