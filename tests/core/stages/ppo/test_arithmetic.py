"""PPO's arithmetic on small tensors whose results are worked out by hand."""

from __future__ import annotations

import pytest
import torch

from tuneline.core.stages.ppo.arithmetic import (
    AdaptiveKLController,
    RunningMoments,
    advantages_and_returns,
    clipped_losses,
    last_positions,
    masked_whiten,
    token_rewards,
)
from tuneline.core.stages.ppo.trainer import cut_reply, sequence_batch


def test_token_rewards_penalise_kl_on_reply_tokens_and_add_the_score_at_the_last():
    mask = torch.tensor([[0.0, 1, 1, 0]])
    rewards, kl = token_rewards(torch.tensor([2.0]), torch.tensor([[0.0, -1, -2, 0]]), torch.tensor([[0.0, -1.5, -1, 0]]),
                                mask, kl_coef=0.5)
    assert kl.tolist() == [[0.0, 0.5, -1.0, 0.0]]
    assert rewards.tolist() == [[0.0, -0.25, 2.5, 0.0]]
    assert last_positions(torch.tensor([[1.0, 1, 0], [0, 0, 1]])).tolist() == [1, 2]


def test_generalised_advantages_match_a_hand_computation():
    # gamma = lam = 1: the advantage is the sum of future deltas; returns are the rewards to go.
    advantages, returns = advantages_and_returns(torch.tensor([[1.0, 2, 0]]), torch.tensor([[0.0, 0, 1]]),
                                                 torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert returns.tolist() == [[1.0, 1.0, 1.0]]
    assert advantages == pytest.approx(torch.tensor([[0.0, -1.0, 1.0]]), abs=1e-6)  # [0, -1, 1] has mean 0 and variance 1


def test_positions_outside_the_reply_neither_earn_nor_pass_on_value():
    mask = torch.tensor([[0.0, 1, 1, 0]])
    _, returns = advantages_and_returns(torch.tensor([[5.0, 1, 2, 7]]), torch.tensor([[9.0, 0, 1, 9]]), mask,
                                        gamma=1.0, lam=1.0)
    assert returns.tolist() == [[0.0, 1.0, 1.0, 0.0]]
    lam_half, _ = advantages_and_returns(torch.tensor([[0.0, 1, 2, 0]]), torch.tensor([[0.0, 0, 1, 0]]), mask,
                                         gamma=1.0, lam=0.5)
    assert lam_half[0, 0] == 0 and lam_half[0, 3] == 0


def test_policy_loss_clips_the_ratio_only_where_it_would_gain():
    mask = torch.ones(1, 2)
    doubled = torch.log(torch.tensor([[2.0, 2.0]]))
    zero = torch.zeros(1, 2)
    losses = clipped_losses(doubled, zero, zero, zero, torch.tensor([[1.0, -1.0]]), zero, mask,
                            cliprange=0.2, cliprange_value=0.2, vf_coef=0.1)
    # advantage +1: min(2, 1.2) x 1 -> loss -1.2 (clipped); advantage -1: ratio 2 counts in full -> loss 2
    assert losses.policy.item() == pytest.approx((-1.2 + 2.0) / 2)
    assert losses.policy_clipped.item() == pytest.approx(0.5)


def test_value_loss_takes_the_worse_of_the_clipped_and_unclipped_errors():
    mask = torch.ones(1, 1)
    zero = torch.zeros(1, 1)
    losses = clipped_losses(zero, zero, torch.tensor([[1.0]]), zero, zero, torch.tensor([[1.0]]), mask,
                            cliprange=0.2, cliprange_value=0.2, vf_coef=0.5)
    # unclipped error 0, clipped prediction 0.2 -> error 0.64; the loss is half the larger
    assert losses.value.item() == pytest.approx(0.32)
    assert losses.total.item() == pytest.approx(0.5 * 0.32)


def test_kl_coefficient_moves_towards_the_target_proportionally_and_bounded():
    controller = AdaptiveKLController(0.2, target=6.0, horizon=10_000)
    controller.update(100.0, samples=100)  # error clipped to +20%
    assert controller.value == pytest.approx(0.2 * 1.002)
    controller.update(3.0, samples=100)  # half the target: -50% clipped to -20%
    assert controller.value == pytest.approx(0.2 * 1.002 * 0.998)


def test_running_moments_equal_the_statistics_of_everything_seen():
    first, second = torch.tensor([1.0, 2.0, 4.0]), torch.tensor([-3.0, 0.5])
    moments = RunningMoments()
    moments.update(first)
    moments.update(second)
    both = torch.cat([first, second]).double()
    assert moments.mean == pytest.approx(both.mean().item())
    assert moments.std == pytest.approx(both.std().item())


def test_masked_whiten_ignores_masked_positions():
    values = torch.tensor([[100.0, 1.0, 3.0]])
    whitened = masked_whiten(values, torch.tensor([[0.0, 1, 1]]))
    assert whitened[0, 0] == 0
    assert whitened[0, 1:].tolist() == pytest.approx([-2 ** -0.5, 2 ** -0.5], abs=1e-6)


def test_replies_end_at_their_first_stop_token_which_they_keep():
    assert cut_reply([5, 7, 2, 0, 0], stops={2}, pad_token_id=0) == [5, 7, 2]
    assert cut_reply([5, 7, 0, 0], stops={2}, pad_token_id=0) == [5, 7]
    assert cut_reply([0, 0], stops={2}, pad_token_id=0) == [0]


def test_sequence_batch_masks_the_positions_that_predict_reply_tokens():
    ids, attention, mask = sequence_batch([[1, 2, 3], [4]], [[5, 6], [7]], pad_token_id=0, device=torch.device("cpu"))
    assert ids.tolist() == [[1, 2, 3, 5, 6], [4, 7, 0, 0, 0]]
    assert attention.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert mask.tolist() == [[0, 0, 1, 1], [1, 0, 0, 0]]
