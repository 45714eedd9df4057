"""One short training run in the worker, tracked in MLflow as a pipeline's train task tracks it, with
the hub tokens and the profiler keys set:

- the tokens (`hf_hub_token`, `ms_hub_token`, `om_hub_token`) are read and never written anywhere: not
  in the manifest, the MLflow store, the job file, the output or the log;
- `enable_torch_profiler` writes a Chrome trace of the active step and logs it to the run, and
  `profile_modules` prints the matched modules' times at each logging step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
SECRETS = {"hf_hub_token": "hf_tok3nHF", "ms_hub_token": "ms-tok3nMS", "om_hub_token": "om-tok3nOM"}
TRAINER_TOKEN = "hf_tr4inerTok"  # transformers' own `hub_token`, which its trainer pickles into training_args.bin
PROFILER = {"enable_torch_profiler": True, "profiler_wait_steps": 1, "profiler_warmup_steps": 1, "profiler_active_steps": 1,
            "profiler_repeat": 1, "profiler_with_stack": False, "profile_modules": "*.layers.*.mlp"}


@dataclass(frozen=True)
class TrackedRun:
    root: Path
    uri: str
    run_id: str
    artifact: Path
    manifest: dict
    lines: list[str]
    metrics: dict


@pytest.fixture(scope="module")
def tracked(tiny_base: Path, tmp_path_factory) -> TrackedRun:
    from tuneline.core.pipeline.stage_runs import train_job
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.store.artifacts import find_artifact, write_artifact
    from tuneline.core.tracking import runs as tracking
    from tuneline.core.worker.launch import launch_training

    root = tmp_path_factory.mktemp("tracked")
    config = build_stage_config({
        "model_name_or_path": str(tiny_base), "stage": "sft", "lora_rank": 4, "dataset": "demo_alpaca",
        "dataset_dir": str(REPO_ROOT / "data"), "template": "chatml", "cutoff_len": 32, "max_samples": 8, "max_steps": 3,
        "per_device_train_batch_size": 2, "logging_steps": 1, "report_to": "none", "output_dir": "unused", "hub_token": TRAINER_TOKEN,
        **SECRETS, **PROFILER})
    assert (config.model.hf_hub_token, config.model.ms_hub_token, config.model.om_hub_token) == tuple(SECRETS.values())
    tokenize_stage_data(config, tokenizer_path=tiny_base, output_dir=root / "tokenized")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    experiment_id = tracking.ensure_experiment(uri, "tracked", artifact_root=root / "mlartifacts")
    lines: list[str] = []
    with tracking.tracked_run(uri, experiment_id, name="sft") as run_id:
        params = config.flat()  # what a pipeline's train task logs and records
        tracking.log_params(uri, run_id, params)
        tracking.log_dict(uri, run_id, params, "config.json")
        with write_artifact(root / "workspace", "trained", "key", config=tracking.redact(params)) as draft:
            job = train_job(config, start_model=str(tiny_base), dataset_path=str(root / "tokenized"),
                            output_dir=str(draft.path), training=config.training, tracking_uri=uri, run_id=run_id)
            metrics = launch_training(job, log=lines.append)
            tracking.log_artifact(uri, run_id, draft.path / "trainer_log.jsonl")
    artifact = find_artifact(root / "workspace", "trained", "key")
    assert artifact is not None
    return TrackedRun(root=root, uri=uri, run_id=run_id, artifact=artifact.path, manifest=artifact.manifest, lines=lines,
                      metrics=metrics)


@pytest.mark.slow
def test_hub_tokens_reach_the_worker_and_no_file_mlflow_record_or_log(tracked: TrackedRun, monkeypatch):
    from tuneline.core.tracking import runs as tracking
    from tuneline.core.training.job import TrainJob
    from tuneline.core.worker.launch import JOB_FILE

    assert tracked.metrics["train_loss"] > 0
    assert tracked.manifest["config"]["hf_hub_token"] == tracking.REDACTED
    assert tracking.client(tracked.uri).get_run(tracked.run_id).data.params["ms_hub_token"] == tracking.REDACTED
    written = [path for path in tracked.root.rglob("*") if path.is_file()]
    assert any(path.name == "mlflow.db" for path in written) and any(path.name == JOB_FILE for path in written)
    assert any(path.name == "training_args.bin" for path in written)
    for name, secret in {**SECRETS, "hub_token": TRAINER_TOKEN}.items():
        assert not [path for path in written if secret.encode() in path.read_bytes()], name
        assert secret not in "\n".join(tracked.lines), name

    job_file = tracked.artifact / JOB_FILE
    assert json.loads(job_file.read_text())["model"]["hf_hub_token"] == "$TUNELINE_HF_HUB_TOKEN"
    carried = {"TUNELINE_HF_HUB_TOKEN": "hf_tok3nHF", "TUNELINE_MS_HUB_TOKEN": "ms-tok3nMS", "TUNELINE_OM_HUB_TOKEN": "om-tok3nOM"}
    for variable, value in carried.items():
        monkeypatch.setenv(variable, value)  # what the launcher gives the worker
    job = TrainJob.read(job_file)
    assert {key: job.model[key] for key in SECRETS} == SECRETS and job.secret_env() == carried


@pytest.mark.slow
def test_the_profiler_writes_the_active_steps_trace_and_logs_it(tracked: TrackedRun):
    from tuneline.core.tracking import runs as tracking

    traces = sorted((tracked.artifact / "profiler" / "rank_0").iterdir())
    assert len(traces) == 1 and traces[0].name.endswith(".pt.trace.json")  # one cycle, no partial file left
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any(event.get("name", "").startswith("aten::") for event in events)
    logged = tracking.client(tracked.uri).list_artifacts(tracked.run_id, "profiler/rank_0")
    assert [Path(item.path).name for item in logged] == [traces[0].name]
    assert any((tracked.root / "mlartifacts").rglob(traces[0].name))
    times = [line for line in tracked.lines if "layers.1.mlp: forward" in line]
    assert len(times) == 3  # one per logging step
    forward = float(times[0].split("forward ")[1].split(",")[0])
    assert forward > 0
