"""Rank 0: learn. Sample B prompts x K samples from the replay buffer, take one optimizer step on the TB loss, and every
k steps run a sync round: trajectories in from every searcher, current weights out to every searcher.
Synchronous mode (async=false) runs the same round every step with the train step inside it: gather the data the
searchers generated with the current weights, train on exactly that, push the new weights.
"""
import json
import math
import os
import shutil
import time

import torch
import yaml
from tqdm import tqdm

import comm as C
from buffer import ReplayBuffer
from config import config_to_dict
from losses import LOSSES, beta_at, lr_at, vargrad_log_z
from policy import encode_prompt, load_model, token_logprobs


class Logger:
    """metrics.jsonl (one object per trainer step) + tensorboard scalars under the same names."""

    def __init__(self, out_dir):
        from torch.utils.tensorboard import SummaryWriter
        self.tb = SummaryWriter(os.path.join(out_dir, "tb"))
        self.file = open(os.path.join(out_dir, "metrics.jsonl"), "w")

    def log(self, step, row):
        for k, v in row.items():
            if isinstance(v, (int, float)) and k != "step":
                self.tb.add_scalar(k, v, step)
        self.file.write(json.dumps({"step": step, **row}) + "\n")
        self.file.flush()

    def close(self):
        self.tb.close()
        self.file.close()


def padded(arrays, like):
    """Per-token numpy arrays -> one zero-padded tensor shaped like `like` (N, L)."""
    out = torch.zeros_like(like, dtype=torch.float32)
    for i, a in enumerate(arrays):
        out[i, : len(a)] = torch.from_numpy(a)
    return out


def save_checkpoint(model, tok, path):
    """HF format (save_pretrained), loadable by transformers and vLLM; written to a temp dir, then renamed."""
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def run(cfg, comm, ctx):
    out = cfg.out_dir
    os.makedirs(os.path.join(out, "checkpoints"), exist_ok=True)
    with open(os.path.join(out, "config.yaml"), "w") as f:
        yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
    torch.manual_seed(cfg.seed)
    tok, task, train = ctx.tok, ctx.task, ctx.train
    prompts = [encode_prompt(tok, r["prompt"]) for r in train]
    model = load_model(cfg.model, cfg.dtype, ctx.device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, cfg.adam_beta2), weight_decay=cfg.weight_decay)
    n_params = sum(p.numel() for p in model.parameters())
    weights = ctx.make_transport(comm, model)
    buffer = ReplayBuffer(cfg.per_prompt_cap, cfg.m if cfg.asynchronous else 1.0, cfg.inv_temp, seed=cfg.seed)
    log = Logger(out)
    totals = dict(train_s=0.0, sync_s=0.0, rounds=0)
    last_eval = {}
    row = {}  # metrics of the step being run

    def sync_round(step, flags, between=None):
        """One collective round; `between` runs after the gather and before the weight push (synchronous mode)."""
        t0 = time.perf_counter()
        comm.announce(step, flags)
        gathered = comm.gather_object(None)[1:]
        samples = [s for traj, _ in gathered for s in traj]
        new = buffer.add(samples)
        t_gather = time.perf_counter() - t0
        if between is not None:
            between()
        t1 = time.perf_counter()
        push_s = weights.push() if flags & C.WEIGHTS else 0.0
        if flags & C.WEIGHTS and cfg.check_sync:
            probes = comm.gather_object(None)[1:]
            mine = greedy_probe()
            row["sync/probe_match"] = sum(p == mine for p in probes) / len(probes)
            with open(os.path.join(out, "sync_probe.jsonl"), "a") as f:
                f.write(json.dumps({"step": step, "trainer": mine, "searchers": probes}) + "\n")
        if flags & C.EVAL:
            results = sorted(r for part in comm.gather_object(None)[1:] for r in part)
            acc = sum(ok for _, _, ok in results) / max(1, len(results))
            last_eval.update(accuracy=acc, step=step, n=len(results))
            row["eval/accuracy"] = acc
            with open(os.path.join(out, f"eval_step{step}.jsonl"), "w") as f:
                for i, text, ok in results:
                    f.write(json.dumps({"id": i, "correct": ok, "completion": text}) + "\n")
        sync_s = t_gather + time.perf_counter() - t1
        totals["sync_s"] += sync_s
        totals["rounds"] += 1
        tokens = sum(st["tokens"] for _, st in gathered)
        gen_s = sum(st["gen_s"] for _, st in gathered)
        row.update({"sync/seconds": sync_s, "sync/push_seconds": push_s, "sync/new_samples": new,
                    "search/tokens_per_s": tokens / gen_s if gen_s else 0.0,
                    "search/reward_errors": sum(st["reward_errors"] for _, st in gathered)})
        if samples:
            row["search/reward_mean"] = sum(s.reward for s in samples) / len(samples)
        return samples

    @torch.no_grad()
    def greedy_probe():
        """The trainer's greedy completion of the first training prompt (check_sync)."""
        ids = torch.tensor([prompts[0]], device=ctx.device)
        out_ids = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=C.PROBE_TOKENS, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)[0, ids.shape[1]:].tolist()
        return out_ids[: out_ids.index(tok.eos_token_id) + 1] if tok.eos_token_id in out_ids else out_ids

    def train_step(step):
        """One optimizer step on B x K samples; the loss is the mean over all of them."""
        t0 = time.perf_counter()
        beta = beta_at(step, cfg.beta_start, cfg.beta_end, cfg.beta_decay_steps, cfg.beta_cut_step)
        lr = lr_at(step, cfg.lr, cfg.lr_schedule, cfg.warmup_steps, cfg.stable_steps, cfg.decay_steps, cfg.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = buffer.sample(cfg.B, cfg.K)
        flat = [(gid, s) for gid, (_, picks, _) in enumerate(batch) for s in picks]
        per_mb = max(1, (cfg.micro_batch or cfg.K) // cfg.K) * cfg.K  # whole prompts per micro-batch
        opt.zero_grad(set_to_none=True)
        logs = dict(loss=0.0, log_z=0.0, logp=0.0, ref_logp=0.0, behav_logp=0.0)
        for s in range(0, len(flat), per_mb):
            part = [x for _, x in flat[s : s + per_mb]]
            lp, mask = token_logprobs(model, [prompts[x.prompt_id] for x in part], [x.response for x in part],
                                      cfg.temperature)
            b = dict(logp=lp.float(), mask=mask, behav=padded([x.logp_behav for x in part], lp),
                     ref=padded([x.logp_ref for x in part], lp), beta=beta, n_total=len(flat),
                     reward=torch.tensor([x.reward for x in part], device=lp.device),
                     group=torch.tensor([g for g, _ in flat[s : s + per_mb]], device=lp.device))
            loss = LOSSES[cfg.loss](b, cfg)
            w = len(part) / len(flat)
            (loss * w).backward()
            logp, ref = (b["logp"] * mask).sum(1).detach(), b["ref"].sum(1)
            logs["loss"] += loss.item() * w
            logs["log_z"] += vargrad_log_z(logp, ref, b["reward"], beta, b["group"]).mean().item() * w
            logs["logp"] += logp.mean().item() * w
            logs["ref_logp"] += ref.mean().item() * w
            logs["behav_logp"] += b["behav"].sum(1).mean().item() * w
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
        opt.step()
        if ctx.device == "cuda":
            torch.cuda.synchronize()
        train_s = time.perf_counter() - t0
        totals["train_s"] += train_s
        samples = [x for _, x in flat]
        tokens = sum(len(prompts[x.prompt_id]) + len(x.response) for x in samples)
        row["perf/train_tokens_per_s"] = tokens / train_s
        if cfg.peak_tflops:  # forward + backward ~ 6 FLOPs per parameter per token (+ the log-prob recompute ignored)
            row["perf/mfu"] = 6 * n_params * tokens / train_s / (cfg.peak_tflops * 1e12)
        if ctx.device == "cuda":
            row["perf/peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        stale = [step - 1 - x.version for x in samples]
        row.update({"train/loss": logs["loss"], "train/log_z": logs["log_z"], "train/beta": beta, "train/lr": lr,
                    "train/grad_norm": float(grad_norm), "train/reward_mean": sum(x.reward for x in samples) / len(samples),
                    "train/accuracy": sum(x.reward >= 1.0 for x in samples) / len(samples),
                    "train/logp": logs["logp"], "train/kl_seq": logs["logp"] - logs["ref_logp"],
                    "train/behav_minus_logp": logs["behav_logp"] - logs["logp"],
                    "train/response_len": sum(len(x.response) for x in samples) / len(samples),
                    "train/recent_fraction": sum(r for *_, r in batch) / len(batch),
                    "buffer/size": len(buffer), "buffer/prompts": len(buffer.items),
                    "staleness/mean": sum(stale) / len(stale), "staleness/max": max(stale),
                    "staleness/hist": [stale.count(i) for i in range(max(stale) + 1)],
                    "time/train_seconds": train_s})

    # ------------------------------------------------------------------ start: evaluate, fill the buffer
    t_start = time.perf_counter()
    sync_round(0, C.EVAL)
    eval_start = dict(last_eval)
    log.log(0, dict(row))
    while cfg.asynchronous and len(buffer) < cfg.initial_buffer:
        sync_round(0, 0)
    t_loop = time.perf_counter()
    totals["train_s"] = 0.0
    pbar = tqdm(range(1, cfg.steps + 1), disable=not cfg.progress, desc="train", dynamic_ncols=True)
    step = 0
    for step in pbar:
        row.clear()
        t_step = time.perf_counter()
        over_budget = cfg.time_budget_min and (time.perf_counter() - t_start) / 60 > cfg.time_budget_min
        last = step == cfg.steps or bool(over_budget)
        due_eval = last or (cfg.eval_every and step % cfg.eval_every == 0)
        flags = C.WEIGHTS | (C.EVAL if due_eval else 0) | (C.STOP if last else 0)
        if not cfg.asynchronous:
            sync_round(step, flags, between=lambda: train_step(step))
        else:
            train_step(step)
            if step % cfg.k == 0 or due_eval:
                sync_round(step, flags)
        step_s = time.perf_counter() - t_step
        row.update({"time/step_seconds": step_s, "time/wait_seconds": step_s - row["time/train_seconds"],
                    "time/elapsed_seconds": time.perf_counter() - t_start})
        log.log(step, dict(row))
        pbar.set_postfix(loss=f"{row['train/loss']:.3g}", reward=f"{row['train/reward_mean']:.2f}",
                         acc=f"{last_eval.get('accuracy', float('nan')):.3f}")
        if cfg.save_every and step % cfg.save_every == 0 and not last:
            save_checkpoint(model, tok, os.path.join(out, "checkpoints", f"step_{step}"))
        if last:
            break
    save_checkpoint(model, tok, os.path.join(out, "checkpoints", "final"))
    wall = time.perf_counter() - t_start
    loop = time.perf_counter() - t_loop
    summary = {"steps": step, "wall_seconds": wall, "loop_seconds": loop,
               "trainer_busy_fraction": totals["train_s"] / loop if loop else 0.0,
               "sync_rounds": totals["rounds"], "sync_seconds_total": totals["sync_s"],
               "eval_start": eval_start, "eval_end": dict(last_eval),
               "final": {k: v for k, v in row.items() if isinstance(v, (int, float))}}
    tmp = os.path.join(out, "summary.json.tmp")
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(tmp, os.path.join(out, "summary.json"))
    log.close()
    print(f"done: {step} steps in {wall:.0f}s; eval accuracy {eval_start.get('accuracy', float('nan')):.3f} -> "
          f"{last_eval.get('accuracy', float('nan')):.3f}; out_dir {out}", flush=True)
