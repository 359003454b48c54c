"""Objectives and their schedules. One function per loss; the config key `loss` picks one by its name in LOSSES, or
names a file of your own (`loss=path/to/myloss.py`, a file that defines `loss(batch, cfg)`).

Every loss has the same signature, `fn(batch, cfg) -> (loss, metrics)`, on one micro-batch of whole prompts:
    batch["logp"]        (N, L) per-token log pi_theta(y_t | x, y_<t) of the policy being trained (with grad)
    batch["mask"]        (N, L) bool: True on response tokens; padding positions hold garbage and must get no weight
    batch["logp_behav"]  (N, L) per-token log-probs under the policy that sampled the response (the searcher's)
    batch["logp_ref"]    (N, L) per-token log-probs under the reference policy pi_ref
    batch["reward"]      (N,)   reward of each response
    batch["group"]       (N,)   prompt id of each response: group by this, never by the layout of the batch
    batch["beta"]        float  the KL coefficient at this step (beta_at below)
Log-probs use logits / temperature (paper section 3). `loss` is the MEAN over the N samples of a per-sample objective
(the trainer weights micro-batches by N / batch size, so the optimiser sees the mean over the whole batch however it
is split); `metrics` is a dict of floats, logged as train/<name> (averaged over micro-batches the same way).
Knobs are read as cfg.<key> (config.py declares each with its default, range and doc).
"""
import importlib.util
import math
import os

import torch


def group_mean(x, group_ids):
    """Mean of x over the samples that share a group id (a prompt), returned per sample."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    sums = torch.zeros(int(inverse.max()) + 1, dtype=x.dtype, device=x.device).index_add_(0, inverse, x)
    counts = torch.bincount(inverse).to(x.dtype)
    return (sums / counts)[inverse]


def group_count(group_ids):
    """Number of samples that share each sample's group id, returned per sample (float)."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return counts[inverse].float()


def masked(x, mask):
    """x with padding positions set to 0, before any exp/log, so padding values (e.g. trl's INVALID_LOGPROB = 1.0)
    cannot leak into a loss or its gradient."""
    return torch.where(mask, x, torch.zeros_like(x))


def vargrad_log_z(logp, logp_ref, reward, beta, group_ids):
    """log Z_i = sg(-mean_j delta_ij) over prompt i's samples (the VarGrad estimate of paper Eq. 5), per sample."""
    return -group_mean((logp - logp_ref - reward / beta).detach(), group_ids)


def tb_loss(logp, logp_ref, reward, beta, group_ids):
    """Trajectory Balance with the VarGrad log Z estimate (paper Eq. 5), on sequence log-probs:

    delta_ij = logp_ij - logp_ref_ij - r_ij / beta,   log Z_i = sg(-mean_j delta_ij)
    L = mean_ij (log Z_i + delta_ij)^2
    """
    delta = logp - logp_ref - reward / beta
    return ((vargrad_log_z(logp, logp_ref, reward, beta, group_ids) + delta) ** 2).mean()


# ---------------------------------------------------------------- the objectives, fn(batch, cfg) -> (loss, metrics)


def tb_batch_loss(batch, cfg):
    """Trajectory Balance (paper Eq. 5): tb_loss on the sequence sums of logp and logp_ref over response tokens.
    Needs no importance weight: TB is off-policy by construction (paper section 3.1)."""
    mask = batch["mask"]
    logp, logp_ref = masked(batch["logp"], mask).sum(1), masked(batch["logp_ref"], mask).sum(1)
    reward = batch["reward"].to(logp.dtype)
    log_z = vargrad_log_z(logp, logp_ref, reward, batch["beta"], batch["group"])
    return tb_loss(logp, logp_ref, reward, batch["beta"], batch["group"]), {"log_z": log_z.mean().item()}


def grpo_loss(batch, cfg):
    """GRPO (Shao et al. 2024, DeepSeekMath, Eq. 3 with the outcome-supervision advantage of section 4.1.2).

    A_i = (r_i - mean_g r) / (std_g r + 1e-4), std with Bessel's correction as in TRL (a one-sample group gets A = 0);
    rho_t = exp(logp_t - logp_behav_t);  l_t = -min(rho_t A, clip(rho_t, 1-eps, 1+eps) A) + beta * k3_t,
    k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1  (Eq. 4, Schulman's unbiased estimator);
    loss = mean_i [ (1/|y_i|) sum_t l_t ]   (per-sequence token mean, then mean over sequences).
    Metrics: clip_fraction (response tokens whose clipped term is the one taken), kl_k3 (mean k3 per token).
    """
    mask, logp, g = batch["mask"], batch["logp"], batch["group"]
    eps = cfg.clip_eps
    r = batch["reward"].to(logp.dtype)
    n = group_count(g).to(logp.dtype)
    centred = r - group_mean(r, g)
    var = group_mean(centred ** 2, g) * n / (n - 1).clamp(min=1)
    adv = (centred / (var.sqrt() + 1e-4)).unsqueeze(1)
    ratio = torch.exp(masked(logp - batch["logp_behav"], mask))
    unclipped, clipped = ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv
    surrogate = torch.minimum(unclipped, clipped)
    log_r = masked(batch["logp_ref"] - logp, mask)
    k3 = torch.exp(log_r) - log_r - 1
    per_token = masked(-surrogate + batch["beta"] * k3, mask)
    per_seq = per_token.sum(1) / mask.sum(1).clamp(min=1).to(logp.dtype)
    tokens = mask.sum().clamp(min=1)
    return per_seq.mean(), {"clip_fraction": ((clipped < unclipped) & mask).sum().item() / tokens.item(),
                            "kl_k3": masked(k3.detach(), mask).sum().item() / tokens.item()}


def _truncated_is_pg(batch, cfg, adv):
    """Shared token-level policy gradient of Dr. GRPO ("ratio" form) and TBA':
    l_t = -sg(min(rho_t, is_cap)) * A * logp_t, rho_t = exp(logp_t - logp_behav_t); loss = mean_i sum_t l_t / T with
    T = max_new_tokens (a constant). The truncated IS weight is a stop-gradient (CISPO), so grad = -min(rho, cap) A
    grad logp. Metrics: is_weight_mean (mean truncated weight per token), is_capped_fraction (tokens with rho > cap)."""
    mask, logp = batch["mask"], batch["logp"]
    rho = torch.exp(masked(logp - batch["logp_behav"], mask)).detach()
    w = rho.clamp(0.0, cfg.is_cap)
    per_token = masked(-w * adv.unsqueeze(1) * logp, mask)
    tokens = mask.sum().clamp(min=1).item()
    return (per_token.sum(1) / cfg.max_new_tokens).mean(), {
        "is_weight_mean": masked(w, mask).sum().item() / tokens,
        "is_capped_fraction": ((rho > cfg.is_cap) & mask).sum().item() / tokens}


def dr_grpo_loss(batch, cfg):
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like Training", Eq. 3 / Fig. 1): advantage
    A_i = r_i - mean_g r (no std division); per-token loss summed and divided by the CONSTANT max_new_tokens (no
    per-sequence length normalisation); no KL term (the paper drops it for rule-based rewards).

    Off-policy correction: PRIME-RL's "ratio" form, -sg(min(rho_t, is_cap)) A logp_t with rho = exp(logp -
    logp_behav), instead of PPO clipping, so that tba_prime_loss with beta = 0 is exactly this loss in value and
    gradient (prime-rl issue #1235: the only difference between TBA' and that Dr. GRPO is the centred KL term in A).
    """
    r = batch["reward"].to(batch["logp"].dtype)
    return _truncated_is_pg(batch, cfg, r - group_mean(r, batch["group"]))


def rloo_loss(batch, cfg):
    """RLOO (Ahmadian et al. 2024, "Back to Basics", Eq. 7): on-policy REINFORCE with a leave-one-out baseline.

    R_i = r_i - beta * sg(sum_t (logp_t - ref_t))   (KL-shaped sequence reward, Eq. 1);
    A_i = R_i - (1/(n_g - 1)) sum_{j != i in g} R_j  (= n_g/(n_g-1) (R_i - mean_g R); 0 for a one-sample group);
    loss = -mean_i A_i * sum_t logp_t. No importance ratio (standard on-policy estimator). Metric: kl_seq.
    """
    mask, logp, g = batch["mask"], batch["logp"], batch["group"]
    seq_logp = masked(logp, mask).sum(1)
    kl = masked(logp.detach() - batch["logp_ref"], mask).sum(1)
    shaped = batch["reward"].to(logp.dtype) - batch["beta"] * kl
    n = group_count(g).to(logp.dtype)
    adv = torch.where(n > 1, n / (n - 1).clamp(min=1) * (shaped - group_mean(shaped, g)), torch.zeros_like(shaped))
    return -(adv * seq_logp).mean(), {"kl_seq": kl.mean().item()}


def online_dpo_loss(batch, cfg):
    """Online DPO (Guo et al. 2024; Noukhovitch et al. 2024, "Asynchronous RLHF", section 3 / Eq. 2 with a
    best-vs-worst pair per prompt). In each group w = argmax r, l = argmin r (first in batch order on equal
    rewards); groups where max r == min r give no pair.
    z = dpo_beta * ((S_w - Ref_w) - (S_l - Ref_l)), S = sum_t logp, Ref = sum_t logp_ref;  loss_g = -log sigmoid(z).

    Scaling: each sample carries its group's pair loss (0 for a tied group), and the function returns the mean of
    that over the N samples, i.e. sum_g n_g loss_g / N: with K samples per prompt and no ties, the mean over the
    batch's pairs, independent of how prompts are split into micro-batches. Returns 0 * sum(logp) (graph kept) with
    no pairs. Metric: pair_fraction (prompts that gave a pair).
    """
    mask, logp = batch["mask"], batch["logp"]
    seq = masked(logp, mask).sum(1) - masked(batch["logp_ref"], mask).sum(1)
    r, g = batch["reward"], batch["group"]
    groups = torch.unique(g).tolist()
    terms = []
    for gid in groups:
        idx = (g == gid).nonzero(as_tuple=True)[0]
        rg = r[idx]
        hi, lo = int(torch.argmax(rg)), int(torch.argmin(rg))  # argmax/argmin return the first occurrence
        if not bool(rg[hi] > rg[lo]):
            continue
        z = cfg.dpo_beta * (seq[idx[hi]] - seq[idx[lo]])
        terms.append(-torch.nn.functional.logsigmoid(z) * len(idx))
    metrics = {"pair_fraction": len(terms) / len(groups)}
    if not terms:
        return 0.0 * masked(logp, mask).sum(), metrics
    return torch.stack(terms).sum() / logp.shape[0], metrics


def tba_prime_loss(batch, cfg):
    """TBA' (paper section 6 / App. C; bbartoldson/tba-prime `tba_loss`).

    KL_i = sg(sum_t clamp(logp_t - ref_t, -10, 10));  A_i = (r_i - mean_g r) - beta (KL_i - mean_g KL);
    l_t = -sg(min(exp(logp_t - logp_behav_t), is_cap)) * A_i * logp_t  (CISPO-style truncated IS, cap 8);
    loss = mean_i sum_t l_t / max_new_tokens (constant normaliser, Dr. GRPO style).
    With beta = 0 this is exactly dr_grpo_loss (prime-rl issue #1235).
    """
    mask, logp, g = batch["mask"], batch["logp"], batch["group"]
    r = batch["reward"].to(logp.dtype)
    kl = masked((logp.detach() - batch["logp_ref"]).clamp(-10.0, 10.0), mask).sum(1)
    adv = (r - group_mean(r, g)) - batch["beta"] * (kl - group_mean(kl, g))
    return _truncated_is_pg(batch, cfg, adv)


LOSSES = {
    "tb": tb_batch_loss,
    "grpo": grpo_loss,
    "dr_grpo": dr_grpo_loss,
    "rloo": rloo_loss,
    "online_dpo": online_dpo_loss,
    "tba_prime": tba_prime_loss,
}


def get_loss(name):
    """The loss called `name` in LOSSES, or the `loss` function of a file (loss=path/to/myloss.py)."""
    if not name.endswith(".py"):
        return LOSSES[name]
    spec = importlib.util.spec_from_file_location(os.path.basename(name)[:-3], name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.loss


# ---------------------------------------------------------------- schedules: pure functions of the 1-based step u


def beta_at(u, beta_start, beta_end, decay_steps, cut_step=0):
    """KL coefficient at update u (the reference code's `kl_anneal`, bbartoldson/TBA): linear from beta_start towards
    beta_end over D = decay_steps, and beta_end from cut_step on (cut_step 0 means D). GSM8K: 0.014 -> 0.004,
    D = 500; TL;DR: 1.0 -> 0.05, D = 128, cut at 32 (the paper's rule: jump to the final value at 1/8 of training)."""
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
