"""Loading tokenizers and models, and making the chosen parameters trainable.

Local folders load as they are; anything else is treated as a hub id, which needs the network:
offline, the failure names the id and says how to point at a local folder instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def load_tokenizer(path: str | Path, *, model: ModelConfig | None = None) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    model = model or ModelConfig()
    try:
        return AutoTokenizer.from_pretrained(
            str(path),
            use_fast=model.use_fast_tokenizer,
            trust_remote_code=model.trust_remote_code,
            revision=model.model_revision,
            cache_dir=model.cache_dir,
        )
    except OSError as e:
        raise ConfigError(_unreachable_model_message("model_name_or_path", path)) from e


def load_model(path: str | Path, *, model: ModelConfig | None = None, vocab_size: int | None = None) -> PreTrainedModel:
    """A causal LM in float32 (CPU training), its embeddings resized to `vocab_size` if larger."""
    import torch
    from transformers import AutoModelForCausalLM

    model = model or ModelConfig()
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            str(path),
            dtype=torch.float32,
            trust_remote_code=model.trust_remote_code,
            revision=model.model_revision,
            cache_dir=model.cache_dir,
            use_safetensors=True,
        )
    except OSError as e:
        raise ConfigError(_unreachable_model_message("model_name_or_path", path)) from e
    if vocab_size is not None and vocab_size > loaded.get_input_embeddings().num_embeddings:
        loaded.resize_token_embeddings(vocab_size)
    return loaded


def apply_finetuning(model: PreTrainedModel, finetuning: FinetuningConfig) -> PreTrainedModel:
    """Wrap `model` for the chosen method; refuse a setup in which nothing would train."""
    if finetuning.finetuning_type == "lora":
        model = _inject_lora(model, finetuning)
    trainable, total = count_parameters(model)
    if trainable == 0:
        raise ConfigError(
            f"no parameter is trainable with finetuning_type '{finetuning.finetuning_type}' "
            f"and lora_target '{finetuning.lora_target}'; modules available: {', '.join(linear_module_names(model))}."
        )
    return model


def _inject_lora(model: PreTrainedModel, finetuning: FinetuningConfig) -> PreTrainedModel:
    from peft import LoraConfig, TaskType, get_peft_model

    if finetuning.lora_target == "all":
        targets: str | list[str] = "all-linear"
    else:
        targets = [name.strip() for name in finetuning.lora_target.split(",") if name.strip()]
        missing = [t for t in targets if t not in linear_module_names(model)]
        if missing:
            raise ConfigError(
                f"lora_target names {', '.join(missing)}, which the model does not have; "
                f"modules available: {', '.join(linear_module_names(model))} (or 'all')."
            )
    extra = finetuning.additional_target.split(",") if finetuning.additional_target else None
    config = LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=finetuning.lora_rank,
        lora_alpha=finetuning.lora_alpha or finetuning.lora_rank * 2,
        lora_dropout=finetuning.lora_dropout,
        target_modules=targets,
        modules_to_save=extra,
        use_rslora=finetuning.use_rslora,
        use_dora=finetuning.use_dora,
    )
    return get_peft_model(model, config)


def linear_module_names(model: PreTrainedModel) -> list[str]:
    """Distinct short names of the linear layers (what `lora_target` may name), lm_head excluded."""
    import torch

    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    return sorted(names - {"lm_head"})


def count_parameters(model: PreTrainedModel) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def trainable_summary(model: PreTrainedModel) -> str:
    trainable, total = count_parameters(model)
    return f"trainable params: {trainable:,} || all params: {total:,} || trainable%: {100 * trainable / total:.4f}"


def _unreachable_model_message(key: str, path: str | Path) -> str:
    if Path(path).exists():
        return f"'{key}: {path}' is a folder without a loadable model or tokenizer (config.json, tokenizer files)."
    return (
        f"'{key}: {path}' is neither a local folder nor reachable on the Hugging Face Hub "
        "(offline, or the id is wrong); download it first or point the key at a local model folder."
    )
