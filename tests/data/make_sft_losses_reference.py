"""Reference numbers of LLaMA-Factory 0.9.5's SFT loss functions on fixed logits and labels, the data of
tests/core/training/test_losses.py (sft_losses_llamafactory.json). Run with LLaMA-Factory's Python:

    /work/lfvenv/bin/python tests/data/make_sft_losses_reference.py > tests/data/sft_losses_llamafactory.json
"""
import json

import torch
from llamafactory.train.trainer_utils import asft_loss_func, dft_loss_func, eaft_loss_func


def fixed_inputs():
    b, t, v = 2, 6, 32
    idx = torch.arange(b * t * v, dtype=torch.float64).reshape(b, t, v)
    logits = (3.0 * torch.sin(0.37 * idx) + torch.cos(1.3 * idx)).float()
    ref = (2.0 * torch.cos(0.23 * idx) - torch.sin(0.71 * idx)).float()
    labels = torch.tensor([[-100, -100, 5, 17, 3, 30], [-100, 9, 9, 0, -100, -100]])
    return logits, ref, labels

logits, ref, labels = fixed_inputs()
out = {"logits": logits}
rows = {
  "dft": dft_loss_func(out, labels).item(),
  "dft_num_items_10": dft_loss_func(out, labels, num_items_in_batch=torch.tensor(10)).item(),
  "eaft_alpha_1": eaft_loss_func(out, labels, None, 1.0).item(),
  "eaft_alpha_0.5": eaft_loss_func(out, labels, None, 0.5).item(),
  "eaft_alpha_2_num_items_10": eaft_loss_func(out, labels, torch.tensor(10), 2.0).item(),
  "asft_alpha_0.1": asft_loss_func(out, labels, ref, asft_alpha=0.1).item(),
  "asft_alpha_1": asft_loss_func(out, labels, ref, asft_alpha=1.0).item(),
}
print(json.dumps(rows, indent=1))
