"""LoRA and OFT adapters with LLaMA-Factory's keys, and the LoRA+ optimizer.

A new adapter is LoRA, rsLoRA (`use_rslora`), DoRA (`use_dora`), PiSSA-initialised (`pissa_init`), or
OFT (`finetuning_type: oft`: orthogonal block rotations of each targeted layer's input, peft's OFT).
Both are saved, loaded and merged the same way. With `use_llama_pro` the adapter goes only on the layers
that block expansion added (see `core/models/expansion.py`). `adapter_name_or_path` continues the last
adapter it lists and merges the ones before it into the base; with `create_new_adapter` all of them are
merged and a fresh adapter starts on top, as LLaMA-Factory does. On a multimodal model an adapter goes
only on the parts that train (`core.models.composite`): not the vision tower unless
`freeze_vision_tower: false`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError, unknown_name_message
from tuneline.core.models.composite import adapter_targets, model_parts
from tuneline.core.models.freeze import expanded_layer_modules

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig, OFTConfig, PeftModel
    from transformers import PreTrainedModel, TrainingArguments

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_SAFETENSORS = "adapter_model.safetensors"
ADAPTER_PICKLE = "adapter_model.bin"


def apply_adapter(
    model: PreTrainedModel, finetuning: FinetuningConfig, *, model_config: ModelConfig, head: str | None = None,
    new_token_rows: Sequence[int] = (),
) -> PeftModel:
    """A trainable LoRA or OFT adapter on `model`: the last of `adapter_name_or_path` continued, or a new one.

    With `head` (a sequence classifier's scoring head) every adapter listed is merged into the base
    (an SFT adapter, typically) and a new adapter starts, training the head in full.
    `new_token_rows` are the embedding rows of added tokens, which a new adapter trains and saves;
    a continued adapter must already hold them.
    """
    from peft import get_peft_model

    adapters = adapter_paths(model_config)
    resume = bool(adapters) and not finetuning.create_new_adapter and head is None
    for path in adapters[:-1] if resume else adapters:
        # an SFT adapter merges into a reward model's backbone as well: its task is not the head's
        model = load_adapter(model, path, model_config=model_config, trainable=False, any_task=head is not None).merge_and_unload()
    if resume:
        continued = load_adapter(model, adapters[-1], model_config=model_config, trainable=True)
        _check_continued_rows(continued, new_token_rows, path=adapters[-1])
        return continued
    new_config = oft_config if finetuning.finetuning_type == "oft" else lora_config
    if finetuning.pissa_init and finetuning.pissa_iter != -1 and not finetuning.pissa_convert:
        print(f"pissa_iter: {finetuning.pissa_iter} takes PiSSA's components from the fast randomised SVD, which every "
              "load of the saved adapter (merge, export, continued training) draws anew, so the reloaded model is close "
              "to the trained one but not equal; 'pissa_iter: -1' (the exact SVD) or 'pissa_convert: true' (a plain "
              "LoRA adapter in pissa_converted/) reload exactly.", flush=True)
    # peft would make a new adapter float32 on a half-precision base; pure_bf16 trains it in bfloat16 too
    return get_peft_model(model, new_config(model, finetuning, head=head, new_token_rows=new_token_rows),
                          autocast_adapter_dtype=not finetuning.pure_bf16)


def lora_config(model: PreTrainedModel, finetuning: FinetuningConfig, *, head: str | None = None,
                new_token_rows: Sequence[int] = ()) -> LoraConfig:
    """peft's LoraConfig from the LoRA keys, target and extra module names checked against `model`.

    With `head` it is a sequence classifier's adapter: the head is saved with the adapter
    (`modules_to_save`), never adapted. `new_token_rows` train and are saved as peft's trainable
    tokens (`trainable_token_indices`) in the input embeddings and an untied output head, unless
    `additional_target` already trains that module in full.

    PiSSA takes the principal components from the exact SVD with `pissa_iter: -1`, otherwise from
    `pissa_iter` iterations of the fast randomised SVD (peft's `pissa_niter_N`). peft recomputes
    them whenever the saved adapter is loaded (merge, export, continued training); only the exact
    SVD gives the same residual base again, which is why `pissa_convert` exists.
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
        init_lora_weights=pissa_init_weights(finetuning.pissa_iter) if finetuning.pissa_init else True,
        trainable_token_indices=_trainable_tokens(model, new_token_rows, trained_in_full=extra),
    )


def pissa_init_weights(iterations: int) -> str:
    """peft's name of the PiSSA initialisation: the exact SVD for -1, the fast SVD otherwise."""
    return "pissa" if iterations == -1 else f"pissa_niter_{iterations}"


def oft_config(model: PreTrainedModel, finetuning: FinetuningConfig, *, head: str | None = None,
               new_token_rows: Sequence[int] = ()) -> OFTConfig:
    """peft's OFTConfig from the OFT keys: `oft_rank` blocks per layer, or (oft_rank 0, LLaMA-Factory's
    default) blocks of `oft_block_size` features, their number derived from each layer's width.
    peft's OFT has no trainable tokens, so with `new_token_rows` the embeddings (and an untied output
    head) train and are saved in full unless `additional_target` names modules, as LLaMA-Factory does."""
    from peft import OFTConfig, TaskType

    targets, extra = _targets(model, finetuning, key="oft_target", value=finetuning.oft_target, head=head)
    if new_token_rows and not finetuning.additional_target:
        extra = [*extra, *embedding_module_names(model)]
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
        # LoRA also adapts embedding layers, when named (never with 'all')
        targetable = sorted({*available, *embedding_layer_names(model)}) if key == "lora_target" else available
        targets = _names(value)
        missing = [t for t in targets if t not in targetable]
        if missing:
            raise ConfigError(
                f"'{key}' names {', '.join(missing)}, which the model does not have as layers the adapter can target; "
                f"modules available: {', '.join(targetable)} (or 'all')."
            )
    extra = _names(finetuning.additional_target)
    module_names = sorted({name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name})
    unknown = [unknown_name_message("module", name, module_names) for name in extra if name not in module_names]
    if unknown:
        raise ConfigError([f"'additional_target': {message}" for message in unknown])
    composite = model_parts(model.config) is not None
    if head is not None:  # the scoring head trains in full, saved with the adapter
        if targets != "all-linear" or not composite:  # a multimodal model's "all" is chosen by its parts below
            targets = sorted(set(available if targets == "all-linear" else targets) - {head})
        extra = [*extra, head]
    if finetuning.use_llama_pro:
        targets = expanded_layer_modules(model, available if targets == "all-linear" else targets,
                                         expanded_blocks=finetuning.freeze_trainable_layers)
    qualified = adapter_targets(model, finetuning, None if targets == "all-linear" else list(targets))
    if qualified is not None and head is not None:
        qualified = [name for name in qualified if name.rsplit(".", 1)[-1] != head]
    if qualified is not None:  # a multimodal model: its frozen parts take no adapter
        if not qualified:
            raise ConfigError(f"'{key}: {value}' names no layer outside the parts kept frozen (freeze_vision_tower, "
                              "freeze_multi_modal_projector, freeze_language_model); target layers of a part that trains.")
        targets = qualified
    return targets, extra


def embedding_module_names(model: PreTrainedModel) -> list[str]:
    """Short names of the input embeddings and of a separate output head, as module lists name them."""
    modules = [model.get_input_embeddings()]
    output = model.get_output_embeddings()
    if output is not None and output.weight is not modules[0].weight:
        modules.append(output)
    names = {id(module): name.rsplit(".", 1)[-1] for name, module in model.named_modules() if name}
    return [names[id(module)] for module in modules]


def _trainable_tokens(model: PreTrainedModel, rows: Sequence[int], *, trained_in_full: Sequence[str]
                      ) -> dict[str, list[int]] | None:
    """peft's `trainable_token_indices`: `rows` of each embedding matrix not trained in full already
    (a tied output head follows the input embeddings in peft)."""
    chosen = {name: list(rows) for name in embedding_module_names(model) if name not in trained_in_full}
    return chosen if rows and chosen else None


def _check_continued_rows(adapter: PeftModel, rows: Sequence[int], *, path: str) -> None:
    """A continued adapter trains the rows of added tokens only if it was made with them."""
    from peft import LoraConfig

    config = adapter.peft_config[adapter.active_adapter]
    if not rows or set(embedding_module_names(adapter.get_base_model())) <= set(config.modules_to_save or ()):
        return
    indices = (config.trainable_token_indices if isinstance(config, LoraConfig) else None) or {}
    held = {row for value in (indices.values() if isinstance(indices, dict) else [indices]) for row in value}
    missing = sorted(set(rows) - held)
    if missing:
        raise ConfigError(f"'adapter_name_or_path: {path}' was not trained with the added tokens (embedding rows "
                          f"{missing[0]}..{missing[-1]}), so continuing it would leave them untrained; set "
                          "'create_new_adapter: true' to merge it and train a new adapter with them.")


def adapter_paths(model_config: ModelConfig) -> list[str]:
    return _names(model_config.adapter_name_or_path)


def with_adapters(model: PreTrainedModel, model_config: ModelConfig) -> PreTrainedModel:
    """`model` with the adapters of `adapter_name_or_path` applied for inference, each merged in turn;
    a quantized base keeps its one adapter beside it (as LLaMA-Factory does)."""
    quantized = getattr(model, "hf_quantizer", None) is not None
    for path in adapter_paths(model_config):
        model = load_adapter(model, path, model_config=model_config, trainable=False)
        if not quantized:
            model = model.merge_and_unload()
    return model


def load_adapter(model: PreTrainedModel, path: str, *, model_config: ModelConfig, trainable: bool,
                 any_task: bool = False) -> PeftModel:
    """A saved adapter on `model` (from the `adapter_folder` subfolder of `path` when set); local
    folders must hold safetensors unless pickle is allowed.

    peft wraps a model in the class of the task the adapter was trained for, and a causal LM's
    wrapper fails on a sequence classifier; `any_task` loads it as a plain PeftModel instead, for
    an adapter that is only merged into the backbone the two share.
    """
    from peft import PeftConfig, PeftModel

    subfolder = model_config.adapter_folder
    if subfolder and Path(path).is_dir() and not (Path(path) / subfolder).is_dir():
        raise ConfigError(f"'adapter_folder: {subfolder}' is not a folder inside 'adapter_name_or_path: {path}'; name the "
                          "subfolder that holds the adapter's adapter_config.json, or remove adapter_folder.")
    check_adapter_folder(str(Path(path) / subfolder) if subfolder else path, allow_pickle=model_config.allow_pickle_weights)
    token, where = model_config.hf_hub_token, {"subfolder": subfolder} if subfolder else {}
    try:
        config = None
        if any_task:
            config = PeftConfig.from_pretrained(path, cache_dir=model_config.cache_dir, token=token, **where)
            config.task_type = None  # a fresh copy read for this load alone
        return PeftModel.from_pretrained(model, path, config=config, is_trainable=trainable, cache_dir=model_config.cache_dir,
                                         token=token, offload_folder=model_config.offload_folder, **where)
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
    """LoRA+ (B matrices, and biases, learn `loraplus_lr_ratio` times faster than A matrices; the
    LoRA matrices of embedding layers learn at `loraplus_lr_embedding`) with the optimizer the
    trainer arguments name; None leaves the trainer's own optimizer in place."""
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
                                     loraplus_weight_decay=args.weight_decay,
                                     loraplus_lr_embedding=finetuning.loraplus_lr_embedding, **kwargs)


def linear_module_names(model: PreTrainedModel) -> list[str]:
    """Distinct short names of the linear layers (what `lora_target` may name), lm_head excluded;
    on a model already wrapped by peft, the names of the wrapped layers."""
    names = {name.rsplit(".", 1)[-1] for name, _ in _linear_modules(model)}
    return sorted(names - {"lm_head"})


def embedding_layer_names(model: PreTrainedModel) -> list[str]:
    """Distinct short names of the embedding layers, which `lora_target` may also name."""
    import torch

    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Embedding) and ".lora_" not in name})


def _linear_modules(model: PreTrainedModel) -> list[tuple[str, torch.nn.Linear]]:
    """The model's own linear layers by qualified name, seen through peft's wrappers."""
    import torch

    return [(name.replace(".base_layer", "").replace(".original_module", ""), module)
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and ".lora_" not in name and ".modules_to_save." not in name]


def _names(value: str | None) -> list[str]:
    return [name.strip() for name in (value or "").split(",") if name.strip()]
