"""The whole-logits head answers as TRL's chunked LM head does, and steps aside where it should."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

OUTPUTS = ("log_probs", "entropy", "mean_logits", "is_top1")


def patched_model(tiny_base: Path, *, full_logits: bool):
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from tuneline.core.training.full_logits_head import prefer_full_logits

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_base)
    add_fused_lm_head(model, outputs=OUTPUTS)
    if full_logits:
        prefer_full_logits(model, outputs=OUTPUTS)
    return model


def batch(vocabulary: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, vocabulary, (4, 24), generator=generator)
    labels = input_ids.clone()
    labels[:, :10] = -100  # the prompt
    labels[0, 20:] = -100  # padding of a shorter row
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def scored(model, inputs: dict[str, torch.Tensor]):
    model.zero_grad()
    output = model(**inputs, fused_lm_head=True)
    (output.log_probs.sum() + output.loss).backward()
    return output, {name: p.grad.clone() for name, p in model.named_parameters()}


def test_fields_and_gradients_equal_trls_chunked_head(tiny_base: Path) -> None:
    trl_model, own_model = patched_model(tiny_base, full_logits=False), patched_model(tiny_base, full_logits=True)
    inputs = batch(trl_model.config.vocab_size)
    with torch.no_grad():  # a few labels that are the model's first choice, so top-1 is seen both ways
        best = trl_model(input_ids=inputs["input_ids"]).logits.argmax(-1)
    inputs["labels"][:, 13:17] = best[:, 12:16]
    expected, expected_grads = scored(trl_model, inputs)
    found, found_grads = scored(own_model, inputs)
    for field in ("log_probs", "entropy", "mean_logits", "loss"):
        assert torch.allclose(getattr(found, field), getattr(expected, field), atol=1e-5), field
    assert torch.equal(found.is_top1, expected.is_top1) and torch.equal(found.label_mask, expected.label_mask)
    assert found.entropy.requires_grad is False  # a metric: the trainers detach it
    assert (found.log_probs[~found.label_mask] == 0).all()
    assert found.is_top1.any() and (found.label_mask & ~found.is_top1).any()
    for name, grad in expected_grads.items():
        assert torch.allclose(found_grads[name], grad, atol=1e-5), name


def test_large_batches_and_the_plain_forward_go_to_trls_head(tiny_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuneline.core.training import full_logits_head

    calls = []
    original = full_logits_head.scored_tokens
    monkeypatch.setattr(full_logits_head, "scored_tokens", lambda *a, **k: calls.append(1) or original(*a, **k))
    model = patched_model(tiny_base, full_logits=True)
    inputs = batch(model.config.vocab_size)
    model(**inputs, fused_lm_head=True)
    assert len(calls) == 1
    scored = int((inputs["labels"][:, 1:] != -100).sum())  # only the positions with a label get logits
    monkeypatch.setattr(full_logits_head, "FULL_LOGITS_ELEMENTS", scored * model.config.vocab_size - 1)
    large = model(**inputs, fused_lm_head=True)
    assert len(calls) == 1 and large.log_probs.shape == (4, 23)
    plain = model(input_ids=inputs["input_ids"])
    assert len(calls) == 1 and plain.logits.shape == (4, 24, model.config.vocab_size)
    monkeypatch.setattr(full_logits_head, "FULL_LOGITS_ELEMENTS", 1 << 26)
    model.config.final_logit_softcapping = 30.0  # soft-capped logits (Gemma 2): TRL's head applies the cap
    model(**inputs, fused_lm_head=True)
    assert len(calls) == 1


def test_a_field_it_does_not_compute_leaves_trls_head_alone(tiny_base: Path) -> None:
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from tuneline.core.training.full_logits_head import prefer_full_logits

    model = AutoModelForCausalLM.from_pretrained(tiny_base)
    add_fused_lm_head(model, outputs=("log_probs", "log_sum_sq_probs"))
    trls_forward = model.forward
    prefer_full_logits(model, outputs=("log_probs", "log_sum_sq_probs"))
    assert model.forward is trls_forward

