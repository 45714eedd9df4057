"""The trainer of sft's anchored loss (ASFT), which needs each batch's inputs for its reference's
forward pass and so overrides `compute_loss`. Imported lazily by `causal_lm`, since loading
transformers' Trainer takes seconds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from transformers import Trainer

from tuneline.core.training.losses import asft_loss

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class AnchoredSFTTrainer(Trainer):
    """Anchored SFT (`use_asft_loss`): the DFT loss plus `asft_alpha` times the KL divergence from the
    reference model's next-token distributions to the policy's.

    The reference is `ref_model` when set, else the policy as it starts: for LoRA the policy with its
    adapter switched off, else a frozen copy (`preference.reference_model`). LLaMA-Factory needs a
    separate model, and fails on LoRA without `ref_model`.
    """

    # The loss is the mean of one micro-batch, so transformers divides it by the accumulation steps
    # (LLaMA-Factory's does not, which scales its ASFT gradients with gradient_accumulation_steps).
    loss_is_scaled_for_ga = False

    def __init__(self, *args: Any, reference: PreTrainedModel | None, asft_alpha: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asft_alpha = asft_alpha
        self.reference = None if reference is None else self.accelerator.prepare_model(reference, evaluation_mode=True)

    def compute_loss(self, model: PreTrainedModel, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None) -> Any:
        labels = inputs["labels"]
        model_inputs = {key: value for key, value in inputs.items() if key != "labels"}
        outputs = model(**model_inputs)
        with torch.no_grad():
            reference_logits = self._reference_logits(model, model_inputs)
        loss = asft_loss(outputs["logits"], labels, reference_logits, alpha=self.asft_alpha)
        return (loss, outputs) if return_outputs else loss

    def _reference_logits(self, model: PreTrainedModel, model_inputs: dict[str, Any]) -> torch.Tensor:
        if self.reference is not None:
            return self.reference(**model_inputs)["logits"]
        with self.accelerator.unwrap_model(model).disable_adapter():
            return model(**model_inputs)["logits"]
