"""Keys of the model: where it comes from, how it loads, which tokens it gets, which kernels it uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tuneline.core.config.fields import documented as _doc


@dataclass(frozen=True)
class ModelConfig:
    model_name_or_path: str | None = _doc("Local model folder or hub id of the base model.", default=None)
    adapter_name_or_path: str | None = _doc("Adapter folder(s) to load on top of the base, comma-separated.", default=None)
    adapter_folder: str | None = _doc("Subfolder of each adapter_name_or_path that holds the adapter.", default=None)
    cache_dir: str | None = _doc("Where hub downloads are cached.", default=None)
    model_revision: str = _doc("Hub revision (branch, tag or commit) of the model.", default="main")
    trust_remote_code: bool = _doc("Allow code shipped with the model to run. Off unless asked.", default=False)
    use_fast_tokenizer: bool = _doc("Use the Rust (fast) tokenizer.", default=True)
    resize_vocab: bool = _doc("Resize the embeddings when the template adds tokens.", default=False)
    split_special_tokens: bool = _doc("Tokenize special-token text as plain text instead of as the special token.", default=False)
    add_tokens: str | None = _doc("Plain tokens added to the vocabulary, comma-separated.", default=None)
    add_special_tokens: str | None = _doc("Special tokens added to the vocabulary, comma-separated.", default=None)
    new_special_tokens_config: str | None = _doc("YAML file mapping each new special token to a description.", default=None)
    init_special_tokens: Literal["noise_init", "desc_init", "desc_init_w_noise"] = _doc(
        "How the embedding rows of added tokens start: mean plus noise, or the mean embedding of a description.",
        default="noise_init")
    low_cpu_mem_usage: bool = _doc("Load weights without a first full-size random initialisation "
                                       "(transformers 5 always does; the key is accepted, either value).", default=True)
    rope_scaling: Literal["linear", "dynamic", "yarn", "llama3"] | None = _doc(
        "Stretch RoPE positions for longer contexts than the model was trained on.", default=None)
    flash_attn: Literal["auto", "disabled", "sdpa", "fa2"] = _doc("Attention implementation.", default="auto")
    shift_attn: bool = _doc("LongLoRA's shifted sparse attention (S^2-Attn) during training.", default=False)
    mixture_of_depths: Literal["convert", "load"] | None = _doc(
        "Mixture-of-Depths: convert the model to MoD layers, or load a MoD checkpoint.", default=None)
    use_unsloth: bool = _doc("Unsloth's kernels for LoRA training (CUDA).", default=False)
    use_unsloth_gc: bool = _doc("Unsloth's gradient checkpointing (CUDA).", default=False)
    enable_liger_kernel: bool = _doc("Liger's fused Triton kernels (CUDA).", default=False)
    use_v1_kernels: bool | None = _doc("LLaMA-Factory's experimental v1 kernels (CUDA).", default=False)
    moe_aux_loss_coef: float | None = _doc("Weight of the router's load-balancing loss of mixture-of-experts models.", default=None)
    disable_gradient_checkpointing: bool = _doc("Never use gradient checkpointing.", default=False)
    use_reentrant_gc: bool = _doc("Reentrant gradient checkpointing (the torch default) rather than non-reentrant.", default=True)
    upcast_layernorm: bool = _doc("Keep the normalisation layers' weights in float32.", default=False)
    upcast_lmhead_output: bool = _doc("Compute the output logits in float32.", default=False)
    train_from_scratch: bool = _doc("Start from randomly initialised weights of the model's architecture.", default=False)
    print_param_status: bool = _doc("Print every parameter's name, dtype, device and whether it trains.", default=False)
    hf_hub_token: str | None = _doc("Token of every Hugging Face Hub download and upload (models, adapters, datasets, "
                                    "export_hub_model_id); a secret, masked wherever the config is recorded.", default=None)
    ms_hub_token: str | None = _doc("Token for the ModelScope hub; read and masked, but tuneline loads nothing from that hub.",
                                    default=None)
    om_hub_token: str | None = _doc("Token for the Modelers hub; read and masked, but tuneline loads nothing from that hub.",
                                    default=None)
    quantization_bit: int | None = _doc("Load the base in 4 or 8 bits (QLoRA).", default=None)
    quantization_method: Literal["bnb", "gptq", "awq", "aqlm", "quanto", "eetq", "hqq"] = _doc("Quantization backend.", default="bnb")
    quantization_type: Literal["fp4", "nf4"] = _doc("4-bit data type of bitsandbytes.", default="nf4")
    double_quantization: bool = _doc("Quantize the quantization constants too (bitsandbytes).", default=True)
    quantization_device_map: Literal["auto"] | None = _doc("Device map of a quantized model for inference; refused, since every "
                                                           "stage trains.", default=None)
    offload_folder: str = _doc("Where weights that fit on no device are offloaded (handed to peft's adapter loading).",
                                default="offload")
    allow_pickle_weights: bool = _doc("Load pickle (.bin) weights of the model or adapter when they have no safetensors; "
                                      "unpickling can run code, so only for files you trust.", default=False)
