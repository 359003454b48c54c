"""Objectives and their schedules. One function per loss; the trainer picks one with the config key `loss`.

Notation (paper, section 3): for prompt x_i with K responses y_ij, logp = log pi_theta(y|x) and ref_logp =
log pi_ref(y|x) are summed over response tokens with logits / temperature; r is the reward, beta the KL coefficient.
"""
import math

import torch


def group_mean(x, group_ids):
    """Mean of x over the samples that share a group id (a prompt), returned per sample."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    sums = torch.zeros(int(inverse.max()) + 1, dtype=x.dtype, device=x.device).index_add_(0, inverse, x)
    counts = torch.bincount(inverse).to(x.dtype)
    return (sums / counts)[inverse]


def tb_loss(logp, ref_logp, reward, beta, group_ids):
    """Trajectory Balance with the VarGrad log Z estimate (paper Eq. 5).

    delta_ij = logp_ij - ref_logp_ij - r_ij / beta,   log Z_i = sg(-mean_j delta_ij)
    L = mean_ij (log Z_i + delta_ij)^2
    Grouping is by prompt id, never by the layout of the batch.
    """
    delta = logp - ref_logp - reward / beta
    log_z = -group_mean(delta.detach(), group_ids)
    return ((log_z + delta) ** 2).mean()


def vargrad_log_z(logp, ref_logp, reward, beta, group_ids):
    """The per-sample log Z estimate used inside tb_loss (for logging)."""
    return -group_mean((logp - ref_logp - reward / beta).detach(), group_ids)


# ---------------------------------------------------------------- schedules: pure functions of the 1-based step u


def beta_at(u, beta_start, beta_end, decay_steps, cut_step=0):
    """KL coefficient at update u (tba_spec.md 1.3): linear from beta_start towards beta_end over D = decay_steps,
    and beta_end from cut_step on (cut_step 0 means D). GSM8K: 0.014 -> 0.004, D = 500; TL;DR: 1.0 -> 0.05, D = 128,
    cut at 32."""
    if decay_steps <= 0:
        return beta_start
    stop = cut_step or decay_steps
    if u >= stop:
        return beta_end
    frac = (u - 1) / decay_steps
    return beta_start * (1 - frac) + beta_end * frac


def lr_at(u, lr, schedule, warmup, stable, decay, total_steps):
    """Learning rate at update u. wsd (paper, transformers' get_wsd_schedule): u/warmup during warmup, then constant
    for `stable` steps, then cosine to 0 over `decay` steps. linear: lr * (1 - (u-1)/total_steps). constant: lr."""
    if schedule == "constant":
        return lr
    if schedule == "linear":
        return lr * max(0.0, 1.0 - (u - 1) / total_steps)
    if u < warmup:
        return lr * u / warmup
    if u < warmup + stable or decay <= 0:
        return lr
    progress = min(1.0, (u - warmup - stable) / decay)
    return lr * 0.5 * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------- baseline objectives on one micro-batch
#
# Shared interface: fn(b, cfg) -> scalar. b holds per-token tensors of shape (N, L) for whole prompts:
#   logp (policy being trained, with grad), mask (bool, response tokens), behav (sampling policy), ref (reference),
#   plus reward (N,), group (N,) prompt ids, beta (float), n_total (int).
# Every function returns the MEAN over its N samples of a per-sample objective; the trainer multiplies by N / n_total
# and sums micro-batches, so the optimizer sees the mean over the whole batch regardless of how it was split.
# Groups are always formed from b["group"] (group_mean), never from the layout of the batch. Positions where mask is
# False are replaced by 0 before any exp/log so padding values (e.g. trl's INVALID_LOGPROB = 1.0) cannot leak in.


def _masked(x, mask):
    return torch.where(mask, x, torch.zeros_like(x))


def _group_count(group_ids):
    """Number of samples that share each sample's group id, returned per sample (float)."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return counts[inverse].float()


def _max_tokens(cfg):
    """Dr. GRPO's constant normaliser: cfg.max_tokens if set, else cfg.max_new_tokens (the response length cap)."""
    t = getattr(cfg, "max_tokens", None) or getattr(cfg, "max_new_tokens", None)
    if not t or t <= 0:
        raise ValueError("the Dr. GRPO / TBA' normaliser needs cfg.max_tokens or cfg.max_new_tokens > 0")
    return float(t)


def tb_batch_loss(b, cfg):
    """Trajectory Balance (paper Eq. 5) on the shared interface: tb_loss on the sequence sums
    sum_t logp and sum_t ref over response tokens. tb_loss already returns the mean over the N samples."""
    mask = b["mask"]
    seq_logp = _masked(b["logp"], mask).sum(1)
    seq_ref = _masked(b["ref"], mask).sum(1)
    return tb_loss(seq_logp, seq_ref, b["reward"].to(seq_logp.dtype), b["beta"], b["group"])


def grpo_loss(b, cfg):
    """GRPO (Shao et al. 2024, DeepSeekMath, Eq. 3 with the outcome-supervision advantage of section 4.1.2).

    A_i = (r_i - mean_g r) / (std_g r + 1e-4), std with Bessel's correction as in TRL (a one-sample group gets A = 0);
    rho_t = exp(logp_t - behav_t);  l_t = -min(rho_t A, clip(rho_t, 1-eps, 1+eps) A) + beta * k3_t,
    k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1  (Eq. 4, Schulman's unbiased estimator);
    loss = mean_i [ (1/|y_i|) sum_t l_t ]   (per-sequence token mean, then mean over sequences).
    """
    mask, logp = b["mask"], b["logp"]
    eps = getattr(cfg, "clip_eps", 0.2)
    r = b["reward"].to(logp.dtype)
    g = b["group"]
    n = _group_count(g).to(logp.dtype)
    centred = r - group_mean(r, g)
    var = group_mean(centred ** 2, g) * n / (n - 1).clamp(min=1)
    adv = (centred / (var.sqrt() + 1e-4)).unsqueeze(1)
    ratio = torch.exp(_masked(logp - b["behav"], mask))
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
    log_r = _masked(b["ref"] - logp, mask)
    k3 = torch.exp(log_r) - log_r - 1
    per_token = _masked(-surrogate + b["beta"] * k3, mask)
    per_seq = per_token.sum(1) / mask.sum(1).clamp(min=1).to(logp.dtype)
    return per_seq.mean()


def _truncated_is_pg(b, cfg, adv):
    """Shared token-level policy gradient of Dr. GRPO ("ratio" form) and TBA':
    l_t = -sg(min(rho_t, is_cap)) * A * logp_t, rho_t = exp(logp_t - behav_t); loss = mean_i sum_t l_t / max_tokens.
    The truncated IS weight is a stop-gradient (CISPO), so grad = -min(rho, cap) A grad logp, which equals the
    gradient of -min(rho, cap) A wherever rho < cap and stays non-zero above the cap."""
    mask, logp = b["mask"], b["logp"]
    cap = getattr(cfg, "is_cap", 8.0)
    w = torch.exp(_masked(logp - b["behav"], mask)).clamp(0.0, cap).detach()
    per_token = _masked(-w * adv.unsqueeze(1) * logp, mask)
    return (per_token.sum(1) / _max_tokens(cfg)).mean()


def dr_grpo_loss(b, cfg):
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like Training", Eq. 3 / Fig. 1): advantage
    A_i = r_i - mean_g r (no std division); per-token loss summed and divided by the CONSTANT max_tokens (no
    per-sequence length normalisation); no KL term (the paper drops it for rule-based rewards).

    Off-policy correction: PRIME-RL's "ratio" form, -sg(min(rho_t, is_cap)) A logp_t with rho = exp(logp - behav),
    instead of PPO clipping, so that tba_prime_loss with beta = 0 is exactly this loss in value and gradient
    (prime-rl issue #1235: the only difference between TBA' and that Dr. GRPO is the centred KL term in A).
    cfg.clip_eps is therefore unused here.
    """
    r = b["reward"].to(b["logp"].dtype)
    return _truncated_is_pg(b, cfg, r - group_mean(r, b["group"]))


def rloo_loss(b, cfg):
    """RLOO (Ahmadian et al. 2024, "Back to Basics", Eq. 7): on-policy REINFORCE with a leave-one-out baseline.

    R_i = r_i - beta * sg(sum_t (logp_t - ref_t))   (KL-shaped sequence reward, Eq. 1);
    A_i = R_i - (1/(n_g - 1)) sum_{j != i in g} R_j  (= n_g/(n_g-1) (R_i - mean_g R); 0 for a one-sample group);
    loss = -mean_i A_i * sum_t logp_t. No importance ratio (standard on-policy estimator).
    """
    mask, logp = b["mask"], b["logp"]
    g = b["group"]
    seq_logp = _masked(logp, mask).sum(1)
    kl = _masked(logp.detach() - b["ref"], mask).sum(1)
    shaped = b["reward"].to(logp.dtype) - b["beta"] * kl
    n = _group_count(g).to(logp.dtype)
    adv = torch.where(n > 1, n / (n - 1).clamp(min=1) * (shaped - group_mean(shaped, g)), torch.zeros_like(shaped))
    return -(adv * seq_logp).mean()


def online_dpo_loss(b, cfg):
    """Online DPO (Guo et al. 2024; Noukhovitch et al. 2024, "Asynchronous RLHF", section 3 / Eq. 2 with a
    best-vs-worst pair per prompt). In each group w = argmax r, l = argmin r (first in batch order on equal
    rewards); groups where max r == min r give no pair.
    z = dpo_beta * ((S_w - Ref_w) - (S_l - Ref_l)), S = sum_t logp, Ref = sum_t ref;  loss_g = -log sigmoid(z).

    Scaling: each sample carries its group's pair loss (0 for a tied group), and the function returns the mean of
    that over the N samples, i.e. sum_g n_g loss_g / N. Summed by the trainer with weights N / n_total this is
    sum_g n_g loss_g / n_total: with K samples per prompt and no ties, exactly the mean over the batch's pairs,
    independent of how prompts are split into micro-batches. Returns 0 * sum(logp) (graph kept) with no pairs.
    """
    mask, logp = b["mask"], b["logp"]
    beta_dpo = getattr(cfg, "dpo_beta", 0.1)
    seq = _masked(logp, mask).sum(1) - _masked(b["ref"], mask).sum(1)
    r, g = b["reward"], b["group"]
    n_samples = logp.shape[0]
    terms = []
    for gid in torch.unique(g).tolist():
        idx = (g == gid).nonzero(as_tuple=True)[0]
        rg = r[idx]
        hi, lo = int(torch.argmax(rg)), int(torch.argmin(rg))  # argmax/argmin return the first occurrence
        if not bool(rg[hi] > rg[lo]):
            continue
        z = beta_dpo * (seq[idx[hi]] - seq[idx[lo]])
        terms.append(-torch.nn.functional.logsigmoid(z) * len(idx))
    if not terms:
        return 0.0 * _masked(logp, mask).sum()
    return torch.stack(terms).sum() / n_samples


def tba_prime_loss(b, cfg):
    """TBA' (paper section 6 / App. C; bbartoldson/tba-prime `tba_loss`; tba_spec.md section 6).

    KL_i = sg(sum_t clamp(logp_t - ref_t, -10, 10));  A_i = (r_i - mean_g r) - beta (KL_i - mean_g KL);
    l_t = -sg(min(exp(logp_t - behav_t), is_cap)) * A_i * logp_t  (CISPO-style truncated IS, cap 8);
    loss = mean_i sum_t l_t / max_tokens (constant normaliser, Dr. GRPO style).
    With beta = 0 this is exactly dr_grpo_loss (prime-rl issue #1235).
    """
    mask, logp = b["mask"], b["logp"]
    g = b["group"]
    r = b["reward"].to(logp.dtype)
    kl = _masked((logp.detach() - b["ref"]).clamp(-10.0, 10.0), mask).sum(1)
    adv = (r - group_mean(r, g)) - b["beta"] * (kl - group_mean(kl, g))
    return _truncated_is_pg(b, cfg, adv)


LOSSES = {
    "tb": tb_batch_loss,
    "grpo": grpo_loss,
    "dr_grpo": dr_grpo_loss,
    "rloo": rloo_loss,
    "online_dpo": online_dpo_loss,
    "tba_prime": tba_prime_loss,
}
