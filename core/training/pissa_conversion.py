"""`pissa_convert`: the trained PiSSA adapter saved once more as a plain LoRA adapter of the original base.

PiSSA starts the adapter from the base's principal components and trains on the residual base
(W - A0 B0), so the adapter on its own only fits a base from which the same components were
taken out again. The converted adapter holds the whole change instead (A B - A0 B0, of twice the
rank) and applies to the unchanged base like any LoRA adapter, with no SVD when it loads.

In LLaMA-Factory's layout, inside `output_dir`: `pissa_init/` (the adapter as it started, saved
when training starts) and `pissa_converted/` (written when training ends).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import TrainerControl, TrainerState, TrainingArguments

INITIAL_DIR = "pissa_init"
CONVERTED_DIR = "pissa_converted"


class PissaConversion(TrainerCallback):
    """Saves the starting adapter, then the converted one, on the process that saves."""

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: PeftModel | None = None, **kwargs: Any) -> None:
        initial = Path(args.output_dir) / INITIAL_DIR
        if args.should_save and state.global_step == 0:  # a resumed run keeps the first attempt's start
            save_initial_adapter(model, initial)
        elif args.should_save:
            check_initial_adapter(initial)  # before training, so the training is not lost at its end

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     model: PeftModel | None = None, **kwargs: Any) -> None:
        if args.should_save:
            save_converted_adapter(model, Path(args.output_dir) / CONVERTED_DIR, initial=Path(args.output_dir) / INITIAL_DIR)


def save_initial_adapter(model: PeftModel, folder: Path) -> None:
    """The adapter as PiSSA started it, its config saying plain LoRA so that loading it takes the
    saved matrices as they are instead of decomposing the base again."""
    config = model.peft_config[model.active_adapter]
    init = config.init_lora_weights
    config.init_lora_weights = True
    try:
        _save_whole(folder, lambda draft: model.save_pretrained(str(draft)))
    finally:
        config.init_lora_weights = init


def check_initial_adapter(initial: Path) -> None:
    if not (initial / "adapter_config.json").is_file():
        raise ConfigError(f"'pissa_convert: true' needs the adapter as PiSSA started it, in {initial}, which is missing "
                          "(removed while the stage ran, or the run resumed from a checkpoint written without "
                          "pissa_convert); train the stage again from the start.")


def save_converted_adapter(model: PeftModel, folder: Path, *, initial: Path) -> None:
    check_initial_adapter(initial)
    _save_whole(folder, lambda draft: model.save_pretrained(str(draft), path_initial_model_for_weight_conversion=str(initial)))


def _save_whole(folder: Path, save: Callable[[Path], None]) -> None:
    """`save` into a draft beside `folder`, then the draft renamed to it: a kill leaves no half-written adapter."""
    draft = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(draft, ignore_errors=True)  # our own draft, left by a killed run
    save(draft)
    if folder.exists():
        shutil.rmtree(folder)  # an earlier attempt's, in the stage's own output folder
    os.replace(draft, folder)
