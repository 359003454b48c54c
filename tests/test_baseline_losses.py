"""Baseline objectives in losses.py (GRPO, Dr. GRPO, PRIME-RL's ratio loss, TBA', proximal RLOO, online DPO, M2PO, TB
on the shared interface).

Each loss is checked in value and gradient against a reference written here with plain Python floats (math.exp,
explicit loops, hand-derived gradients), never by calling the loss twice, including the cases that tell the sources
apart (PPO clip vs the truncated ratio, a sequence-level vs a token-level ratio, DPO pairing and ties, M2PO masking).
Padding positions carry garbage in logp (1.0, trl's INVALID_LOGPROB), logp_behav and logp_ref and must get no
gradient and no weight.
"""
import dataclasses
import math
import os

import pytest
import torch

from config import Config, load_config
from losses import (
    LOSSES,
    dr_grpo_loss,
    grpo_loss,
    m2po_loss,
    online_dpo_loss,
    prime_ratio_loss,
    rloo_loss,
    tb_batch_loss,
    tb_loss,
    tba_prime_loss,
)

CFG = Config(clip_eps=0.2, is_cap=8.0, max_new_tokens=5, dpo_beta=0.1)
BEHAV_PAD, REF_PAD = 37.0, -41.0  # garbage the losses must never read


def batch(logp, mask, behav, ref, reward, group, beta):
    mask_t = torch.tensor(mask, dtype=torch.bool)
    pad = lambda x, v: torch.where(mask_t, torch.tensor(x, dtype=torch.float64), torch.tensor(v, dtype=torch.float64))
    return {
        "logp": torch.tensor(logp, dtype=torch.float64, requires_grad=True),
        "mask": mask_t,
        "logp_behav": pad(behav, BEHAV_PAD),
        "logp_ref": pad(ref, REF_PAD),
        "reward": torch.tensor(reward, dtype=torch.float64),
        "group": torch.tensor(group),
        "beta": beta,
    }


def value_and_grad(fn, b, cfg=CFG):
    b["logp"].grad = None
    loss, metrics = fn(b, cfg)
    assert all(isinstance(v, float) for v in metrics.values())
    loss.backward()
    return loss.item(), b["logp"].grad.clone()


def lists(b):
    return b["logp"].detach().tolist(), b["mask"].tolist(), b["logp_behav"].tolist(), b["logp_ref"].tolist()


def centred_by_group(x, group):
    out = []
    for i, gid in enumerate(group):
        xs = [x[j] for j, g in enumerate(group) if g == gid]
        out.append(x[i] - sum(xs) / len(xs))
    return out


def grpo_advantages_by_hand(reward, group, eps):
    adv = [0.0] * len(reward)
    for gid in set(group):
        idx = [i for i, g in enumerate(group) if g == gid]
        rs = [reward[i] for i in idx]
        m = sum(rs) / len(rs)
        std = math.sqrt(sum((x - m) ** 2 for x in rs) / (len(rs) - 1)) if len(rs) > 1 else 0.0
        for i in idx:
            adv[i] = (reward[i] - m) / (std + eps)
    return adv


# A shared 4-sample example with interleaved prompts (5, 9, 5, 9); sample 1 has one response token and garbage after.
EX = dict(
    logp=[[-0.5, -1.0], [-1.5, 1.0], [-0.3, -0.7], [-2.0, -0.2]],
    mask=[[1, 1], [1, 0], [1, 1], [1, 1]],
    behav=[[-1.0, -0.9], [-1.0, 0.0], [-0.4, -0.2], [-1.9, -0.5]],
    ref=[[-0.6, -1.2], [-1.0, 0.0], [-0.1, -0.9], [-2.2, -0.1]],
    reward=[1.0, 0.2, 0.0, 0.8],
    group=[5, 9, 5, 9],
)

# one token (sample 0, t 0) has logp - behav = 2.5 (ratio 12.2 > cap 8, and > 1 + eps with A > 0); one (sample 3, t 1)
# has logp - ref = 12
EX3 = dict(
    logp=[[1.0, -1.0, -0.4], [-1.5, -0.8, 1.0], [-0.3, -0.7, -1.1], [-2.0, -0.5, 1.0], [-0.9, -1.3, -0.2]],
    mask=[[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]],
    behav=[[-1.5, -0.9, -0.5], [-1.0, -1.0, 0.0], [-0.4, -0.2, -1.0], [-1.9, -0.6, 0.0], [-1.0, -1.0, -0.3]],
    ref=[[-1.2, -1.1, -0.6], [-1.4, -0.6, 0.0], [-0.1, -0.9, -1.5], [-2.2, -12.5, 0.0], [-0.8, -1.6, -0.1]],
    reward=[1.0, 0.0, 0.0, 1.0, 1.0],
    group=[2, 4, 2, 4, 4],
)


# ---------------------------------------------------------------- GRPO and Dr. GRPO (PPO clip)


def clipped_pg_by_hand(lp, mask, bh, rf, adv, beta, eps, norm, max_tokens):
    """-min(rho A, clip(rho) A) + beta k3 per token, normalised by `norm`; returns value, grad, clipped tokens."""
    n, length = len(lp), len(lp[0])
    total = sum(sum(m) for m in mask)
    value, grad, clipped = 0.0, torch.zeros(n, length, dtype=torch.float64), set()
    for i in range(n):
        scale = {"seq_mean": 1 / sum(mask[i]) / n, "token_mean": 1 / total, "constant": 1 / max_tokens / n}[norm]
        for t in range(length):
            if not mask[i][t]:
                continue
            ratio = math.exp(lp[i][t] - bh[i][t])
            unclipped, clip = ratio * adv[i], min(max(ratio, 1 - eps), 1 + eps) * adv[i]
            d = rf[i][t] - lp[i][t]
            value += (-min(unclipped, clip) + beta * (math.exp(d) - d - 1)) * scale
            g_sur = -ratio * adv[i] if unclipped <= clip else 0.0
            if unclipped > clip:
                clipped.add((i, t))
            grad[i, t] = (g_sur + beta * (1 - math.exp(d))) * scale
    return value, grad, clipped


@pytest.mark.parametrize("norm", ["seq_mean", "token_mean", "constant"])
def test_grpo_value_and_gradient_by_hand(norm):
    beta, eps = 0.3, CFG.clip_eps
    cfg = dataclasses.replace(CFG, grpo_norm=norm)
    b = batch(**EX, beta=beta)
    lp, mask, bh, rf = lists(b)
    adv = grpo_advantages_by_hand(EX["reward"], EX["group"], 1e-4)
    # group 5: r = [1, 0] -> std (Bessel) = sqrt(0.5); group 9: r = [0.2, 0.8] -> std = sqrt(0.18)
    assert adv[0] == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-4))
    assert adv[1] == pytest.approx(-0.3 / (math.sqrt(0.18) + 1e-4))
    value, grad, clipped = clipped_pg_by_hand(lp, mask, bh, rf, adv, beta, eps, norm, cfg.max_new_tokens)
    # both branches: A > 0 with ratio > 1 + eps ((0, 0): 1.65) and A < 0 with ratio < 1 - eps are clipped
    assert clipped == {(0, 0), (1, 0), (2, 1), (3, 1)}
    v, g = value_and_grad(grpo_loss, b, cfg)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)
    _, metrics = grpo_loss(batch(**EX, beta=beta), cfg)  # 4 of the 7 response tokens take the clipped term
    k3s = [math.exp(rf[i][t] - lp[i][t]) - (rf[i][t] - lp[i][t]) - 1 for i in range(4) for t in range(2) if mask[i][t]]
    assert metrics["clip_fraction"] == pytest.approx(4 / 7) and metrics["kl_k3"] == pytest.approx(sum(k3s) / 7)
    # without the KL term the clipped tokens get exactly no gradient, the others do
    _, g0 = value_and_grad(grpo_loss, batch(**EX, beta=0.0), cfg)
    for i in range(4):
        for t in range(2):
            assert (g0[i, t].item() == 0.0) == ((i, t) in clipped or not mask[i][t])


def test_grpo_token_mean_uses_the_whole_batch_counts():
    # a micro-batch of 4 samples / 7 tokens inside a batch of 10 samples / 20 tokens: sum / 20 * 10 / 4
    beta = 0.3
    cfg = dataclasses.replace(CFG, grpo_norm="token_mean")
    lp, mask, bh, rf = lists(batch(**EX, beta=beta))
    adv = grpo_advantages_by_hand(EX["reward"], EX["group"], 1e-4)
    value, grad, _ = clipped_pg_by_hand(lp, mask, bh, rf, adv, beta, CFG.clip_eps, "token_mean", 5)  # / 7 tokens
    b = dict(batch(**EX, beta=beta), batch_tokens=20, batch_samples=10)
    v, g = value_and_grad(grpo_loss, b, cfg)
    assert v == pytest.approx(value * 7 / 20 * 10 / 4, rel=1e-9)
    assert torch.allclose(g, grad * 7 / 20 * 10 / 4, atol=1e-12)


def test_grpo_singleton_group_has_zero_advantage():
    b = batch(logp=[[-1.0]], mask=[[1]], behav=[[-1.2]], ref=[[-1.0]], reward=[1.0], group=[0], beta=0.0)
    v, g = value_and_grad(grpo_loss, b)
    assert v == 0.0 and g.abs().max().item() == 0.0


def test_dr_grpo_value_and_gradient_by_hand():
    b = batch(**EX3, beta=0.7)  # beta must not matter: Dr. GRPO has no KL term
    lp, mask, bh, rf = lists(b)
    adv = centred_by_group(EX3["reward"], EX3["group"])  # no std division
    assert adv == pytest.approx([0.5, -2 / 3, -0.5, 1 / 3, 1 / 3])
    value, grad, clipped = clipped_pg_by_hand(lp, mask, bh, rf, adv, 0.0, CFG.clip_eps, "constant", 5)
    v, g = value_and_grad(dr_grpo_loss, b)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)
    # PPO clip: the token with ratio 12.2 > 1 + eps and A = 0.5 > 0 takes the constant clipped term, no gradient
    assert (0, 0) in clipped and g[0, 0].item() == 0.0
    _, metrics = dr_grpo_loss(batch(**EX3, beta=0.7), CFG)
    assert metrics["clip_fraction"] == pytest.approx(len(clipped) / 13)
    # constant normaliser: the loss scales as 1 / max_new_tokens, not with the response length
    v10, _ = value_and_grad(dr_grpo_loss, batch(**EX3, beta=0.7), dataclasses.replace(CFG, max_new_tokens=10))
    assert v10 == pytest.approx(value / 2, rel=1e-9)


# ---------------------------------------------------------------- PRIME-RL's ratio loss and TBA'


def ratio_loss_by_hand(lp, mask, bh, adv, cap, max_tokens):
    """-clamp(rho, 0, cap) A per token, sum / max_tokens, mean over samples; d/dlogp = -rho A below the cap, else 0."""
    n = len(lp)
    value, grad = 0.0, torch.zeros(n, len(lp[0]), dtype=torch.float64)
    for i in range(n):
        for t in range(len(lp[0])):
            if mask[i][t]:
                rho = math.exp(lp[i][t] - bh[i][t])
                value += -min(rho, cap) * adv[i] / max_tokens / n
                grad[i, t] = (-rho * adv[i] if rho < cap else 0.0) / max_tokens / n
    return value, grad


def test_prime_ratio_value_and_gradient_by_hand():
    b = batch(**EX3, beta=0.7)  # no KL term: beta must not matter
    lp, mask, bh, _ = lists(b)
    adv = centred_by_group(EX3["reward"], EX3["group"])
    value, grad = ratio_loss_by_hand(lp, mask, bh, adv, CFG.is_cap, CFG.max_new_tokens)
    v, g = value_and_grad(prime_ratio_loss, b)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)
    # no stop-gradient on the ratio: the token above the cap (rho = 12.2) gets no gradient, not -cap A
    assert math.exp(2.5) > CFG.is_cap and g[0, 0].item() == 0.0
    # below the cap the gradient is -rho A / (T N) (sample 1, t 0: rho = exp(-0.5) < 1 - eps, A = -2/3, which PPO's
    # clip would give no gradient)
    assert g[1, 0].item() == pytest.approx(math.exp(-0.5) * (2 / 3) / 5 / 5)
    _, metrics = prime_ratio_loss(batch(**EX3, beta=0.7), CFG)  # 1 of the 13 response tokens is above the cap
    weights = [min(math.exp(lp[i][t] - bh[i][t]), 8.0) for i in range(5) for t in range(3) if mask[i][t]]
    assert metrics["is_capped_fraction"] == pytest.approx(1 / 13)
    assert metrics["is_weight_mean"] == pytest.approx(sum(weights) / 13)


def test_tba_prime_value_and_gradient_by_hand():
    beta = 0.5
    b = batch(**EX3, beta=beta)
    lp, mask, bh, rf = lists(b)
    kl = [sum(max(-10.0, min(10.0, lp[i][t] - rf[i][t])) for t in range(3) if mask[i][t]) for i in range(5)]
    # sample 3 token 1: logp - ref = 12 is clamped to 10
    assert kl[3] == pytest.approx((-2.0 + 2.2) + 10.0)
    r_c, kl_c = centred_by_group(EX3["reward"], EX3["group"]), centred_by_group(kl, EX3["group"])
    adv = [r_c[i] - beta * kl_c[i] for i in range(5)]
    value, grad = ratio_loss_by_hand(lp, mask, bh, adv, CFG.is_cap, CFG.max_new_tokens)
    v, g = value_and_grad(tba_prime_loss, b)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)
    assert g[0, 0].item() == 0.0  # above the cap: no gradient, as prime_ratio


def random_batch(seed, n_groups=3, k=4, length=6, beta=0.05, kl_spread=1.0):
    gen = torch.Generator().manual_seed(seed)
    n = n_groups * k
    mask = torch.rand(n, length, generator=gen) < 0.8
    mask[:, 0] = True
    logp = -torch.rand(n, length, generator=gen) * 3
    behav = logp + 0.3 * torch.randn(n, length, generator=gen)
    ref = logp + kl_spread * torch.randn(n, length, generator=gen)
    group = torch.arange(n_groups).repeat(k)[torch.randperm(n, generator=gen)]  # interleaved prompts
    reward = torch.rand(n, generator=gen)
    logp = torch.where(mask, logp, torch.ones_like(logp))  # INVALID_LOGPROB padding
    return {
        "logp": logp.double().requires_grad_(True),
        "mask": mask,
        "logp_behav": torch.where(mask, behav, torch.full_like(behav, BEHAV_PAD)).double(),
        "logp_ref": torch.where(mask, ref, torch.full_like(ref, REF_PAD)).double(),
        "reward": reward.double(),
        "group": group,
        "beta": beta,
    }


def test_tba_prime_with_beta_zero_is_prime_ratio():
    for seed in range(3):
        b = random_batch(seed, beta=0.0)
        b["logp_behav"] = torch.where(b["mask"], b["logp"].detach() - 2.6 * torch.rand(b["mask"].shape,
                                      generator=torch.Generator().manual_seed(seed), dtype=torch.float64),
                                      b["logp_behav"])  # some ratios above the cap of 8
        v1, g1 = value_and_grad(tba_prime_loss, b)
        v2, g2 = value_and_grad(prime_ratio_loss, b)
        assert v1 == v2
        assert torch.equal(g1, g2)
        assert tba_prime_loss(b, CFG)[1]["is_capped_fraction"] > 0


def test_tba_prime_differs_from_prime_ratio_when_kl_varies_within_a_group():
    b = random_batch(7, beta=0.05, kl_spread=1.0)
    v1, g1 = value_and_grad(tba_prime_loss, b)
    v2, g2 = value_and_grad(prime_ratio_loss, b)
    assert abs(v1 - v2) > 1e-4
    assert (g1 - g2).abs().max().item() > 1e-4
    # a KL that is constant within each group cancels in the centred advantage
    b = random_batch(7, beta=0.05)
    b["mask"] = torch.ones_like(b["mask"])  # equal lengths
    b["logp_ref"] = b["logp"].detach() - 0.5  # KL_i = 0.5 * L for every sample
    b["logp_behav"] = b["logp"].detach() - 0.1
    v1, g1 = value_and_grad(tba_prime_loss, b)
    v2, g2 = value_and_grad(prime_ratio_loss, b)
    assert v1 == pytest.approx(v2, rel=1e-9)
    assert torch.allclose(g1, g2, atol=1e-12)


# ---------------------------------------------------------------- proximal RLOO (sequence-level PPO clip)

# prompt 4: rows 0, 1, 3; prompts 2 and 6 have one sample each (no leave-one-out baseline, A = 0).
# row 0: every token ratio exp(0.15) = 1.16 is inside 1 +- 0.2, the sequence ratio exp(0.45) = 1.57 is not (A > 0);
# row 1: token ratios exp(0.3) = 1.35 and exp(-0.25) = 0.78 are outside, the sequence ratio exp(0.05) is inside;
# row 3: sequence ratio exp(-0.8) = 0.45 < 0.8 with A < 0.
EXR = dict(
    logp=[[-1.0, -1.0, -1.0], [-0.5, -1.0, 1.0], [-0.3, -0.7, -1.1], [-2.0, -1.0, -1.0], [-0.9, -1.3, -0.2]],
    mask=[[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]],
    behav=[[-1.15, -1.15, -1.15], [-0.8, -0.75, 0.0], [-0.4, -0.2, -1.0], [-1.5, -0.8, -0.9], [-1.0, -1.0, -0.3]],
    ref=[[-1.1, -1.1, -1.1], [-0.7, -0.9, 0.0], [-0.1, -0.9, -1.5], [-1.4, -1.0, -0.8], [-0.8, -1.6, -0.1]],
    reward=[1.0, 0.5, 0.3, 0.0, 0.5],
    group=[4, 4, 2, 4, 6],
)


def test_rloo_value_and_gradient_by_hand():
    beta, eps, n = 0.2, CFG.clip_eps, 5
    b = batch(**EXR, beta=beta)
    lp, mask, bh, rf = lists(b)
    # KL penalty from the behaviour log-probs (TRL 0.9.4: the log-probs of the policy that sampled)
    shaped = [EXR["reward"][i] - beta * sum(bh[i][t] - rf[i][t] for t in range(3) if mask[i][t]) for i in range(n)]
    adv = []
    for i, gid in enumerate(EXR["group"]):
        others = [shaped[j] for j, g in enumerate(EXR["group"]) if g == gid and j != i]
        adv.append(shaped[i] - sum(others) / len(others) if others else 0.0)
    assert adv[0] > 0 and adv[1] < 0 and adv[3] < 0 and adv[2] == adv[4] == 0.0
    value, grad, clipped = 0.0, torch.zeros(n, 3, dtype=torch.float64), set()
    for i in range(n):
        ratio = math.exp(sum(lp[i][t] - bh[i][t] for t in range(3) if mask[i][t]))  # one ratio per sequence
        unclipped, clip = -adv[i] * ratio, -adv[i] * min(max(ratio, 1 - eps), 1 + eps)
        value += max(unclipped, clip) / n
        if clip > unclipped:
            clipped.add(i)
        for t in range(3):
            grad[i, t] = (-adv[i] * ratio / n if clip <= unclipped else 0.0) if mask[i][t] else 0.0
    assert clipped == {0, 3}  # row 1 is not clipped although two of its token ratios are outside 1 +- eps
    v, g = value_and_grad(rloo_loss, b)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)
    assert g[0].abs().max().item() == 0.0 and g[3].abs().max().item() == 0.0 and g[1, 0].item() != 0.0
    _, metrics = rloo_loss(batch(**EXR, beta=beta), CFG)
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)
    kls = [sum(bh[i][t] - rf[i][t] for t in range(3) if mask[i][t]) for i in range(n)]
    assert metrics["kl_penalty"] == pytest.approx(sum(kls) / n)


def test_rloo_kl_penalty_ignores_the_trained_policy():
    # the shaped reward uses logp_behav, so moving logp changes only the ratio, never the advantage
    b1, b2 = batch(**EXR, beta=0.2), batch(**EXR, beta=0.2)
    with torch.no_grad():
        b2["logp"] += 0.01
    r1, r2 = rloo_loss(b1, CFG)[1]["kl_penalty"], rloo_loss(b2, CFG)[1]["kl_penalty"]
    assert r1 == r2


# ---------------------------------------------------------------- online DPO

# prompt 0: rewards [0.2, 0.9, 0.1, 0.5] at rows 0, 2, 4, 6; prompt 1: tied rewards at rows 1, 3;
# prompt 2: rows 5 (0.0), 7 (1.0)
DPO_REWARD = [0.2, 1.0, 0.9, 1.0, 0.1, 0.0, 0.5, 1.0]
DPO_GROUP = [0, 1, 0, 1, 0, 2, 0, 2]


def dpo_batch():
    gen = torch.Generator().manual_seed(3)
    lp = (-torch.rand(8, 3, generator=gen) * 2).tolist()
    rf = (-torch.rand(8, 3, generator=gen) * 2).tolist()
    mask = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]]
    return batch(lp, mask, [[0.0] * 3] * 8, rf, reward=DPO_REWARD, group=DPO_GROUP, beta=0.05)


def dpo_by_hand(b, pairs, n):
    """pairs: (chosen, rejected, weight); value = sum_pairs weight * -log sigmoid(z) / n."""
    lp, mask, _, rf = lists(b)
    s = [sum(lp[i][t] - rf[i][t] for t in range(3) if mask[i][t]) for i in range(n)]
    db = CFG.dpo_beta
    value, grad = 0.0, torch.zeros(n, 3, dtype=torch.float64)
    for w, l, k in pairs:
        z = db * (s[w] - s[l])
        value += -math.log(1 / (1 + math.exp(-z))) * k / n
        dz = -(1 / (1 + math.exp(z))) * k / n  # d(-log sigmoid z)/dz = -sigmoid(-z)
        for t in range(3):
            grad[w, t] += dz * db * mask[w][t]
            grad[l, t] -= dz * db * mask[l][t]
    return value, grad


def test_online_dpo_best_worst_by_hand():
    # prompt 0: w = row 2 (0.9), l = row 4 (0.1), standing for its 4 responses; prompt 1: tied (skipped, counted);
    # prompt 2: w = row 7, l = row 5
    b = dpo_batch()
    value, grad = dpo_by_hand(b, [(2, 4, 4), (7, 5, 2)], 8)
    v, g = value_and_grad(online_dpo_loss, b)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)
    assert online_dpo_loss(b, CFG)[1] == {"tied_fraction": 1 / 3}
    assert sorted(set(torch.nonzero(g)[:, 0].tolist())) == [2, 4, 5, 7]


def test_online_dpo_adjacent_pairs_by_hand_and_mean_over_pairs():
    # prompt 0 in batch order rows 0, 2, 4, 6 -> pairs (0, 2): 0.2 vs 0.9 and (4, 6): 0.1 vs 0.5; prompt 1: (1, 3)
    # tied; prompt 2: (5, 7). 4 pairs for 8 responses: the loss is the mean over all 4 pairs, the tied one counting 0
    b = dpo_batch()
    cfg = dataclasses.replace(CFG, dpo_pairs="adjacent")
    value, grad = dpo_by_hand(b, [(2, 0, 2), (6, 4, 2), (7, 5, 2)], 8)
    lp, mask, _, rf = lists(b)
    s = [sum(lp[i][t] - rf[i][t] for t in range(3) if mask[i][t]) for i in range(8)]
    mean_over_pairs = sum(-math.log(1 / (1 + math.exp(-CFG.dpo_beta * (s[w] - s[l])))) for w, l in
                          [(2, 0), (6, 4), (7, 5)]) / 4
    assert value == pytest.approx(mean_over_pairs, rel=1e-12)
    v, g = value_and_grad(online_dpo_loss, b, cfg)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)
    assert online_dpo_loss(b, cfg)[1] == {"tied_fraction": 1 / 4}
    assert g[1].abs().max().item() == 0.0 and g[3].abs().max().item() == 0.0  # the tied pair


def test_online_dpo_no_pairs_returns_zero_with_graph():
    b = batch([[-1.0, -2.0], [-0.5, -0.1]], [[1, 1], [1, 0]], [[0, 0], [0, 0]], [[-1, -1], [-1, 0]],
              reward=[1.0, 1.0], group=[3, 3], beta=0.1)
    for rule in ("best_worst", "adjacent"):
        loss, metrics = online_dpo_loss(b, dataclasses.replace(CFG, dpo_pairs=rule))
        assert loss.item() == 0.0 and loss.requires_grad and metrics == {"tied_fraction": 1.0}
        loss.backward()
        assert b["logp"].grad.abs().max().item() == 0.0


# ---------------------------------------------------------------- M2PO

# advantages (GRPO, Bessel std): rows 0 and 3 A = +0.707, rows 1 and 2 A = -0.707. Delta = logp - behav:
#   row 0 (A > 0): [0.5, 0.1, -0.3]   trust region: Delta > 0 -> 0.25, 0.01
#   row 1 (A < 0): [-0.2, 0.4, pad]   trust region: Delta < 0 -> 0.04 (0.4^2 = 0.16 is outside it: never masked)
#   row 2 (A < 0): [-0.6, -0.05, 0.2] trust region: 0.36, 0.0025
#   row 3 (A > 0): [0.05, pad, pad]   trust region: 0.0025
EXM = dict(
    logp=[[-1.0, -1.2, -0.8], [-0.6, -0.9, 1.0], [-1.1, -0.4, -0.7], [-0.5, 1.0, 1.0]],
    mask=[[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]],
    behav=[[-1.5, -1.3, -0.5], [-0.4, -1.3, 0.0], [-0.5, -0.35, -0.9], [-0.55, 0.0, 0.0]],
    ref=[[-1.0] * 3] * 4,
    reward=[1.0, 0.0, 0.0, 1.0],
    group=[0, 0, 1, 1],
)


def m2po_mask_by_hand(delta, adv, mask, tau):
    """Algorithm 1 as a loop: while the mean M2 over the trust-region tokens left exceeds tau, mask the largest."""
    trust = {(i, t): delta[i][t] ** 2 for i in range(len(delta)) for t in range(len(delta[0]))
             if mask[i][t] and ((adv[i] > 0 and delta[i][t] > 0) or (adv[i] < 0 and delta[i][t] < 0))}
    masked = set()
    while trust and sum(trust.values()) / len(trust) > tau:
        j = max(trust, key=trust.get)
        masked.add(j)
        del trust[j]
    return masked


def m2po_by_hand(b, tau, batch_tokens=None, batch_samples=None):
    lp, mask, bh, _ = lists(b)
    n = len(lp)
    adv = grpo_advantages_by_hand(b["reward"].tolist(), b["group"].tolist(), 1e-6)
    delta = [[lp[i][t] - bh[i][t] for t in range(3)] for i in range(n)]
    masked = m2po_mask_by_hand(delta, adv, mask, tau)
    tokens = batch_tokens or sum(sum(m) for m in mask)
    scale = (batch_samples or n) / (tokens * n)
    value, grad = 0.0, torch.zeros(n, 3, dtype=torch.float64)
    for i in range(n):
        for t in range(3):
            if mask[i][t] and (i, t) not in masked:
                rho = math.exp(delta[i][t])
                value += -rho * adv[i] * scale
                grad[i, t] = -rho * adv[i] * scale
    return value, grad, masked


@pytest.mark.parametrize("tau, expected", [(0.04, {(0, 0), (2, 0)}), (0.1, {(2, 0)}), (0.2, set())])
def test_m2po_masking_by_hand(tau, expected):
    cfg = dataclasses.replace(CFG, m2po_tau=tau)
    b = batch(**EXM, beta=0.05)
    value, grad, masked = m2po_by_hand(b, tau)
    # tau 0.04: mean M2 over the 6 trust-region tokens 0.111 -> without 0.36: 0.061 -> without 0.25: 0.014 <= 0.04
    assert masked == expected
    v, g = value_and_grad(m2po_loss, b, cfg)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)
    for i, t in expected:
        assert g[i, t].item() == 0.0
    assert g[1, 1].item() != 0.0  # the largest M2 outside the trust region (0.16) is kept
    metrics = m2po_loss(batch(**EXM, beta=0.05), cfg)[1]
    assert metrics["masked_fraction"] == pytest.approx(len(expected) / 9)
    lp, mask, bh, _ = lists(b)
    rhos = [math.exp(lp[i][t] - bh[i][t]) for i in range(4) for t in range(3) if mask[i][t]]
    assert metrics["is_weight_mean"] == pytest.approx(sum(rhos) / 9)


def test_m2po_trust_region_is_per_micro_batch():
    # tau 0.09: the whole batch masks only row 2 t 0 (0.111 -> 0.061); prompt 0 alone has mean M2 0.1 > 0.09 over
    # its trust-region tokens and masks row 0 t 0 too. Each micro-batch follows Algorithm 1 on its own tokens.
    cfg = dataclasses.replace(CFG, m2po_tau=0.09)
    b = batch(**EXM, beta=0.05)
    assert m2po_by_hand(b, 0.09)[2] == {(2, 0)}
    total = 0.0
    for rows, masked in (([0, 1], {(0, 0)}), ([2, 3], {(0, 0)})):  # row indices inside the micro-batch
        part = {k: (x[rows].detach().clone() if torch.is_tensor(x) else x) for k, x in b.items()}
        part.update(batch_tokens=9, batch_samples=4)
        part["logp"].requires_grad_(True)
        value, grad, got = m2po_by_hand(part, 0.09, batch_tokens=9, batch_samples=4)
        assert got == masked
        v, g = value_and_grad(m2po_loss, part, cfg)
        assert v == pytest.approx(value, rel=1e-9) and torch.allclose(g, grad, atol=1e-12)
        total += v * 2 / 4
    assert total != pytest.approx(value_and_grad(m2po_loss, batch(**EXM, beta=0.05), cfg)[0], rel=1e-6)


# ---------------------------------------------------------------- TB on the shared interface


def test_tb_batch_loss_by_hand_and_equals_tb_loss_on_sequence_sums():
    beta = 0.25
    b = batch(**EX3, beta=beta)
    lp, mask, _, rf = lists(b)
    n = 5
    delta = [sum(lp[i][t] - rf[i][t] for t in range(3) if mask[i][t]) - EX3["reward"][i] / beta for i in range(n)]
    resid = centred_by_group(delta, EX3["group"])
    value = sum(x * x for x in resid) / n
    grad = torch.tensor([[2 * resid[i] / n if mask[i][t] else 0.0 for t in range(3)] for i in range(n)],
                        dtype=torch.float64)
    v, g = value_and_grad(tb_batch_loss, b)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)
    grp = EX3["group"]
    log_z = [-(sum(delta[j] for j in range(n) if grp[j] == grp[i]) / grp.count(grp[i])) for i in range(n)]
    assert tb_batch_loss(b, CFG)[1]["log_z"] == pytest.approx(sum(log_z) / n)
    # and it is literally tb_loss on the masked sequence sums
    seq = (b["logp"] * b["mask"]).sum(1)
    ref_seq = (b["logp_ref"] * b["mask"]).sum(1)
    direct = tb_loss(seq, ref_seq, b["reward"], beta, b["group"])
    assert v == pytest.approx(direct.item(), rel=1e-12)


# ---------------------------------------------------------------- properties of every loss (and every variant)

VARIANTS = [(name, {}) for name in sorted(LOSSES)] + [
    ("grpo", {"grpo_norm": "token_mean"}), ("grpo", {"grpo_norm": "constant"}),
    ("online_dpo", {"dpo_pairs": "adjacent"})]
IDS = [name + "".join(f"-{v}" for v in over.values()) for name, over in VARIANTS]


def test_variants_cover_every_loss_and_knob_value():
    assert {name for name, _ in VARIANTS} == set(LOSSES)
    assert {over.get("grpo_norm", "seq_mean") for name, over in VARIANTS if name == "grpo"} == {
        "seq_mean", "token_mean", "constant"}


def regroup(group, seed):
    """A permutation that interleaves the prompts differently but keeps each prompt's responses in their relative order
    (online_dpo's adjacent pairs follow that order by design)."""
    layout = group[torch.randperm(len(group), generator=torch.Generator().manual_seed(seed))]
    perm = torch.empty_like(group)
    for gid in torch.unique(group):
        perm[layout == gid] = (group == gid).nonzero(as_tuple=True)[0]
    return perm


@pytest.mark.parametrize("name, over", VARIANTS, ids=IDS)
def test_grouping_is_by_prompt_id_not_layout(name, over):
    fn, cfg = LOSSES[name], dataclasses.replace(CFG, **over)
    b = random_batch(11, beta=0.05)
    v, g = value_and_grad(fn, b, cfg)
    perm = regroup(b["group"], 5)
    assert not torch.equal(perm, torch.arange(len(perm)))
    bp = {k: (x[perm].detach().clone() if torch.is_tensor(x) else x) for k, x in b.items()}
    bp["logp"].requires_grad_(True)
    vp, gp = value_and_grad(fn, bp, cfg)
    assert vp == pytest.approx(v, rel=1e-9, abs=1e-12)
    assert torch.allclose(gp, g[perm], atol=1e-12)


@pytest.mark.parametrize("name, over", VARIANTS, ids=IDS)
def test_micro_batches_of_whole_prompts_sum_to_the_full_batch(name, over):
    # the trainer sums micro-batch losses weighted by N / batch_samples, and gives each micro-batch the batch's
    # batch_tokens and batch_samples: this must equal the loss on the whole batch. m2po's trust region is per
    # micro-batch by design (test_m2po_trust_region_is_per_micro_batch): here it does not bind
    fn = LOSSES[name]
    cfg = dataclasses.replace(CFG, **over, **({"m2po_tau": 100.0} if name == "m2po" else {}))
    b = random_batch(13, n_groups=4, beta=0.05)
    v, g = value_and_grad(fn, b, cfg)
    n_total, tokens = b["logp"].shape[0], int(b["mask"].sum())
    total, grad = 0.0, torch.zeros_like(g)
    for part in ([0, 2], [1, 3]):
        rows = torch.isin(b["group"], torch.tensor(part)).nonzero(as_tuple=True)[0]
        mb = {k: (x[rows].detach().clone() if torch.is_tensor(x) else x) for k, x in b.items()}
        mb.update(batch_tokens=tokens, batch_samples=n_total)
        assert int(mb["mask"].sum()) != tokens * len(rows) / n_total  # unequal tokens per sample: token_mean matters
        mb["logp"].requires_grad_(True)
        vm, gm = value_and_grad(fn, mb, cfg)
        total += vm * len(rows) / n_total
        grad[rows] += gm * len(rows) / n_total
    assert total == pytest.approx(v, rel=1e-9, abs=1e-12)
    assert torch.allclose(grad, g, atol=1e-12)


@pytest.mark.parametrize("name, over", VARIANTS, ids=IDS)
def test_padding_gets_no_gradient_and_no_weight(name, over):
    fn, cfg = LOSSES[name], dataclasses.replace(CFG, **over)
    b = random_batch(17, beta=0.05)
    v, g = value_and_grad(fn, b, cfg)
    assert math.isfinite(v)
    assert g[~b["mask"]].abs().max().item() == 0.0
    # other garbage in every padded position of logp, logp_behav and logp_ref: same value, same gradient
    b2 = {k: (x.detach().clone() if torch.is_tensor(x) else x) for k, x in b.items()}
    for key, junk in (("logp", 50.0), ("logp_behav", -70.0), ("logp_ref", 90.0)):
        b2[key] = torch.where(b["mask"], b2[key], torch.full_like(b2[key], junk))
    b2["logp"].requires_grad_(True)
    v2, g2 = value_and_grad(fn, b2, cfg)
    assert v2 == pytest.approx(v, rel=1e-12, abs=1e-12)
    assert torch.allclose(g2, g, atol=1e-12)


@pytest.mark.parametrize("name, keys", [
    ("grpo", {"clip_fraction"}), ("dr_grpo", {"clip_fraction"}), ("rloo", {"clip_fraction"}),
    ("prime_ratio", {"is_weight_mean"}), ("tba_prime", {"is_weight_mean"}),
    ("m2po", {"is_weight_mean", "masked_fraction"}), ("online_dpo", {"tied_fraction"}), ("tb", {"log_z"})])
def test_each_loss_logs_what_a_researcher_reads_first(name, keys):
    _, metrics = LOSSES[name](random_batch(19, beta=0.05), CFG)
    assert keys <= set(metrics)


def test_gsm8k_grpo_config_is_app_d1():
    c = load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                                 "gsm8k_grpo.yaml"))
    assert (c.loss, c.grpo_norm, c.asynchronous, c.steps, c.B * c.K, c.K) == ("grpo", "token_mean", False, 744, 640, 8)
    assert (c.beta_start, c.beta_end, c.beta_decay_steps, c.clip_eps) == (0.04, 0.04, 0, 0.2)
    assert 8 * (7473 // c.B) == c.steps  # 8 epochs over GSM8K's 7473 training prompts
    assert c.model == "realtreetune/rho-1b-sft-GSM8K"


def test_losses_registry_names():
    assert set(LOSSES) == {"tb", "grpo", "dr_grpo", "rloo", "online_dpo", "tba_prime", "prime_ratio", "m2po"}
