"""LLaMA-Factory's keys that a stage does not run, each named with the reason, never "unknown key".

Four kinds, each a small table of frozen values:
- `REFUSED`: features a stage does not run (Megatron-Core through MCoreAdapter, KTransformers, ...),
  with why and what to use instead (another command, where one reads them: `command`). These keys
  are not fields of any stage config; set to LLaMA-Factory's default they ask for nothing and pass.
  A feature's keys are refused together, in one paragraph; a config field's value that asks for it
  (`infer_backend: ktransformers`) is named there too.
- `NEEDS_CUDA`: kernels and precisions that only run on a CUDA GPU; on a machine without one,
  asking for them is an error that says so (never silently ignored).
- `PENDING`: keys that are fields of the config, with LLaMA-Factory's name and default, whose
  feature this version does not implement yet; asking for it is an error naming the key.
- `BROKEN_UPSTREAM`: keys whose feature LLaMA-Factory delegates to a package that cannot run with
  the transformers tuneline runs on; asking for it is an error naming the package and why.

A key "asks for" its feature when its value differs from the field's (or the table's) default,
or, for keys listed with `values`, when it takes one of those values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tuneline.core.config.stage import GROUPS, StageConfig

NO_VALUES: Mapping[str, tuple[Any, ...]] = {}


@dataclass(frozen=True)
class Refused:
    what: str
    instead: str
    defaults: Mapping[str, Any]  # each key with LLaMA-Factory's default
    command: str | None = None  # the tuneline command that reads these keys, where one does
    why: str | None = None  # why tuneline does not run it (CUDA kernels, another engine), where that needs saying
    values: Mapping[str, tuple[Any, ...]] = field(default_factory=lambda: NO_VALUES)
    """Config fields whose values ask for the feature (`infer_backend: ktransformers`): those values are refused here,
    named with the feature, instead of being read as a field's unknown choice."""


@dataclass(frozen=True)
class Unavailable:
    """A feature asked for by `keys` (away from their defaults) or by `values` (key -> values that ask)."""

    what: str
    keys: tuple[str, ...] = ()
    values: Mapping[str, tuple[Any, ...]] = field(default_factory=lambda: NO_VALUES)


_KTRANSFORMERS_KEYS: Mapping[str, Any] = {
    "use_kt": False, "kt_weight_path": None, "kt_expert_checkpoint_path": None, "kt_use_lora_experts": None,
    "kt_lora_expert_num": None, "kt_lora_expert_intermediate_size": None}
"""LLaMA-Factory 0.9.5's KTransformersArguments."""
_KTRANSFORMERS_ENGINE_KEYS: Mapping[str, Any] = {
    "kt_optimize_rule": None, "cpu_infer": 32, "chunk_size": 8192, "mode": "normal", "kt_maxlen": 4096,
    "kt_use_cuda_graph": True, "kt_mode": "normal", "kt_force_think": False}
"""The KTransformers keys of LLaMA-Factory's earlier releases (its engine for `infer_backend: ktransformers`), which
the KTransformers examples shipped with 0.9.5 still set."""
_MCORE_ADAPTER_KEYS: Mapping[str, Any] = {
    # parallelism
    "tensor_model_parallel_size": None, "pipeline_model_parallel_size": None, "sequence_parallel": False,
    "virtual_pipeline_model_parallel_size": None, "context_parallel_size": None, "expert_model_parallel_size": None,
    "account_for_embedding_in_pipeline_split": None, "account_for_loss_in_pipeline_split": None,
    "pipeline_model_parallel_layout": None, "overlap_p2p_comm": True, "variable_seq_lengths": False,
    # recomputation and fused kernels
    "recompute_granularity": None, "recompute_method": None, "recompute_modules": None, "recompute_num_layers": None,
    "bias_activation_fusion": False, "apply_rope_fusion": False,
    # mixture of experts and multi-token prediction
    "moe_layer_recompute": False, "moe_token_dispatcher_type": "allgather", "moe_aux_loss_coeff": None,
    "moe_grouped_gemm": None, "moe_expert_capacity_factor": None, "moe_pad_expert_input_to_capacity": None,
    "moe_token_drop_policy": None, "moe_shared_expert_overlap": False, "moe_router_dtype": None, "mtp_num_layers": None,
    # training
    "calculate_per_token_loss": False, "transformer_impl": None, "fp8_recipe": None, "fp8_param": False,
    "additional_configs": {}, "accumulate_allreduce_grads_in_fp32": False, "use_distributed_optimizer": False,
    "distrib_optim_fully_reshardable": True, "distrib_optim_fully_reshardable_mem_efficient": False,
    "overlap_grad_reduce": False, "delay_grad_reduce": True, "overlap_param_gather": False,
    "check_for_nan_in_loss_and_grad": True, "ddp_average_in_collective": False, "ddp_bucket_size": None,
    "optimizer_cpu_offload": False, "optimizer_offload_fraction": 0.0, "save_hf_model": False,
    "save_merged_model": False, "sequence_packing": False,
}
"""MCoreAdapter's TrainingArguments (its Megatron and parallelism arguments), which LLaMA-Factory parses in place of
its own with USE_MCA=1, with their defaults. Left out: `fp8`, LLaMA-Factory's own key, and `optimizer`, whose
refusal would mislead whoever meant transformers' `optim` (unknown, it gets that hint)."""

REFUSED: tuple[Refused, ...] = (
    Refused("SwanLab experiment tracking", "tuneline records every stage in MLflow (parameters, metrics, artifacts)",
            {"use_swanlab": False, "swanlab_project": "llamafactory", "swanlab_workspace": None, "swanlab_run_name": None,
             "swanlab_mode": "cloud", "swanlab_api_key": None, "swanlab_logdir": None, "swanlab_lark_webhook_url": None,
             "swanlab_lark_secret": None}),
    Refused("KTransformers' CPU offloading of mixture-of-experts layers",
            "train with LoRA or QLoRA, and generate with 'infer_backend: huggingface', on GPUs that hold the model",
            {**_KTRANSFORMERS_KEYS, **_KTRANSFORMERS_ENGINE_KEYS},
            why="KTransformers is an engine of its own, with its CUDA and AMX CPU kernels and its optimize rules, that "
                "tuneline does not run", values={"infer_backend": ("ktransformers",)}),
    Refused("Megatron-Core training (MCoreAdapter)", "use DeepSpeed or FSDP through accelerate for models too large for one GPU",
            {"use_mca": False, **_MCORE_ADAPTER_KEYS},
            why="LLaMA-Factory hands a run to MCoreAdapter when launched with USE_MCA=1, and Megatron-Core is a training "
                "engine of its own, on CUDA GPUs only, that tuneline does not run"),
    Refused("HyperParallel training", "use DeepSpeed or FSDP through accelerate", {"use_hyper_parallel": False,
                                                                                 "hyper_parallel_args": None}),
    Refused("the rendezvous address as YAML keys", "set MASTER_ADDR and MASTER_PORT in the environment of `tuneline "
            "train`, which torchrun reads", {"master_addr": None, "master_port": None}),
    Refused("benchmark evaluation (llamafactory-cli eval)", "run it with `tuneline eval CONFIG.yaml`, which reads these "
            "keys beside the model, adapter and template keys",
            {"task": None, "task_dir": "evaluation", "lang": "en", "n_shot": 5, "save_dir": None, "batch_size": 4,
             "download_mode": "reuse_dataset_if_exists"}, command="tuneline eval"),
)

NEEDS_CUDA: tuple[Unavailable, ...] = (
    Unavailable("Unsloth's kernels", keys=("use_unsloth", "use_unsloth_gc")),
    Unavailable("Liger's Triton kernels (liger-kernel)", keys=("enable_liger_kernel",)),
    Unavailable("LLaMA-Factory's v1 kernels", keys=("use_v1_kernels",)),
    Unavailable("FP8 training", keys=("fp8", "fp8_enable_fsdp_float8_all_gather")),
    Unavailable("a vLLM or SGLang engine", values={"infer_backend": ("vllm", "sglang")}),
)

PENDING: tuple[Unavailable, ...] = (
    *NEEDS_CUDA,  # where CUDA is present, these are not implemented yet either
)

# None at present (Mixture-of-Depths runs as tuneline's own, core/models/mixture_of_depths.py).
BROKEN_UPSTREAM: tuple[tuple[Unavailable, str], ...] = ()

REFUSED_KEYS: Mapping[str, Refused] = {key: refused for refused in REFUSED for key in refused.defaults}


def refused_value(key: str, value: Any) -> Refused | None:
    """The refused feature that a config field's `value` asks for (`infer_backend: ktransformers`), else None."""
    return next((refused for refused in REFUSED if value in refused.values.get(key, ())), None)


def refusal_problems(raw: Mapping[str, Any]) -> list[str]:
    """One paragraph for each refused feature that keys of `raw` ask for, naming all of them."""
    asking: dict[str, list[str]] = {}  # feature -> its keys, in the order the config names them
    features = {refused.what: refused for refused in REFUSED}
    for key, value in raw.items():
        refused = REFUSED_KEYS[key] if key in REFUSED_KEYS and value != REFUSED_KEYS[key].defaults[key] else None
        refused = refused or refused_value(key, value)
        if refused is not None:
            asking.setdefault(refused.what, []).append(f"'{key}: {value}'")
    return [_refusal(keys, features[what]) for what, keys in asking.items()]


def _refusal(keys: list[str], refused: Refused) -> str:
    offered = "which `tuneline train` and pipelines do not run" if refused.command else "which tuneline does not offer"
    named = keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + " and " + keys[-1]
    why = f" ({refused.why})" if refused.why else ""
    remove = "Remove the key." if len(keys) == 1 else "Remove these keys."
    return f"{named} {'asks' if len(keys) == 1 else 'ask'} for {refused.what}, {offered}{why}; {refused.instead}. {remove}"


def unavailable_problems(config: StageConfig, *, has_cuda: Callable[[], bool]) -> list[str]:
    """One line for each key of `config` that asks for a feature this machine or this
    version cannot run; `has_cuda()` is called only when a CUDA-only key asks."""
    flat, defaults = config.flat(), _field_defaults(config)
    cuda_asked = [(key, table.what) for table in NEEDS_CUDA for key in _asking(table, flat, defaults)]
    problems = []
    if cuda_asked and not has_cuda():
        problems.extend(f"'{key}: {flat[key]}' needs {what}, available only on a CUDA GPU, and this machine has none; "
                        "remove the key, or run the stage on a CUDA machine." for key, what in cuda_asked)
    cuda_keys = {key for key, _ in cuda_asked}
    problems.extend(f"'{key}: {flat[key]}' ({table.what}) is a LLaMA-Factory key that this version of tuneline reads but does "
                    f"not implement yet; remove it (its default is {defaults[key]!r})."
                    for table in PENDING for key in _asking(table, flat, defaults) if key not in cuda_keys)
    problems.extend(f"'{key}: {flat[key]}' asks for {table.what}, which cannot run with this version of transformers: "
                    f"{why}; remove the key." for table, why in BROKEN_UPSTREAM for key in _asking(table, flat, defaults))
    return problems


def _asking(table: Unavailable, flat: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    moved = [key for key in table.keys if flat[key] != defaults[key]]
    return moved + [key for key, values in table.values.items() if flat[key] in values]


def _field_defaults(config: StageConfig) -> dict[str, Any]:
    return {f.name: f.default for name in GROUPS for f in dataclasses.fields(getattr(config, name))}
