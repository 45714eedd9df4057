"""TRL trainer configurations built from the trainer arguments tuneline resolved.

TRL's configs subclass transformers' `TrainingArguments` but change some of its defaults (learning
rate 1e-6, gradient checkpointing and bf16 on, a log every 10 steps). A stage configured the
LLaMA-Factory way must mean the same whichever trainer runs it, so every `TrainingArguments` field
is copied from the arguments `core.train.training_arguments` resolved, and only the method's own
fields (beta, loss type, ...) are set by the caller.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    from transformers import TrainingArguments

ConfigT = TypeVar("ConfigT")


def trl_config(config_class: type[ConfigT], args: TrainingArguments, **method: Any) -> ConfigT:
    """`config_class` (a TRL config) holding `args`' trainer settings plus the method fields given."""
    from transformers import TrainingArguments

    shared = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainingArguments) if f.init}
    try:
        return config_class(**{**shared, **method})
    except (TypeError, ValueError) as e:
        raise ConfigError(f"the trainer arguments do not fit {config_class.__name__}: {e}") from e
