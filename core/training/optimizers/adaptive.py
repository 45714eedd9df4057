"""Adam-mini (the `adam-mini` package) and Muon (`torch.optim.Muon`), as LLaMA-Factory builds them.

Adam-mini keeps one second-moment value per block of parameters (per attention head, per neuron),
told the model's width and head counts. Muon orthogonalises the momentum of the hidden layers'
2-D weights; embeddings, the output head and every 1-D parameter take AdamW, all with one
learning rate and weight decay. Muon's step is scaled to match AdamW's update size
(`match_rms_adamw`: 0.2 * sqrt(max(rows, columns))), as LLaMA-Factory's Muon scales it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch  # this module is imported only to build an optimizer, never to read a config

if TYPE_CHECKING:
    from transformers import PreTrainedModel, TrainingArguments


def adam_mini_optimizer(model: PreTrainedModel, *, args: TrainingArguments) -> torch.optim.Optimizer:
    from adam_mini import Adam_mini
    from transformers.integrations import is_deepspeed_zero3_enabled

    config = model.config
    return Adam_mini(named_parameters=model.named_parameters(), lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                     eps=args.adam_epsilon, weight_decay=args.weight_decay, model_sharding=is_deepspeed_zero3_enabled(),
                     dim=config.hidden_size, n_heads=config.num_attention_heads,
                     # a model without grouped-query attention has no key/value head count of its own
                     n_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads)


def muon_parameter(name: str, parameter: torch.nn.Parameter) -> bool:
    """Whether Muon (rather than AdamW) trains this parameter: a 2-D weight that is no embedding or head."""
    return parameter.ndim == 2 and "embed" not in name and "lm_head" not in name


def muon_optimizer(model: PreTrainedModel, *, args: TrainingArguments) -> torch.optim.Optimizer:
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    hidden = [p for name, p in trainable if muon_parameter(name, p)]
    rest = [p for name, p in trainable if not muon_parameter(name, p)]
    parts: list[torch.optim.Optimizer] = []
    if hidden:
        parts.append(torch.optim.Muon(hidden, lr=args.learning_rate, weight_decay=args.weight_decay,
                                      adjust_lr_fn="match_rms_adamw"))
    if rest:
        parts.append(torch.optim.AdamW(rest, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                                       eps=args.adam_epsilon, weight_decay=args.weight_decay))
    return MuonWithAdamW(parts)


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon and AdamW stepped as one optimizer, for a Trainer that holds one: their parameter
    groups are this one's (so the scheduler sets their learning rates), and their states are saved
    and restored side by side."""

    def __init__(self, parts: list[torch.optim.Optimizer]) -> None:
        self.parts = parts
        super().__init__([p for part in parts for group in part.param_groups for p in group["params"]], {})
        self.param_groups = [group for part in parts for group in part.param_groups]

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        for part in self.parts:
            part.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part, saved in zip(self.parts, state_dict["parts"], strict=True):
            part.load_state_dict(saved)
