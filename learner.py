"""The learner: what an ablation edits. One optimizer step on a batch of whole prompts drawn from the replay buffer
(micro-batches, the loss from losses.py, clipping, a skipped update on a non-finite loss or gradient), the greedy
probe, and the step's metrics row. Every trainer rank builds one (build); with n_trainers = T > 1 each runs the same
update on its B / T prompts of the batch, and trainer_group.py averages the gradients (FSDP2 / DDP).
"""
import math
import os
from typing import NamedTuple

import torch

import checkpoint
import sync
import trainer_group
from losses import NEEDS_LOGP, get_loss, masked, share_values
from policy import ModelError, decoder_layers, encode_prompt, load_model, token_batches, trim_at_eos
from trainer_group import Command


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


class Update(NamedTuple):
    """What one optimizer step did."""
    beta: float  # the scheduled KL coefficient
    lr: float  # the scheduled learning rate
    sums: dict  # the loss, its metrics and the mean sequence log-probs, averaged over the batch
    grad_norm: torch.Tensor  # before clipping
    finite: bool  # False: the loss or gradient was not finite and the update was skipped


def padded(arrays, like):
    """Per-token numpy arrays -> one zero-padded float32 tensor shaped like `like` (N, L), on its device."""
    out = torch.zeros_like(like, dtype=torch.float32)
    for i, a in enumerate(arrays):
        out[i, : len(a)] = torch.from_numpy(a)
    return out


class Learner:
    """The policy being trained and what trains it, on one trainer rank. `group` (trainer_group.Group) wraps the
    model for T > 1 and carries rank 0's commands to ranks 1..T-1; `prompts` are the training prompts' token ids."""

    def __init__(self, cfg, tok, prompts, model, group):
        self.cfg, self.tok, self.prompts, self.model, self.group = cfg, tok, prompts, model, group
        trained = [p for p in model.parameters() if p.requires_grad]  # lora_rank: the adapters only
        # after the group wrapped the model (fsdp); on CUDA the fused kernel (one launch for all tensors), not
        # measured here; on CPU the default (foreach) implementation
        self.opt = torch.optim.AdamW(trained, lr=cfg.lr, betas=(0.9, cfg.adam_beta2), weight_decay=cfg.weight_decay,
                                     fused=True if trained and trained[0].is_cuda else None)
        self.loss_fn = get_loss(cfg.loss)

    # ------------------------------------------------------------ one optimizer step
    def loss_input(self, items, beta):
        """The loss's input (losses.py documents the keys) for one micro-batch: `items`, its (group id, Sample)
        pairs."""
        samples = [s for _, s in items]
        logp, mask = self.group.logprobs([self.prompts[s.prompt_id] for s in samples], [s.response for s in samples],
                                         self.cfg.temperature)
        return dict(logp=logp.float(), mask=mask, logp_behav=padded([s.logp_behav for s in samples], logp),
                    logp_ref=padded([s.logp_ref for s in samples], logp), beta=beta,
                    reward=torch.tensor([s.reward for s in samples], device=logp.device),
                    group=torch.tensor([g for g, _ in items], device=logp.device))

    def micro_batches(self, share):
        """The micro-batches of `share`, as lists of its indices: micro_batch samples each, in order (0 = K: one
        prompt each); or with micro_tokens, the samples by length, packed while count x longest (prompt + response)
        stays within micro_tokens, so that a long-tail batch pads little and a micro-batch's memory is bounded."""
        cfg = self.cfg
        if cfg.micro_tokens:
            length = [len(self.prompts[s.prompt_id]) + len(s.response) for _, s in share]
            order = sorted(range(len(share)), key=length.__getitem__)
            packed = token_batches([length[i] for i in order], cfg.micro_tokens)
            return [[order[j] for j in index] for index in packed]
        per_mb = cfg.micro_batch or cfg.K
        return [list(range(start, min(start + per_mb, len(share)))) for start in range(0, len(share), per_mb)]

    def share_values(self, share, beta, micro_batches):
        """micro_batch not a multiple of K, or micro_tokens (a prompt's samples span micro-batches): the per-sample
        sequence values of this rank's whole share that the losses take group statistics over (losses.share_values),
        in share order; the policy's log-probs without gradient, one pass over the share's `micro_batches`, for the
        losses that need them (losses.NEEDS_LOGP)."""
        samples = [s for _, s in share]
        device = next(self.model.parameters()).device
        values = dict(reward=torch.tensor([s.reward for s in samples], device=device),
                     group=torch.tensor([g for g, _ in share], device=device),
                     logp_ref=torch.tensor([float(s.logp_ref.sum()) for s in samples], device=device),
                     logp_behav=torch.tensor([float(s.logp_behav.sum()) for s in samples], device=device))
        if self.cfg.loss in NEEDS_LOGP:  # each micro-batch's own values, as a whole-prompt micro-batch computes them
            with torch.no_grad():
                own = [share_values(self.loss_input([share[i] for i in index], beta))[0] for index in micro_batches]
            order = torch.tensor([i for index in micro_batches for i in index], device=device).argsort()
            values.update({k: torch.cat([mb[k] for mb in own])[order] for k in ("logp", "kl")})
        return values

    def optimizer_step(self, share, totals, step):
        """The optimizer step of trainer step `step` on `share`, this rank's whole prompts of the batch (all of it
        with T = 1). The loss is the mean over the share; FSDP / DDP average the gradients over the ranks' equal
        shares, so the update is the whole batch's mean (`totals` are the whole batch's counts, for the losses
        normalised by its tokens). A non-finite loss or gradient skips the update. Every trainer rank runs this."""
        cfg, opt = self.cfg, self.opt
        beta = beta_at(step, cfg.beta_start, cfg.beta_end, cfg.beta_decay_steps, cfg.beta_cut_step)
        lr = lr_at(step, cfg.lr, cfg.lr_schedule, cfg.warmup_steps, cfg.stable_steps, cfg.decay_steps, cfg.steps)
        for param_group in opt.param_groups:
            param_group["lr"] = lr
        micro_batches = self.micro_batches(share)
        # a micro-batch of whole prompts computes its group statistics itself; otherwise from the whole share first
        whole = cfg.micro_batch % cfg.K == 0 and not cfg.micro_tokens
        values = None if whole else self.share_values(share, beta, micro_batches)
        opt.zero_grad(set_to_none=True)
        sums = {}  # each micro-batch's values weighted by its fraction of the samples
        for index in micro_batches:
            mb = dict(self.loss_input([share[i] for i in index], beta), **totals)
            if values is not None:
                mb.update(share=values, index=torch.tensor(index, device=values["reward"].device))
            loss, metrics = self.loss_fn(mb, cfg)
            w = len(index) / len(share)
            (loss * w).backward()
            seq = {k: masked(mb[k].detach(), mb["mask"]).sum(1).mean().item()
                   for k in ("logp", "logp_ref", "logp_behav")}
            for k, v in {"loss": loss.item(), **metrics, **seq}.items():
                sums[k] = sums.get(k, 0.0) + v * w
        sums = self.group.average(sums)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.group.model.parameters(),
                                                   cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
        grad_norm = self.group.assemble(grad_norm)  # fsdp: the norm over every rank's shard
        finite = math.isfinite(sums["loss"]) and bool(torch.isfinite(grad_norm))
        if finite:
            opt.step()
        else:  # skipped; max_bad_steps in a row stop the run (failures.stop_reason)
            opt.zero_grad(set_to_none=True)
        return Update(beta, lr, sums, grad_norm, finite)

    def train(self, batch, step):
        """Rank 0: one optimizer step on `batch` (buffer draws, each one prompt's K samples), the ranks 1..T-1 each
        taking their share. Returns (the (group id, Sample) items trained on, the Update)."""
        items = [(gid, s) for gid, draw in enumerate(batch) for s in draw.samples]  # group id: the draw (Eq. 5)
        totals = dict(batch_tokens=sum(len(s.response) for _, s in items), batch_samples=len(items))
        with self.group.collectives():
            share = self.group.tell(Command.STEP, (totals, step), self.group.split(items))
            update = self.optimizer_step(share, totals, step)
        if next(self.model.parameters()).is_cuda:
            torch.cuda.synchronize()
        return items, update

    # ------------------------------------------------------------ the probe (check_sync)
    @torch.no_grad()
    def probe(self, weights=None):
        """The policy's greedy completion of the first training prompt (check_sync: every searcher's engine must give
        the same), with the model's weights or, for weight_delay, with `weights` ({name: tensor}) loaded for the
        probe only. Every trainer rank runs this (under fsdp they generate in lock-step)."""
        model = self.group.start_probe()
        current = {n: t.detach().clone() for n, t in model.state_dict().items()} if weights is not None else None
        if weights is not None:
            model.load_state_dict(weights, strict=False)
        ids = torch.tensor([self.prompts[0]], device=next(model.parameters()).device)
        model.eval()  # generation with its KV cache (grad_checkpointing turns the cache off in training mode)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=sync.PROBE_TOKENS, pad_token_id=self.tok.pad_token_id,
                             eos_token_id=self.tok.eos_token_id)
        model.train()
        if current is not None:
            model.load_state_dict(current, strict=False)
        return trim_at_eos(out[0, ids.shape[1]:].tolist(), self.tok.eos_token_id)

    # ------------------------------------------------------------ the step's metrics
    def metrics(self, batch, items, update, step, seconds):
        """The metrics row of trainer step `step`: the loss and its terms, the batch, staleness and speed."""
        samples = [s for _, s in items]
        n = len(samples)
        tokens = sum(len(self.prompts[s.prompt_id]) + len(s.response) for s in samples)
        # updates between the (oldest, for a sample that spans an in-flight weight update) sampling weights and these
        stale = [step - 1 - s.version_first for s in samples]
        sums = update.sums
        row = {f"train/{k}": v for k, v in sums.items() if k not in ("logp_ref", "logp_behav")}
        row.update({"train/skipped": int(not update.finite), "train/beta": update.beta, "train/lr": update.lr,
                    "train/grad_norm": float(update.grad_norm),
                    "train/reward_mean": sum(s.reward for s in samples) / n,
                    "train/accuracy": sum(s.reward >= 1.0 for s in samples) / n,
                    "train/kl_seq": sums["logp"] - sums["logp_ref"],
                    "train/logp_behav_minus_logp": sums["logp_behav"] - sums["logp"],
                    "train/response_len": sum(len(s.response) for s in samples) / n,
                    "train/recent_fraction": sum(d.recent for d in batch) / len(batch),
                    "train/distinct_prompts": len({d.prompt_id for d in batch}),
                    # distinct response token sequences among a group's K, mean over the groups (prompts) of the batch
                    "train/distinct_per_group": sum(len({s.response for s in d.samples}) for d in batch) / len(batch),
                    "staleness/mean": sum(stale) / n, "staleness/max": max(stale),
                    "staleness/hist": [stale.count(i) for i in range(max(stale) + 1)],
                    "staleness/mixed_fraction": sum(s.mixed for s in samples) / n,
                    "time/train_seconds": seconds, "perf/train_tokens_per_s": tokens / seconds,
                    "perf/train_threads": torch.get_num_threads()})
        if self.cfg.peak_tflops:  # forward + backward ~ 6 FLOPs per parameter per token (log-prob recompute ignored)
            n_params = sum(p.numel() for p in self.model.parameters())
            row["perf/mfu"] = 6 * n_params * tokens / seconds / (self.cfg.peak_tflops * 1e12)
        if next(self.model.parameters()).is_cuda:
            row["perf/peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        return row


def finite(model):
    """Whether every weight of `model` is finite (under fsdp: this rank's shards)."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    return bool(torch.stack([torch.isfinite(p).all() for p in local]).all())  # one device sync, not one per tensor


def checkpointing(model, cfg):
    """grad_checkpointing: every decoder layer recomputes its activations in the backward pass (Hugging Face's
    per-layer checkpointing, torch.utils.checkpoint with use_reentrant=False). Before the trainer group wraps the
    model, so that under FSDP2 the recompute gathers each layer's weights as its forward does."""
    if cfg.grad_checkpointing:
        if not model.supports_gradient_checkpointing:
            raise ValueError(f"grad_checkpointing: {type(model).__name__} does not support it")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def policy_model(cfg, resume, device):
    """The policy a trainer rank starts from: the checkpoint's weights on resume, else `model`; with lora_rank the
    frozen base model (`model`) with LoRA adapters (lora_model), on resume the checkpoint's."""
    if not cfg.lora_rank:
        return load_model(resume or cfg.model, cfg.dtype, device)
    return lora_model(load_model(cfg.model, cfg.dtype, device), cfg, resume)


def lora_model(base, cfg, resume=None):
    """LoRA (Hu et al. 2021, arXiv 2106.09685) through peft: the frozen `base` plus a low-rank update of each linear
    layer of its decoder blocks, W x + (alpha / r) B A x (attention and MLP, QLoRA's 'all-linear'; not the embeddings
    or the LM head; target_modules names them as adapter configs do, q_proj ... down_proj), A and B the only trained
    weights. B starts at zero, so step 0's policy is the base model; A is peft's Kaiming-uniform draw from cfg.seed.
    The adapters are float32 whatever the base's dtype (peft's autocast_adapter_dtype), and so are their gradients and
    AdamW states: in bfloat16 an AdamW step at a LoRA learning rate is below half an ulp of most of A, which would
    never move. On resume the checkpoint's adapters (its adapter/ folder). The searchers and the checkpoint's HF files
    get the merged weights (policy.merged_weights)."""
    from peft import LoraConfig, PeftModel, get_peft_model
    linear = {name.rsplit(".", 1)[-1] for block in decoder_layers(base)
              for name, m in block.named_modules() if isinstance(m, torch.nn.Linear)}
    if not linear:
        raise ModelError(f"lora_rank: {type(base).__name__} has no linear layers in decoder blocks")
    config = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha or cfg.lora_rank, target_modules=sorted(linear),
                        task_type="CAUSAL_LM")
    if resume:
        try:
            return PeftModel.from_pretrained(base, os.path.join(resume, checkpoint.ADAPTERS), config=config,
                                             is_trainable=True)
        except RuntimeError as e:  # load_state_dict: adapters of another shape
            raise ModelError(f"resume: {resume}/{checkpoint.ADAPTERS} does not fit lora_rank={cfg.lora_rank}: "
                             f"{str(e).splitlines()[-1].strip()}") from None
    with torch.random.fork_rng(devices=[]):  # A's draw depends on the seed alone
        torch.manual_seed(cfg.seed)
        return get_peft_model(base, config)


def build(cfg, ctx, store):
    """Every trainer rank's learner: the policy (from the checkpoint on resume), the trainer group around it, AdamW
    (with this rank's optimizer state on resume when T > 1; with T = 1 the trainer's checkpoint state has it)."""
    torch.manual_seed(cfg.seed)
    prompts = [encode_prompt(ctx.tok, r["prompt"]) for r in ctx.train]
    model = checkpointing(policy_model(cfg, ctx.resume, ctx.device).train(), cfg)
    group = trainer_group.Group(cfg, model, ctx.device, store)  # T > 1: FSDP2 / DDP over ranks 0..T-1
    learner = Learner(cfg, ctx.tok, prompts, model, group)
    group.load_optimizer(learner.opt, ctx.resume)
    return learner
