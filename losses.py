"""Objectives and the KL coefficient's schedule. One function per loss; the config key `loss` picks one by its name in
LOSSES, or names a file of your own (`loss=path/to/myloss.py`, a file that defines `loss(batch, cfg)`).

Every loss has the same signature, `fn(batch, cfg) -> (loss, metrics)`, on one micro-batch of whole prompts:
    batch["logp"]          (N, L) per-token log pi_theta(y_t | x, y_<t) of the policy being trained (with grad)
    batch["mask"]          (N, L) bool: True on response tokens; padding positions of logp, logp_behav and logp_ref
                           hold garbage and must get no weight
    batch["logp_behav"]    (N, L) per-token log-probs under the policy that sampled the response (the searcher's)
    batch["logp_ref"]      (N, L) per-token log-probs under the reference policy pi_ref
    batch["reward"]        (N,)   reward of each response
    batch["group"]         (N,)   prompt id of each response: group by this, never by the layout of the batch
    batch["beta"]          float  the KL coefficient at this step (learner.beta_at)
    batch["batch_tokens"]  int    response tokens in the whole optimizer batch, all micro-batches together
                                  (Learner.train); absent: this micro-batch's own count
    batch["batch_samples"] int    samples in the whole optimizer batch; absent: N
    batch["share"], batch["index"]  only with micro_batch not a multiple of K, where a prompt's samples span several
                           micro-batches: per-sample values of this rank's whole share of the batch (dict: reward,
                           group, logp_ref, logp_behav, sequence sums; logp and kl, without gradient, for the losses in
                           NEEDS_LOGP) and this micro-batch's indices in it. share_values() hands a built-in loss its
                           group statistics from there; a loss of your own gets whole prompts (config refuses the rest)
Log-probs use logits / temperature (paper section 3). `loss` is the MEAN over the N samples of a per-sample objective
(the trainer weights micro-batches by N / batch_samples, so the optimiser sees the mean over the whole batch however
it is split). A loss normalised by the batch's token count (grpo_norm=token_mean, m2po) returns
sum over its tokens / batch_tokens * batch_samples / N: weighted that way, the micro-batches sum to exactly the
batch's token mean. `metrics` is a dict of floats, logged as train/<name> (averaged over micro-batches the same way).
Knobs are read as cfg.<key> (config.py declares each with its default, range and doc).

Each docstring cites the equation or the file and line it follows. Sources, by the short names used below:
    TRL17   huggingface/trl v0.17.0, trl/trainer/grpo_trainer.py (the TBA paper's App. D.1 GRPO ran TRL 0.17.0)
    TRL094  huggingface/trl v0.9.4, trl/trainer/rloo_trainer.py (the asynchronous-RLHF RLOO, Noukhovitch et al.)
    ODPO17  huggingface/trl v0.17.0, trl/trainer/online_dpo_trainer.py
    ARLHF   mnoukhov/async_rlhf @028aa87, src/online_dpo_single_vllm_trainer.py (Noukhovitch et al. 2024's code)
    PRIME   PrimeIntellect-ai/prime-rl @bbb760a7, src/prime_rl/trainer/loss.py
    TBAP    bbartoldson/tba-prime @115573d, src/zeroband/training/loss.py (the paper's TBA' code, a PRIME-RL fork)
    M2PO    Zheng et al. 2025, arXiv 2510.01161 ("Prosperity before Collapse": Algorithm 1, the M2 and J_M2PO
            equations) and the authors' code, Infini-AI-Lab/M2PO @af54a3e, verl/trainer/ppo/core_algos.py
"""
import importlib.util
import os

import torch
import torch.nn.functional as F


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


def seq_sum(x, mask):
    """Sum of x over each response's tokens, per sample (padding set to 0 first)."""
    return masked(x, mask).sum(1)


SPLITS = ("tb", "grpo", "dr_grpo", "rloo", "tba_prime", "prime_ratio", "online_dpo")  # exact below K too
NEEDS_LOGP = ("tb", "tba_prime", "online_dpo")  # their statistics need the policy's log-probs: a no-grad pass first


def share_values(batch):
    """(values, index): the per-sample sequence values a loss takes group statistics over, and this micro-batch's
    indices in them. With whole prompts (the default) the micro-batch itself; with micro-batches below K, the trainer's
    values over its whole share (batch["share"]), so each group statistic is the whole prompt's. Statistics of the
    rewards and the searchers' log-probs need no forward; log Z (tb) and the centred KL (tba_prime) take the policy's
    log-probs WITHOUT gradient in either case (the default path detaches them too), so the gradient is the same
    however the batch is split: e.g. for VarGrad, d/dtheta sum_j (delta_j - mean delta)^2 = 2 sum_j (delta_j - mean
    delta) d delta_j, since sum_j (delta_j - mean delta) = 0 kills the mean's own gradient. online_dpo splits a pair
    through its gradient coefficients (_dpo_split); m2po does not split (its trust region is per micro-batch)."""
    if "share" in batch:
        return batch["share"], batch["index"]
    mask = batch["mask"]
    logp = batch["logp"].detach()
    return dict(reward=batch["reward"], group=batch["group"], logp=seq_sum(logp, mask),
                logp_ref=seq_sum(batch["logp_ref"], mask), logp_behav=seq_sum(batch["logp_behav"], mask),
                kl=seq_sum((logp - batch["logp_ref"]).clamp(-10.0, 10.0), mask)), slice(None)


def grpo_advantage(r, group_ids, eps):
    """(r_i - mean_g r) / (std_g r + eps) with Bessel's correction in std (torch.std, as TRL17 lines 1082-1089 and
    verl); 0 for a one-sample group (its centred reward is 0)."""
    n = group_count(group_ids).to(r.dtype)
    centred = r - group_mean(r, group_ids)
    std = (group_mean(centred ** 2, group_ids) * n / (n - 1).clamp(min=1)).sqrt()
    return centred / (std + eps)


def ppo_clip(ratio, adv, eps):
    """PPO's pessimistic surrogate as a loss, -min(ratio A, clip(ratio, 1 - eps, 1 + eps) A), and where the clipped
    term is the one taken (strictly smaller): there the loss is constant in the ratio, so its gradient is 0
    (ratio > 1 + eps with A > 0, ratio < 1 - eps with A < 0)."""
    unclipped, clipped = ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def normalise(per_token, mask, how, batch, cfg):
    """The micro-batch's loss from per-token losses (already 0 on padding), by `how`:
    seq_mean:   mean_i (1/|y_i|) sum_t l_it     (DeepSeekMath Eq. 3; TRL17 line 1220, loss_type="grpo")
    constant:   mean_i (1/T) sum_t l_it, T = cfg.max_new_tokens   (Dr. GRPO; TRL17 line 1224, loss_type="dr_grpo")
    token_mean: sum_it l_it / batch_tokens * batch_samples / N   (TRL17 line 1222, loss_type="bnpo"; weighted by
                N / batch_samples the micro-batches sum to the whole batch's sum over tokens / its token count)."""
    n = per_token.shape[0]
    if how == "seq_mean":
        return (per_token.sum(1) / mask.sum(1).clamp(min=1).to(per_token.dtype)).mean()
    if how == "constant":
        return (per_token.sum(1) / cfg.max_new_tokens).mean()
    if how == "token_mean":
        tokens = max(int(batch.get("batch_tokens", int(mask.sum()))), 1)
        return per_token.sum() * batch.get("batch_samples", n) / (tokens * n)
    raise ValueError(f"unknown normaliser {how!r}")


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
    """Trajectory Balance (paper Eq. 5): tb_loss on the sequence sums of logp and logp_ref over response tokens, its
    log Z over the prompt's samples however the batch is split (share_values). Needs no importance weight: TB is
    off-policy by construction (paper section 3.1)."""
    mask, beta = batch["mask"], batch["beta"]
    logp, logp_ref = seq_sum(batch["logp"], mask), seq_sum(batch["logp_ref"], mask)
    reward = batch["reward"].to(logp.dtype)
    share, index = share_values(batch)  # log Z over the prompt's samples (all of them, wherever they are)
    log_z = vargrad_log_z(share["logp"], share["logp_ref"], share["reward"].to(logp.dtype), beta, share["group"])
    log_z = log_z[index]
    return ((log_z + logp - logp_ref - reward / beta) ** 2).mean(), {"log_z": log_z.mean().item()}


def grpo_loss(batch, cfg):
    """GRPO (Shao et al. 2024, DeepSeekMath Eq. 3 with the outcome-supervision advantage of section 4.1.2), as TRL17
    computes it (lines 1189-1242):

    A_i = (r_i - mean_g r) / (std_g r + 1e-4)    (lines 1081-1089; grpo_advantage)
    rho_t = exp(logp_t - logp_behav_t)           (line 1211; against the behaviour policy, the searcher's)
    l_t = -min(rho_t A_i, clip(rho_t, 1 - eps, 1 + eps) A_i) + beta k3_t    (lines 1212-1217, eps = clip_eps)
    k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1   (DeepSeekMath Eq. 4; lines 1202-1204)
    loss = normalise(l, cfg.grpo_norm): seq_mean (DeepSeekMath; TRL loss_type="grpo"), token_mean (TRL 0.17's default
    "bnpo", here over the whole optimizer batch; TRL takes it over each device's local batch), constant (Dr. GRPO).
    beta is the scheduled one (TRL's default, a constant 0.04: configs/gsm8k_grpo.yaml). A token with
    rho > 1 + eps and A > 0 (or rho < 1 - eps and A < 0) takes the clipped, constant term: it gets only the KL gradient.
    Metrics: clip_fraction (response tokens that take the clipped term; TRL17 lines 1236-1242), kl_k3 (mean k3).
    """
    mask, logp = batch["mask"], batch["logp"]
    share, index = share_values(batch)
    adv = grpo_advantage(share["reward"].to(logp.dtype), share["group"], 1e-4)[index].unsqueeze(1)
    surrogate, clipped = ppo_clip(torch.exp(masked(logp - batch["logp_behav"], mask)), adv, cfg.clip_eps)
    log_r = masked(batch["logp_ref"] - logp, mask)
    k3 = torch.exp(log_r) - log_r - 1
    loss = normalise(masked(surrogate + batch["beta"] * k3, mask), mask, cfg.grpo_norm, batch, cfg)
    tokens = mask.sum().clamp(min=1).item()
    return loss, {"clip_fraction": (clipped & mask).sum().item() / tokens,
                  "kl_k3": masked(k3.detach(), mask).sum().item() / tokens}


def dr_grpo_loss(batch, cfg):
    """Dr. GRPO (Liu et al. 2025, arXiv 2503.20783, section 3.2 and Fig. 1: GRPO without the 1/|o_i| length and the
    std normalisation), as TRL17 runs it with loss_type="dr_grpo", scale_rewards=False, beta=0:

    A_i = r_i - mean_g r                         (TRL17 line 1087, no std division)
    l_t = -min(rho_t A_i, clip(rho_t, 1 - eps, 1 + eps) A_i),  rho_t = exp(logp_t - logp_behav_t)  (lines 1211-1215)
    loss = mean_i sum_t l_t / max_new_tokens     (line 1224: sum / (N * max_completion_length))
    No KL term (Liu et al. drop it; batch["beta"] is not used). A token with rho > 1 + eps and A > 0 gets no gradient.
    Metric: clip_fraction. The TBA paper's Fig. 6 "Dr. GRPO" is a different loss, PRIME-RL's: prime_ratio_loss.
    """
    mask, logp = batch["mask"], batch["logp"]
    share, index = share_values(batch)
    r = share["reward"].to(logp.dtype)
    adv = (r - group_mean(r, share["group"]))[index].unsqueeze(1)
    surrogate, clipped = ppo_clip(torch.exp(masked(logp - batch["logp_behav"], mask)), adv, cfg.clip_eps)
    loss = normalise(masked(surrogate, mask), mask, "constant", batch, cfg)
    return loss, {"clip_fraction": (clipped & mask).sum().item() / mask.sum().clamp(min=1).item()}


def _prime_ratio(batch, cfg, adv):
    """PRIME-RL's "ratio" loss (PRIME lines 102-108, grpo_loss_ratio; the same in TBAP lines 217-219):
    l_t = -clamp(rho_t, 0, is_cap) A_i, rho_t = exp(logp_t - logp_behav_t), with NO stop-gradient: the gradient is
    -rho_t A_i d logp_t below the cap and 0 above it (clamp passes no gradient there);
    loss = mean_i sum_t l_t / max_new_tokens (TBAP lines 224 and 385-386: sum over tokens / a constant).
    Metrics: is_weight_mean (mean clamped ratio per token), is_capped_fraction (tokens with rho > is_cap)."""
    mask, logp = batch["mask"], batch["logp"]
    rho = torch.exp(masked(logp - batch["logp_behav"], mask))
    weight = rho.clamp(0.0, cfg.is_cap)
    loss = normalise(masked(-weight * adv.unsqueeze(1), mask), mask, "constant", batch, cfg)
    tokens = mask.sum().clamp(min=1).item()
    return loss, {"is_weight_mean": masked(weight.detach(), mask).sum().item() / tokens,
                  "is_capped_fraction": ((rho.detach() > cfg.is_cap) & mask).sum().item() / tokens}


def prime_ratio_loss(batch, cfg):
    """The TBA paper's Fig. 6 "Dr. GRPO" (section 6): PRIME-RL's ratio loss with the Dr. GRPO advantage
    A_i = r_i - mean_g r (no std division; PrimeIntellect-ai/prime-rl issue #1235). Formula: _prime_ratio."""
    share, index = share_values(batch)
    r = share["reward"].to(batch["logp"].dtype)
    return _prime_ratio(batch, cfg, (r - group_mean(r, share["group"]))[index])


def tba_prime_loss(batch, cfg):
    """TBA' (paper section 6 / App. C; prime-rl issue #1235: PRIME-RL's ratio loss with a centred KL in the advantage).

    KL_i = sg(sum_t clamp(logp_t - ref_t, -10, 10));  A_i = (r_i - mean_g r) - beta (KL_i - mean_g KL)
    then _prime_ratio: l_t = -clamp(exp(logp_t - logp_behav_t), 0, is_cap) A_i,
    loss = mean_i sum_t l_t / max_new_tokens.
    With beta = 0 this is exactly prime_ratio_loss, in value and gradient.
    """
    share, index = share_values(batch)
    groups, r, kl = share["group"], share["reward"].to(batch["logp"].dtype), share["kl"].to(batch["logp"].dtype)
    adv = (r - group_mean(r, groups)) - batch["beta"] * (kl - group_mean(kl, groups))
    return _prime_ratio(batch, cfg, adv[index])


def rloo_loss(batch, cfg):
    """Proximal RLOO, the asynchronous-RLHF RLOO baseline (Noukhovitch et al. 2024), as TRL094 computes it (the
    asynchronous-RLHF code, mnoukhov/async_rlhf @5598529 src/rloo_trainer_vllm.py lines 361-417, is the same):

    R_i = r_i - beta sum_t (logp_behav_t - ref_t)   (TRL094 lines 315-317: the KL penalty uses the log-probs of the
          policy that sampled, lines 254-257; computed without gradient)
    A_i = R_i - mean_{j != i, same prompt} R_j      (lines 320-323, leave-one-out; 0 for a one-sample prompt)
    rho_i = exp(sum_t logp_t - sum_t logp_behav_t)  (lines 351-355: ONE ratio per sequence, not per token)
    l_i = max(-A_i rho_i, -A_i clip(rho_i, 1 - eps, 1 + eps)),  loss = mean_i l_i   (lines 356-359, eps = clip_eps)
    A sequence with rho > 1 + eps and A > 0 (or rho < 1 - eps and A < 0) gets no gradient.
    Metrics: clip_fraction (sequences that take the clipped term, line 365), kl_penalty (mean sum_t logp_behav - ref).
    """
    mask, logp = batch["mask"], batch["logp"]
    behav = seq_sum(batch["logp_behav"], mask)
    kl = behav - seq_sum(batch["logp_ref"], mask)
    share, index = share_values(batch)  # the leave-one-out baseline over the prompt's samples, wherever they are
    groups = share["group"]
    shaped = share["reward"].to(logp.dtype) - batch["beta"] * (share["logp_behav"] - share["logp_ref"]).to(logp.dtype)
    n = group_count(groups).to(logp.dtype)
    adv = torch.where(n > 1, n / (n - 1).clamp(min=1) * (shaped - group_mean(shaped, groups)),
                      torch.zeros_like(shaped))[index]
    loss, clipped = ppo_clip(torch.exp(seq_sum(logp, mask) - behav), adv, cfg.clip_eps)
    return loss.mean(), {"clip_fraction": clipped.float().mean().item(), "kl_penalty": kl.mean().item()}


def dpo_pairs(reward, group_ids, rule):
    """The pairs of online_dpo_loss: (a, b, weight) row indices of two responses to one prompt, a first in batch order,
    and the number of responses the pair stands for (best_worst: the prompt's n_g; adjacent: 2)."""
    pairs = []
    for gid in torch.unique(group_ids).tolist():
        members = (group_ids == gid).nonzero(as_tuple=True)[0].tolist()  # the prompt's responses in batch order
        rs = [float(reward[i]) for i in members]
        if rule == "best_worst" and len(members) > 1:
            hi, lo = rs.index(max(rs)), rs.index(min(rs))  # the first one on equal rewards; hi == lo if all tie
            pairs.append((members[min(hi, lo)], members[max(hi, lo)], len(members)))
        elif rule == "adjacent":
            pairs += [(members[j], members[j + 1], 2) for j in range(0, len(members) - 1, 2)]
    return pairs


def online_dpo_loss(batch, cfg):
    """Online DPO (Guo et al. 2024) as the asynchronous-RLHF baselines ran it (Noukhovitch et al. 2024). Pairs by
    cfg.dpo_pairs (dpo_pairs above):
      best_worst: per prompt, the highest- against the lowest-reward response (ARLHF lines 492-504: torch.max and
        torch.min over the prompt's rloo_k responses; its configs/onlinedpovllm_rho1b_gsm8k.yml, rloo_k 4, is the GSM8K
        run the TBA paper's Fig. 1 takes its DPO point from). With 2 responses per prompt it is TRL's one pair.
      adjacent: the prompt's responses paired in batch order (1st, 2nd), (3rd, 4th), ..., an odd last one unpaired:
        ODPO17 lines 600-607 pair the 2 completions of each prompt this way.
    The higher reward is chosen. z = dpo_beta ((S_w - Ref_w) - (S_l - Ref_l)), S = sum_t logp, Ref = sum_t logp_ref;
    l = -log sigmoid(z) (ODPO17 lines 624-630; ARLHF lines 615-620).
    A pair with equal rewards is tied and skipped (loss 0, no gradient), as ARLHF's fully tied prompt (max == min picks
    one response as both chosen and rejected: no gradient, value log 2); ODPO17 (line 603, >=) would train a tied pair
    with the first response chosen.
    Scale: the mean over ALL the batch's pairs, a tied one counting 0, as both sources average (losses.mean() over
    every pair: ODPO17 line 636, ARLHF line 629). Written per sample: each response carries the loss of its pair
    (best_worst: all n_g responses of the prompt) and the function returns the mean over its N samples, which the
    trainer's weights turn into sum over pairs of l * weight / batch_samples exactly, however the batch is split; that
    is the mean over pairs when every prompt has K responses (K even for adjacent), as in the trainer's batches.
    Returns 0 * sum(logp) (graph kept) when no pair is untied. Metric: tied_fraction (tied pairs / pairs).
    """
    mask, logp, r = batch["mask"], batch["logp"], batch["reward"]
    log_ratio = seq_sum(logp, mask) - seq_sum(batch["logp_ref"], mask)  # S - Ref per response
    if "share" in batch:  # micro_batch below K: a pair's two responses may sit in different micro-batches
        return _dpo_split(batch, cfg, log_ratio)
    pairs = dpo_pairs(r, batch["group"], cfg.dpo_pairs)
    terms, tied = [], 0
    for a, b, weight in pairs:
        if not bool(r[a] != r[b]):
            tied += 1
            continue
        chosen, rejected = (a, b) if bool(r[a] > r[b]) else (b, a)
        terms.append(-F.logsigmoid(cfg.dpo_beta * (log_ratio[chosen] - log_ratio[rejected])) * weight)
    metrics = {"tied_fraction": tied / len(pairs) if pairs else 0.0}
    if not terms:
        return 0.0 * masked(logp, mask).sum(), metrics
    return torch.stack(terms).sum() / logp.shape[0], metrics


def _dpo_split(batch, cfg, log_ratio):
    """online_dpo_loss on part of the share: the pairs and their z come from the whole share's log-probs, taken
    without gradient (batch["share"]); each response in this micro-batch carries its pair's gradient through
    g (x - sg x), g = dl/dx at those values (-dpo_beta sigmoid(-z) weight for the chosen, + for the rejected), and
    each pair's value is counted once, in the micro-batch of its chosen response. Weighted by N / batch_samples the
    micro-batches sum to the whole batch's loss and gradient."""
    share, index = batch["share"], batch["index"]
    # a response's position in the share -> its position in this micro-batch
    local, n = {int(i): j for j, i in enumerate(index.tolist())}, log_ratio.shape[0]
    x = (share["logp"] - share["logp_ref"]).to(log_ratio.dtype)
    pairs = dpo_pairs(share["reward"], share["group"], cfg.dpo_pairs)
    total, tied = 0.0 * log_ratio.sum(), 0
    for a, b, weight in pairs:
        ra, rb = share["reward"][a], share["reward"][b]
        if not bool(ra != rb):
            tied += 1
            continue
        chosen, rejected = (a, b) if bool(ra > rb) else (b, a)
        z = cfg.dpo_beta * (x[chosen] - x[rejected])
        g = cfg.dpo_beta * torch.sigmoid(-z) * weight
        for i, sign in ((chosen, -1.0), (rejected, 1.0)):
            if i in local:
                total = total + sign * g * (log_ratio[local[i]] - log_ratio[local[i]].detach())
        if chosen in local:
            total = total - F.logsigmoid(z) * weight
    return total / n, {"tied_fraction": tied / len(pairs) if pairs else 0.0}


def m2po_keep(delta, adv, mask, tau):
    """M2PO Algorithm 1 on one call's tokens: the trust-region tokens T are those where PPO's clip would act, A > 0 with
    rho > 1 or A < 0 with rho < 1 (the authors' code, core_algos.py lines 726-755); M2_i = delta_i^2,
    delta = logp - logp_behav; while mean_{i in T} M2_i > tau, the token of T with the largest M2_i is masked and
    leaves T (ties: the first in row-major order). Returns a bool (N, L), False on the masked tokens only."""
    trust = mask & (((adv > 0) & (delta > 0)) | ((adv < 0) & (delta < 0)))
    m2 = (delta ** 2)[trust]
    order = torch.sort(m2, descending=True, stable=True).indices
    left = m2[order].flip(0).cumsum(0).flip(0) / torch.arange(len(m2), 0, -1, dtype=m2.dtype, device=m2.device)
    below = (left <= tau).nonzero(as_tuple=True)[0]  # left[k]: mean of T after masking its k largest
    k = int(below[0]) if len(below) else len(m2)
    dropped = torch.zeros_like(m2, dtype=torch.bool)
    dropped[order[:k]] = True
    keep = torch.ones_like(mask)
    keep[trust] = ~dropped
    return keep


def m2po_loss(batch, cfg):
    """M2PO, second-moment trust policy optimization (M2PO: Zheng et al. 2025, the J_M2PO equation and Algorithm 1):

    A_i = (r_i - mean_g r) / (std_g r + 1e-6)   (the GRPO advantage of the authors' verl, core_algos.py line 161; 0
          for a one-sample prompt, where verl's lines 152-153 would give r_i)
    M = m2po_keep(logp - logp_behav, A, tau = m2po_tau)   (Algorithm 1; tau = 0.04 in all the paper's runs)
    l_t = -M_t rho_t A_i, rho_t = exp(logp_t - logp_behav_t), no epsilon clip and no KL term;
    loss = sum over the batch's tokens of l_t / batch_tokens (J_M2PO's 1 / sum_i |o_i|: masked tokens still count).
    The trust region is per CALL, over this micro-batch's tokens (the authors' verl also applies it per micro-batch,
    dp_actor.py lines 361-408): the trainer's default micro_batch = K makes it per prompt; micro_batch = B x K gives
    the whole batch's, as Algorithm 1 states it. Sources that differ, not followed: the authors' code (core_algos.py
    lines 758-867) finds one bound c with mean_T min(delta^2, c^2) = tau and PPO-clips rho at exp(+-c), which masks
    the tokens of T with |delta| > c (the gradient of masking) under a capped rather than a removed mean; AReaL
    (inclusionAI/AReaL @4aef98d areal/trainer/ppo/actor.py lines 769-848) takes T = all response tokens and keeps a
    PPO clip.
    Metrics: masked_fraction (response tokens masked), is_weight_mean (mean rho per token), m2 (mean delta^2 over the
    response tokens, the paper's M2 before masking).
    """
    mask, logp = batch["mask"], batch["logp"]
    adv = grpo_advantage(batch["reward"].to(logp.dtype), batch["group"], 1e-6).unsqueeze(1)
    delta = masked(logp - batch["logp_behav"], mask)
    keep = m2po_keep(delta.detach(), adv, mask, cfg.m2po_tau)
    rho = torch.exp(delta)
    loss = normalise(masked(-rho * adv, mask & keep), mask, "token_mean", batch, cfg)
    tokens = mask.sum().clamp(min=1).item()
    return loss, {"masked_fraction": (mask & ~keep).sum().item() / tokens,
                  "is_weight_mean": masked(rho.detach(), mask).sum().item() / tokens,
                  "m2": (delta.detach() ** 2).sum().item() / tokens}


LOSSES = {
    "tb": tb_batch_loss,
    "grpo": grpo_loss,
    "dr_grpo": dr_grpo_loss,
    "rloo": rloo_loss,
    "online_dpo": online_dpo_loss,
    "tba_prime": tba_prime_loss,
    "prime_ratio": prime_ratio_loss,
    "m2po": m2po_loss,
}


def get_loss(name):
    """The loss called `name` in LOSSES, or the `loss` function of a file (loss=path/to/myloss.py)."""
    if not name.endswith(".py"):
        return LOSSES[name]
    spec = importlib.util.spec_from_file_location(os.path.basename(name)[:-3], name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.loss
