"""The project's tiny audio-language model, Qwen2-Audio shaped (a Whisper-style audio encoder, its
projector and Qwen2's decoder), from transformers' own config classes, randomly initialised and saved
with Qwen2-Audio's processor: Whisper's feature extractor at 128 mel bins (preprocessor_config.json)
and Qwen2AudioProcessor's tokens, so the folder loads with AutoModelForMultimodalLM, AutoProcessor and
AutoFeatureExtractor like a downloaded one. `vision.build_vision_language_model` builds it
for `vision: qwen2_audio`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

AUDIO_TOKENS = ("<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>")
"""Qwen2-Audio's special tokens, as its tokenizer names them."""
MEL_BINS = 128  # Qwen2-Audio's feature extractor and encoder: 128 mel bins, 3000 frames (30 s) a clip
ENCODER_POSITIONS = 1500  # the encoder's positions after its stride-2 convolution: half the frames


def qwen2_audio_model(text_config: dict[str, Any], *, encoder_width: int, encoder_depth: int, audio_token_id: int):
    """A Qwen2-Audio of `text_config`'s Qwen2 decoder and a Whisper-style encoder `encoder_width` wide and
    `encoder_depth` layers deep."""
    from transformers import Qwen2AudioConfig, Qwen2AudioEncoderConfig, Qwen2AudioForConditionalGeneration, Qwen2Config

    audio = Qwen2AudioEncoderConfig(d_model=encoder_width, encoder_layers=encoder_depth, encoder_attention_heads=2,
                                    encoder_ffn_dim=2 * encoder_width, num_mel_bins=MEL_BINS,
                                    max_source_positions=ENCODER_POSITIONS)
    return Qwen2AudioForConditionalGeneration(Qwen2AudioConfig(audio_config=audio, text_config=Qwen2Config(**text_config),
                                                               audio_token_index=audio_token_id))


def save_qwen2_audio_processor(tokenizer, output_dir: str | Path) -> None:
    from transformers import Qwen2AudioProcessor, WhisperFeatureExtractor

    feature_extractor = WhisperFeatureExtractor(feature_size=MEL_BINS)
    Qwen2AudioProcessor(feature_extractor=feature_extractor, tokenizer=tokenizer).save_pretrained(output_dir)
    feature_extractor.save_pretrained(output_dir)  # preprocessor_config.json, where AutoFeatureExtractor looks first
