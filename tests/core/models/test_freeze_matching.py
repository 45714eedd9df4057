"""Freeze tuning picks the parameters LLaMA-Factory 0.9.5 picks: its own choice for each setting,
recorded on a model of the tiny base's shape (tests/data/freeze_llamafactory.json, written by
tests/data/make_freeze_reference.py), compared name for name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.core.config import FinetuningConfig
from tuneline.core.models.freeze import apply_freeze
from tuneline.core.models.loading import load_model

REFERENCE = json.loads((Path(__file__).resolve().parents[2] / "data/freeze_llamafactory.json").read_text())


def test_the_reference_is_llamafactorys():
    assert REFERENCE["llamafactory_version"] == "0.9.5" and len(REFERENCE["cases"]) == 5


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda case: "-".join(str(v) for v in case["settings"].values()))
def test_freeze_trains_the_parameters_llamafactory_trains(tiny_base: Path, case):
    model = apply_freeze(load_model(tiny_base), FinetuningConfig(finetuning_type="freeze", **case["settings"]))
    trainable = sorted(name for name, parameter in model.named_parameters() if parameter.requires_grad)
    assert trainable == case["trainable"]
