"""Merging a LoRA adapter into its base and writing a standalone Hugging Face model folder."""

from __future__ import annotations

from pathlib import Path


def merge_adapter(base_path: str | Path, adapter_path: str | Path, output_dir: str | Path) -> dict[str, int]:
    """Fold the adapter's low-rank updates into the base weights; write model and tokenizer."""
    from peft import PeftModel

    from tuneline.core.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(adapter_path)
    base = load_model(base_path, vocab_size=len(tokenizer))
    merged = PeftModel.from_pretrained(base, str(adapter_path)).merge_and_unload()
    merged.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    return {"parameters": sum(p.numel() for p in merged.parameters())}


def write_hf_folder(model_dir: str | Path, out_dir: str | Path, *, template: str, export_size_gb: int = 5,
                    infer_dtype: str = "auto", use_kv_cache: bool = True, rope_scaling: str | None = None,
                    model_max_length: int | None = None) -> None:
    """Write `model_dir` into `out_dir` as a Hugging Face folder: safetensors shards, the tokenizer
    with its chat template, and a generation config that stops on the template's stop tokens. The
    weights are written in `infer_dtype` ('auto': as they load), the config's `use_cache` says
    `use_kv_cache`, and `rope_scaling` scales RoPE to `model_max_length` (None: by 2)."""
    import torch

    from tuneline.core.config import ModelConfig
    from tuneline.core.models.loading import load_model, load_tokenizer
    from tuneline.core.templates.conversation import get_template, stop_token_ids

    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, model=ModelConfig(rope_scaling=rope_scaling), model_max_length=model_max_length,
                       use_kv_cache=use_kv_cache)
    if infer_dtype != "auto":
        model = model.to(getattr(torch, infer_dtype))
    model.generation_config.eos_token_id = stop_token_ids(get_template(template, tokenizer=tokenizer), tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size=f"{export_size_gb}GB")
    tokenizer.save_pretrained(out_dir)
