"""GRPO math against hand-computed values (services/policy_trainer/grpo.py)."""

import math

import pytest
import torch

from services.policy_trainer.grpo import group_advantages, grpo_loss, token_logprobs

EPS = 1e-6


# ---------------------------------------------------------------------------------------------- advantages


def test_advantages_population_std_plus_minus_one():
    # rewards [1, 0, 0, 1]: mean 0.5; POPULATION std (divide by G=4) = sqrt(4 * 0.25 / 4) = 0.5
    # A = (r - 0.5) / (0.5 + eps) = ±0.5 / 0.500001 = ±1 / (1 + 2e-6)
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), eps=EPS)
    want = torch.tensor([[1.0, -1.0, -1.0, 1.0]]) / (1 + 2 * EPS)
    torch.testing.assert_close(adv, want, rtol=0, atol=1e-7)


def test_advantages_use_population_not_unbiased_std():
    # rewards [0, 0, 1]: mean 1/3; deviations (-1/3, -1/3, 2/3); sum of squares 1/9 + 1/9 + 4/9 = 2/3
    # population std = sqrt((2/3) / 3) = sqrt(2)/3  ->  A = (-1/sqrt(2), -1/sqrt(2), sqrt(2))
    # (the unbiased std sqrt((2/3) / 2) = 1/sqrt(3) would give 2/sqrt(3) = 1.1547 for the last one)
    adv = group_advantages(torch.tensor([[0.0, 0.0, 1.0]]), eps=0.0)
    r2 = math.sqrt(2.0)
    torch.testing.assert_close(adv, torch.tensor([[-1 / r2, -1 / r2, r2]]), rtol=0, atol=1e-6)


def test_advantages_groups_are_independent_and_constant_groups_are_zero():
    # group 0: [2, 4] -> mean 3, std 1 -> [-1, 1]; group 1: all equal (0.1 is not exact in binary: the
    # mean may differ from each element by round-off, yet the result must be exactly 0, not round-off / eps)
    rewards = torch.tensor([[2.0, 4.0, 2.0, 4.0], [0.1, 0.1, 0.1, 0.1], [1.1, 1.1, 1.1, 1.1]])
    adv = group_advantages(rewards, eps=EPS)
    torch.testing.assert_close(adv[0], torch.tensor([-1.0, 1.0, -1.0, 1.0]) / (1 + EPS), rtol=0, atol=1e-7)
    assert torch.equal(adv[1:], torch.zeros(2, 4))


def test_advantages_without_std_scaling_are_centered_rewards():
    # [1, 0, 0, 1] - 0.5 = [0.5, -0.5, -0.5, 0.5]
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), scale_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([[0.5, -0.5, -0.5, 0.5]]))


def test_advantages_reject_wrong_rank():
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0, 0.0]))


# ---------------------------------------------------------------------------------------------- log-probs


def test_token_logprobs_hand_value():
    # logits [0, ln 3] -> softmax [1/4, 3/4]; targets 1 and 0 -> ln(3/4), ln(1/4)
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    lp = token_logprobs(logits, torch.tensor([[1, 0]]))
    torch.testing.assert_close(lp, torch.tensor([[math.log(0.75), math.log(0.25)]]))


def test_token_logprobs_matches_log_softmax_in_chunks_with_grad():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, 11, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (5, 7), generator=g)
    got = token_logprobs(logits, targets, chunk_rows=2)  # chunks of 2, 2, 1 rows
    want = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(got, want)
    (g1,) = torch.autograd.grad(got.sum(), logits)
    (g2,) = torch.autograd.grad(want.sum(), logits)
    torch.testing.assert_close(g1, g2)


def test_token_logprobs_bf16_logits_are_computed_in_fp32():
    logits = torch.tensor([[[0.0, math.log(3.0)]]]).bfloat16()
    lp = token_logprobs(logits, torch.tensor([[1]]))
    assert lp.dtype == torch.float32


# ---------------------------------------------------------------------------------------------- loss


def _clip_example():
    # 2 sequences x 2 tokens, clip_eps 0.2 (clip range [0.8, 1.2]), ratios 1.5 and 0.5 in each sequence.
    old = torch.zeros(2, 2)
    logp = torch.log(torch.tensor([[1.5, 0.5], [1.5, 0.5]])).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    return logp, old, adv


def test_clipped_loss_hand_values():
    logp, old, adv = _clip_example()
    loss, stats = grpo_loss(logp, old, adv, torch.ones(2, 2, dtype=torch.bool), clip_eps=0.2)
    # A=+1, ratio 1.5: -min(1.5*1, 1.2*1) = -1.2   (clipped: no gradient)
    # A=+1, ratio 0.5: -min(0.5*1, 0.8*1) = -0.5   (unclipped)
    # A=-1, ratio 1.5: -min(-1.5, -1.2)   = +1.5   (unclipped: the pessimistic side)
    # A=-1, ratio 0.5: -min(-0.5, -0.8)   = +0.8   (clipped: no gradient)
    # token-mean: (-1.2 - 0.5 + 1.5 + 0.8) / 4 = 0.6 / 4 = 0.15
    assert loss.item() == pytest.approx(0.15, abs=1e-6)
    assert stats["loss"] == pytest.approx(0.15, abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(2 / 4)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.5 + 0.5) / 4)
    assert stats["kl_mean"] == 0.0
    assert stats["tokens"] == 4
    # d loss / d logp = -ratio * A / 4 where unclipped, 0 where clipped:
    # [0, -0.5 * 1 / 4], [-1.5 * -1 / 4, 0] = [[0, -0.125], [0.375, 0]]
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.125], [0.375, 0.0]]))


def test_ratio_one_gives_minus_advantage_token_mean():
    # ratio 1 everywhere -> per-token loss = -A; 3 tokens of A=2 -> -2
    lp = torch.full((1, 3), -1.3)
    loss, stats = grpo_loss(lp, lp.clone(), torch.tensor([2.0]), torch.ones(1, 3), clip_eps=0.2)
    assert loss.item() == pytest.approx(-2.0)
    assert stats["clip_fraction"] == 0.0 and stats["ratio_mean"] == pytest.approx(1.0)


def test_k3_kl_value():
    # logp = ln 0.5, ref = ln 0.25: log_r = ref - logp = ln 0.5
    # k3 = exp(ln 0.5) - ln 0.5 - 1 = 0.5 + ln 2 - 1 = ln 2 - 0.5 = 0.19315
    logp = torch.log(torch.tensor([[0.5]]))
    ref = torch.log(torch.tensor([[0.25]]))
    k3 = math.log(2.0) - 0.5
    # A = 0 and ratio 1: the policy-gradient term is 0; loss = kl_coef * k3
    loss, stats = grpo_loss(
        logp, logp.clone(), torch.tensor([0.0]), torch.ones(1, 1), 0.2, ref_logprobs=ref, kl_coef=0.1
    )
    assert stats["kl_mean"] == pytest.approx(k3, abs=1e-6)
    assert loss.item() == pytest.approx(0.1 * k3, abs=1e-7)
    # kl_coef 0: reported, not added; ref == logp: k3 = 1 - 0 - 1 = 0
    loss0, stats0 = grpo_loss(
        logp, logp.clone(), torch.tensor([0.0]), torch.ones(1, 1), 0.2, ref_logprobs=ref
    )
    assert loss0.item() == 0.0 and stats0["kl_mean"] == pytest.approx(k3, abs=1e-6)
    _, same = grpo_loss(
        logp, logp.clone(), torch.tensor([0.0]), torch.ones(1, 1), 0.2, ref_logprobs=logp, kl_coef=0.1
    )
    assert same["kl_mean"] == 0.0


def test_kl_coef_without_reference_is_an_error():
    lp = torch.zeros(1, 1)
    with pytest.raises(ValueError):
        grpo_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 1), 0.2, kl_coef=0.1)


def test_masked_tokens_are_ignored_even_if_inf():
    logp, old, adv = _clip_example()
    mask = torch.tensor([[True, True, False], [True, True, False]])
    # a third, masked-out column with absurd values: ratio e^50, -inf old log-prob, NaN reference
    logp3 = torch.cat([logp.detach(), torch.tensor([[50.0], [50.0]])], 1).requires_grad_(True)
    old3 = torch.cat([old, torch.tensor([[-math.inf], [0.0]])], 1)
    ref3 = torch.cat([logp.detach(), torch.tensor([[math.nan], [0.0]])], 1)
    loss, stats = grpo_loss(logp3, old3, adv, mask, 0.2, ref_logprobs=ref3, kl_coef=0.5)
    assert loss.item() == pytest.approx(0.15, abs=1e-6)  # same as test_clipped_loss_hand_values (k3 = 0)
    assert stats["tokens"] == 4 and stats["ratio_mean"] == pytest.approx(1.0)
    (grad,) = torch.autograd.grad(loss, logp3)
    assert torch.isfinite(grad).all() and torch.equal(grad[:, 2], torch.zeros(2))


def test_token_mean_across_sequences_of_different_lengths():
    # ratio 1: per-token loss = -A. seq 0: 1 token, A=+1 -> -1; seq 1: 3 tokens, A=-1 -> +1 each.
    # token-mean (DAPO) = (-1 + 3 * 1) / 4 = 0.5   (a per-sequence mean would give (-1 + 1) / 2 = 0)
    lp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    loss, stats = grpo_loss(lp, lp, torch.tensor([1.0, -1.0]), mask, 0.2)
    assert loss.item() == pytest.approx(0.5)
    assert stats["tokens"] == 4


def test_num_tokens_makes_micro_batch_losses_add_up():
    g = torch.Generator().manual_seed(0)
    lp, old = torch.randn(4, 5, generator=g) * 0.3, torch.randn(4, 5, generator=g) * 0.3
    adv = torch.tensor([1.0, -0.5, 0.25, -2.0])
    mask = torch.rand(4, 5, generator=g) > 0.3
    full, _ = grpo_loss(lp, old, adv, mask, 0.2)
    n = float(mask.sum())
    a, _ = grpo_loss(lp[:1], old[:1], adv[:1], mask[:1], 0.2, num_tokens=n)
    b, _ = grpo_loss(lp[1:], old[1:], adv[1:], mask[1:], 0.2, num_tokens=n)
    torch.testing.assert_close(a + b, full)


def test_shape_checks():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        grpo_loss(lp, lp, torch.zeros(3), torch.ones(2, 3), 0.2)
    with pytest.raises(ValueError):
        grpo_loss(lp, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3), 0.2)
