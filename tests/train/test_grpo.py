"""GRPO arithmetic and gradient surgery on hand-computed cases."""

import math

import pytest
import torch

from mainspring.train.grpo import group_advantages, has_signal, policy_loss
from mainspring.train.interference import cagrad, combine, pcgrad


def test_group_advantages_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.2, 0.2, 0.2]], dtype=torch.float64)
    a = group_advantages(r)
    std = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    assert torch.allclose(a[0], torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64) / (std + 1e-6))
    assert torch.equal(a[1], torch.zeros(4, dtype=torch.float64))  # no signal, no advantage
    assert torch.allclose(group_advantages(r, "none")[0], torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64))
    assert has_signal(r).tolist() == [True, False]
    with pytest.raises(ValueError):
        group_advantages(torch.ones(3, 1))


def test_clip_higher_by_hand():
    # one completion of 3 tokens: ratios e^0.5, 1, e^-0.5; advantage +1 then -1
    old = torch.zeros(1, 3)
    logp = torch.tensor([[0.5, 0.0, -0.5]], requires_grad=True)
    mask = torch.ones(1, 3)
    pos = policy_loss(logp, old, torch.tensor([1.0]), mask, batch_tokens=3, clip_low=0.2, clip_high=0.28)
    # A>0: min(r, clip(r)) = [1.28, 1, e^-0.5]; the first token is clipped (no gradient)
    want = -(1.28 + 1.0 + math.exp(-0.5)) / 3
    assert pos.loss.item() == pytest.approx(want, rel=1e-6)
    assert pos.clipped_tokens == 1
    pos.loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] == pytest.approx(-1 / 3)
    logp.grad = None
    neg = policy_loss(logp, old, torch.tensor([-1.0]), mask, batch_tokens=3, clip_low=0.2, clip_high=0.28)
    # A<0: min(-r, -clip(r)) = [-e^0.5, -1, -0.8]; the last token is clipped at 1 - 0.2
    assert neg.loss.item() == pytest.approx((math.exp(0.5) + 1.0 + 0.8) / 3, rel=1e-6)
    assert neg.clipped_tokens == 1


def test_token_level_mean_weighs_every_token_equally():
    # a 1-token and a 3-token completion, same advantage: the loss is the mean over 4 tokens
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    out = policy_loss(logp, logp, torch.tensor([1.0, 1.0]), mask, batch_tokens=4)
    assert out.loss.item() == pytest.approx(-1.0)
    assert out.tokens == 4


def test_kl_k3_is_zero_at_the_reference_and_positive_away():
    logp = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2)
    same = policy_loss(logp, logp, torch.zeros(1), mask, 2, ref_logp=logp.clone(), kl_beta=0.1)
    assert same.kl_sum == pytest.approx(0.0, abs=1e-9)
    away = policy_loss(logp, logp, torch.zeros(1), mask, 2, ref_logp=logp - 0.5, kl_beta=0.1)
    assert away.kl_sum == pytest.approx(2 * (math.exp(-0.5) + 0.5 - 1), rel=1e-6)


def test_pcgrad_projects_conflicting_gradients():
    g1, g2 = torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 1.0])
    # g1 . g2 < 0: g1' = g1 - (g1.g2/|g2|^2) g2 = [0.5, 0.5]; g2' = g2 - (g2.g1/|g1|^2) g1 = [0, 1]
    out = pcgrad([g1, g2])
    assert torch.allclose(out, torch.tensor([0.25, 0.75]))
    naive = (g1 + g2) / 2
    assert not torch.allclose(out, naive)
    # the result no longer conflicts with either domain
    assert out @ g1 >= 0 and out @ g2 >= 0
    # agreeing gradients are left alone
    assert torch.allclose(pcgrad([g1, torch.tensor([1.0, 1.0])]), torch.tensor([1.0, 0.5]))


def test_gradient_surgery_refuses_a_single_combined_gradient():
    with pytest.raises(ValueError, match="silently"):
        pcgrad([torch.ones(3)])
    with pytest.raises(ValueError, match="silently"):
        combine("cagrad", [torch.ones(3)])


def test_cagrad_improves_the_worst_domain():
    g1, g2 = torch.tensor([1.0, 0.0]), torch.tensor([-0.9, 0.3])
    mean = (g1 + g2) / 2
    d = cagrad([g1, g2], c=0.5)
    # the worst domain's first-order improvement is better than under the plain average
    assert min(d @ g1, d @ g2) > min(mean @ g1, mean @ g2)
    # c = 0 is the plain average
    assert torch.allclose(cagrad([g1, g2], c=0.0), mean, atol=1e-6)
