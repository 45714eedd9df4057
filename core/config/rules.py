"""Checks across keys that hold whatever the stage: values out of range and keys that cannot go
together. The checks of one stage kind live in its module (core/stages/)."""

from __future__ import annotations

from tuneline.core.config.added_tokens import added_token_problems
from tuneline.core.config.method import FinetuningConfig
from tuneline.core.config.ray import ray_problems
from tuneline.core.config.stage import StageConfig


def conflicts(config: StageConfig) -> list[str]:
    return [*_value_problems(config), *data_problems(config), *method_problems(config), *loading_problems(config),
            *media_problems(config), *added_token_problems(config.model),
            *profiler_problems(config), *ray_problems(config.ray)]


def profiler_problems(config: StageConfig) -> list[str]:
    """torch.profiler's schedule counts steps: none negative, and at least one recorded per cycle."""
    runtime = config.runtime
    if not runtime.enable_torch_profiler:
        return []
    problems = [f"'{key}' must be 0 or more, got {getattr(runtime, key)}."
                for key in ("profiler_wait_steps", "profiler_warmup_steps", "profiler_repeat") if getattr(runtime, key) < 0]
    if runtime.profiler_active_steps <= 0:
        problems.append(f"'profiler_active_steps' must be positive (the steps recorded per cycle), got "
                        f"{runtime.profiler_active_steps}.")
    return problems


def _value_problems(config: StageConfig) -> list[str]:
    problems = []
    ft, data = config.finetuning, config.data
    if ft.finetuning_type == "lora" and ft.lora_rank <= 0:
        problems.append(f"'lora_rank' must be positive, got {ft.lora_rank}.")
    if not 0 <= ft.lora_dropout < 1:
        problems.append(f"'lora_dropout' must be in [0, 1), got {ft.lora_dropout}.")
    if ft.finetuning_type == "oft":
        problems.extend(_oft_problems(ft))
    if ft.use_llama_pro and ft.finetuning_type == "full":
        problems.append("'use_llama_pro: true' trains only the blocks added by expansion, which 'finetuning_type: full' "
                        "cannot do; use 'finetuning_type: freeze' (or lora, oft).")
    if ft.use_llama_pro and ft.freeze_trainable_layers <= 0:
        problems.append(f"'use_llama_pro: true' reads 'freeze_trainable_layers' as the number of blocks the model was "
                        f"expanded by, which must be positive, got {ft.freeze_trainable_layers}.")
    problems.extend(_mixture_of_depths_problems(config))
    if data.cutoff_len <= 0:
        problems.append(f"'cutoff_len' must be positive, got {data.cutoff_len}.")
    if data.val_size < 0:
        problems.append(f"'val_size' must be a share in [0, 1) or a row count, got {data.val_size}.")
    if data.neat_packing and data.packing is False:
        problems.append("'neat_packing: true' needs packing; remove 'packing: false'.")
    if data.mask_history and data.train_on_prompt:
        problems.append("'mask_history: true' trains only the last reply and 'train_on_prompt: true' trains every token; "
                        "they cannot go together, keep one.")
    if data.strict_template and data.allow_template_mismatch:
        problems.append("'strict_template: true' refuses a template that renders differently from the tokenizer's own and "
                        "'allow_template_mismatch: true' accepts one; keep one.")
    if config.export.export_legacy_format:
        problems.append("'export_legacy_format: true' would write pickle weights; only safetensors is written.")
    if config.model.quantization_bit not in (None, 4, 8):
        problems.append(f"'quantization_bit' must be 4 or 8, got {config.model.quantization_bit}.")
    if data.interleave_probs and data.mix_strategy == "concat":
        problems.append("'interleave_probs' needs 'mix_strategy: interleave_under' or 'interleave_over'.")
    if data.interleave_probs and data.dataset:
        probs, names = data.interleave_probs.split(","), data.dataset.split(",")
        if len(probs) != len(names):
            problems.append(f"'interleave_probs' has {len(probs)} values for {len(names)} datasets; give one per dataset.")
    return problems


def _mixture_of_depths_problems(config: StageConfig) -> list[str]:
    mod, ft = config.model.mixture_of_depths, config.finetuning
    if mod is None:
        return []
    problems = []
    if mod == "convert" and ft.finetuning_type != "full":
        problems.append(f"'mixture_of_depths: convert' adds a new router to every other decoder layer, which only "
                        f"'finetuning_type: full' trains ('{ft.finetuning_type}' would leave the routers as they "
                        "started); set finetuning_type: full, or train the converted model in full first and then load "
                        "it with 'mixture_of_depths: load'.")
    if config.model.flash_attn == "fa2":
        problems.append(f"'mixture_of_depths: {mod}' routes tokens through the attention masks of SDPA and eager "
                        "attention, not FlashAttention-2; set 'flash_attn: sdpa' or remove one of the two keys.")
    return problems


def data_problems(config: StageConfig) -> list[str]:
    """LLaMA-Factory's rules on which datasets and how they are read."""
    data, training = config.data, config.training
    problems = []
    if data.val_size and not data.dataset:
        problems.append(f"'val_size: {data.val_size}' holds rows out of 'dataset', which is not set; name the dataset or "
                        "remove val_size.")
    if data.val_size and data.eval_dataset:
        problems.append(f"'val_size: {data.val_size}' and 'eval_dataset: {data.eval_dataset}' both choose the evaluation rows; "
                        "keep one.")
    if data.interleave_probs and data.eval_dataset and data.mix_strategy != "concat":
        probs, names = data.interleave_probs.split(","), data.eval_dataset.split(",")
        if len(probs) != len(names):
            problems.append(f"'interleave_probs' has {len(probs)} values for the {len(names)} datasets of 'eval_dataset'; "
                            "give one per dataset.")
    if data.buffer_size < 1:
        problems.append(f"'buffer_size' is the number of rows of the streaming shuffle buffer and must be at least 1, "
                        f"got {data.buffer_size}.")
    if data.streaming:
        if (training.get("max_steps") or -1) <= 0:
            problems.append("'streaming: true' reads a dataset of unknown length, so training needs 'max_steps'; set it.")
        if 0 < data.val_size < 1:
            problems.append(f"'streaming: true' takes a row count for 'val_size', not the share {data.val_size}; "
                            "give a whole number of rows.")
        if data.max_samples is not None:
            problems.append(f"'max_samples: {data.max_samples}' cannot cut a streamed dataset ('streaming: true'); "
                            "remove one of the two.")
    evaluates = [key for key in ("do_eval", "do_predict", "predict_with_generate") if training.get(key)]
    if evaluates and not data.eval_dataset and not data.val_size:
        keys = " and ".join(f"'{key}: true'" for key in evaluates)
        problems.append(f"{keys} need evaluation rows: name 'eval_dataset' or hold rows out of the training data with "
                        "'val_size'.")
    return problems


def method_problems(config: StageConfig) -> list[str]:
    """LLaMA-Factory's rules on methods and precision that hold whatever the stage."""
    model, ft = config.model, config.finetuning
    problems = []
    if ft.finetuning_type != "lora":
        problems.extend(f"'{key}: true' is a LoRA option and 'finetuning_type' is '{ft.finetuning_type}'; set "
                        f"'finetuning_type: lora' or remove {key}."
                        for key in ("use_rslora", "use_dora", "pissa_init") if getattr(ft, key))
    if model.quantization_bit is not None and model.resize_vocab:
        problems.append(f"'resize_vocab: true' cannot resize the embeddings of a quantized model ('quantization_bit: "
                        f"{model.quantization_bit}'); remove one of the two.")
    if config.runtime.fp8 and model.quantization_bit is not None:
        problems.append(f"'fp8: true' cannot train a quantized model ('quantization_bit: {model.quantization_bit}'); "
                        "remove one of the two.")
    for key in ("ref_model_quantization_bit", "reward_model_quantization_bit"):
        if getattr(ft, key) not in (None, 4, 8):
            problems.append(f"'{key}' must be 4 or 8, got {getattr(ft, key)}.")
    export_bit = config.export.export_quantization_bit
    if export_bit is not None and not config.export.export_quantization_dataset:
        problems.append(f"'export_quantization_bit: {export_bit}' needs calibration data in "
                        "'export_quantization_dataset'; set it.")
    if export_bit not in (None, 2, 3, 4, 8):
        problems.append(f"'export_quantization_bit' must be 2, 3, 4 or 8 (GPTQ's widths), got {export_bit}.")
    if export_bit is not None and model.adapter_name_or_path:
        problems.append(f"'export_quantization_bit: {export_bit}' quantizes a full model, and 'adapter_name_or_path' asks "
                        "for a merge in the same export (LLaMA-Factory refuses it too); export the merged model first, then "
                        "quantize that export with it as model_name_or_path and no adapter.")
    if export_bit is not None and (config.export.export_quantization_nsamples <= 0
                                   or config.export.export_quantization_maxlen <= 0):
        problems.append("'export_quantization_nsamples' and 'export_quantization_maxlen' must be positive, got "
                        f"{config.export.export_quantization_nsamples} and {config.export.export_quantization_maxlen}.")
    return problems


def loading_problems(config: StageConfig) -> list[str]:
    """Rules on the model-loading, precision and method keys (LLaMA-Factory's, and keys that would
    otherwise ask for nothing without saying so)."""
    model, ft, training = config.model, config.finetuning, config.training
    problems = []
    if model.quantization_device_map is not None:
        problems.append(f"'quantization_device_map: {model.quantization_device_map}' spreads a quantized model over the "
                        "devices for inference; training cannot use it (LLaMA-Factory refuses it in training too), and "
                        "tuneline's inference commands load models unquantized; remove the key.")
    if model.adapter_folder and not model.adapter_name_or_path:
        problems.append(f"'adapter_folder: {model.adapter_folder}' names the subfolder of each 'adapter_name_or_path' "
                        "to load, and adapter_name_or_path is not set; set it or remove adapter_folder.")
    if model.train_from_scratch and model.quantization_bit is not None:
        problems.append(f"'train_from_scratch: true' starts from random weights, which 'quantization_bit: "
                        f"{model.quantization_bit}' cannot quantize (bitsandbytes quantizes weights as they load); "
                        "remove one of the two.")
    if model.disable_gradient_checkpointing and training.get("gradient_checkpointing"):
        problems.append("'disable_gradient_checkpointing: true' and 'gradient_checkpointing: true' contradict each "
                        "other; remove one of the two.")
    reentrant = (training.get("gradient_checkpointing_kwargs") or {}).get("use_reentrant")
    if reentrant is not None and reentrant != model.use_reentrant_gc:
        problems.append(f"'gradient_checkpointing_kwargs' sets use_reentrant {reentrant} and 'use_reentrant_gc' is "
                        f"{model.use_reentrant_gc}; keep one of the two.")
    if ft.pissa_iter < -1:
        problems.append(f"'pissa_iter' must be -1 (the exact SVD) or a number of fast-SVD iterations (0 or more), "
                        f"got {ft.pissa_iter}.")
    if ft.pissa_convert and not ft.pissa_init:
        problems.append("'pissa_convert: true' converts a PiSSA adapter to a plain LoRA adapter, and 'pissa_init' is "
                        "not set; set 'pissa_init: true' or remove pissa_convert.")
    # peft's conversion rewrites the LoRA matrices only: it would drop these parts of the adapter
    # (and a reward head: core.stages.rules)
    lost = [key for key, asked in (("use_dora", ft.use_dora), ("additional_target", ft.additional_target)) if asked]
    if ft.pissa_convert and lost:
        problems.append(f"'pissa_convert: true' keeps only the LoRA matrices of the adapter, and "
                        f"{', '.join(repr(key) for key in lost)} adds "
                        "parts it would drop (DoRA's magnitudes, modules trained in full); remove "
                        "pissa_convert, or the other key.")
    if ft.loraplus_lr_embedding != FinetuningConfig.loraplus_lr_embedding and ft.loraplus_lr_ratio is None:
        problems.append(f"'loraplus_lr_embedding: {ft.loraplus_lr_embedding}' is the learning rate of LoRA+'s "
                        "embedding group, and 'loraplus_lr_ratio' is not set; set it or remove loraplus_lr_embedding.")
    if ft.pure_bf16 and training.get("fp16"):
        problems.append("'pure_bf16: true' trains the weights in bfloat16, and 'fp16: true' would compute them in float16 "
                        "with a loss scaler; remove fp16 (pure_bf16 needs no mixed precision).")
    problems.extend(_quantized_reference_problems(ft))
    return problems


def _quantized_reference_problems(ft: FinetuningConfig) -> list[str]:
    problems = []
    if ft.ref_model_quantization_bit is not None and not ft.ref_model:
        problems.append(f"'ref_model_quantization_bit: {ft.ref_model_quantization_bit}' quantizes the model named by "
                        "'ref_model', which is not set (the reference is then the policy itself); set ref_model or "
                        "remove the key.")
    adapters = [name for name in (ft.ref_model_adapters or "").split(",") if name.strip()]
    if ft.ref_model_quantization_bit is not None and len(adapters) > 1:
        problems.append(f"'ref_model_adapters' lists {len(adapters)} adapters, but a quantized reference "
                        f"('ref_model_quantization_bit: {ft.ref_model_quantization_bit}') takes one; merge them first.")
    if ft.reward_model_quantization_bit is not None and not ft.reward_model:
        problems.append(f"'reward_model_quantization_bit: {ft.reward_model_quantization_bit}' quantizes the model named "
                        "by 'reward_model', which is not set; set reward_model or remove the key.")
    return problems


def media_problems(config: StageConfig) -> list[str]:
    media = config.media
    return [f"'{kind}_max_pixels: {high}' is smaller than '{kind}_min_pixels: {low}'; raise the maximum or lower the minimum."
            for kind, high, low in (("image", media.image_max_pixels, media.image_min_pixels),
                                    ("video", media.video_max_pixels, media.video_min_pixels)) if high < low]


def _oft_problems(ft: FinetuningConfig) -> list[str]:
    """OFT's shape is given by the number of blocks or by their size, exactly one of the two (peft's rule)."""
    problems = []
    if ft.oft_rank < 0 or ft.oft_block_size < 0:
        problems.append(f"'oft_rank' and 'oft_block_size' cannot be negative, got {ft.oft_rank} and {ft.oft_block_size}.")
    elif (ft.oft_rank == 0) == (ft.oft_block_size == 0):
        problems.append(f"OFT takes either 'oft_rank' (blocks per layer) or 'oft_block_size' (features per block), not "
                        f"both, got {ft.oft_rank} and {ft.oft_block_size}; set one of them to 0 (the default is "
                        "oft_rank 0 with oft_block_size 32).")
    if not 0 <= ft.module_dropout < 1:
        problems.append(f"'module_dropout' must be in [0, 1), got {ft.module_dropout}.")
    if ft.lora_target != "all":  # LLaMA-Factory 0.9.5 hands lora_target to OFT; silently ignoring it would differ
        problems.append(f"'lora_target: {ft.lora_target}' does not choose OFT's modules here, 'oft_target' does "
                        "(LLaMA-Factory 0.9.5 reads lora_target for OFT); move the value to oft_target.")
    return problems
