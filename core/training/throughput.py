"""Throughput accounting for training: tokens seen and model FLOPs utilisation (MFU).

Tokens are counted by a forward pre-hook on the model in training mode, both ways at once:
every position of the batch (`all`, padding included: what the accelerator computes) and the
positions that are not padding (`non_padding`: the batch's 2D attention mask summed; with a 4D
packed mask or none, the positions whose id is not the pad id). Counts stay on the device and
are read only when a step is logged, so counting adds no synchronisation to the step.

MFU is an estimate: model FLOPs per second over the peak FLOP/s of the hardware.

    flops_per_token = 4 * N_all + 2 * N_trainable
    MFU = flops_per_token * all_tokens_per_second / (peak_flops_per_device * processes)

A forward pass costs 2 FLOPs per parameter per token and the backward pass 4: 2 for the
gradients of the activations, which every layer needs, and 2 for the gradients of the weights,
which only trainable weights need. Full fine-tuning gives the usual 6 * N; LoRA, whose base
weights are frozen, about 4 * N. Attention-score FLOPs (which grow with sequence length) are left
out, as in the 6 * N rule, so MFU is slightly understated for long sequences.

The peak comes from `TUNELINE_PEAK_TFLOPS` (per device) when set; otherwise from a table of
dense bf16/fp16 datasheet peaks of known accelerators, matched on `torch.cuda.get_device_name`;
on a CPU it is an estimate (threads x clock x fp32 FLOPs per cycle from the vector extensions),
labelled as such wherever it is printed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

PEAK_ENV = "TUNELINE_PEAK_TFLOPS"

# Dense (no sparsity) bf16/fp16 tensor peak per device in TFLOP/s, from the vendors' datasheets.
# A row matches when every one of its words is a word of the device name; the first match wins.
GPU_PEAK_TFLOPS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("B200",), 2250.0),
    (("H200", "NVL"), 835.0),
    (("H200",), 989.0),
    (("GH200",), 989.0),
    (("H100", "NVL"), 835.0),
    (("H100", "PCIE"), 756.0),
    (("H100",), 989.0),
    (("A100",), 312.0),
    (("L40S",), 362.0),
    (("L40",), 181.0),
    (("L4",), 121.0),
    (("A10",), 125.0),
    (("V100", "PCIE"), 112.0),
    (("V100",), 125.0),
    (("T4",), 65.0),
    (("RTX", "4090"), 165.2),
    (("MI300X",), 1307.4),
    (("MI250X",), 383.0),
)
_DEFAULT_CPU_GHZ = 2.5


@dataclass(frozen=True)
class Peak:
    """Peak FLOP/s of one device and where the number comes from (printed next to MFU)."""

    flops: float
    source: str


def gpu_peak(device_name: str) -> Peak | None:
    """The table's peak for a device name such as 'NVIDIA H100 80GB HBM3'; None when unknown."""
    words = set(re.split(r"[^0-9A-Z]+", device_name.upper()))
    for required, tflops in GPU_PEAK_TFLOPS:
        if set(required) <= words:
            return Peak(tflops * 1e12, f"{device_name}: {tflops:g} TFLOP/s dense bf16 datasheet peak")
    return None


def cpu_peak(cpuinfo: str | None = None, *, threads: int | None = None) -> Peak:
    """An estimate: threads x clock x fp32 FLOPs per cycle (AVX-512: 64, AVX2+FMA: 32, else 16)."""
    import torch

    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    threads = threads or torch.get_num_threads()
    clocks = [float(mhz) / 1000 for mhz in re.findall(r"^cpu MHz\s*:\s*([0-9.]+)", cpuinfo, flags=re.M)]
    ghz = max(clocks) if clocks else _DEFAULT_CPU_GHZ
    found = re.search(r"^flags\s*:(.*)$", cpuinfo, flags=re.M)
    flags = set(found.group(1).split()) if found else set()
    per_cycle = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 16
    clock = f"{ghz:.2f} GHz" if clocks else f"{ghz:.2f} GHz (assumed)"
    return Peak(threads * ghz * 1e9 * per_cycle, f"CPU estimate: {threads} threads x {clock} x {per_cycle} FLOP/cycle")


def device_peak(device: torch.device) -> Peak | None:
    """The peak of `device`: the environment's override, the GPU table, or the CPU estimate."""
    override = os.environ.get(PEAK_ENV)
    if override:
        return Peak(float(override) * 1e12, f"{PEAK_ENV}={override}")
    if device.type == "cuda":
        import torch

        return gpu_peak(torch.cuda.get_device_name(device))
    if device.type == "cpu":
        return cpu_peak()
    return None


def flops_per_token(*, total_params: int, trainable_params: int) -> float:
    """Training FLOPs per token: 6 per trainable parameter, 4 per frozen one (see module docstring)."""
    return 4.0 * total_params + 2.0 * trainable_params


def mfu(*, tokens_per_second: float, flops_per_token_: float, peak_flops: float) -> float:
    """Model FLOPs utilisation as a fraction of the peak."""
    return tokens_per_second * flops_per_token_ / peak_flops


class TokenCounter:
    """Counts all and non-padding input tokens of every training-mode forward of a model."""

    def __init__(self, *, pad_token_id: int | None) -> None:
        self.pad_token_id = pad_token_id
        self.all_tokens = 0
        self._non_padding: Any = 0  # an int, or a device tensor read only when logged
        self._handle = None

    @property
    def non_padding_tokens(self) -> int:
        return int(self._non_padding)

    def attach(self, model: torch.nn.Module) -> None:
        self.detach()
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _count(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not module.training:
            return
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is None:
            return
        attention_mask = kwargs.get("attention_mask")
        if attention_mask is not None and attention_mask.shape[-1] != input_ids.shape[-1]:
            return  # a decoding step of generation (online RL's sampling), which reads cached keys: no training tokens
        self.all_tokens += input_ids.numel()
        self._non_padding = self._non_padding + self._non_padding_in(input_ids, attention_mask)

    def _non_padding_in(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> Any:
        if attention_mask is not None and attention_mask.dim() == 2:
            return attention_mask.ne(0).sum()
        if self.pad_token_id is not None:
            return input_ids.ne(self.pad_token_id).sum()
        return input_ids.numel()


def effective_tokens_per_second(train_dataset: Any, metrics: dict[str, float], *, world_size: int) -> float:
    """`include_effective_tokens_per_second`, as LLaMA-Factory reports it: the tokens of the training rows
    (a pair's chosen and rejected rows both) times the epochs trained, over the training seconds, per process."""
    columns = train_dataset.column_names
    token_columns = [name for name in ("chosen_input_ids", "rejected_input_ids") if name in columns] or ["input_ids"]
    tokens = sum(len(ids) for name in token_columns for ids in train_dataset[name])
    return tokens * metrics["epoch"] / metrics["train_runtime"] / world_size
