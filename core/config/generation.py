"""Keys of generation (predictions, chat, PPO rollouts) and of the inference engine that serves it.

The defaults are LLaMA-Factory 0.9.5's GeneratingArguments: sampling at temperature 0.95, top_p 0.7,
top_k 50, up to 1024 new tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tuneline.core.config.fields import documented as _doc


@dataclass(frozen=True)
class GeneratingConfig:
    max_new_tokens: int = _doc("Tokens generated per answer (0 or less: max_length bounds prompt plus answer instead).",
                               default=1024)
    max_length: int = _doc("Longest prompt plus answer; max_new_tokens wins when both are set.", default=1024)
    do_sample: bool = _doc("Sample (temperature, top_p, top_k) instead of greedy decoding.", default=True)
    temperature: float = _doc("Sampling temperature.", default=0.95)
    top_p: float = _doc("Nucleus sampling mass.", default=0.7)
    top_k: int = _doc("Top-k sampling.", default=50)
    num_beams: int = _doc("Beams of beam search (1: none).", default=1)
    repetition_penalty: float = _doc("Penalty on repeated tokens.", default=1.0)
    length_penalty: float = _doc("Beam search: exponent of the length normalisation of the scores.", default=1.0)
    skip_special_tokens: bool = _doc("Leave special tokens out of the decoded answer.", default=True)


@dataclass(frozen=True)
class InferenceConfig:
    infer_backend: Literal["huggingface", "vllm", "sglang"] = _doc("Engine that generates: transformers, vLLM or SGLang.",
                                                                   default="huggingface")
    infer_dtype: Literal["auto", "float16", "bfloat16", "float32"] = _doc("Weights' dtype for inference.", default="auto")
    use_kv_cache: bool = _doc("Keep the attention keys and values of earlier tokens while generating.", default=True)
    vllm_maxlen: int = _doc("vLLM: longest prompt plus answer.", default=4096)
    vllm_gpu_util: float = _doc("vLLM: share of GPU memory it may take.", default=0.7)
    vllm_enforce_eager: bool = _doc("vLLM: no CUDA graphs.", default=False)
    vllm_max_lora_rank: int = _doc("vLLM: largest LoRA rank it serves.", default=32)
    vllm_config: dict[str, Any] | str | None = _doc("vLLM: further engine arguments (a mapping or JSON).", default=None)
    sglang_maxlen: int = _doc("SGLang: longest prompt plus answer.", default=4096)
    sglang_mem_fraction: float = _doc("SGLang: share of GPU memory it may take.", default=0.7)
    sglang_tp_size: int = _doc("SGLang: tensor-parallel GPUs (-1: all).", default=-1)
    sglang_config: dict[str, Any] | str | None = _doc("SGLang: further engine arguments (a mapping or JSON).", default=None)
    sglang_lora_backend: Literal["triton", "flashinfer"] = _doc("SGLang: LoRA kernels.", default="triton")
