"""The training job: everything a worker process needs to train one stage, as a JSON file.

The job names only paths and plain values: a tokenized dataset (with its fixed tokenizer), the
model to start from, the method and the trainer arguments. Preprocessing is finished before the job
is written (docs/ARCHITECTURE.md, "Training runs in a worker"), so no worker ever tokenizes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG_FILE = "trainer_log.jsonl"
LOSS_PLOT = "training_loss.png"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
TRACKING_URI_FROM_ENV = "$MLFLOW_TRACKING_URI"  # what job.json holds instead of a URI taken from the environment
# The secrets a job may carry (section, key) and the variable of the worker's environment that
# carries each instead of job.json, so that no token lands in an output folder or an artifact.
SECRET_ENV = {
    ("model", "hf_hub_token"): "TUNELINE_HF_HUB_TOKEN",
    ("model", "ms_hub_token"): "TUNELINE_MS_HUB_TOKEN",
    ("model", "om_hub_token"): "TUNELINE_OM_HUB_TOKEN",
    ("training", "hub_token"): "TUNELINE_HUB_TOKEN",
}


@dataclass(frozen=True)
class TrainJob:
    """Everything a worker needs, written as JSON to the stage directory."""

    model_path: str
    dataset_path: str
    output_dir: str
    finetuning: dict[str, Any]
    training: dict[str, Any]
    model: dict[str, Any] = field(default_factory=dict)
    generating: dict[str, Any] = field(default_factory=dict)  # GeneratingConfig for do_predict
    data: dict[str, Any] = field(default_factory=dict)  # DataConfig: the worker reads eval_num_beams, ignore_pad_token_for_loss
    optimizer: dict[str, Any] = field(default_factory=dict)  # OptimizerConfig: GaLore, APOLLO, BAdam, Adam-mini, Muon
    runtime: dict[str, Any] = field(default_factory=dict)  # RuntimeConfig: the profiler keys
    tracking_uri: str | None = None
    run_id: str | None = None
    keep_checkpoints: bool = True
    world_size: int = 1  # processes the launcher starts (NPROC_PER_NODE x NNODES); the worker checks it
    overwrite_output_dir: bool = False  # start over instead of resuming from output_dir's checkpoints
    model_max_length: int | None = None  # the stage's cutoff_len, which rope_scaling stretches RoPE to
    ray: dict[str, Any] = field(default_factory=dict)  # RayConfig: the launcher reads it, the worker does not

    def secret_env(self) -> dict[str, str]:
        """The job's secrets by the variables (SECRET_ENV) that carry them into the worker."""
        values = dataclasses.asdict(self)
        return {variable: values[section][key] for (section, key), variable in SECRET_ENV.items()
                if values[section].get(key)}

    def write(self, path: str | Path) -> Path:
        """A tracking URI taken from MLFLOW_TRACKING_URI (it may hold a password) is written as a
        reference to that variable, which the worker inherits, so it never lands in the workspace;
        each secret of SECRET_ENV likewise as `$VARIABLE`, its value passed in `secret_env()`."""
        values = dataclasses.asdict(self)
        if values["tracking_uri"] and values["tracking_uri"] == os.environ.get(TRACKING_URI_ENV):
            values["tracking_uri"] = TRACKING_URI_FROM_ENV
        for (section, key), variable in SECRET_ENV.items():
            if values[section].get(key):
                values[section][key] = f"${variable}"
        path = Path(path)
        path.write_text(json.dumps(values, indent=2), encoding="utf-8")
        return path

    @classmethod
    def read(cls, path: str | Path) -> TrainJob:
        values = json.loads(Path(path).read_text(encoding="utf-8"))
        if values.get("tracking_uri") == TRACKING_URI_FROM_ENV:
            values["tracking_uri"] = os.environ.get(TRACKING_URI_ENV)
        for (section, key), variable in SECRET_ENV.items():
            if values.get(section, {}).get(key) == f"${variable}":
                values[section][key] = os.environ.get(variable)
        return cls(**values)
