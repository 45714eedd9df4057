"""MLflow as a server: `tuneline run` with MLFLOW_TRACKING_URI=http://... logs every stage to a real
`mlflow server` (tests/cluster_services.py) whose artifacts go to the object store (SeaweedFS), and the
champion it registers loads and answers where nothing of the run is local.

One run per module: a LoRA SFT of the tiny base (2 steps), exported and registered. The client holds
no object-store credentials, so every artifact reaches the bucket through the server. Then the
workspace is moved away (the registry's record of the exported folder points nowhere, as on another
machine) and an empty folder with only MLFLOW_TRACKING_URI plays the third machine:
`mlflow.pyfunc.load_model("models:/NAME@champion")` in a fresh interpreter, and `tuneline api`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import run_cli_here, stop_process
from serving_server import exported_greedy, start_server

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]

REPO_DATA = Path(__file__).resolve().parents[2] / "data"
MODEL = "served-demo"
STAGES = {"sft/tokenize", "sft", "sft/merge", "sft/export", "register"}
PROMPT = "Give three tips for staying healthy."
MAX_TOKENS = 8
SECRET = "s3cret-9d2e"


def pipeline(tiny_base: Path) -> dict:
    return {
        "name": "tracking-server",
        "defaults": {"dataset_dir": str(REPO_DATA), "template": "default", "cutoff_len": 64, "seed": 7, "logging_steps": 1},
        "stages": [{"name": "sft", "stage": "sft", "model_name_or_path": str(tiny_base), "finetuning_type": "lora",
                    "lora_rank": 4, "lora_target": "all", "dataset": "demo_alpaca", "max_samples": 8,
                    "per_device_train_batch_size": 4, "max_steps": 2}],
        "export": {"stage": "sft"},
        "register": {"model_name": MODEL},
    }


def without_store_credentials(env: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if not key.startswith("AWS_")}


@pytest.fixture(scope="module")
def served_run(tiny_base: Path, mlflow_server, tmp_path_factory) -> dict:
    project = tmp_path_factory.mktemp("tracking_server")
    (project / "pipeline.yaml").write_text(yaml.safe_dump(pipeline(tiny_base)))
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update({**without_store_credentials(saved), "MLFLOW_TRACKING_URI": mlflow_server.uri})
    try:  # in this process, as `tuneline run` runs it; its training worker inherits the variable
        result = run_cli_here("run", "pipeline.yaml", "--workspace", "workspace", cwd=project)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    parent = re.search(rf"^MLflow:\s+{re.escape(mlflow_server.uri)} \(parent run (\w+)\)$", result.stdout, flags=re.M)
    assert parent, result.stdout[-3000:]
    moved = project / "elsewhere"
    (project / "workspace").rename(moved)  # the exported folder the registry recorded is gone
    machine = project / "third_machine"
    machine.mkdir()
    env = {**without_store_credentials(dict(os.environ)), "MLFLOW_TRACKING_URI": mlflow_server.uri, "OMP_NUM_THREADS": "1"}
    # started now, so that it loads while the pyfunc test runs; waited for by the api test
    api = start_server("api", f"models:/{MODEL}@champion", folder=machine, env={"MLFLOW_TRACKING_URI": mlflow_server.uri})
    try:
        yield {"project": project, "workspace": moved, "parent_run_id": parent.group(1), "stdout": result.stdout,
               "machine": machine, "env": env, "api": api}
    finally:
        stop_process(api.process)


def client(mlflow_server):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=mlflow_server.uri, registry_uri=mlflow_server.uri)


def exported_folder(workspace: Path) -> Path:
    folder, = (workspace / "artifacts" / "export").glob("export-*")
    return folder


def test_every_stage_is_a_child_run_of_the_pipeline_run_on_the_server(served_run, mlflow_server):
    registry = client(mlflow_server)
    experiment = registry.get_experiment_by_name("tracking-server")
    runs = registry.search_runs([experiment.experiment_id])
    parent = registry.get_run(served_run["parent_run_id"])
    children = [run for run in runs if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.data.tags["tuneline.pipeline"] == "tracking-server" and parent.info.status == "FINISHED"
    assert {run.info.run_name for run in children} == STAGES and len(children) == len(STAGES)
    assert {run.info.status for run in children} == {"FINISHED"}
    assert all(run.data.tags.get("tuneline.worker") for run in children)
    trained, = (run for run in children if run.info.run_name == "sft")
    losses = registry.get_metric_history(trained.info.run_id, "loss")  # logged by the training worker process
    assert [metric.step for metric in losses] == [1, 2], losses
    assert all(run.info.artifact_uri.startswith("mlflow-artifacts:/") for run in [parent, *children])
    workspace = served_run["workspace"]
    assert not (workspace / "mlflow.db").exists() and not (workspace / "mlartifacts").exists()


def test_a_password_in_the_server_uri_is_never_printed(mlflow_server, capfd):
    """MLflow prints each ended run's page as the tracking URI it was given; with a password in it, it
    does not (the server here ignores the credentials, so the run is logged all the same)."""
    from tuneline.core.tracking import runs as tracking

    uri = mlflow_server.uri.replace("http://", f"http://trainer:{SECRET}@")
    experiment_id = tracking.ensure_experiment(uri, "password-in-uri")
    with tracking.tracked_run(uri, experiment_id, name="masked") as run_id:
        tracking.log_params(uri, run_id, {"tracking_uri": uri})
    printed = "".join(capfd.readouterr())
    run = client(mlflow_server).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["tracking_uri"] == uri.replace(SECRET, "***")
    assert SECRET not in printed


def test_the_champion_is_registered_with_its_artifacts_in_the_bucket(served_run, mlflow_server, s3_store):
    from safetensors.torch import load, load_file

    registry = client(mlflow_server)
    champion = registry.get_model_version_by_alias(MODEL, "champion")
    assert str(champion.version) == "1" and champion.source.startswith("mlflow-artifacts:/")
    assert champion.tags["tuneline.mlflow_flavor"] == "transformers"
    run = registry.get_run(champion.run_id)
    assert run.info.run_name == "register" and run.data.tags["mlflow.parentRunId"] == served_run["parent_run_id"]
    bucket = s3_store.filesystem()
    prefix = f"{mlflow_server.artifacts.removeprefix('s3://')}/{run.info.experiment_id}/{run.info.run_id}/artifacts/model"
    stored = {path.removeprefix(prefix + "/") for path in bucket.find(prefix)}
    print(f"{len(stored)} objects under s3://{prefix}: {sorted(stored)}")
    assert {"MLmodel", "model/config.json", "model/model.safetensors", "components/tokenizer/tokenizer.json"} <= stored
    weights = load(bucket.cat_file(f"{prefix}/model/model.safetensors"))
    exported = load_file(exported_folder(served_run["workspace"]) / "model.safetensors")
    assert weights.keys() == exported.keys() and all((weights[name] == exported[name]).all() for name in exported)
    assert not list(mlflow_server.folder.rglob("model.safetensors"))  # the server kept no copy of its own


PYFUNC_SCRIPT = f"""
import json, mlflow
chat = mlflow.pyfunc.load_model("models:/{MODEL}@champion")
answer = chat.predict({{"messages": [{{"role": "user", "content": {PROMPT!r}}}], "max_tokens": {MAX_TOKENS}}})[0]
print(json.dumps(answer))
"""


def test_pyfunc_loads_the_champion_in_a_fresh_process_with_nothing_local(served_run):
    from transformers import AutoTokenizer

    result = subprocess.run([sys.executable, "-c", PYFUNC_SCRIPT], cwd=served_run["machine"], env=served_run["env"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    reply = answer["choices"][0]["message"]
    print(f"models:/{MODEL}@champion (pyfunc, fresh process) answered {reply['content']!r}")
    assert reply["role"] == "assistant" and isinstance(reply["content"], str)
    tokenizer = AutoTokenizer.from_pretrained(exported_folder(served_run["workspace"]))
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"]
    assert answer["usage"]["prompt_tokens"] == len(rendered)  # the champion's own chat template rendered it
    assert 0 < answer["usage"]["completion_tokens"] <= MAX_TOKENS


def test_tuneline_api_serves_the_champion_downloaded_from_the_server(served_run):
    """The answer equals the exported model's own greedy generate() on the prompt ids training's
    template encoder writes: the downloaded champion is the exported model, rendered as it trained."""
    from openai import OpenAI

    server = served_run["api"].wait()
    try:
        api = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": PROMPT}]
        completion = api.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=MAX_TOKENS)
    finally:
        stop_process(server.process)
    log = server.log.read_text()
    assert "version 1" in log and "downloaded artifact" in log, log[-2000:]
    prompt, expected = exported_greedy(exported_folder(served_run["workspace"]), messages, template="default",
                                       max_new_tokens=MAX_TOKENS)
    print(f"tuneline api (models:/{MODEL}@champion, downloaded) answered {completion.choices[0].message.content!r}")
    assert completion.usage.prompt_tokens == len(prompt)
    assert completion.choices[0].message.content.strip() == expected.strip()
    assert (served_run["machine"] / "cache" / "registry" / MODEL).is_dir()  # downloaded into the machine's own cache
