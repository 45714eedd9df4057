"""S^2-Attn on the tiny LLaMA model: in training each head attends within its (shifted) quarter of the
sequence, equal to a dense per-head mask computed independently here; outside training it is
ordinary attention; training with it lowers the loss; other families and ppo are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import train_steps
from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError
from tuneline.core.models.loading import apply_finetuning, load_model
from tuneline.core.models.shifted_attention import S2_ATTENTION, shifted_sparse_attention, use_shifted_sparse_attention
from tuneline.core.stages.registry import build_stage_config


class Attention(torch.nn.Module):
    """Stands for a model's attention module: what the function and SDPA's read of it."""

    is_causal = True
    num_key_value_groups = 2


def reference(query, key, value, valid: torch.Tensor) -> torch.Tensor:
    """Dense attention with each head's LongLoRA groups as a mask: group g of the unshifted heads is
    positions [g*s, (g+1)*s); the shifted heads' groups start half a group later, wrapping round."""
    batch, heads, length, dim = query.shape
    size = length // 4
    positions = torch.arange(length)
    masks = []
    for head in range(heads):
        offset = 0 if head < heads // 2 else size // 2
        group = ((positions - offset) % length) // size
        same = group[:, None] == group[None, :]
        causal = positions[:, None] >= positions[None, :]
        masks.append(same & causal)
    mask = torch.stack(masks)[None] & valid[:, None, None, :]
    mask = mask | torch.eye(length, dtype=torch.bool)
    repeat = heads // key.shape[1]
    key, value = key.repeat_interleave(repeat, 1), value.repeat_interleave(repeat, 1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask).transpose(1, 2)


@pytest.mark.parametrize("length", [16, 14])
def test_training_attention_is_the_shifted_group_mask(length: int):
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 4, length, 8), torch.randn(2, 2, length, 8), torch.randn(2, 2, length, 8)
    valid = torch.ones(2, length, dtype=torch.bool)
    valid[1, -3:] = False  # right padding in the second row
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    mask = (causal[None] & valid[:, None, :])[:, None]  # transformers' boolean SDPA mask, (batch, 1, q, k)
    module = Attention().train()
    out, _ = shifted_sparse_attention(module, query, key, value, mask, scaling=8 ** -0.5)
    assert out.shape == (2, length, 4, 8)
    if length % 4 == 0:
        expected = reference(query, key, value, valid)
        assert torch.allclose(out[0], expected[0], atol=1e-5)
        assert torch.allclose(out[1, :-3], expected[1, :-3], atol=1e-5)  # padded positions are never read
    # Whatever the length, a query never sees a later token: changing the last token leaves every
    # earlier output as it was.
    later = value.clone()
    later[:, :, -1] += 1.0
    moved, _ = shifted_sparse_attention(module, query, key, later, mask, scaling=8 ** -0.5)
    assert torch.allclose(moved[:, :-1], out[:, :-1], atol=1e-6) and not torch.allclose(moved[0, -1], out[0, -1])
    # Out of training it is ordinary causal attention.
    full, _ = shifted_sparse_attention(module.eval(), query, key, value, mask, scaling=8 ** -0.5)
    dense = torch.nn.functional.scaled_dot_product_attention(query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1),
                                                             attn_mask=mask).transpose(1, 2)
    assert torch.allclose(full[0], dense[0], atol=1e-5)


@pytest.fixture(scope="module")
def token_batch(tiny_base: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    texts = ["The quick brown fox jumps over the lazy dog, and the dog sleeps on.",
             "Paris is the capital of France, a large and old city on the Seine."]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    return {**batch, "labels": batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)}


@pytest.mark.slow
def test_lora_training_with_shift_attn_uses_it_and_lowers_the_loss(tiny_base: Path, token_batch, one_torch_thread):
    torch.manual_seed(0)
    model_config = ModelConfig(shift_attn=True)
    model = apply_finetuning(load_model(tiny_base, model=model_config), FinetuningConfig(lora_rank=4), model_config=model_config)
    assert model.config._attn_implementation == S2_ATTENTION
    inputs = {key: token_batch[key] for key in ("input_ids", "attention_mask")}
    model.eval()
    with torch.no_grad():
        plain = load_model(tiny_base).eval()(**inputs).logits
        assert torch.allclose(model(**inputs).logits, plain, atol=1e-5)  # full attention outside training
    model.train()
    with torch.no_grad():
        assert not torch.allclose(model(**inputs).logits, plain, atol=1e-3)  # grouped attention in training
    losses, moved = train_steps(model, token_batch)
    assert losses[-1] < losses[0]
    assert moved == {name for name, p in model.named_parameters() if p.requires_grad}
    assert moved and all(".lora_" in name for name in moved)


def test_shift_attn_is_refused_for_other_families_and_for_ppo(tmp_path: Path):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(ConfigError, match=r"applies to the llama model family, and this model is 'gpt2'"):
        use_shifted_sparse_attention(gpt2)
    with pytest.raises(ConfigError, match=r"'shift_attn: true' cannot train with 'stage: ppo'"):
        build_stage_config({"stage": "ppo", "reward_model": str(tmp_path), "shift_attn": True})
    with pytest.raises(ConfigError, match=r"remove 'flash_attn: fa2' or shift_attn"):
        apply_finetuning(gpt2, FinetuningConfig(), model_config=ModelConfig(shift_attn=True, flash_attn="fa2"))
