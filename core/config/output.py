"""Keys of what a stage writes: the output folder, the merged export, and what runs beside training
(the torch profiler, FP8 kernels)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tuneline.core.config.fields import documented as _doc


@dataclass(frozen=True)
class ExportConfig:
    export_dir: str | None = _doc("Folder the merged Hugging Face model is written to.", default=None)
    export_size: int = _doc("Largest safetensors shard, in GB.", default=5)
    export_device: Literal["cpu", "auto"] = _doc("Device used for merging.", default="cpu")
    export_legacy_format: bool = _doc("Write pickle (.bin) weights instead of safetensors.", default=False)
    export_quantization_bit: int | None = _doc("Quantize the exported model to this many bits (GPTQ).", default=None)
    export_quantization_dataset: str | None = _doc("Calibration data for export quantization.", default=None)
    export_quantization_nsamples: int = _doc("Calibration rows for export quantization.", default=128)
    export_quantization_maxlen: int = _doc("Longest calibration row, in tokens.", default=1024)
    export_hub_model_id: str | None = _doc("Hub repository the export is pushed to.", default=None)


@dataclass(frozen=True)
class OutputConfig:
    overwrite_output_dir: bool = _doc("Allow writing into an output_dir that holds other files.", default=False)


@dataclass(frozen=True)
class RuntimeConfig:
    fp8: bool = _doc("FP8 matrix multiplications during training (CUDA, Hopper or newer).", default=False)
    fp8_backend: str = _doc("FP8 implementation: auto, torchao, te or msamp.", default="auto")
    fp8_enable_fsdp_float8_all_gather: bool = _doc("FP8 all-gather of FSDP shards.", default=False)
    enable_torch_profiler: bool = _doc("Profile training steps with torch.profiler.", default=False)
    profiler_output_dir: str | None = _doc("Where the profiler's traces go (default: output_dir/profiler).", default=None)
    profiler_wait_steps: int = _doc("Profiler: steps skipped at the start of each cycle.", default=1)
    profiler_warmup_steps: int = _doc("Profiler: steps traced but discarded.", default=1)
    profiler_active_steps: int = _doc("Profiler: steps recorded.", default=1)
    profiler_repeat: int = _doc("Profiler: cycles recorded (0: until training ends).", default=1)
    profiler_record_shapes: bool = _doc("Profiler: record operator input shapes.", default=True)
    profiler_profile_memory: bool = _doc("Profiler: record memory use.", default=True)
    profiler_with_stack: bool = _doc("Profiler: record Python stacks.", default=True)
    profile_modules: str | None = _doc("Profiler: modules whose forward passes are labelled, comma-separated.", default=None)
