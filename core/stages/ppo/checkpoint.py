"""What stage ppo writes: its log lines, its checkpoints (and resuming from them), its final outputs.

A checkpoint folder has the layout the other stages' checkpoints have, so `checkpoints.py` judges
it the same way: `trainer_state.json` naming the step, the weights (`adapter_model.safetensors` or
`model.safetensors`), and the completion record written last, after every process saved its
random state. The step's other state (value head, optimizer, schedule, KL coefficient, score
statistics) sits beside them.
"""

from __future__ import annotations

import json
import pickle
import random
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from tuneline.core.errors import ConfigError
from tuneline.core.training.checkpoint_record import write_record
from tuneline.core.training.checkpoints import CHECKPOINT_PREFIX, TRAINER_STATE, rotate_checkpoints
from tuneline.core.training.outputs import TrainingLog, save_results, split_results

if TYPE_CHECKING:
    from accelerate import Accelerator

    from tuneline.core.stages.ppo.arithmetic import AdaptiveKLController, RunningMoments


class ValueHeadModel(Protocol):
    """What is saved of the model: the policy (adapter or full weights) and its value head."""

    policy: Any
    value_head: torch.nn.Linear


class PPOTrainer(Protocol):
    """The state of a PPO run that a checkpoint holds (the trainer in `trainer.py`, which calls these)."""

    accelerator: Accelerator
    optimizer: torch.optim.Optimizer
    scheduler: Any
    step: int
    total_steps: int
    kl: AdaptiveKLController
    score_moments: RunningMoments

    @property
    def unwrapped(self) -> ValueHeadModel: ...

VALUE_HEAD_FILE = "value_head.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"


class PPOLog:
    """`trainer_log.jsonl` lines with LLaMA-Factory's keys (loss, reward, lr, epoch, ...) plus PPO's
    own (kl, kl_coef, policy and value loss, clip fraction, reply length), a console line, MLflow."""

    def __init__(self, output_dir: str | Path, *, total_steps: int, start_step: int, steps_per_epoch: int,
                 tracking_uri: str | None, run_id: str | None, main: bool) -> None:
        self.log = TrainingLog(output_dir, tracking_uri=tracking_uri, run_id=run_id)
        self.total_steps, self.start_step, self.steps_per_epoch = total_steps, start_step, steps_per_epoch
        self.main = main
        self.started = time.monotonic()
        self.last: dict[str, float] = {}

    def write(self, step: int, stats: dict[str, float]) -> None:
        self.last = stats
        if not self.main:
            return
        elapsed = time.monotonic() - self.started
        done = step - self.start_step
        remaining = elapsed / done * (self.total_steps - step) if done else 0.0
        record = {
            "current_steps": step, "total_steps": self.total_steps, "loss": round(stats["loss"], 6),
            "reward": round(stats["reward"], 6), "lr": stats["lr"], "epoch": round(step / self.steps_per_epoch, 4),
            "percentage": round(100 * step / self.total_steps, 2),
            "elapsed_time": str(timedelta(seconds=int(elapsed))), "remaining_time": str(timedelta(seconds=int(remaining))),
            **{key: round(stats[key], 6) for key in ("kl", "kl_coef", "policy_loss", "value_loss", "clipfrac", "response_length")},
        }
        named = {("learning_rate" if k == "lr" else k): v for k, v in stats.items()}  # the other stages' names
        self.log.write(record, metrics={**named, "epoch": record["epoch"]}, step=step)


def save_checkpoint(output_dir: Path, trainer: PPOTrainer, *, limit: int | None) -> Path:
    """`checkpoint-<step>` with everything a resumed run needs; older ones beyond `limit` go."""
    from safetensors.torch import save_file

    accelerator = trainer.accelerator
    folder = output_dir / f"{CHECKPOINT_PREFIX}{trainer.step}"
    if accelerator.is_main_process:
        folder.mkdir(parents=True, exist_ok=True)
        model = trainer.unwrapped
        model.policy.save_pretrained(folder)
        save_file({k: v.contiguous() for k, v in model.value_head.state_dict().items()}, folder / VALUE_HEAD_FILE)
        torch.save(trainer.optimizer.state_dict(), folder / OPTIMIZER_FILE)
        torch.save(trainer.scheduler.state_dict(), folder / SCHEDULER_FILE)
        state = {"global_step": trainer.step, "max_steps": trainer.total_steps, "kl_coef": trainer.kl.value,
                 "score_moments": trainer.score_moments.state()}
        (folder / TRAINER_STATE).write_text(json.dumps(state, indent=1), encoding="utf-8")
    accelerator.wait_for_everyone()
    save_random_state(folder / f"rng_state_{accelerator.process_index}.pth")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_record(folder, step=trainer.step, world_size=accelerator.num_processes)
        rotate_checkpoints(output_dir, limit=limit)
    return folder


def load_checkpoint(folder: Path, *, model: ValueHeadModel | None, optimizer: Any, trainer: PPOTrainer | None) -> None:
    """Restore from `folder`: the weights into `model` (before it is wrapped for training), or the
    optimizer, schedule, step, KL coefficient, score statistics and random state into `trainer`."""
    from safetensors.torch import load_file

    if model is not None:
        _load_policy_weights(model.policy, folder)
        model.value_head.load_state_dict(load_file(folder / VALUE_HEAD_FILE, device=str(model.value_head.weight.device)))
        return
    assert trainer is not None
    state = json.loads((folder / TRAINER_STATE).read_text(encoding="utf-8"))
    optimizer.load_state_dict(torch.load(folder / OPTIMIZER_FILE, weights_only=True, map_location=trainer.accelerator.device))
    trainer.scheduler.load_state_dict(torch.load(folder / SCHEDULER_FILE, weights_only=True))
    trainer.step = int(state["global_step"])
    trainer.kl.value = float(state["kl_coef"])
    moments = state["score_moments"]
    trainer.score_moments.mean, trainer.score_moments.var, trainer.score_moments.count = moments["mean"], moments["var"], moments["count"]
    rng = folder / f"rng_state_{trainer.accelerator.process_index}.pth"
    if not rng.is_file():
        raise ConfigError(f"{folder} holds no random state for process {trainer.accelerator.process_index}; it was saved by "
                          "fewer processes. Resume with as many processes as saved it, or set 'overwrite_output_dir: true'.")
    restore_random_state(rng)


def _load_policy_weights(policy, folder: Path) -> None:
    from peft import PeftModel, set_peft_model_state_dict
    from safetensors.torch import load_file

    if isinstance(policy, PeftModel):
        set_peft_model_state_dict(policy, load_file(folder / "adapter_model.safetensors"))
        return
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(folder / name))
    missing, unexpected = policy.load_state_dict(state, strict=False)
    tied = set(getattr(policy, "_tied_weights_keys", None) or {})
    if unexpected or [key for key in missing if key not in tied]:
        raise ConfigError(f"{folder}: the saved weights do not fit the model (missing {missing[:3]}, unexpected "
                          f"{unexpected[:3]}); resume with the settings it was saved with.")
    policy.tie_weights()


def save_random_state(path: Path) -> None:
    """This process's random state: Python's (a tuple of ints) and torch's CPU and CUDA generators
    (byte tensors), all of which `torch.load(weights_only=True)` reads without allow-listing."""
    states: dict[str, Any] = {"python": random.getstate(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    torch.save(states, path)


def restore_random_state(path: Path) -> None:
    """Restore the state `save_random_state` wrote. Read with `weights_only=True`: a file holding any
    other pickled object (which could run code as it loads) is refused, never unpickled."""
    try:
        states = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        what = f"the pickled object {found[1]}" if found else "pickled objects"
        raise ConfigError(f"{path} holds {what}, not only a random state (tensors, numbers, tuples), so it is not "
                          "loaded: unpickling it could run code. tuneline's ppo stage never writes that; delete "
                          f"{path.parent} to resume from an earlier checkpoint, or set 'overwrite_output_dir: true'.") from e
    random.setstate(states["python"])
    torch.random.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.random.set_rng_state_all(states["cuda"])


def save_outputs(output_dir: Path, trainer: PPOTrainer, *, tokenizer: Any, metrics: dict[str, float]) -> None:
    """The trained policy (adapter or model), its value head, the tokenizer and the metrics files."""
    from safetensors.torch import save_file

    if not trainer.accelerator.is_main_process:
        return
    model = trainer.unwrapped
    model.policy.save_pretrained(output_dir)
    save_file({k: v.contiguous() for k, v in model.value_head.state_dict().items()}, output_dir / VALUE_HEAD_FILE)
    tokenizer.save_pretrained(output_dir)
    for split, values in split_results(metrics).items():
        save_results(output_dir, split, values)
