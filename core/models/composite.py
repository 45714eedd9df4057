"""The parts of a multimodal model (vision tower, projector, language model) and which of them train.

LLaMA-Factory 0.9.5's semantics, by the parameter and module names of transformers' classes: a part
is every module whose qualified name contains one of its keys. `freeze_vision_tower` (default on) and
`freeze_multi_modal_projector` (default on) keep those parts frozen under full and freeze tuning, and
out of an adapter's targets; `freeze_language_model` freezes the language model (and its head) the same
way. An adapter never targets the family's `lora_conflict` modules (Qwen2-VL's convolutional patch
embedding), and `lora_target: all` never reaches the projector, whatever the keys say.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuneline.core.config import FinetuningConfig

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel


@dataclass(frozen=True)
class ModelParts:
    projector: tuple[str, ...]
    vision_tower: tuple[str, ...]
    language_model: tuple[str, ...] = ("language_model", "lm_head")
    lora_conflicts: tuple[str, ...] = ()


_QWEN_VISION = ModelParts(projector=("visual.merger",), vision_tower=("visual.patch_embed", "visual.blocks"),
                          lora_conflicts=("patch_embed",))
PARTS: dict[str, ModelParts] = {
    "qwen2_vl": _QWEN_VISION,
    "qwen2_5_vl": _QWEN_VISION,
    "glm4v": ModelParts(projector=("visual.merger",), vision_tower=("visual.patch_embed", "visual.blocks"),
                        lora_conflicts=("patch_embed",)),
    "llava": ModelParts(projector=("multi_modal_projector",), vision_tower=("vision_tower",)),
    "llava_next": ModelParts(projector=("multi_modal_projector",), vision_tower=("vision_tower",)),
    "gemma3": ModelParts(projector=("multi_modal_projector",), vision_tower=("vision_tower",)),
    "internvl": ModelParts(projector=("multi_modal_projector",), vision_tower=("vision_tower",)),
    "paligemma": ModelParts(projector=("multi_modal_projector",), vision_tower=("vision_tower",)),
    "mllama": ModelParts(projector=("multi_modal_projector",), vision_tower=("vision_model",)),
    # the tower's own window merger (vision_tower.vit_merger) is part of the tower; model.merger projects to the text
    "minicpmv4_6": ModelParts(projector=("model.merger",), vision_tower=("model.vision_tower",),
                              language_model=("model.language_model", "lm_head")),
    # the thinker's vision tower (its last block merges patches, as Qwen2.5-VL's merger) and its audio encoder
    "qwen2_5_omni_thinker": ModelParts(projector=("visual.merger", "audio_tower.proj"),
                                       vision_tower=("visual.patch_embed", "visual.blocks", "audio_tower"),
                                       lora_conflicts=("patch_embed",)),
    # LLaMA-Factory's vision keys name Qwen2-Audio's audio tower: freeze_vision_tower keeps it frozen
    "qwen2_audio": ModelParts(projector=("multi_modal_projector",), vision_tower=("audio_tower",)),
    "qwen3_vl": ModelParts(projector=("visual.merger",), lora_conflicts=("patch_embed",),
                           vision_tower=("visual.pos_embed", "visual.patch_embed", "visual.blocks", "visual.deepstack_merger_list")),
}
"""Each multimodal model type's parts, by the keys LLaMA-Factory registers for it."""

MODEL_TEMPLATES = {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_vl", "qwen3_vl": "qwen3_vl", "glm4v": "glm4v",
                   "llava": "llava", "llava_next": "llava_next", "gemma3": "gemma3", "internvl": "intern_vl",
                   "paligemma": "paligemma", "mllama": "mllama", "minicpmv4_6": "minicpm_v_4_6", "qwen2_audio": "qwen2_audio",
                   "qwen2_5_omni_thinker": "qwen2_omni"}
"""The template whose media tokens each vision-language model type (that tuneline encodes images for) reads."""
FAMILY_TEMPLATES = ("qwen2_vl for Qwen2-VL and Qwen2.5-VL, qwen3_vl for Qwen3-VL, glm4v for GLM-4.1V, llava for LLaVA-1.5, "
                    "llava_next for LLaVA-NeXT, gemma3 for Gemma 3, intern_vl for InternVL, "
                    "paligemma or paligemma_chat for PaliGemma, mllama for Llama 3.2 Vision, minicpm_v_4_6 for MiniCPM-V 4.6, "
                    "qwen2_audio for Qwen2-Audio, qwen2_omni "
                    "for Qwen2.5-Omni")


def model_parts(config: PretrainedConfig) -> ModelParts | None:
    return PARTS.get(getattr(config, "model_type", None))


def frozen_keys(config: PretrainedConfig, finetuning: FinetuningConfig) -> tuple[str, ...]:
    """The keys of the parts the freeze_* settings keep frozen (none for a text model)."""
    parts = model_parts(config)
    if parts is None:
        return ()
    return ((parts.vision_tower if finetuning.freeze_vision_tower else ())
            + (parts.projector if finetuning.freeze_multi_modal_projector else ())
            + (parts.language_model if finetuning.freeze_language_model else ()))


def in_part(name: str, keys: Iterable[str]) -> bool:
    return any(key in name for key in keys)


def freeze_parts(model: PreTrainedModel, finetuning: FinetuningConfig) -> None:
    """Full and freeze tuning: the frozen parts' parameters stop training."""
    keys = frozen_keys(model.config, finetuning)
    for name, parameter in model.named_parameters():
        if in_part(name, keys):
            parameter.requires_grad_(False)


def trainable_projector(model: PreTrainedModel, finetuning: FinetuningConfig) -> tuple[str, ...]:
    """Freeze tuning trains the projector too when `freeze_multi_modal_projector: false`."""
    parts = model_parts(model.config)
    return parts.projector if parts is not None and not finetuning.freeze_multi_modal_projector else ()


def adapter_targets(model: PreTrainedModel, finetuning: FinetuningConfig, targets: list[str] | None) -> list[str] | None:
    """The qualified names of the modules an adapter goes on: those named by `targets` (short or
    qualified names; None for `all`, every linear layer outside the projector and, with freeze_vision_tower, the tower)
    that lie in no frozen part and are no LoRA conflict. None for a text model: its targets stand."""
    import torch

    parts = model_parts(model.config)
    if parts is None:
        return None
    excluded = frozen_keys(model.config, finetuning) + parts.lora_conflicts
    if targets is None:
        excluded += parts.projector + (parts.vision_tower if finetuning.freeze_vision_tower else ())
    chosen = []
    for name, module in model.named_modules():
        short = name.rsplit(".", 1)[-1]
        if in_part(name, excluded) or short == "lm_head":
            continue
        if (short in targets or name in targets) if targets is not None else isinstance(module, torch.nn.Linear):
            chosen.append(name)
    return chosen


def vision_keys(config: PretrainedConfig) -> tuple[str, ...]:
    """The keys of the vision tower and projector, whose numbered blocks are not the decoder's layers."""
    parts = model_parts(config)
    return () if parts is None else parts.vision_tower + parts.projector
