"""TB loss value and gradient against a hand computation; beta and lr at the paper's GSM8K and TL;DR schedules."""
import math

import pytest
import torch

from learner import beta_at, lr_at
from losses import tb_loss, vargrad_log_z


def test_tb_loss_value_by_hand():
    # prompt 0: two samples, prompt 1: one sample; beta = 0.5
    logp = torch.tensor([-1.0, -2.0, -3.0])
    ref = torch.tensor([-1.5, -1.0, -2.0])
    r = torch.tensor([1.0, 0.0, 1.0])
    g = torch.tensor([7, 7, 3])
    # delta = logp - ref - r/beta = [-1.5, -1.0, -3.0]; group means: prompt 7 -> -1.25, prompt 3 -> -3.0
    # residuals [-0.25, 0.25, 0.0] -> loss = (0.0625 + 0.0625 + 0) / 3
    assert tb_loss(logp, ref, r, 0.5, g).item() == pytest.approx(0.125 / 3)
    assert vargrad_log_z(logp, ref, r, 0.5, g).tolist() == pytest.approx([1.25, 1.25, 3.0])


def test_tb_loss_gradient_is_centred_residual():
    # dL/dlogp_j = (2/N) (delta_j - mean_group delta): log Z is a stop-gradient (paper Eq. 5)
    torch.manual_seed(0)
    logp = torch.randn(6, requires_grad=True)
    ref, r = torch.randn(6), torch.rand(6)
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    beta = 0.1
    tb_loss(logp, ref, r, beta, g).backward()
    delta = (logp - ref - r / beta).detach()
    centred = torch.cat([delta[:3] - delta[:3].mean(), delta[3:] - delta[3:].mean()])
    assert torch.allclose(logp.grad, 2 * centred / 6, atol=1e-6)


def test_grouping_is_by_prompt_id_not_layout():
    torch.manual_seed(1)
    logp, ref, r = torch.randn(8), torch.randn(8), torch.rand(8)
    g = torch.tensor([0, 1, 0, 1, 2, 2, 0, 1])
    perm = torch.randperm(8)
    a = tb_loss(logp, ref, r, 0.3, g)
    b = tb_loss(logp[perm], ref[perm], r[perm], 0.3, g[perm])
    assert a.item() == pytest.approx(b.item(), rel=1e-6)
    # a contiguous (K, -1) reshape, the reference code's latent bug, gives a different value here
    wrong = logp - ref - r / 0.3
    wrong = ((wrong.view(2, 4) - wrong.view(2, 4).mean(0)) ** 2).mean()
    assert wrong.item() != pytest.approx(a.item(), rel=1e-3)


def test_on_policy_gradient_matches_reinforce_with_kl_advantage():
    # App. A: on-policy, grad TB = -(2/beta) x REINFORCE gradient with A = (r - r_bar) - beta (KL - KL_bar)
    torch.manual_seed(2)
    logp = torch.randn(5, requires_grad=True)
    ref, r = torch.randn(5), torch.rand(5)
    g = torch.zeros(5, dtype=torch.long)
    beta = 0.2
    tb_loss(logp, ref, r, beta, g).backward()
    kl = (logp - ref).detach()
    adv = (r - r.mean()) - beta * (kl - kl.mean())
    assert torch.allclose(logp.grad, -(2 / beta) * adv / 5, atol=1e-6)


def test_beta_schedule_gsm8k_launch():
    b = lambda u: beta_at(u, 0.014, 0.004, 500)
    assert b(1) == pytest.approx(0.014)
    assert b(250) == pytest.approx(0.00902, abs=1e-8)
    assert b(499) == pytest.approx(0.00404, abs=1e-8)
    assert b(500) == b(700) == pytest.approx(0.004)


def test_beta_schedule_tldr_cut():
    b = lambda u: beta_at(u, 1.0, 0.05, 128, cut_step=32)
    assert b(1) == pytest.approx(1.0)
    assert b(31) == pytest.approx(0.777, abs=1e-3)
    assert b(32) == b(200) == pytest.approx(0.05)


def test_beta_constant_without_decay():
    assert beta_at(1, 0.05, 0.01, 0) == beta_at(999, 0.05, 0.01, 0) == 0.05


def test_lr_wsd_700_step_launch():
    lr = lambda u: lr_at(u, 1e-5, "wsd", 50, 350, 600, 700)
    assert lr(1) == pytest.approx(2e-7)
    assert lr(49) == pytest.approx(9.8e-6)
    assert lr(50) == lr(250) == lr(399) == pytest.approx(1e-5)
    assert lr(400) == pytest.approx(1e-5)
    assert lr(700) == pytest.approx(5e-6)
    assert lr(1000) == pytest.approx(0.0, abs=1e-12)


def test_lr_linear_and_constant():
    assert lr_at(1, 3e-6, "linear", 0, 0, 0, 256) == pytest.approx(3e-6)
    assert lr_at(129, 3e-6, "linear", 0, 0, 0, 256) == pytest.approx(1.5e-6)
    assert lr_at(77, 3e-6, "constant", 0, 0, 0, 256) == 3e-6
    assert math.isclose(lr_at(256, 3e-6, "linear", 0, 0, 0, 256), 3e-6 / 256)
