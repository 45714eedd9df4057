"""Shared test fixtures.

The real tokenizers live outside the repository, in `../shared` (or where `TUNELINE_ASSETS`
points). Without them the tests that need them are skipped, unless `TUNELINE_REQUIRE_ASSETS=1`
(CI), where a missing asset is a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def find_shared_dir() -> Path | None:
    """The shared assets folder (holding `tokenizers/`), or None if it is not there."""
    configured = os.environ.get("TUNELINE_ASSETS")
    candidate = Path(configured).expanduser() if configured else REPO_ROOT.parent / "shared"
    return candidate if (candidate / "tokenizers").is_dir() else None


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The shared assets folder; skips (or fails with TUNELINE_REQUIRE_ASSETS=1) when absent."""
    found = find_shared_dir()
    if found is not None:
        return found
    where = os.environ.get("TUNELINE_ASSETS") or str(REPO_ROOT.parent / "shared")
    reason = f"shared test assets not found: no tokenizers/ folder in {where} (set TUNELINE_ASSETS)"
    if os.environ.get("TUNELINE_REQUIRE_ASSETS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


QUIET_ENV = {
    "HF_HUB_OFFLINE": "1",
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "TOKENIZERS_PARALLELISM": "false",
}
for _name, _value in QUIET_ENV.items():
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    """A very small LLaMA-shaped model with a tokenizer trained on the demo corpus."""
    import json

    from tuneline.core.models.base_model import BaseModelConfig, build_base_model

    texts = [json.loads(line)["text"] for line in (REPO_ROOT / "data/demo_pretrain.jsonl").read_text().splitlines()]
    path = tmp_path_factory.mktemp("tiny_base")
    config = BaseModelConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1)
    build_base_model(texts, path, config=config)
    return path


@pytest.fixture(scope="module")
def load(shared_dir: Path):
    """`load(name)`: an unmodified tokenizer from shared/tokenizers, loaded once per test module."""
    from transformers import AutoTokenizer

    cache = {}

    def _load(name: str):
        if name not in cache:
            cache[name] = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / name)
        return cache[name]

    return _load


@dataclass(frozen=True)
class TrainCli:
    """`tuneline train` on a small SFT config, each run a real subprocess in the config's folder."""

    config: Path

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "TUNELINE_CACHE": str(self.config.parent / "cache"), "OMP_NUM_THREADS": "1", **extra}

    def command(self, *overrides: str) -> list[str]:
        return [sys.executable, "-m", "tuneline.flows.cli", "train", str(self.config), *overrides]

    def train(self, *overrides: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*overrides), cwd=self.config.parent, capture_output=True, text=True,
                              timeout=timeout, env=self.env(**env))


@pytest.fixture(scope="session")
def small_sft(tiny_base: Path, tmp_path_factory) -> TrainCli:
    """LoRA SFT on 16 demo rows, 2 per step (8 steps an epoch), seeded, logging every step.

    Its tokenized data is cached once for every test that trains with it.
    """
    import yaml

    folder = tmp_path_factory.mktemp("small_sft")
    config = {
        "model_name_or_path": str(tiny_base), "stage": "sft", "finetuning_type": "lora", "lora_rank": 4,
        "dataset": "demo_alpaca", "dataset_dir": str(REPO_ROOT / "data"), "template": "chatml", "cutoff_len": 64,
        "max_samples": 16, "output_dir": "out", "per_device_train_batch_size": 2, "learning_rate": 5.0e-3,
        "max_steps": 4, "logging_steps": 1, "seed": 7, "report_to": "none",
    }
    (folder / "sft.yaml").write_text(yaml.safe_dump(config))
    return TrainCli(folder / "sft.yaml")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module: tiny models gain nothing from more, and on a shared
    two-core machine the threads' spin-waits stall training many times over."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
