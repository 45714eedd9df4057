"""Merging a LoRA adapter into its base and writing a standalone Hugging Face model folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tuneline.core.config import ExportConfig, ModelConfig

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
"""A multimodal model's processor settings, which travel beside its weights and tokenizer."""


def merge_adapter(base_path: str | Path, adapter_path: str | Path, output_dir: str | Path, *,
                  model_config: ModelConfig | None = None, model_max_length: int | None = None) -> dict[str, int]:
    """Fold the adapter's low-rank updates into the base weights; write model and tokenizer (and a
    multimodal model's processor files), the weights in the dtype the base was saved in.
    `model_config` holds the loading settings of a base from the hub (its token, revision, cache)
    and the `rope_scaling` the adapter was trained with, which scales RoPE to `model_max_length`
    as training did, so the merged model's config says so."""
    from peft import PeftModel

    from tuneline.core.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(adapter_path)
    base = load_model(base_path, model=model_config, vocab_size=len(tokenizer), model_max_length=model_max_length)
    merged = PeftModel.from_pretrained(base, str(adapter_path)).merge_and_unload()
    dtype = saved_dtype(base_path)
    if dtype is not None:  # merged in the dtype it loaded in (float32 on a CPU), written in the base's own
        merged = merged.to(dtype)
    merged.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    copy_processor_files([adapter_path, base_path], output_dir)
    return {"parameters": sum(p.numel() for p in merged.parameters())}


def write_hf_folder(model_dir: str | Path, out_dir: str | Path, *, template: str, export_size_gb: int = 5,
                    export: ExportConfig | None = None, model_config: ModelConfig | None = None,
                    infer_dtype: str = "auto", use_kv_cache: bool = True, model_max_length: int | None = None) -> None:
    """Write `model_dir` into `out_dir` as a Hugging Face folder: safetensors shards, the tokenizer
    with its chat template, a multimodal model's processor files, and a generation config that stops on the template's stop tokens.
    With `export.export_quantization_bit` the weights are GPTQ-quantized (`core.models.gptq`);
    otherwise they are written in `infer_dtype` ('auto': see `auto_export_dtype`). The config's `use_cache`
    says `use_kv_cache`, and `model_config.rope_scaling` scales RoPE to `model_max_length` (None: by 2)."""
    import torch

    from tuneline.core.models.loading import load_tokenizer
    from tuneline.core.templates.conversation import chat_template_jinja, get_template, stop_token_ids

    tokenizer = load_tokenizer(model_dir, model=model_config)
    if not tokenizer.chat_template:  # a server renders prompts with it; training rendered them with `template`
        tokenizer.chat_template = chat_template_jinja(get_template(template, tokenizer=tokenizer), tokenizer)
    model = _export_model(model_dir, tokenizer, export=export, model_config=model_config or ModelConfig(),
                          model_max_length=model_max_length, use_kv_cache=use_kv_cache)
    if export is None or export.export_quantization_bit is None:  # a quantized model keeps its dtypes
        model = model.to(getattr(torch, infer_dtype) if infer_dtype != "auto" else auto_export_dtype(model_dir))
    model.generation_config.eos_token_id = stop_token_ids(get_template(template, tokenizer=tokenizer), tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size=f"{export_size_gb}GB")
    tokenizer.save_pretrained(out_dir)
    copy_processor_files([model_dir], out_dir)


def copy_processor_files(sources: list[str | Path], out_dir: str | Path) -> None:
    """The processor files of the first local folder of `sources` that has any, copied into `out_dir`."""
    import shutil

    for source in sources:
        found = [Path(source) / name for name in PROCESSOR_FILES if (Path(source) / name).is_file()]
        if found:
            for path in found:
                shutil.copyfile(path, Path(out_dir) / path.name)
            return


def auto_export_dtype(model_dir: str | Path) -> torch.dtype:
    """The dtype an `infer_dtype: auto` export writes, as LLaMA-Factory's export picks it: the one the
    model was saved in; for a float32 model, half precision where a CUDA GPU computes it (bfloat16
    where it can), else float32."""
    import torch

    saved = saved_dtype(model_dir)
    if saved is not None and saved != torch.float32:
        return saved
    if torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def saved_dtype(model_dir: str | Path) -> torch.dtype | None:
    """The dtype config.json of a local model folder names (a CPU loads every model in float32,
    so the loaded model cannot tell); None for a hub name or a config without one."""
    import json

    import torch

    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = (config.get("dtype") or config.get("torch_dtype")) if isinstance(config, dict) else None
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    return dtype if isinstance(dtype, torch.dtype) else None


def _export_model(model_dir: str | Path, tokenizer, *, export: ExportConfig | None, model_config: ModelConfig,
                  model_max_length: int | None, use_kv_cache: bool) -> PreTrainedModel:
    from tuneline.core.models.loading import load_model

    if export is None or export.export_quantization_bit is None:
        return load_model(model_dir, model=model_config, model_max_length=model_max_length, use_kv_cache=use_kv_cache)
    from tuneline.core.models.gptq import gptq_config, load_quantized

    return load_quantized(model_dir, gptq_config(tokenizer, export, model_config), model=model_config)
