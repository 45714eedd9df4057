"""Every stage kind run by `tuneline train` writes LLaMA-Factory's output layout, file for file.

The expected files and log keys (tests/data/output_layout.json) were recorded from the release
before stage kinds had a registry. The runs that other tests make check them (`assert_output_layout`:
sft in test_single_stage, rm, dpo and kto in test_llamafactory_examples, ppo in test_ppo, every kind of
a pipeline in test_chain); pt, which no other test trains with `tuneline train`, is run here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import assert_output_layout

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tuneline_train_writes_the_layout_of_stage_pt(tiny_base: Path, tmp_path: Path):
    config = tmp_path / "pt.yaml"
    config.write_text(yaml.safe_dump({
        "model_name_or_path": str(tiny_base), "stage": "pt", "finetuning_type": "lora", "lora_rank": 4,
        "dataset": "demo_pretrain", "dataset_dir": str(REPO / "data"), "template": "chatml", "cutoff_len": 64,
        "max_samples": 16, "per_device_train_batch_size": 2, "max_steps": 2, "logging_steps": 1, "seed": 7,
        "report_to": "none", "learning_rate": 1e-3, "output_dir": str(tmp_path / "pt"),
    }))
    env = {**os.environ, "TUNELINE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "tuneline.flows.cli", "train", str(config)], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert_output_layout(tmp_path / "pt", "pt")


def test_the_recorded_layout_covers_every_stage_kind():
    import json

    from tuneline.core.stages.registry import STAGE_NAMES

    assert set(json.loads((REPO / "tests/data/output_layout.json").read_text())["kinds"]) == set(STAGE_NAMES)
