"""The SFT loss variants against LLaMA-Factory 0.9.5's own functions (numbers in
tests/data/sft_losses_llamafactory.json, made by tests/data/make_sft_losses_reference.py), and the
parts of their definitions a number cannot show: which factors are detached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tuneline.core.training.losses import asft_loss, dft_loss, eaft_loss

REFERENCE = json.loads((Path(__file__).resolve().parents[2] / "data/sft_losses_llamafactory.json").read_text())


def fixed_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The logits, reference logits and labels the reference numbers were computed on (2 rows, 6 positions, 32 tokens)."""
    index = torch.arange(2 * 6 * 32, dtype=torch.float64).reshape(2, 6, 32)
    logits = (3.0 * torch.sin(0.37 * index) + torch.cos(1.3 * index)).float()
    reference = (2.0 * torch.cos(0.23 * index) - torch.sin(0.71 * index)).float()
    labels = torch.tensor([[-100, -100, 5, 17, 3, 30], [-100, 9, 9, 0, -100, -100]])
    return logits, reference, labels


@pytest.mark.parametrize(("name", "loss"), [
    ("dft", lambda logits, reference, labels: dft_loss(logits, labels)),
    ("dft_num_items_10", lambda logits, reference, labels: dft_loss(logits, labels, num_items_in_batch=torch.tensor(10))),
    ("eaft_alpha_1", lambda logits, reference, labels: eaft_loss(logits, labels, alpha=1.0)),
    ("eaft_alpha_0.5", lambda logits, reference, labels: eaft_loss(logits, labels, alpha=0.5)),
    ("eaft_alpha_2_num_items_10",
     lambda logits, reference, labels: eaft_loss(logits, labels, alpha=2.0, num_items_in_batch=torch.tensor(10))),
    ("asft_alpha_0.1", lambda logits, reference, labels: asft_loss(logits, labels, reference, alpha=0.1)),
    ("asft_alpha_1", lambda logits, reference, labels: asft_loss(logits, labels, reference, alpha=1.0)),
])
def test_losses_equal_llamafactorys(name: str, loss) -> None:
    logits, reference, labels = fixed_inputs()
    assert loss(logits, reference, labels).item() == pytest.approx(REFERENCE[name], rel=1e-6)


def _trained(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    keep = labels[:, 1:] != -100
    return logits[:, :-1][keep], labels[:, 1:][keep]


def test_dft_gradient_is_the_cross_entropy_gradient_weighted_by_the_detached_probability() -> None:
    logits, _, labels = fixed_inputs()
    logits.requires_grad_(True)
    dft_loss(logits, labels).backward()
    expected = torch.zeros_like(logits)
    scores, targets = _trained(logits.detach(), labels)
    per_token = F.cross_entropy(scores, targets, reduction="none")
    weights = torch.exp(-per_token)
    grads = (scores.softmax(-1) - F.one_hot(targets, 32)) * weights[:, None] / len(targets)
    expected[:, :-1][labels[:, 1:] != -100] = grads
    assert torch.allclose(logits.grad, expected, atol=1e-6)


def test_eaft_weight_is_the_scaled_top_k_entropy_and_is_detached() -> None:
    logits, _, labels = fixed_inputs()
    scores, targets = _trained(logits, labels)
    top = scores.topk(20, dim=-1).values.softmax(-1)
    weight = (-(top * top.log()).sum(-1) / 3.0) ** 1.5
    per_token = F.cross_entropy(scores, targets, reduction="none")
    assert eaft_loss(logits, labels, alpha=1.5).item() == pytest.approx((per_token * weight).mean().item(), rel=1e-5)
    logits.requires_grad_(True)
    eaft_loss(logits, labels, alpha=1.5).backward()
    ce_only = logits.detach().clone().requires_grad_(True)
    s, t = _trained(ce_only, labels)
    (F.cross_entropy(s, t, reduction="none") * weight).mean().backward()
    assert torch.allclose(logits.grad, ce_only.grad, atol=1e-6)


def test_asft_is_dft_plus_alpha_times_kl_from_the_reference_and_zero_kl_against_itself() -> None:
    logits, reference, labels = fixed_inputs()
    scores, _ = _trained(logits, labels)
    ref, _ = _trained(reference, labels)
    kl = (ref.softmax(-1) * (ref.log_softmax(-1) - scores.log_softmax(-1))).sum(-1).mean()
    assert asft_loss(logits, labels, reference, alpha=0.3).item() == pytest.approx(dft_loss(logits, labels).item()
                                                                                     + 0.3 * kl.item(), rel=1e-5)
    assert asft_loss(logits, labels, logits, alpha=5.0).item() == pytest.approx(dft_loss(logits, labels).item(), abs=1e-6)


def test_a_batch_without_trained_tokens_gives_zero_that_still_backpropagates() -> None:
    logits = torch.randn(1, 4, 8, requires_grad=True)
    labels = torch.full((1, 4), -100)
    for loss in (dft_loss(logits, labels), eaft_loss(logits, labels, alpha=1.0), asft_loss(logits, labels, logits.detach(), alpha=0.1)):
        assert loss.item() == 0.0
        loss.backward()
