"""What a run trains with, read off the live trainer and model as training begins.

The keys of a config say what was asked for; this says what runs: the optimizer the trainer steps
(inside accelerate's wrapper, with the optimizers a composite one steps), what computes the loss,
the modules from outside torch and transformers in the model (adapters, routers), the attention
function its layers call, the decoder layers that train, and NEFTune's noise on the embeddings.
Rank 0 prints it as one line (`LINE_PREFIX` and a JSON object) and tags the stage's MLflow run
with it (`tuneline.<field>`), so a user can check that a key took effect.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from tuneline.core.tracking import runs as tracking

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, Trainer, TrainerControl, TrainerState, TrainingArguments

LINE_PREFIX = "training with: "
TAG_PREFIX = "tuneline."
LAYER_INDEX = re.compile(r"\.layers\.(\d+)\.")
OWN_PACKAGES = ("torch", "transformers")  # the modules of a model as transformers builds it come from these


@dataclass(frozen=True)
class MethodRecord:
    optimizer: str  # "package.module.Class", with the classes of the optimizers it steps in brackets
    loss: str  # the trainer's compute_loss_func, or the compute_loss method of the trainer's class
    attention: str  # the model's attention implementation (sdpa, eager, s2_sdpa for S^2-Attn)
    trainable_layers: list[int]  # decoder layers with a trainable parameter
    added_modules: dict[str, int]  # module classes from outside torch and transformers, with their counts
    neftune_noise_alpha: float | None  # the noise NEFTune's hook adds to the input embeddings, None: no hook

    def line(self) -> str:
        return LINE_PREFIX + json.dumps(asdict(self))

    @classmethod
    def from_line(cls, line: str) -> MethodRecord:
        return cls(**json.loads(line.removeprefix(LINE_PREFIX)))


def method_record(model: PreTrainedModel, optimizer: torch.optim.Optimizer, *, loss: str) -> MethodRecord:
    added = Counter(qualified_name(type(module)) for module in model.modules()
                    if type(module).__module__.split(".")[0] not in OWN_PACKAGES)
    layers = sorted({int(found.group(1)) for name, parameter in model.named_parameters()
                     if parameter.requires_grad and (found := LAYER_INDEX.search(f".{name}"))})
    return MethodRecord(optimizer=optimizer_name(optimizer), loss=loss,
                        attention=str(model.config._attn_implementation), trainable_layers=layers,
                        added_modules=dict(sorted(added.items())), neftune_noise_alpha=neftune_alpha(model))


def optimizer_name(optimizer: torch.optim.Optimizer) -> str:
    """The class of the optimizer stepped, unwrapped from accelerate's; a composite one (layer-wise
    GaLore/APOLLO, Muon with AdamW) lists the classes of its parts."""
    from accelerate.optimizer import AcceleratedOptimizer

    from tuneline.core.training.optimizers.adaptive import MuonWithAdamW
    from tuneline.core.training.optimizers.projected import LayerwiseOptimizer

    while isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    parts: list[torch.optim.Optimizer] = []
    if isinstance(optimizer, LayerwiseOptimizer):
        parts = list(optimizer.per_parameter.values())
    elif isinstance(optimizer, MuonWithAdamW):
        parts = optimizer.parts
    inner = sorted({qualified_name(type(part)) for part in parts})
    return qualified_name(type(optimizer)) + (f"[{', '.join(inner)}]" if inner else "")


def trainer_loss(trainer: Trainer) -> str:
    """What computes `trainer`'s training loss: its `compute_loss_func` (sft's DFT and EAFT), else the
    `compute_loss` of its class (transformers' Trainer's is the model's own loss)."""
    if trainer.compute_loss_func is not None:
        return str(trainer.compute_loss_func)
    owner = next(cls for cls in type(trainer).__mro__ if "compute_loss" in vars(cls))
    return f"{qualified_name(owner)}.compute_loss"


def neftune_alpha(model: PreTrainedModel) -> float | None:
    from transformers.integrations.neftune import neftune_post_forward_hook

    embeddings = model.get_input_embeddings()
    # transformers hooks NEFTune onto the input embeddings as training starts, and says how much noise on the module
    if neftune_post_forward_hook in embeddings._forward_hooks.values():
        return float(embeddings.neftune_noise_alpha)
    return None


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class MethodRecordCallback(TrainerCallback):
    """Prints the run's `MethodRecord` as training begins (rank 0) and tags its MLflow run with it."""

    def __init__(self, *, loss: str, tracking_uri: str | None, run_id: str | None) -> None:
        self.loss, self.tracking_uri, self.run_id = loss, tracking_uri, run_id

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: PreTrainedModel | None = None, optimizer: torch.optim.Optimizer | None = None,
                       **kwargs: Any) -> None:
        if state.is_world_process_zero and model is not None and optimizer is not None:
            report(method_record(model, optimizer, loss=self.loss), tracking_uri=self.tracking_uri, run_id=self.run_id)


def report(record: MethodRecord, *, tracking_uri: str | None, run_id: str | None) -> None:
    """Print `record` and tag the stage's MLflow run with it (rank 0's part; a loop of its own calls this too)."""
    print(record.line(), flush=True)
    if tracking_uri and run_id:
        tracking.set_tags(tracking_uri, run_id, {TAG_PREFIX + key: value if isinstance(value, str) else json.dumps(value)
                                                 for key, value in asdict(record).items()})
