"""The hub tokens (`hf_hub_token`, `ms_hub_token`, `om_hub_token`) are read as LLaMA-Factory reads them
and never written anywhere: not in the manifest, the MLflow store, the job file or the output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
SECRETS = {"hf_hub_token": "hf_tok3nHF", "ms_hub_token": "ms-tok3nMS", "om_hub_token": "om-tok3nOM"}


@pytest.mark.slow
def test_hub_tokens_reach_the_worker_and_no_file_mlflow_or_log(tiny_base: Path, tmp_path: Path, monkeypatch):
    from tuneline.core.pipeline.stage_runs import train_job
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data
    from tuneline.core.store.artifacts import find_artifact, write_artifact
    from tuneline.core.tracking import runs as tracking
    from tuneline.core.training.job import TrainJob
    from tuneline.core.worker.launch import JOB_FILE, launch_training

    config = build_stage_config({
        "model_name_or_path": str(tiny_base), "stage": "sft", "lora_rank": 4, "dataset": "demo_alpaca",
        "dataset_dir": str(REPO_ROOT / "data"), "template": "chatml", "cutoff_len": 32, "max_samples": 4, "max_steps": 1,
        "logging_steps": 1, "report_to": "none", "output_dir": "unused", **SECRETS})
    assert (config.model.hf_hub_token, config.model.ms_hub_token, config.model.om_hub_token) == tuple(SECRETS.values())
    tokenize_stage_data(config, tokenizer_path=tiny_base, output_dir=tmp_path / "tokenized")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment_id = tracking.ensure_experiment(uri, "tokens", artifact_root=tmp_path / "mlartifacts")
    lines: list[str] = []
    with tracking.tracked_run(uri, experiment_id, name="sft") as run_id:
        params = config.flat()  # what a pipeline's train task logs and records
        tracking.log_params(uri, run_id, params)
        tracking.log_dict(uri, run_id, params, "config.json")
        with write_artifact(tmp_path / "workspace", "trained", "key", config=tracking.redact(params)) as draft:
            job = train_job(config, start_model=str(tiny_base), dataset_path=str(tmp_path / "tokenized"),
                            output_dir=str(draft.path), training=config.training, tracking_uri=uri, run_id=run_id)
            metrics = launch_training(job, log=lines.append)
            tracking.log_artifact(uri, run_id, draft.path / "trainer_log.jsonl")
    assert metrics["train_loss"] > 0

    artifact = find_artifact(tmp_path / "workspace", "trained", "key")
    assert artifact is not None and artifact.manifest["config"]["hf_hub_token"] == tracking.REDACTED
    assert tracking.client(uri).get_run(run_id).data.params["ms_hub_token"] == tracking.REDACTED
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert any(path.name == "mlflow.db" for path in written) and any(path.name == JOB_FILE for path in written)
    for name, secret in SECRETS.items():
        assert not [path for path in written if secret.encode() in path.read_bytes()], name
        assert secret not in "\n".join(lines), name

    job_file = artifact.path / JOB_FILE
    assert json.loads(job_file.read_text())["model"]["hf_hub_token"] == "$TUNELINE_HF_HUB_TOKEN"
    monkeypatch.setenv("TUNELINE_HF_HUB_TOKEN", SECRETS["hf_hub_token"])  # what the launcher gives the worker
    assert TrainJob.read(job_file).model["hf_hub_token"] == SECRETS["hf_hub_token"]
    assert job.secret_env() == {"TUNELINE_HF_HUB_TOKEN": "hf_tok3nHF", "TUNELINE_MS_HUB_TOKEN": "ms-tok3nMS",
                                "TUNELINE_OM_HUB_TOKEN": "om-tok3nOM"}
