"""The project's own tiny base model, since nothing can be downloaded.

A byte-level BPE tokenizer trained with `tokenizers` on the demo corpus, and a small randomly
initialised LLaMA-shaped model sized to it. The demo then pre-trains it briefly (stage pt). With
`vision`, the same tokenizer and sizes make a tiny vision-language model (`tiny/vision.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
# Tokens the shipped templates use, present from the start so no template forces a resize.
TEMPLATE_TOKENS = ("<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>", "<|endoftext|>")


@dataclass(frozen=True)
class BaseModelConfig:
    vocab_size: int = field(default=4096, metadata={"help": "BPE vocabulary size, special tokens included."})
    hidden_size: int = field(default=256, metadata={"help": "Model width."})
    intermediate_size: int = field(default=704, metadata={"help": "MLP width."})
    num_hidden_layers: int = field(default=4, metadata={"help": "Decoder layers."})
    num_attention_heads: int = field(default=4, metadata={"help": "Attention heads."})
    num_key_value_heads: int = field(default=2, metadata={"help": "Key/value heads (grouped-query attention)."})
    max_position_embeddings: int = field(default=1024, metadata={"help": "Longest sequence the model supports."})
    seed: int = field(default=0, metadata={"help": "Seed of the weight initialisation."})
    vision: str | None = field(default=None, metadata={
        "help": "Build a vision-language model of this family instead (qwen2_vl, qwen2_5_vl or llava): the same "
                "tokenizer and language model sizes, with a tiny vision tower and the family's image processor."})


def train_tokenizer(texts: Iterable[str], *, vocab_size: int):
    """A byte-level BPE fast tokenizer with bos/eos/pad and the templates' special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, BOS, EOS, *TEMPLATE_TOKENS]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(TEMPLATE_TOKENS),
        model_max_length=1024,
    )
    return tokenizer


def build_base_model(texts: Iterable[str], output_dir: str | Path, *, config: BaseModelConfig) -> dict[str, int]:
    """Write tokenizer and randomly initialised weights (safetensors) to `output_dir`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = train_tokenizer(texts, vocab_size=config.vocab_size)
    if config.vision is not None:
        return _build_vision_model(tokenizer, output_dir, config=config)
    model_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(model_config)
    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    return {"parameters": sum(p.numel() for p in model.parameters()), "vocab_size": len(tokenizer)}


def _build_vision_model(tokenizer, output_dir: str | Path, *, config: BaseModelConfig) -> dict[str, int]:
    import tempfile

    from tuneline.core.models.tiny.vision import FAMILIES, VisionModelConfig, build_vision_language_model

    if config.vision not in FAMILIES:
        from tuneline.core.errors import ConfigError

        raise ConfigError(f"'vision: {config.vision}' is not a family the tiny model is built in; choose one of "
                          f"{', '.join(FAMILIES)}, or remove the key for a text model.")
    vision = VisionModelConfig(family=config.vision, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                               num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
                               num_key_value_heads=config.num_key_value_heads,
                               max_position_embeddings=config.max_position_embeddings, seed=config.seed)
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        return build_vision_language_model(folder, output_dir, config=vision)
