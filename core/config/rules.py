"""Checks across keys that hold whatever the stage: values out of range and keys that cannot go
together. The checks of one stage kind live in its module (core/stages/)."""

from __future__ import annotations

from tuneline.core.config.stage import StageConfig


def conflicts(config: StageConfig) -> list[str]:
    problems = []
    ft, data = config.finetuning, config.data
    if ft.finetuning_type == "lora" and ft.lora_rank <= 0:
        problems.append(f"'lora_rank' must be positive, got {ft.lora_rank}.")
    if not 0 <= ft.lora_dropout < 1:
        problems.append(f"'lora_dropout' must be in [0, 1), got {ft.lora_dropout}.")
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
