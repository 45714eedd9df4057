"""The project's tiny vision-language models, since nothing can be downloaded: Qwen2-VL, Qwen2.5-VL,
Qwen3-VL, GLM-4.1V, LLaVA-1.5, LLaVA-NeXT, Gemma 3, InternVL, PaliGemma, Llama 3.2 Vision (Mllama) and MiniCPM-V 4.6
(tiny/minicpm.py) shaped, from transformers' own config classes, randomly initialised.

A model takes a tokenizer folder (the project's own, or a real one such as Qwen2.5's), gains the
family's media tokens and its template's control tokens where the tokenizer lacks them and the chat template of the family's template
(`qwen2_vl`, `qwen3_vl`, `llava`, `gemma3`), and is saved with the family's image processor (transformers'
class, sized small so a CPU cuts few patches; LLaVA's and Gemma 3's with their processor's numbers in
processor_config.json),
so its folder loads with AutoModelForImageTextToText, AutoTokenizer and AutoImageProcessor like a
downloaded one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tuneline.core.models.composite import MODEL_TEMPLATES
from tuneline.core.models.tiny.audio import AUDIO_TOKENS, qwen2_audio_model, save_qwen2_audio_processor
from tuneline.core.models.tiny.minicpm import MINICPM_V_TOKENS, minicpm_v_model, save_minicpm_v_processor
from tuneline.core.models.tiny.omni import OMNI_TOKENS, qwen2_omni_thinker, save_qwen2_omni_processors
from tuneline.core.templates.catalog import TEMPLATES
from tuneline.core.templates.check import template_markers
from tuneline.core.templates.jinja import chat_template_jinja

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
"""Qwen2-VL's special tokens for media, in the order its tokenizer numbers them."""
LLAVA_IMAGE_TOKEN = "<image>"
MLLAMA_IMAGE_TOKEN = "<|image|>"
MLLAMA_TILES = 2  # at most two tiles an image: wide and tall pictures take two, a square one
GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
"""Gemma 3's image tokens, by the names its tokenizer gives them (Gemma3Processor reads them so)."""
GLM4V_TOKENS = ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_image|>",
                "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|video|>")
"""GLM-4V's control and media tokens (single tokens in GLM's own tokenizer)."""
INTERNVL_TOKENS = ("<img>", "</img>", "<IMG_CONTEXT>")
"""InternVL's image markers and its one token a pooled feature."""
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "llava", "llava_next", "gemma3", "internvl", "paligemma", "mllama",
            "minicpmv4_6", "qwen2_audio", "qwen2_5_omni_thinker")
PATCH_SIZE, MERGE_SIZE, TEMPORAL_PATCH_SIZE = 14, 2, 2  # the families' own: one Qwen image token per 28x28 pixels
QWEN3_PATCH_SIZE = 16  # Qwen3-VL's: one image token per 32x32 pixels


@dataclass(frozen=True)
class VisionModelConfig:
    family: str = field(default="qwen2_vl", metadata={"help": "qwen2_vl, qwen2_5_vl, qwen3_vl, glm4v, llava, llava_next, gemma3, internvl, "
                                                                 "paligemma, mllama, minicpmv4_6 (tiny/minicpm.py), qwen2_audio "
                                                                 "(tiny/audio.py) or qwen2_5_omni_thinker (tiny/omni.py)."})
    hidden_size: int = field(default=64, metadata={"help": "Language model width (the projector's output)."})
    intermediate_size: int = field(default=128, metadata={"help": "Language model MLP width."})
    num_hidden_layers: int = field(default=2, metadata={"help": "Decoder layers."})
    num_attention_heads: int = field(default=4, metadata={"help": "Attention heads (head width hidden_size / heads)."})
    num_key_value_heads: int = field(default=2, metadata={"help": "Key/value heads."})
    vision_width: int = field(default=32, metadata={"help": "Vision tower width."})
    vision_depth: int = field(default=1, metadata={"help": "Vision tower blocks."})
    max_position_embeddings: int = field(default=1024, metadata={"help": "Longest sequence the model supports."})
    image_min_pixels: int = field(default=28 * 28, metadata={"help": "The image processor's smallest image."})
    image_max_pixels: int = field(default=112 * 112, metadata={"help": "The image processor's largest image."})
    image_size: int = field(default=56, metadata={"help": "LLaVA, Gemma 3, InternVL and PaliGemma: the side every image is "
                                                          "resized (and cropped) to, in vision patches of 14x14."})
    image_tokens: int = field(default=16, metadata={"help": "Gemma 3: soft tokens an image's patches are pooled to "
                                                            "(a square, dividing the patches per side)."})
    seed: int = field(default=0, metadata={"help": "Seed of the weight initialisation."})


def build_vision_language_model(tokenizer_path: str | Path, output_dir: str | Path, *, config: VisionModelConfig) -> dict[str, int]:
    """Write tokenizer, image processor and random weights (safetensors) of `config.family` to `output_dir`."""
    import torch
    from transformers import AutoTokenizer

    if config.family not in FAMILIES:
        raise ValueError(f"family {config.family!r} is not one of {', '.join(FAMILIES)}")
    named = GEMMA3_TOKENS if config.family == "gemma3" else {}
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path), **named)
    template = TEMPLATES[MODEL_TEMPLATES[config.family]]
    family_tokens = {"llava": (LLAVA_IMAGE_TOKEN,), "llava_next": (LLAVA_IMAGE_TOKEN,), "paligemma": (LLAVA_IMAGE_TOKEN,),
                     "mllama": (MLLAMA_IMAGE_TOKEN,), "gemma3": tuple(GEMMA3_TOKENS.values()),
                     "qwen2_audio": AUDIO_TOKENS, "qwen2_5_omni_thinker": OMNI_TOKENS, "glm4v": GLM4V_TOKENS, "internvl": INTERNVL_TOKENS,
                     "minicpmv4_6": MINICPM_V_TOKENS}.get(config.family, VISION_TOKENS)
    # the template's control tokens too (chatml's <|im_start|>, Gemma's turns), whatever tokenizer the model starts from
    tokens = tuple(dict.fromkeys((*family_tokens, *template_markers(template))))
    missing = [token for token in tokens if token not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in tokens}
    tokenizer.chat_template = chat_template_jinja(template, tokenizer)  # the family's format
    torch.manual_seed(config.seed)
    if config.family in ("llava", "llava_next"):
        model = _llava_model(config, vocab_size=len(tokenizer), image_token_id=ids[LLAVA_IMAGE_TOKEN], tokenizer=tokenizer)
    elif config.family == "gemma3":
        model = _gemma3_model(config, vocab_size=len(tokenizer), ids=ids, tokenizer=tokenizer)
    elif config.family == "qwen2_audio":
        model = qwen2_audio_model(_qwen2_text(config, vocab_size=len(tokenizer), tokenizer=tokenizer),
                                  encoder_width=config.vision_width, encoder_depth=config.vision_depth,
                                  audio_token_id=ids["<|AUDIO|>"])
    elif config.family == "qwen2_5_omni_thinker":
        text = dict(_qwen2_text(config, vocab_size=len(tokenizer), tokenizer=tokenizer),
                    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": _mrope_sections(config)})
        model = qwen2_omni_thinker(text, vision_width=config.vision_width, depth=config.vision_depth, patch_size=PATCH_SIZE,
                                   merge_size=MERGE_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE, ids=ids)
    elif config.family == "glm4v":
        model = _glm4v_model(config, vocab_size=len(tokenizer), ids=ids, tokenizer=tokenizer)
    elif config.family == "mllama":
        model = _mllama_model(config, vocab_size=len(tokenizer), image_token_id=ids[MLLAMA_IMAGE_TOKEN], tokenizer=tokenizer)
    elif config.family == "paligemma":
        model = _paligemma_model(config, vocab_size=len(tokenizer), image_token_id=ids[LLAVA_IMAGE_TOKEN], tokenizer=tokenizer)
    elif config.family == "minicpmv4_6":
        model = minicpm_v_model(_qwen2_text(config, vocab_size=len(tokenizer), tokenizer=tokenizer),
                                vision_width=config.vision_width, depth=config.vision_depth, patch_size=PATCH_SIZE,
                                image_token_id=ids["<|image_pad|>"])
    elif config.family == "internvl":
        model = _internvl_model(config, vocab_size=len(tokenizer), image_token_id=ids["<IMG_CONTEXT>"], tokenizer=tokenizer)
    else:
        model = _qwen_model_class(config.family)(_qwen_config(config, vocab_size=len(tokenizer), ids=ids, tokenizer=tokenizer))
    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    if config.family in ("llava", "llava_next"):
        _save_llava_processor(config, tokenizer, output_dir)
    elif config.family == "gemma3":
        _save_gemma3_processor(config, tokenizer, output_dir)
    elif config.family == "qwen2_audio":
        save_qwen2_audio_processor(tokenizer, output_dir)
    elif config.family == "qwen2_5_omni_thinker":
        save_qwen2_omni_processors(_qwen_image_processor(config), output_dir)
    elif config.family == "internvl":
        _save_internvl_processor(config, output_dir)
    elif config.family == "minicpmv4_6":
        save_minicpm_v_processor(output_dir, patch_size=PATCH_SIZE)
    elif config.family == "mllama":
        from transformers import MllamaImageProcessor

        MllamaImageProcessor(size={"height": config.image_size, "width": config.image_size},
                             max_image_tiles=MLLAMA_TILES).save_pretrained(output_dir)
    elif config.family == "paligemma":
        from transformers import SiglipImageProcessor

        SiglipImageProcessor(size={"height": config.image_size, "width": config.image_size},
                             image_seq_length=_paligemma_image_tokens(config)).save_pretrained(output_dir)
    elif config.family == "glm4v":
        from transformers import Glm4vImageProcessor

        Glm4vImageProcessor(size={"shortest_edge": config.image_min_pixels, "longest_edge": config.image_max_pixels},
                            patch_size=PATCH_SIZE, merge_size=MERGE_SIZE,
                            temporal_patch_size=TEMPORAL_PATCH_SIZE).save_pretrained(output_dir)
    else:
        _qwen_image_processor(config).save_pretrained(output_dir)
    if config.family in VIDEO_NORMALISATION:
        _save_video_processor(config, output_dir)
    return {"parameters": sum(p.numel() for p in model.parameters()), "vocab_size": len(tokenizer)}


def _qwen_config(config: VisionModelConfig, *, vocab_size: int, ids: dict[str, int], tokenizer):
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig

    half = config.hidden_size // config.num_attention_heads // 2
    # M-RoPE splits the rotary half of each head into time, height and width, a quarter and the rest in two
    # (Qwen2-VL's own 16, 24, 24 of 64)
    time = max(1, half // 4)
    sections = [time, (half - time) // 2, half - time - (half - time) // 2]
    text = dict(vocab_size=vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
                num_key_value_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
                rope_scaling={"type": "mrope", "mrope_section": sections},
                tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)
    common = dict(patch_size=PATCH_SIZE, spatial_merge_size=MERGE_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE,
                  in_channels=3, depth=config.vision_depth, num_heads=2)
    if config.family == "qwen2_vl":
        vision, config_class = dict(common, embed_dim=config.vision_width, hidden_size=config.hidden_size, mlp_ratio=2), Qwen2VLConfig
    elif config.family == "qwen3_vl":  # Qwen3's decoder (q/k norms, interleaved M-RoPE), a deepstack tower
        text.pop("rope_scaling")
        text.update(head_dim=config.hidden_size // config.num_attention_heads,
                    rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": sections,
                                     "mrope_interleaved": True})
        vision = dict(common, patch_size=QWEN3_PATCH_SIZE, hidden_size=config.vision_width, out_hidden_size=config.hidden_size,
                      intermediate_size=2 * config.vision_width, num_position_embeddings=64, deepstack_visual_indexes=[0])
        config_class = Qwen3VLConfig
    else:
        vision = dict(common, hidden_size=config.vision_width, out_hidden_size=config.hidden_size,
                      intermediate_size=2 * config.vision_width, window_size=56, fullatt_block_indexes=[0])
        config_class = Qwen2_5_VLConfig
    return config_class(text_config=text, vision_config=vision, tie_word_embeddings=True,
                        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])


def _mrope_sections(config: VisionModelConfig) -> list[int]:
    """M-RoPE splits the rotary half of each head into time, height and width, a quarter and the rest in two
    (Qwen2-VL's own 16, 24, 24 of 64)."""
    half = config.hidden_size // config.num_attention_heads // 2
    time = max(1, half // 4)
    return [time, (half - time) // 2, half - time - (half - time) // 2]


def _glm4v_model(config: VisionModelConfig, *, vocab_size: int, ids: dict[str, int], tokenizer):
    from transformers import Glm4vConfig, Glm4vForConditionalGeneration

    text = dict(vocab_size=vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
                num_key_value_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": _mrope_sections(config),
                                 "partial_rotary_factor": 1.0},
                pad_token_id=tokenizer.pad_token_id)
    vision = dict(depth=config.vision_depth, hidden_size=config.vision_width, num_heads=2, out_hidden_size=config.hidden_size,
                  intermediate_size=config.hidden_size, patch_size=PATCH_SIZE, spatial_merge_size=MERGE_SIZE,
                  temporal_patch_size=TEMPORAL_PATCH_SIZE, image_size=PATCH_SIZE * MERGE_SIZE * 4)
    glm = Glm4vConfig(text_config=text, vision_config=vision, tie_word_embeddings=True,
                      image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
                      image_start_token_id=ids["<|begin_of_image|>"], image_end_token_id=ids["<|end_of_image|>"],
                      video_start_token_id=ids["<|begin_of_video|>"], video_end_token_id=ids["<|end_of_video|>"])
    return Glm4vForConditionalGeneration(glm)


def _qwen_model_class(family: str) -> type:
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration, Qwen3VLForConditionalGeneration

    return {"qwen2_vl": Qwen2VLForConditionalGeneration, "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
            "qwen3_vl": Qwen3VLForConditionalGeneration}[family]


def _qwen_image_processor(config: VisionModelConfig):
    from transformers import Qwen2VLImageProcessor

    # Qwen2.5-VL and Qwen3-VL read images with Qwen2-VL's processor class, as their own folders say
    if config.family == "qwen3_vl":
        return Qwen2VLImageProcessor(min_pixels=config.image_min_pixels, max_pixels=config.image_max_pixels,
                                     patch_size=QWEN3_PATCH_SIZE, merge_size=MERGE_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE,
                                     image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return Qwen2VLImageProcessor(min_pixels=config.image_min_pixels, max_pixels=config.image_max_pixels,
                                 patch_size=PATCH_SIZE, merge_size=MERGE_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE)


VIDEO_NORMALISATION = {"qwen3_vl": (QWEN3_PATCH_SIZE, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
                       "glm4v": (PATCH_SIZE, (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))}
"""The families whose folders ship a video processor of their own (its patch size and normalisation): their video
pixel limits bound a whole clip, not a frame."""
VIDEO_PROCESSOR_CLASSES = {"qwen3_vl": "Qwen3VLVideoProcessor", "glm4v": "Glm4vVideoProcessor"}


def _save_video_processor(config: VisionModelConfig, output_dir: str | Path) -> None:
    """video_preprocessor_config.json as Qwen3-VL's and GLM-4.1V's folders hold it, its pixel limits small (at least a
    merged patch per frame pair, at most eight frames of the largest image), written as JSON: transformers' video
    processor classes need torchvision to be built."""
    import json

    patch, mean, std = VIDEO_NORMALISATION[config.family]
    saved = {"video_processor_type": VIDEO_PROCESSOR_CLASSES[config.family], "patch_size": patch,
             "temporal_patch_size": TEMPORAL_PATCH_SIZE, "merge_size": MERGE_SIZE,
             "size": {"shortest_edge": (patch * MERGE_SIZE) ** 2 * TEMPORAL_PATCH_SIZE, "longest_edge": config.image_max_pixels * 8},
             "fps": 2.0, "do_sample_frames": True, "image_mean": list(mean), "image_std": list(std)}
    if config.family == "glm4v":
        saved["max_duration"] = 300.0  # its processor's default: past it, frames are spread over the whole clip
    (Path(output_dir) / "video_preprocessor_config.json").write_text(json.dumps(saved, indent=2), encoding="utf-8")


def _tile_grids(config: VisionModelConfig) -> list[list[int]]:
    """LLaVA-NeXT's grids of tiles, LLaVA-v1.6's five shapes (1x2, 2x1, 2x2, 3x1, 1x3) in tiles of the image size."""
    side = config.image_size
    return [[side, 2 * side], [2 * side, side], [2 * side, 2 * side], [3 * side, side], [side, 3 * side]]


def _llava_model(config: VisionModelConfig, *, vocab_size: int, image_token_id: int, tokenizer):
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
    )

    vision = CLIPVisionConfig(hidden_size=config.vision_width, intermediate_size=2 * config.vision_width,
                              num_hidden_layers=config.vision_depth, num_attention_heads=2, image_size=config.image_size,
                              patch_size=PATCH_SIZE, projection_dim=config.vision_width)
    text = LlamaConfig(vocab_size=vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                       num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
                       num_key_value_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
                       tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)
    # LLaVA-1.5's reading: the last layer's patch features, its class token dropped ("default")
    reading = dict(vision_config=vision, text_config=text, image_token_index=image_token_id, vision_feature_layer=-1,
                   vision_feature_select_strategy="default", projector_hidden_act="gelu", tie_word_embeddings=True)
    if config.family == "llava_next":
        return LlavaNextForConditionalGeneration(LlavaNextConfig(**reading, image_grid_pinpoints=_tile_grids(config)))
    return LlavaForConditionalGeneration(LlavaConfig(**reading))


def _save_llava_processor(config: VisionModelConfig, tokenizer, output_dir: str | Path) -> None:
    from transformers import CLIPImageProcessor, LlavaNextImageProcessor, LlavaNextProcessor, LlavaProcessor

    sizes = {"size": {"shortest_edge": config.image_size}, "crop_size": {"height": config.image_size, "width": config.image_size}}
    if config.family == "llava_next":
        image_processor, processor_class = LlavaNextImageProcessor(**sizes, image_grid_pinpoints=_tile_grids(config)), LlavaNextProcessor
    else:
        image_processor, processor_class = CLIPImageProcessor(**sizes), LlavaProcessor
    processor_class(image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE, num_additional_image_tokens=1,
                    vision_feature_select_strategy="default", image_token=LLAVA_IMAGE_TOKEN).save_pretrained(output_dir)
    image_processor.save_pretrained(output_dir)  # preprocessor_config.json too, where older readers look


def _gemma3_model(config: VisionModelConfig, *, vocab_size: int, ids: dict[str, int], tokenizer):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

    head_dim = config.hidden_size // config.num_attention_heads
    # Gemma 3's decoder alternates local (sliding window) and global attention
    layer_types = ["sliding_attention" if (index + 1) % 2 else "full_attention" for index in range(config.num_hidden_layers)]
    text = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                            num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
                            num_key_value_heads=config.num_key_value_heads, head_dim=head_dim,
                            query_pre_attn_scalar=head_dim, max_position_embeddings=config.max_position_embeddings,
                            sliding_window=64, layer_types=layer_types, bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    # SigLIP without its pooling head, as Gemma 3's tower: the projector pools the patch features itself
    vision = SiglipVisionConfig(hidden_size=config.vision_width, intermediate_size=2 * config.vision_width,
                                num_hidden_layers=config.vision_depth, num_attention_heads=2, image_size=config.image_size,
                                patch_size=PATCH_SIZE, vision_use_head=False)
    gemma = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=config.image_tokens,
                         image_token_index=ids[GEMMA3_TOKENS["image_token"]], boi_token_index=ids[GEMMA3_TOKENS["boi_token"]],
                         eoi_token_index=ids[GEMMA3_TOKENS["eoi_token"]], tie_word_embeddings=True)
    model = Gemma3ForConditionalGeneration(gemma)
    # transformers initialises the projection to zeros (a checkpoint overwrites it); random, pixels reach the decoder
    model.model.multi_modal_projector.mm_input_projection_weight.data.normal_(std=text.initializer_range)
    return model


def _save_gemma3_processor(config: VisionModelConfig, tokenizer, output_dir: str | Path) -> None:
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    image_processor = Gemma3ImageProcessor(size={"height": config.image_size, "width": config.image_size})
    Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer,
                    image_seq_length=config.image_tokens).save_pretrained(output_dir)
    image_processor.save_pretrained(output_dir)


def _mllama_model(config: VisionModelConfig, *, vocab_size: int, image_token_id: int, tokenizer):
    from transformers import MllamaConfig, MllamaForConditionalGeneration

    taps = [0]  # the vision layers whose outputs the projector also reads, beside the last
    vision = dict(hidden_size=config.vision_width, intermediate_size=2 * config.vision_width, num_hidden_layers=config.vision_depth,
                  num_global_layers=1, attention_heads=2, image_size=config.image_size, patch_size=PATCH_SIZE,
                  max_num_tiles=MLLAMA_TILES, intermediate_layers_indices=taps,
                  vision_output_dim=config.vision_width * (len(taps) + 1),
                  supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]])  # the image processor's for two tiles, in its order
    # one cross-attention layer after the first self-attention layers, where the text reads the tiles
    text = dict(vocab_size=vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                num_hidden_layers=config.num_hidden_layers + 1, cross_attention_layers=[1],
                num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
                max_position_embeddings=config.max_position_embeddings, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = MllamaForConditionalGeneration(MllamaConfig(vision_config=vision, text_config=text, image_token_index=image_token_id))
    # transformers opens the cross-attention gates at zero (a checkpoint sets them); opened, the text reads the pixels
    # from the start, as in a trained Llama 3.2 Vision, and LoRA (which leaves the gates alone) can use them
    for name, parameter in model.named_parameters():
        if name.endswith(("cross_attn_attn_gate", "cross_attn_mlp_gate")):
            parameter.data.fill_(1.0)
    return model


def _paligemma_image_tokens(config: VisionModelConfig) -> int:
    return (config.image_size // PATCH_SIZE) ** 2  # one token a SigLIP patch


def _paligemma_model(config: VisionModelConfig, *, vocab_size: int, image_token_id: int, tokenizer):
    from transformers import GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration, SiglipVisionConfig

    text = GemmaConfig(vocab_size=vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                       num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
                       num_key_value_heads=config.num_key_value_heads, head_dim=config.hidden_size // config.num_attention_heads,
                       max_position_embeddings=config.max_position_embeddings, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    vision = SiglipVisionConfig(hidden_size=config.vision_width, intermediate_size=2 * config.vision_width,
                                num_hidden_layers=config.vision_depth, num_attention_heads=2, image_size=config.image_size,
                                patch_size=PATCH_SIZE, projection_dim=config.hidden_size)
    paligemma = PaliGemmaConfig(text_config=text, vision_config=vision, image_token_index=image_token_id,
                                projection_dim=config.hidden_size, hidden_size=config.hidden_size, tie_word_embeddings=True)
    return PaliGemmaForConditionalGeneration(paligemma)


INTERNVL_DOWNSAMPLE = 0.5  # InternVL's pixel shuffle: each 2 x 2 patches become one feature


def _internvl_tokens_per_tile(config: VisionModelConfig) -> int:
    return int((config.image_size // PATCH_SIZE) ** 2 * INTERNVL_DOWNSAMPLE ** 2)


def _internvl_model(config: VisionModelConfig, *, vocab_size: int, image_token_id: int, tokenizer):
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    vision = dict(hidden_size=config.vision_width, num_hidden_layers=config.vision_depth, num_attention_heads=2,
                  intermediate_size=2 * config.vision_width, image_size=[config.image_size] * 2, patch_size=[PATCH_SIZE] * 2)
    text = {"model_type": "qwen2", **_qwen2_text(config, vocab_size=vocab_size, tokenizer=tokenizer)}
    internvl = InternVLConfig(vision_config=vision, text_config=text, image_token_id=image_token_id,
                              image_seq_length=_internvl_tokens_per_tile(config), downsample_ratio=INTERNVL_DOWNSAMPLE,
                              tie_word_embeddings=True)
    return InternVLForConditionalGeneration(internvl)


def _save_internvl_processor(config: VisionModelConfig, output_dir: str | Path) -> None:
    """GotOcr2's image processor, and InternVLProcessor's numbers as its processor_config.json holds them
    (the processor class itself also wants a video processor, which needs torchvision)."""
    import json

    from transformers import GotOcr2ImageProcessor

    GotOcr2ImageProcessor(size={"height": config.image_size, "width": config.image_size},
                          image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]).save_pretrained(output_dir)
    numbers = {"image_seq_length": _internvl_tokens_per_tile(config), "processor_class": "InternVLProcessor"}
    (Path(output_dir) / "processor_config.json").write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")


def _qwen2_text(config: VisionModelConfig, *, vocab_size: int, tokenizer) -> dict:
    """A Qwen2 decoder's settings of `config`'s sizes (InternVL's and Qwen2-Audio's language model; MiniCPM-V
    4.6's Qwen3.5 decoder takes them too)."""
    return dict(vocab_size=vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
                num_key_value_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
                tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)
