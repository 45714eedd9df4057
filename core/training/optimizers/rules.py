"""Which memory-saving optimizer settings can train together, checked before anything loads.

LLaMA-Factory's rules (`hparams/finetuning_args.py`, `hparams/parser.py`), each problem one line
naming the keys: GaLore, APOLLO and BAdam train full or frozen weights, never LoRA adapters, and
only one of them at a time; the layer-wise variants step inside the backward pass, so they cannot
accumulate gradients or share them across processes. The process count is known only at launch
(`parallel_problems`); everything else is known when the config is read (`optimizer_problems`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuneline.core.config import FinetuningConfig, OptimizerConfig, StageConfig
from tuneline.core.training.distributed import deepspeed_settings, deepspeed_zero_stage, fsdp_setting

# transformers' `optim` values each projected optimizer has a galore-torch / apollo-torch class for.
GALORE_OPTIMS = ("adamw_torch", "adamw_torch_fused", "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "adafactor")
GALORE_8BIT_OPTIMS = ("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit")
"""The `optim` values GaLore steps with galore-torch's 8-bit AdamW, which synchronises CUDA at every
step and so runs only on a CUDA GPU (bitsandbytes' own 8-bit AdamW, without GaLore, runs on a CPU)."""
APOLLO_OPTIMS = ("adamw_torch", "adamw_torch_fused")
OPTIMIZER_PACKAGES = {"use_galore": "galore_torch", "use_apollo": "apollo_torch", "use_badam": "badam",
                      "use_adam_mini": "adam_mini"}
"""The package each `use_*` key's optimizer is imported from (Muon is torch's own)."""
DEFAULT_OPTIM = "adamw_torch_fused"  # transformers' default `optim`
NEVER_SWITCH = -1
"""`badam_switch_interval` that keeps BAdam's first block for the whole run."""


def chosen_optimizers(optimizer: OptimizerConfig) -> list[str]:
    """The `use_*` keys set, in LLaMA-Factory's order of precedence."""
    flags = {"use_galore": optimizer.use_galore, "use_apollo": optimizer.use_apollo, "use_badam": optimizer.use_badam,
             "use_adam_mini": optimizer.use_adam_mini, "use_muon": optimizer.use_muon}
    return [key for key, on in flags.items() if on]


def optimizer_packages(optimizer: Mapping[str, Any]) -> list[str]:
    """The packages the `use_*` keys set in `optimizer` (an `OptimizerConfig` as a dict) import."""
    return [package for key, package in OPTIMIZER_PACKAGES.items() if optimizer.get(key)]


def optimizer_problems(config: StageConfig) -> list[str]:
    """Every setting of the optimizer keys that cannot train, one line each."""
    optimizer, finetuning, training = config.optimizer, config.finetuning, config.training
    chosen = chosen_optimizers(optimizer)
    if not chosen:
        return []
    problems = _combination_problems(chosen, finetuning)
    problems += _projection_problems(optimizer, training)
    problems += _badam_problems(optimizer)
    if training.get("deepspeed") and (optimizer.use_galore or optimizer.use_apollo):
        keys = " and ".join(f"'{key}: true'" for key in chosen if key in ("use_galore", "use_apollo"))
        problems.append(f"{keys} cannot train under DeepSpeed ('deepspeed: {training['deepspeed']}'): the projected "
                        "optimizer does not run inside DeepSpeed's; remove 'deepspeed' or the GaLore/APOLLO keys.")
    if "optimizer" in deepspeed_settings(training.get("deepspeed")):
        problems.append(f"'{chosen[0]}: true' chooses the optimizer, and the DeepSpeed config "
                        f"'{training['deepspeed']}' names one of its own, which would replace it; remove its "
                        "\"optimizer\" section or the optimizer key.")
    if fsdp_setting(training.get("fsdp")):
        problems.append(f"'{chosen[0]}: true' cannot train under FSDP in this version (transformers' Trainer refuses an "
                        "optimizer built outside it when FSDP shards the model); remove 'fsdp', or the optimizer key.")
    return problems  # a kind that builds its own optimizer refuses them all (core.stages.rules)


def _combination_problems(chosen: list[str], finetuning: FinetuningConfig) -> list[str]:
    problems = []
    exclusive = [key for key in chosen if key in ("use_galore", "use_apollo", "use_badam")]
    if finetuning.finetuning_type == "lora" and exclusive:
        trains = "trains" if len(exclusive) == 1 else "train"
        problems.append(f"{_listed(exclusive)} {trains} the model's own weights, and 'finetuning_type: lora' trains "
                        "adapters; use 'finetuning_type: full' or 'freeze', or remove the optimizer key.")
    if len(chosen) > 1:
        problems.append(f"{_listed(chosen)} each choose the optimizer; keep one of them.")
    if finetuning.loraplus_lr_ratio is not None:
        problems.append(f"{_listed(chosen)} and 'loraplus_lr_ratio: {finetuning.loraplus_lr_ratio}' each choose the "
                        "optimizer; keep one of them.")
    return problems


def _projection_problems(optimizer: OptimizerConfig, training: Mapping[str, Any]) -> list[str]:
    problems = []
    optim = str(training.get("optim", DEFAULT_OPTIM))
    accumulation = training.get("gradient_accumulation_steps", 1)
    for name, on, layerwise, optims in (("galore", optimizer.use_galore, optimizer.galore_layerwise, GALORE_OPTIMS),
                                        ("apollo", optimizer.use_apollo, optimizer.apollo_layerwise, APOLLO_OPTIMS)):
        if not on:
            continue
        if optim not in optims:
            problems.append(f"'use_{name}: true' has an optimizer for 'optim' {', '.join(optims)}, not 'optim: {optim}'; "
                            f"set one of those or remove 'optim'.")
        elif name == "galore" and optim in GALORE_8BIT_OPTIMS and not _has_cuda():
            problems.append(f"'use_galore: true' with 'optim: {optim}' steps with galore-torch's 8-bit AdamW, which runs "
                            "only on a CUDA GPU, and this machine has none; set 'optim: adamw_torch' (GaLore's 32-bit "
                            "AdamW) or 'adafactor', or run the stage on a CUDA machine.")
        if layerwise and accumulation != 1:
            problems.append(f"'{name}_layerwise: true' steps each weight as soon as its gradient is ready, so it cannot "
                            f"accumulate gradients ('gradient_accumulation_steps: {accumulation}'); set it to 1 or remove "
                            f"'{name}_layerwise'.")
        for key in (f"{name}_rank", f"{name}_update_interval"):
            if getattr(optimizer, key) <= 0:
                problems.append(f"'{key}: {getattr(optimizer, key)}' must be a positive whole number.")
    return problems


def _badam_problems(optimizer: OptimizerConfig) -> list[str]:
    if not optimizer.use_badam:
        return []
    problems = []
    if optimizer.badam_mode == "ratio" and not 1e-6 < optimizer.badam_update_ratio <= 1:
        problems.append(f"'badam_update_ratio: {optimizer.badam_update_ratio}' must be a share in (0, 1].")
    if optimizer.badam_mode == "layer" and optimizer.badam_switch_mode is None:
        problems.append("'badam_switch_mode' must be ascending, descending, random or fixed for 'badam_mode: layer'.")
    if optimizer.badam_mode == "layer" and (optimizer.badam_start_block or 0) < 0:
        problems.append(f"'badam_start_block: {optimizer.badam_start_block}' must be a layer index, 0 or more.")
    interval = optimizer.badam_switch_interval
    if optimizer.badam_mode == "layer" and not (interval == NEVER_SWITCH or (interval is not None and interval > 0)):
        problems.append(f"'badam_switch_interval: {interval}' must be a positive number of steps, or {NEVER_SWITCH} to "
                        "train the first block throughout.")
    return problems


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def parallel_problems(optimizer: OptimizerConfig, training: Mapping[str, Any], *, world_size: int) -> list[str]:
    """The settings several training processes (`world_size` > 1, NPROC_PER_NODE x NNODES) cannot run."""
    if world_size <= 1:
        return []
    problems = []
    for name, on, layerwise in (("galore", optimizer.use_galore, optimizer.galore_layerwise),
                                ("apollo", optimizer.use_apollo, optimizer.apollo_layerwise)):
        if on and layerwise:
            problems.append(f"'{name}_layerwise: true' steps each weight inside the backward pass, before the processes "
                            f"share gradients, so it cannot train on {world_size} processes; remove '{name}_layerwise' or "
                            "train on one process (NPROC_PER_NODE=1).")
    if optimizer.use_badam and optimizer.badam_mode == "ratio":
        problems.append(f"'badam_mode: ratio' cannot train on {world_size} processes yet; use 'badam_mode: layer' with "
                        "DeepSpeed ZeRO-3, or train on one process (NPROC_PER_NODE=1).")
    elif optimizer.use_badam and deepspeed_zero_stage(training.get("deepspeed")) != 3:
        problems.append(f"'use_badam: true' ('badam_mode: layer') trains on {world_size} processes only under DeepSpeed "
                        "ZeRO-3; set 'deepspeed' to a ZeRO stage 3 config, or train on one process (NPROC_PER_NODE=1).")
    return problems


def _listed(keys: list[str]) -> str:
    return " and ".join(f"'{key}: true'" for key in keys)
