"""Baseline objectives in losses.py (GRPO, Dr. GRPO, RLOO, online DPO, TBA', TB on the shared interface).

Each loss is checked in value and gradient against a reference written here with plain Python floats (math.exp,
explicit loops, hand-derived gradients), never by calling the loss twice. Masked positions carry garbage
(logp = 1.0, as trl's INVALID_LOGPROB, or large values) and must get no gradient and no weight.
"""
import math

import pytest
import torch

from config import Config
from losses import (
    LOSSES,
    dr_grpo_loss,
    grpo_loss,
    online_dpo_loss,
    rloo_loss,
    tb_batch_loss,
    tb_loss,
    tba_prime_loss,
)

CFG = Config(clip_eps=0.2, is_cap=8.0, max_new_tokens=5, dpo_beta=0.1)


def batch(logp, mask, behav, ref, reward, group, beta):
    mask_t = torch.tensor(mask, dtype=torch.bool)
    return {
        "logp": torch.tensor(logp, dtype=torch.float64, requires_grad=True),
        "mask": mask_t,
        "logp_behav": torch.tensor(behav, dtype=torch.float64) * mask_t,
        "logp_ref": torch.tensor(ref, dtype=torch.float64) * mask_t,
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


def groups_of(b):
    out = {}
    for i, gid in enumerate(b["group"].tolist()):
        out.setdefault(gid, []).append(i)
    return out


# A shared 4-sample example with interleaved prompts (5, 9, 5, 9); sample 1 has one response token and garbage after.
EX = dict(
    logp=[[-0.5, -1.0], [-1.5, 1.0], [-0.3, -0.7], [-2.0, -0.2]],
    mask=[[1, 1], [1, 0], [1, 1], [1, 1]],
    behav=[[-1.0, -0.9], [-1.0, 0.0], [-0.4, -0.2], [-1.9, -0.5]],
    ref=[[-0.6, -1.2], [-1.0, 0.0], [-0.1, -0.9], [-2.2, -0.1]],
    reward=[1.0, 0.2, 0.0, 0.8],
    group=[5, 9, 5, 9],
)


# ---------------------------------------------------------------- GRPO


def grpo_advantages_by_hand(reward, group):
    adv = [0.0] * len(reward)
    for gid in set(group):
        idx = [i for i, g in enumerate(group) if g == gid]
        rs = [reward[i] for i in idx]
        m = sum(rs) / len(rs)
        std = math.sqrt(sum((x - m) ** 2 for x in rs) / (len(rs) - 1)) if len(rs) > 1 else 0.0
        for i in idx:
            adv[i] = (reward[i] - m) / (std + 1e-4)
    return adv


def test_grpo_value_and_gradient_by_hand():
    beta, eps = 0.3, CFG.clip_eps
    b = batch(**EX, beta=beta)
    lp, mask, bh, rf = lists(b)
    adv = grpo_advantages_by_hand(EX["reward"], EX["group"])
    # group 5: r = [1, 0] -> std (Bessel) = sqrt(0.5); group 9: r = [0.2, 0.8] -> std = sqrt(0.18)
    assert adv[0] == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-4))
    assert adv[1] == pytest.approx(-0.3 / (math.sqrt(0.18) + 1e-4))
    n = len(lp)
    value, grad = 0.0, torch.zeros(4, 2, dtype=torch.float64)
    clipped = set()
    for i in range(n):
        length = sum(mask[i])
        for t in range(2):
            if not mask[i][t]:
                continue
            ratio = math.exp(lp[i][t] - bh[i][t])
            unclipped, clip = ratio * adv[i], min(max(ratio, 1 - eps), 1 + eps) * adv[i]
            d = rf[i][t] - lp[i][t]
            k3 = math.exp(d) - d - 1
            value += (-min(unclipped, clip) + beta * k3) / length / n
            g_sur = -ratio * adv[i] if unclipped <= clip else 0.0
            if unclipped > clip:
                clipped.add((i, t))
            grad[i, t] = (g_sur + beta * (1 - math.exp(d))) / length / n
    # the example exercises both branches: A > 0 with ratio > 1 + eps and A < 0 with ratio < 1 - eps are clipped
    assert clipped == {(0, 0), (1, 0), (2, 1), (3, 1)}
    v, g = value_and_grad(grpo_loss, b)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)
    _, metrics = grpo_loss(batch(**EX, beta=beta), CFG)  # 4 of the 7 response tokens take the clipped term
    k3s = [math.exp(rf[i][t] - lp[i][t]) - (rf[i][t] - lp[i][t]) - 1 for i in range(n) for t in range(2) if mask[i][t]]
    assert metrics["clip_fraction"] == pytest.approx(4 / 7) and metrics["kl_k3"] == pytest.approx(sum(k3s) / 7)
    # without the KL term the clipped tokens get exactly no gradient, the others do
    b0 = batch(**EX, beta=0.0)
    _, g0 = value_and_grad(grpo_loss, b0)
    for i in range(4):
        for t in range(2):
            if (i, t) in clipped or not mask[i][t]:
                assert g0[i, t].item() == 0.0
            else:
                assert g0[i, t].item() != 0.0


def test_grpo_singleton_group_has_zero_advantage():
    b = batch(logp=[[-1.0]], mask=[[1]], behav=[[-1.2]], ref=[[-1.0]], reward=[1.0], group=[0], beta=0.0)
    v, g = value_and_grad(grpo_loss, b)
    assert v == 0.0 and g.abs().max().item() == 0.0


# ---------------------------------------------------------------- Dr. GRPO and TBA'

# one token (sample 0, t 0) has logp - behav = 2.5 (ratio 12.2 > cap 8); one (sample 3, t 1) has logp - ref = 12
EX3 = dict(
    logp=[[1.0, -1.0, -0.4], [-1.5, -0.8, 1.0], [-0.3, -0.7, -1.1], [-2.0, -0.5, 1.0], [-0.9, -1.3, -0.2]],
    mask=[[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]],
    behav=[[-1.5, -0.9, -0.5], [-1.0, -1.0, 0.0], [-0.4, -0.2, -1.0], [-1.9, -0.6, 0.0], [-1.0, -1.0, -0.3]],
    ref=[[-1.2, -1.1, -0.6], [-1.4, -0.6, 0.0], [-0.1, -0.9, -1.5], [-2.2, -12.5, 0.0], [-0.8, -1.6, -0.1]],
    reward=[1.0, 0.0, 0.0, 1.0, 1.0],
    group=[2, 4, 2, 4, 4],
)


def truncated_is_by_hand(lp, mask, bh, adv, cap, max_tokens):
    n = len(lp)
    value, grad = 0.0, torch.zeros(len(lp), len(lp[0]), dtype=torch.float64)
    for i in range(n):
        for t in range(len(lp[0])):
            if mask[i][t]:
                w = min(math.exp(lp[i][t] - bh[i][t]), cap)
                value += -w * adv[i] * lp[i][t] / max_tokens / n
                grad[i, t] = -w * adv[i] / max_tokens / n
    return value, grad


def centred_by_group(x, group):
    out = []
    for i, gid in enumerate(group):
        xs = [x[j] for j, g in enumerate(group) if g == gid]
        out.append(x[i] - sum(xs) / len(xs))
    return out


def test_dr_grpo_value_and_gradient_by_hand():
    b = batch(**EX3, beta=0.7)  # beta must not matter: Dr. GRPO has no KL term
    lp, mask, bh, _ = lists(b)
    adv = centred_by_group(EX3["reward"], EX3["group"])  # no std division
    assert adv == pytest.approx([0.5, -2 / 3, -0.5, 1 / 3, 1 / 3])
    value, grad = truncated_is_by_hand(lp, mask, bh, adv, CFG.is_cap, CFG.max_new_tokens)
    v, g = value_and_grad(dr_grpo_loss, b)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)
    # the truncated weight is a stop-gradient: the token above the cap still gets -cap * A / (T N)
    assert g[0, 0].item() == pytest.approx(-8.0 * 0.5 / 5 / 5)
    _, metrics = dr_grpo_loss(batch(**EX3, beta=0.7), CFG)  # 1 of the 13 response tokens has its ratio above 8
    weights = [min(math.exp(lp[i][t] - bh[i][t]), 8.0) for i in range(5) for t in range(3) if mask[i][t]]
    assert metrics["is_capped_fraction"] == pytest.approx(1 / 13)
    assert metrics["is_weight_mean"] == pytest.approx(sum(weights) / 13)
    # constant normaliser: the loss scales as 1 / max_tokens, not with the response length
    v10, _ = value_and_grad(dr_grpo_loss, batch(**EX3, beta=0.7), Config(is_cap=8.0, max_new_tokens=10))
    assert v10 == pytest.approx(value / 2, rel=1e-9)


def test_tba_prime_value_and_gradient_by_hand():
    beta = 0.5
    b = batch(**EX3, beta=beta)
    lp, mask, bh, rf = lists(b)
    kl = [sum(max(-10.0, min(10.0, lp[i][t] - rf[i][t])) for t in range(3) if mask[i][t]) for i in range(5)]
    # sample 3 token 1: logp - ref = 12 is clamped to 10
    assert kl[3] == pytest.approx((-2.0 + 2.2) + 10.0)
    r_c, kl_c = centred_by_group(EX3["reward"], EX3["group"]), centred_by_group(kl, EX3["group"])
    adv = [r_c[i] - beta * kl_c[i] for i in range(5)]
    value, grad = truncated_is_by_hand(lp, mask, bh, adv, CFG.is_cap, CFG.max_new_tokens)
    v, g = value_and_grad(tba_prime_loss, b)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)


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
        "logp_behav": (behav * mask).double(),
        "logp_ref": (ref * mask).double(),
        "reward": reward.double(),
        "group": group,
        "beta": beta,
    }


def test_tba_prime_with_beta_zero_is_dr_grpo():
    for seed in range(3):
        b = random_batch(seed, beta=0.0)
        v1, g1 = value_and_grad(tba_prime_loss, b)
        v2, g2 = value_and_grad(dr_grpo_loss, b)
        assert v1 == v2
        assert torch.equal(g1, g2)


def test_tba_prime_differs_from_dr_grpo_when_kl_varies_within_a_group():
    b = random_batch(7, beta=0.05, kl_spread=1.0)
    v1, g1 = value_and_grad(tba_prime_loss, b)
    v2, g2 = value_and_grad(dr_grpo_loss, b)
    assert abs(v1 - v2) > 1e-4
    assert (g1 - g2).abs().max().item() > 1e-4
    # a KL that is constant within each group cancels in the centred advantage
    b = random_batch(7, beta=0.05)
    b["mask"] = torch.ones_like(b["mask"])  # equal lengths
    b["logp_ref"] = b["logp"].detach() - 0.5  # KL_i = 0.5 * L for every sample
    v1, g1 = value_and_grad(tba_prime_loss, b)
    v2, g2 = value_and_grad(dr_grpo_loss, b)
    assert v1 == pytest.approx(v2, rel=1e-9)
    assert torch.allclose(g1, g2, atol=1e-12)


# ---------------------------------------------------------------- RLOO


def test_rloo_value_and_gradient_by_hand():
    beta = 0.2
    # prompt 4: rows 0, 1, 3; prompts 2 and 6 have one sample each (no leave-one-out baseline, A = 0)
    ex = dict(EX3, group=[4, 4, 2, 4, 6], reward=[1.0, 0.0, 0.3, 1.0, 0.5])
    b = batch(**ex, beta=beta)
    lp, mask, _, rf = lists(b)
    n = 5
    seq = [sum(lp[i][t] for t in range(3) if mask[i][t]) for i in range(n)]
    shaped = [ex["reward"][i] - beta * sum(lp[i][t] - rf[i][t] for t in range(3) if mask[i][t]) for i in range(n)]
    adv = []
    for i, gid in enumerate(ex["group"]):
        others = [shaped[j] for j, g in enumerate(ex["group"]) if g == gid and j != i]
        adv.append(shaped[i] - sum(others) / len(others) if others else 0.0)
    assert adv[2] == 0.0 and adv[4] == 0.0  # prompts 2 and 6 have one sample each here
    value = -sum(adv[i] * seq[i] for i in range(n)) / n
    grad = torch.tensor([[-adv[i] / n if mask[i][t] else 0.0 for t in range(3)] for i in range(n)], dtype=torch.float64)
    v, g = value_and_grad(rloo_loss, b)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)
    assert g[0].abs().max().item() > 0  # the three-sample prompt does get a gradient


# ---------------------------------------------------------------- online DPO


def test_online_dpo_picks_best_and_worst_per_group_by_hand():
    # prompt 0: rewards [0.2, 0.9, 0.1, 0.5] at rows 0, 2, 4, 6 -> w = row 2, l = row 4
    # prompt 1: tied rewards at rows 1, 3 -> no pair;  prompt 2: rows 5 (0.0), 7 (1.0) -> w = row 7, l = row 5
    gen = torch.Generator().manual_seed(3)
    lp = (-torch.rand(8, 3, generator=gen) * 2).tolist()
    rf = (-torch.rand(8, 3, generator=gen) * 2).tolist()
    mask = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]]
    b = batch(lp, mask, [[0.0] * 3] * 8, rf, reward=[0.2, 1.0, 0.9, 1.0, 0.1, 0.0, 0.5, 1.0],
              group=[0, 1, 0, 1, 0, 2, 0, 2], beta=0.05)
    lp, mask, _, rf = lists(b)
    s = [sum(lp[i][t] - rf[i][t] for t in range(3) if mask[i][t]) for i in range(8)]
    db = CFG.dpo_beta
    pairs = [(2, 4, 4), (7, 5, 2)]  # (winner, loser, group size)
    value, grad = 0.0, torch.zeros(8, 3, dtype=torch.float64)
    for w, l, k in pairs:
        z = db * (s[w] - s[l])
        value += -math.log(1 / (1 + math.exp(-z))) * k / 8
        dz = -(1 / (1 + math.exp(z))) * k / 8  # d(-log sigmoid z)/dz = -sigmoid(-z)
        for t in range(3):
            grad[w, t] = dz * db * mask[w][t]
            grad[l, t] = -dz * db * mask[l][t]
    v, g = value_and_grad(online_dpo_loss, b)
    assert v == pytest.approx(value, rel=1e-9)
    assert torch.allclose(g, grad, atol=1e-12)
    assert online_dpo_loss(b, CFG)[1] == {"pair_fraction": 2 / 3}  # prompt 1 is tied
    nonzero_rows = sorted(set(torch.nonzero(g)[:, 0].tolist()))
    assert nonzero_rows == [2, 4, 5, 7]


def test_online_dpo_no_pairs_returns_zero_with_graph():
    b = batch([[-1.0, -2.0], [-0.5, -0.1]], [[1, 1], [1, 0]], [[0, 0], [0, 0]], [[-1, -1], [-1, 0]],
              reward=[1.0, 1.0], group=[3, 3], beta=0.1)
    loss, metrics = online_dpo_loss(b, CFG)
    assert loss.item() == 0.0 and loss.requires_grad and metrics == {"pair_fraction": 0.0}
    loss.backward()
    assert b["logp"].grad.abs().max().item() == 0.0


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
    log_z = [-(sum(delta[j] for j in range(n) if EX3["group"][j] == EX3["group"][i]) / EX3["group"].count(EX3["group"][i]))
             for i in range(n)]
    assert tb_batch_loss(b, CFG)[1]["log_z"] == pytest.approx(sum(log_z) / n)
    # and it is literally tb_loss on the masked sequence sums
    seq = (b["logp"] * b["mask"]).sum(1)
    ref_seq = (b["logp_ref"] * b["mask"]).sum(1)
    direct = tb_loss(seq, ref_seq, b["reward"], beta, b["group"])
    assert v == pytest.approx(direct.item(), rel=1e-12)


# ---------------------------------------------------------------- properties of every loss


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_grouping_is_by_prompt_id_not_layout(name):
    fn = LOSSES[name]
    b = random_batch(11, beta=0.05)
    v, g = value_and_grad(fn, b)
    perm = torch.randperm(b["logp"].shape[0], generator=torch.Generator().manual_seed(5))
    bp = {k: (x[perm].detach().clone() if torch.is_tensor(x) else x) for k, x in b.items()}
    bp["logp"].requires_grad_(True)
    vp, gp = value_and_grad(fn, bp)
    assert vp == pytest.approx(v, rel=1e-9, abs=1e-12)
    assert torch.allclose(gp, g[perm], atol=1e-12)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_micro_batches_of_whole_prompts_sum_to_the_full_batch(name):
    # the trainer sums micro-batch losses weighted by N / n_total: this must equal the loss on the whole batch
    fn = LOSSES[name]
    b = random_batch(13, n_groups=4, beta=0.05)
    v, g = value_and_grad(fn, b)
    n_total = b["logp"].shape[0]
    total, grad = 0.0, torch.zeros_like(g)
    for part in ([0, 2], [1, 3]):
        rows = torch.isin(b["group"], torch.tensor(part)).nonzero(as_tuple=True)[0]
        mb = {k: (x[rows].detach().clone() if torch.is_tensor(x) else x) for k, x in b.items()}
        mb["logp"].requires_grad_(True)
        vm, gm = value_and_grad(fn, mb)
        total += vm * len(rows) / n_total
        grad[rows] += gm * len(rows) / n_total
    assert total == pytest.approx(v, rel=1e-9, abs=1e-12)
    assert torch.allclose(grad, g, atol=1e-12)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_padding_gets_no_gradient_and_no_weight(name):
    fn = LOSSES[name]
    b = random_batch(17, beta=0.05)
    v, g = value_and_grad(fn, b)
    assert math.isfinite(v)
    assert g[~b["mask"]].abs().max().item() == 0.0
    b2 = {k: (x.detach().clone() if torch.is_tensor(x) else x) for k, x in b.items()}
    b2["logp"] = torch.where(b["mask"], b2["logp"], torch.full_like(b2["logp"], 50.0)).requires_grad_(True)
    v2, g2 = value_and_grad(fn, b2)
    assert v2 == pytest.approx(v, rel=1e-12, abs=1e-12)
    assert torch.allclose(g2, g, atol=1e-12)


def test_losses_registry_names():
    assert set(LOSSES) == {"tb", "grpo", "dr_grpo", "rloo", "online_dpo", "tba_prime"}
