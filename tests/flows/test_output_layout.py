"""Every stage kind run by `tuneline train` writes LLaMA-Factory's output layout, file for file.

The expected files and log keys (tests/data/output_layout.json) were recorded from the release
before stage kinds had a registry; a kind that changes what it writes must change them on purpose.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LAYOUT = json.loads((REPO / "tests/data/output_layout.json").read_text())["kinds"]
# LLaMA-Factory's trainer_log.jsonl keys that every kind writes.
STEP_KEYS = {"current_steps", "total_steps", "loss", "lr", "epoch", "percentage", "elapsed_time", "remaining_time"}
KINDS = {
    "pt": {"stage": "pt", "dataset": "demo_pretrain"},
    "sft": {"stage": "sft", "dataset": "demo_alpaca", "val_size": 4},
    "rm": {"stage": "rm", "dataset": "demo_preference", "eval_dataset": "demo_preference_heldout"},
    "dpo": {"stage": "dpo", "dataset": "demo_preference", "eval_dataset": "demo_preference_heldout"},
    "kto": {"stage": "kto", "dataset": "demo_kto"},
    "ppo": {"stage": "ppo", "dataset": "demo_alpaca", "reward_model": "rm", "max_new_tokens": 8, "val_size": 4},
}


def files_of(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def log_keys(folder: Path) -> set[str]:
    return {key for line in (folder / "trainer_log.jsonl").read_text().splitlines() for key in json.loads(line)}


@pytest.fixture(scope="module")
def trained(tiny_base: Path, tmp_path_factory) -> Path:
    """One 2-step LoRA run of each kind (ppo scored by the rm run), each in its own output_dir."""
    root = tmp_path_factory.mktemp("layout")
    common = {"model_name_or_path": str(tiny_base), "finetuning_type": "lora", "lora_rank": 4, "dataset_dir": str(REPO / "data"),
              "template": "chatml", "cutoff_len": 64, "max_samples": 16, "per_device_train_batch_size": 2, "max_steps": 2,
              "logging_steps": 1, "seed": 7, "report_to": "none", "learning_rate": 1e-3}
    env = {**os.environ, "TUNELINE_CACHE": str(root / "cache"), "OMP_NUM_THREADS": "1"}
    for name, values in KINDS.items():
        values = {**values, **({"reward_model": str(root / values["reward_model"])} if "reward_model" in values else {})}
        config = root / f"{name}.yaml"
        config.write_text(yaml.safe_dump({**common, **values, "output_dir": str(root / name)}))
        result = subprocess.run([sys.executable, "-m", "tuneline.flows.cli", "train", str(config)], capture_output=True,
                                text=True, env=env, timeout=300)
        assert result.returncode == 0, f"{name}: {result.stdout[-2000:]}{result.stderr[-2000:]}"
    return root


@pytest.mark.parametrize("kind", list(KINDS))
def test_tuneline_train_writes_the_layout_of_each_kind(trained: Path, kind: str):
    folder = trained / kind
    assert files_of(folder) == LAYOUT[kind]["files"]
    assert log_keys(folder) == set(LAYOUT[kind]["log_keys"])
    assert STEP_KEYS <= log_keys(folder)
    results = json.loads((folder / "all_results.json").read_text())
    assert set(json.loads((folder / "train_results.json").read_text())) <= set(results)
