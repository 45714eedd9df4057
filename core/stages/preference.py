"""What the preference kinds share (dpo, kto, and ppo's reference): the reference model, TRL
trainers built around one, and the checks of the preference losses.

The reference model is `ref_model` with `ref_model_adapters` merged when set; otherwise, for a
LoRA policy, the policy with its adapter switched off (no second model in memory); otherwise a
frozen copy of the policy as it starts.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError
from tuneline.core.stages.kind import TrainerRequest
from tuneline.core.stages.trl_trainers import trl_trainer

if TYPE_CHECKING:
    from transformers import PreTrainedModel, Trainer, TrainingArguments

REF_ADAPTER = "ref"  # the name TRL gives its frozen copy of a LoRA policy's adapter


def preference_problems(finetuning: FinetuningConfig) -> list[str]:
    """Settings of the preference losses that could not train (dpo and kto alike), one line each."""
    ft = finetuning
    problems = []
    if ft.pref_beta <= 0:
        problems.append(f"'pref_beta' must be positive, got {ft.pref_beta}.")
    if ft.pref_ftx < 0:
        problems.append(f"'pref_ftx' must be 0 or more, got {ft.pref_ftx}.")
    if not 0 <= ft.dpo_label_smoothing < 0.5:
        problems.append(f"'dpo_label_smoothing' must be in [0, 0.5), got {ft.dpo_label_smoothing}.")
    return problems


def pissa_problems(finetuning: FinetuningConfig, *, uses_reference: bool) -> list[str]:
    """PiSSA rewrites the base weights, so a reference model taken from the same base would differ from
    the policy's start (LLaMA-Factory refuses it for kto, ppo and dpo with a reference)."""
    if finetuning.pissa_init and uses_reference:
        return [f"'pissa_init: true' cannot train stage '{finetuning.stage}' against a reference model (PiSSA rewrites the "
                "base the reference is read from); remove pissa_init."]
    return []


def raise_problems(problems: list[str]) -> None:
    """For builders called as a library: the problems the config check would have reported."""
    if problems:
        raise ConfigError(problems)


def reference_model(
    model: PreTrainedModel,
    finetuning: FinetuningConfig,
    *,
    model_config: ModelConfig | None = None,
    vocab_size: int | None = None,
    training: dict[str, Any] | None = None,
    model_max_length: int | None = None,
) -> PreTrainedModel | None:
    """The frozen model the policy is compared with (dpo, kto, ppo), or None where the trainer needs no
    model of its own: LoRA policies, whose adapter is switched off instead. `ref_model` loads with the
    policy's model settings (RoPE scaled to `model_max_length`), in `ref_model_quantization_bit` bits
    when set."""
    from peft import PeftModel

    if finetuning.ref_model:
        return _load_reference(finetuning, model_config=model_config or ModelConfig(), vocab_size=vocab_size,
                               training=training, model_max_length=model_max_length)
    if isinstance(model, PeftModel):
        return None
    return _frozen(copy.deepcopy(model))


def _load_reference(
    finetuning: FinetuningConfig, *, model_config: ModelConfig, vocab_size: int | None, training: dict[str, Any] | None,
    model_max_length: int | None,
) -> PreTrainedModel:
    """A quantized reference keeps its one adapter unmerged (merging into quantized weights loses precision)."""
    from tuneline.core.models.adapters import adapter_paths, load_adapter
    from tuneline.core.models.loading import load_model

    # `mixture_of_depths` converts or loads the policy; a reference loads as it was saved (routed or not)
    config = dataclasses.replace(model_config, model_name_or_path=finetuning.ref_model,
                                 adapter_name_or_path=finetuning.ref_model_adapters,
                                 quantization_bit=finetuning.ref_model_quantization_bit, mixture_of_depths=None)
    reference = load_model(finetuning.ref_model, model=config, vocab_size=vocab_size, training=training,
                           model_max_length=model_max_length, pure_bf16=finetuning.pure_bf16)
    for path in adapter_paths(config):
        reference = load_adapter(reference, path, model_config=config, trainable=False)
        if config.quantization_bit is None:
            reference = reference.merge_and_unload()
    return _frozen(reference)


def _frozen(model: PreTrainedModel) -> PreTrainedModel:
    model.requires_grad_(False)
    return model.eval()


def with_reference(trainer_class: Any, request: TrainerRequest, *, config: Any, convert: Any, **extra: Any) -> Trainer:
    """A TRL trainer that scores against a reference model (DPO, KTO), its data converted by `convert`;
    `extra` holds the trainer class's own arguments."""
    reference = reference_model(request.model, request.finetuning, model_config=request.model_config,
                                vocab_size=len(request.tokenizer), training=dtype_keys(config),
                                model_max_length=request.model_max_length)
    trainer = trl_trainer(trainer_class, request, config=config, convert=convert, ref_model=reference, **extra)
    drop_unneeded_ref_adapter(trainer.model)
    return trainer


def drop_unneeded_ref_adapter(model: PreTrainedModel) -> bool:
    """Remove TRL's frozen copy of a LoRA or OFT policy's adapter when it equals the adapter switched off.

    TRL computes the reference of an adapter policy with a copy of its starting adapter. A new adapter
    changes nothing yet (LoRA's B matrices are zero, OFT's rotations are the identity: their
    skew-symmetric parameters are zero), so switching it off gives the same reference,
    which TRL does when there is no copy; dropping it keeps it out of memory and out of every saved
    adapter folder (as `ref/`). A continued adapter keeps its copy. True when the copy was removed.
    """
    from peft import PeftModel

    if not isinstance(model, PeftModel) or REF_ADAPTER not in model.peft_config:
        return False
    starts_at_zero = all(not parameter.any() for name, parameter in model.named_parameters()
                         if _is_identity_part(name, model.active_adapter))
    if starts_at_zero:
        model.delete_adapter(REF_ADAPTER)
    return starts_at_zero


def _is_identity_part(name: str, adapter: str) -> bool:
    """Whether parameter `name` of `adapter` is one that is zero exactly while the adapter changes
    nothing: a LoRA B matrix (lora_B, lora_embedding_B) or OFT's rotation parameters (oft_R)."""
    parts = name.split(".")
    return any(part in ("lora_B", "lora_embedding_B", "oft_R") and parts[i + 1 : i + 2] == [adapter]
               for i, part in enumerate(parts))


def dtype_keys(args: TrainingArguments) -> dict[str, Any]:
    """The trainer keys that choose the dtype a reference model loads in."""
    return {"bf16": args.bf16, "fp16": args.fp16}
