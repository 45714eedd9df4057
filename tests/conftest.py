"""Shared test fixtures.

The real tokenizers live outside the repository, in `../shared` (or where `TUNELINE_ASSETS`
points). Without them the tests that need them are skipped, unless `TUNELINE_REQUIRE_ASSETS=1`
(CI), where a missing asset is a failure.
"""

from __future__ import annotations

import os
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

    from tuneline.core.base_model import BaseModelConfig, build_base_model

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
