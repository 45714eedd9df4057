"""LoRA and OFT adapters with LLaMA-Factory's keys, and the LoRA+ optimizer.

A new adapter is LoRA, rsLoRA (`use_rslora`), DoRA (`use_dora`), PiSSA-initialised
(`pissa_init`), or OFT (`finetuning_type: oft`: orthogonal block rotations of each targeted layer's
input, peft's OFT). Both are saved, loaded and merged the same way. With `use_llama_pro` the
adapter goes only on the layers that block expansion added (see `core/models/expansion.py`). `adapter_name_or_path` continues the last adapter it lists and merges the ones
before it into the base; with `create_new_adapter` all of them are merged and a fresh adapter
starts on top, as LLaMA-Factory does.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError, unknown_name_message
from tuneline.core.models.freeze import expanded_layer_modules

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig, OFTConfig, PeftModel
    from transformers import PreTrainedModel, TrainingArguments

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_SAFETENSORS = "adapter_model.safetensors"
ADAPTER_PICKLE = "adapter_model.bin"


def apply_adapter(
    model: PreTrainedModel, finetuning: FinetuningConfig, *, model_config: ModelConfig, head: str | None = None
) -> PeftModel:
    """A trainable LoRA or OFT adapter on `model`: the last of `adapter_name_or_path` continued, or a new one.

    With `head` (a sequence classifier's scoring head) every adapter listed is merged into the base
    (an SFT adapter, typically) and a new adapter starts, training the head in full.
    """
    from peft import get_peft_model

    adapters = adapter_paths(model_config)
    resume = bool(adapters) and not finetuning.create_new_adapter and head is None
    for path in adapters[:-1] if resume else adapters:
        # an SFT adapter merges into a reward model's backbone as well: its task is not the head's
        model = load_adapter(model, path, model_config=model_config, trainable=False, any_task=head is not None).merge_and_unload()
    if resume:
        return load_adapter(model, adapters[-1], model_config=model_config, trainable=True)
    new_config = oft_config if finetuning.finetuning_type == "oft" else lora_config
    return get_peft_model(model, new_config(model, finetuning, head=head))


def lora_config(model: PreTrainedModel, finetuning: FinetuningConfig, *, head: str | None = None) -> LoraConfig:
    """peft's LoraConfig from the LoRA keys, target and extra module names checked against `model`.

    With `head` it is a sequence classifier's adapter: the head is saved with the adapter
    (`modules_to_save`), never adapted.

    PiSSA uses the exact SVD: peft recomputes the PiSSA residual of the base whenever the saved
    adapter is loaded (merge, export, continued training), and only an exact SVD gives the same
    residual again (the randomised `pissa_niter_*` would not).
    """
    from peft import LoraConfig, TaskType

    targets, extra = _targets(model, finetuning, key="lora_target", value=finetuning.lora_target, head=head)
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM if head is None else TaskType.SEQ_CLS,
        r=finetuning.lora_rank,
        lora_alpha=finetuning.lora_alpha or finetuning.lora_rank * 2,
        lora_dropout=finetuning.lora_dropout,
        target_modules=targets,
        modules_to_save=extra or None,
        use_rslora=finetuning.use_rslora,
        use_dora=finetuning.use_dora,
        init_lora_weights="pissa" if finetuning.pissa_init else True,
    )


def oft_config(model: PreTrainedModel, finetuning: FinetuningConfig, *, head: str | None = None) -> OFTConfig:
    """peft's OFTConfig from the OFT keys: `oft_rank` blocks per layer, or (oft_rank 0, LLaMA-Factory's
    default) blocks of `oft_block_size` features, their number derived from each layer's width."""
    from peft import OFTConfig, TaskType

    targets, extra = _targets(model, finetuning, key="oft_target", value=finetuning.oft_target, head=head)
    short_names = set(linear_module_names(model)) if targets == "all-linear" else {t.rsplit(".", 1)[-1] for t in targets}
    widths = sorted({module.in_features for name, module in _linear_modules(model) if name.rsplit(".", 1)[-1] in short_names})
    size, blocks = finetuning.oft_block_size, finetuning.oft_rank
    uneven = [width for width in widths if width % (size or blocks)]
    if uneven:
        key, value = ("oft_block_size", size) if size else ("oft_rank", blocks)
        raise ConfigError(f"'{key}: {value}' does not divide the input width of every targeted layer ({', '.join(map(str, uneven))} "
                          f"of {', '.join(map(str, widths))}); choose a {key} that divides them all.")
    return OFTConfig(
        task_type=TaskType.CAUSAL_LM if head is None else TaskType.SEQ_CLS,
        r=blocks,
        oft_block_size=size,
        module_dropout=finetuning.module_dropout,
        target_modules=targets,
        modules_to_save=extra or None,
    )


def _targets(
    model: PreTrainedModel, finetuning: FinetuningConfig, *, key: str, value: str, head: str | None
) -> tuple[str | list[str], list[str]]:
    """The adapter's target modules (`value` of `key`, checked against the model) and the modules
    saved with it in full (`additional_target`, and a scoring head). With `use_llama_pro` the
    targets are the qualified names of those modules in the expanded layers only."""
    available = linear_module_names(model)
    if value == "all":
        targets: str | list[str] = "all-linear"
    else:
        targets = _names(value)
        missing = [t for t in targets if t not in available]
        if missing:
            raise ConfigError(
                f"'{key}' names {', '.join(missing)}, which the model does not have as linear layers; "
                f"modules available: {', '.join(available)} (or 'all')."
            )
    extra = _names(finetuning.additional_target)
    module_names = sorted({name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name})
    unknown = [unknown_name_message("module", name, module_names) for name in extra if name not in module_names]
    if unknown:
        raise ConfigError([f"'additional_target': {message}" for message in unknown])
    if head is not None:
        targets = sorted(set(available if targets == "all-linear" else targets) - {head})
        extra = [*extra, head]
    if finetuning.use_llama_pro:
        targets = expanded_layer_modules(model, available if targets == "all-linear" else targets,
                                         expanded_blocks=finetuning.freeze_trainable_layers)
    return targets, extra


def adapter_paths(model_config: ModelConfig) -> list[str]:
    return _names(model_config.adapter_name_or_path)


def load_adapter(model: PreTrainedModel, path: str, *, model_config: ModelConfig, trainable: bool,
                 any_task: bool = False) -> PeftModel:
    """A saved adapter on `model`; local folders must hold safetensors unless pickle is allowed.

    peft wraps a model in the class of the task the adapter was trained for, and a causal LM's
    wrapper fails on a sequence classifier; `any_task` loads it as a plain PeftModel instead, for
    an adapter that is only merged into the backbone the two share.
    """
    from peft import PeftConfig, PeftModel

    check_adapter_folder(path, allow_pickle=model_config.allow_pickle_weights)
    token = model_config.hf_hub_token
    try:
        config = None
        if any_task:
            config = PeftConfig.from_pretrained(path, cache_dir=model_config.cache_dir, token=token)
            config.task_type = None  # a fresh copy read for this load alone
        return PeftModel.from_pretrained(model, path, config=config, is_trainable=trainable, cache_dir=model_config.cache_dir,
                                         token=token)
    except (OSError, ValueError) as e:
        if Path(path).is_dir():
            raise
        raise ConfigError(
            f"'adapter_name_or_path: {path}' is neither a local adapter folder nor reachable on the Hugging Face Hub "
            "(offline, or the id is wrong); download it first or point the key at the adapter's folder."
        ) from e


def check_adapter_folder(path: str, *, allow_pickle: bool) -> None:
    """A local adapter folder needs its config and safetensors weights (pickle only when allowed)."""
    folder = Path(path)
    if not folder.is_dir():
        return  # a hub id: peft resolves it
    if not (folder / ADAPTER_CONFIG).is_file():
        raise ConfigError(f"'adapter_name_or_path: {path}' has no {ADAPTER_CONFIG}; point it at a folder saved by a LoRA run.")
    if (folder / ADAPTER_SAFETENSORS).is_file() or allow_pickle:
        return
    if (folder / ADAPTER_PICKLE).is_file():
        raise ConfigError(pickle_weights_message("adapter_name_or_path", path, [ADAPTER_PICKLE]))
    raise ConfigError(f"'adapter_name_or_path: {path}' has no {ADAPTER_SAFETENSORS}; point it at a folder saved by a LoRA run.")


def pickle_weights_message(key: str, path: str | Path, files: list[str]) -> str:
    return (
        f"'{key}: {path}' holds only pickle weights ({', '.join(files)}), and unpickling can run arbitrary code; "
        "convert them to safetensors, or set 'allow_pickle_weights: true' if you trust their source."
    )


def loraplus_optimizer(
    model: PeftModel, *, finetuning: FinetuningConfig, args: TrainingArguments
) -> torch.optim.Optimizer | None:
    """LoRA+ (B matrices, and biases, learn `loraplus_lr_ratio` times faster than A matrices) with
    the optimizer the trainer arguments name; None leaves the trainer's own optimizer in place."""
    if finetuning.loraplus_lr_ratio is None:
        return None
    if args.deepspeed or args.fsdp:
        raise ConfigError("'loraplus_lr_ratio' cannot be combined with DeepSpeed or FSDP in this version; "
                          "remove loraplus_lr_ratio or train without deepspeed/fsdp.")
    from peft.optimizers import create_loraplus_optimizer
    from transformers import Trainer

    optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    kwargs = {key: value for key, value in kwargs.items() if key != "lr"}
    return create_loraplus_optimizer(model, optimizer_cls, lr=args.learning_rate, loraplus_lr_ratio=finetuning.loraplus_lr_ratio,
                                     loraplus_weight_decay=args.weight_decay, **kwargs)


def linear_module_names(model: PreTrainedModel) -> list[str]:
    """Distinct short names of the linear layers (what `lora_target` may name), lm_head excluded;
    on a model already wrapped by peft, the names of the wrapped layers."""
    names = {name.rsplit(".", 1)[-1] for name, _ in _linear_modules(model)}
    return sorted(names - {"lm_head"})


def _linear_modules(model: PreTrainedModel) -> list[tuple[str, torch.nn.Linear]]:
    """The model's own linear layers by qualified name, seen through peft's wrappers."""
    import torch

    return [(name.replace(".base_layer", "").replace(".original_module", ""), module)
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and ".lora_" not in name and ".modules_to_save." not in name]


def _names(value: str | None) -> list[str]:
    return [name.strip() for name in (value or "").split(",") if name.strip()]
