"""Loading the base in 4 or 8 bits with bitsandbytes (QLoRA), as LLaMA-Factory configures it.

The quantized weights stay frozen; only LoRA or OFT adapters on top of them train. Nothing is upcast
beyond what the method needs: the non-quantized parameters keep the compute dtype. A model saved
already quantized (GPTQ, AWQ, AQLM, ...) loads through transformers' loader for its method, which
needs that method's package; without it, the message names the package.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tuneline.core.config import ModelConfig
from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from transformers import BitsAndBytesConfig, PretrainedConfig, PreTrainedModel


def quantization_config(model: ModelConfig, *, compute_dtype: torch.dtype) -> BitsAndBytesConfig | None:
    """bitsandbytes settings for `quantization_bit` (None when the base loads unquantized)."""
    if model.quantization_bit is None:
        return None
    if model.quantization_method != "bnb":
        raise ConfigError(
            f"'quantization_method: {model.quantization_method}' is not supported for on-the-fly quantization; "
            "use 'quantization_method: bnb' (bitsandbytes) or load a model that is already quantized."
        )
    from transformers import BitsAndBytesConfig

    if model.quantization_bit == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    if model.quantization_bit == 4:
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_compute_dtype=compute_dtype,
            bnb_4bit_use_double_quant=model.double_quantization,
            bnb_4bit_quant_type=model.quantization_type,
        )
    raise ConfigError(f"'quantization_bit' must be 4 or 8 with bitsandbytes, got {model.quantization_bit}.")


def prequantized_method(config: PretrainedConfig) -> str | None:
    """The method a saved model's weights were quantized with (GPTQ, AWQ, AQLM, ...), or None."""
    settings = getattr(config, "quantization_config", None)  # written into config.json by quantized checkpoints only
    if settings is None:
        return None
    return str((settings if isinstance(settings, dict) else settings.to_dict()).get("quant_method"))


def prequantized_support_message(key: str, path: object, *, method: str, missing: ImportError) -> str:
    """Why a model saved quantized cannot load here: transformers' loader for `method` needs a
    package this environment lacks (`missing` names it)."""
    needs = str(missing).strip().splitlines()[0] if str(missing).strip() else type(missing).__name__
    return (f"'{key}: {path}' holds weights quantized with {method}, and loading them needs what this machine lacks: "
            f"{needs}. Install that package (its kernels may need a GPU), or start from the model's unquantized "
            "weights, with 'quantization_bit: 4' to train QLoRA through bitsandbytes.")


def quantized_device_map() -> dict[str, torch.device]:
    """The whole model on this process's device: bitsandbytes quantizes while placing the weights."""
    import torch

    if torch.cuda.is_available():
        return {"": torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))}
    return {"": torch.device("cpu")}


def keep_4bit_layout_for_training(model: PreTrainedModel) -> int:
    """Stop bitsandbytes from repacking 4-bit weights for its CPU inference kernel; returns the
    number of layers changed.

    On a CPU with AVX512-BF16, bitsandbytes (0.50) rewrites a `Linear4bit` weight in place into a
    layout for its fast inference kernel the first time the layer runs in eval mode without grad
    (evaluation, generation). That kernel has no backward, so every LoRA gradient computed after
    such a pass is silently wrong (relative errors of order one). Keeping the training layout costs
    only inference speed on the CPU. Remove once bitsandbytes undoes the repacking for training.
    """
    from bitsandbytes.nn import Linear4bit

    layers = [module for module in model.modules() if isinstance(module, Linear4bit)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False
    return len(layers)
