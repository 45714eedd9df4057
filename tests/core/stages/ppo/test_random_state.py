"""A PPO checkpoint's random state is read with `torch.load(weights_only=True)`: what the stage saves
comes back whole, and a file holding any other pickled object is refused before it can run."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from tuneline.core.errors import ConfigError
from tuneline.core.stages.ppo.checkpoint import restore_random_state, save_random_state


class Planted:
    """An object whose unpickling would create a file: what a hostile checkpoint could carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def draws() -> tuple[list[float], list[float]]:
    return [random.random() for _ in range(3)], torch.rand(3).tolist()


def test_the_saved_random_state_restores_the_same_draws(tmp_path: Path):
    path = tmp_path / "rng_state_0.pth"
    save_random_state(path)
    first = draws()
    draws()  # the generators move on
    restore_random_state(path)
    assert draws() == first


def test_a_random_state_file_holding_another_pickled_object_is_refused_unloaded(tmp_path: Path):
    marker = tmp_path / "unpickled"
    path = tmp_path / "checkpoint-4" / "rng_state_0.pth"
    path.parent.mkdir()
    torch.save({"python": random.getstate(), "cpu": torch.random.get_rng_state(), "extra": Planted(marker)}, path)
    before = draws()
    with pytest.raises(ConfigError) as refused:
        restore_random_state(path)
    message = str(refused.value)
    assert str(path) in message and "pickled object" in message and "could run code" in message
    assert "overwrite_output_dir: true" in message and str(path.parent) in message
    assert not marker.exists()  # never unpickled
    assert draws() != before  # and nothing restored: the generators went on
