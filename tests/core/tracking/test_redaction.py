"""Secrets never reach MLflow: `log_params` and `log_dict` mask them, checked against a real SQLite store."""

from __future__ import annotations

import json

from tuneline.core.tracking import runs as tracking
from tuneline.core.tracking.runs import REDACTED, redact

SECRET = "hf_s3cr3tValue"
CONFIG = {
    "hub_token": SECRET,
    "hf_hub_token": SECRET,
    "api_key": SECRET,
    "db_password": SECRET,
    "model_name_or_path": f"https://alice:{SECRET}@models.example.com/tiny",
    "mlflow": {"tracking_uri": f"postgresql://mlflow:{SECRET}@db:5432/mlflow"},
    "callbacks": [f"http://bob:{SECRET}@hooks.example.com/x"],
    "learning_rate": 0.001,
    "max_new_tokens": 24,
    "pad_token": "<pad>",
    "tokenizer_path": "/models/tok",
    "use_auth_token": False,
    "hf_hub_url": "org/dataset",
}


def test_redact_masks_secret_keys_and_uri_passwords_and_keeps_the_rest():
    safe = redact(CONFIG)
    assert SECRET not in json.dumps(safe)
    for key in ("hub_token", "hf_hub_token", "api_key", "db_password"):
        assert safe[key] == REDACTED
    assert safe["model_name_or_path"] == f"https://alice:{REDACTED}@models.example.com/tiny"
    assert safe["mlflow"]["tracking_uri"] == f"postgresql://mlflow:{REDACTED}@db:5432/mlflow"
    assert safe["callbacks"] == [f"http://bob:{REDACTED}@hooks.example.com/x"]
    for key in ("learning_rate", "max_new_tokens", "pad_token", "tokenizer_path", "use_auth_token", "hf_hub_url"):
        assert safe[key] == CONFIG[key]
    assert CONFIG["hub_token"] == SECRET  # the caller's mapping is left as it was


def test_params_and_config_artifact_in_mlflow_hold_no_secret(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment_id = tracking.ensure_experiment(uri, "redaction", artifact_root=tmp_path / "mlartifacts")
    with tracking.tracked_run(uri, experiment_id, name="stage") as run_id:
        tracking.log_params(uri, run_id, CONFIG)
        tracking.log_dict(uri, run_id, CONFIG, "config.json")

    client = tracking.client(uri)
    params = client.get_run(run_id).data.params
    assert params["hub_token"] == REDACTED and params["learning_rate"] == "0.001" and params["pad_token"] == "<pad>"
    assert all(SECRET not in value for value in params.values())
    stored = (tmp_path / "mlartifacts").rglob("config.json")
    texts = [path.read_text() for path in stored]
    assert len(texts) == 1 and SECRET not in texts[0] and json.loads(texts[0])["max_new_tokens"] == 24


def test_a_tracking_uri_from_the_environment_stays_off_the_disk(tmp_path, monkeypatch):
    from tuneline.core.training.job import TrainJob

    uri = f"https://trainer:{SECRET}@mlflow.example.com"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    job = TrainJob(model_path="m", dataset_path="d", output_dir="o", finetuning={}, training={}, tracking_uri=uri, run_id="r")
    path = job.write(tmp_path / "job.json")
    assert SECRET not in path.read_text()
    assert TrainJob.read(path).tracking_uri == uri  # the worker inherits the variable
    sqlite = TrainJob(model_path="m", dataset_path="d", output_dir="o", finetuning={}, training={},
                      tracking_uri="sqlite:////ws/mlflow.db")
    assert TrainJob.read(sqlite.write(tmp_path / "job2.json")).tracking_uri == "sqlite:////ws/mlflow.db"
