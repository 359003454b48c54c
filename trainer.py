"""Rank 0: learn. Sample B prompts x K samples from the replay buffer, take one optimizer step on the TB loss, and every
k steps run a sync round: trajectories in from every searcher, current weights out to every searcher.
Synchronous mode (async=false) runs the same round every step with the train step inside it: gather the data the
searchers generated with the current weights, train on exactly that, push the new weights.

Failures: a non-finite loss or gradient skips the update; a dead or stuck searcher, SIGTERM, or max_bad_steps skips in
a row end the run with one line and a resumable checkpoint (checkpoint.py; resume=auto continues from it).
"""
import json
import math
import os
import signal
import sys
import time

import torch
import yaml
from tqdm import tqdm

import checkpoint
import comm as C
from buffer import ReplayBuffer
from config import config_to_dict
from losses import LOSSES, beta_at, lr_at, vargrad_log_z
from policy import encode_prompt, load_model, token_logprobs


class Logger:
    """metrics.jsonl (one object per trainer step) + tensorboard scalars under the same names. Resuming from step N
    keeps the rows and events up to N and appends after them."""

    def __init__(self, out_dir, resume_step=0):
        from torch.utils.tensorboard import SummaryWriter
        path = os.path.join(out_dir, "metrics.jsonl")
        if resume_step and os.path.isfile(path):  # drop rows logged after the checkpoint (they will be redone)
            with open(path) as f:
                keep = [line for line in f if line.strip() and json.loads(line)["step"] <= resume_step]
            with open(path + ".tmp", "w") as f:
                f.writelines(keep)
            os.replace(path + ".tmp", path)
        self.tb = SummaryWriter(os.path.join(out_dir, "tb"), purge_step=resume_step + 1 if resume_step else None)
        self.file = open(path, "a" if resume_step else "w")

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


class Stop(Exception):
    """Ends the run early: a signal, a failed collective or too many skipped updates. Carries the exit code."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def run(cfg, comm, ctx):
    out, ckpt_dir = cfg.out_dir, os.path.join(cfg.out_dir, "checkpoints")
    os.makedirs(ckpt_dir, exist_ok=True)
    with open(os.path.join(out, "config.yaml"), "w") as f:
        yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
    torch.manual_seed(cfg.seed)
    tok, train = ctx.tok, ctx.train
    prompts = [encode_prompt(tok, r["prompt"]) for r in train]
    model = load_model(ctx.resume or cfg.model, cfg.dtype, ctx.device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, cfg.adam_beta2), weight_decay=cfg.weight_decay)
    n_params = sum(p.numel() for p in model.parameters())
    weights = ctx.make_transport(comm, model)
    buffer = ReplayBuffer(cfg.per_prompt_cap, cfg.m if cfg.asynchronous else 1.0, cfg.inv_temp, seed=cfg.seed)
    totals = dict(train_s=0.0, sync_s=0.0, eval_s=0.0, rounds=0, skipped=0, bad_in_a_row=0, elapsed=0.0, loop=0.0,
                  loop_cpu=0.0)
    last_eval, eval_start = {}, {}
    searchers = {}  # rank -> its place in its prompt shard at the last sync round (for checkpoints)
    ref = dict(version=0, state=None)  # TBA': step of the last reference reset, and those weights (for checkpoints)
    start = 0
    if ctx.resume:
        state = checkpoint.load(ctx.resume, "trainer_state.pth")
        start = state["step"]
        opt.load_state_dict(state["optimizer"])
        buffer.load_state_dict(state["buffer"])
        torch.set_rng_state(state["torch_rng"])
        totals.update(state["totals"])
        for key in ("eval_s", "loop_cpu"):  # checkpoints written before these were counted
            totals.setdefault(key, 0.0)
        last_eval.update(state["last_eval"])
        eval_start.update(state["eval_start"])
        searchers.update(checkpoint.load(ctx.resume, "searchers.pth"))
        ref.update(version=state["ref_version"], state=checkpoint.load(ctx.resume, "ref.pth"))
        print(f"resumed from {ctx.resume} (step {start}, buffer {len(buffer)} samples)", flush=True)
    log = Logger(out, start)
    row = {}  # metrics of the step being run
    stop = {}  # set by SIGTERM / SIGINT: finish the step, save, exit

    def on_signal(signum, frame):
        stop["signal"] = signal.Signals(signum).name
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    def save(step, name=None):
        """A resumable checkpoint of the state after `step` (searchers' places as of the last sync round)."""
        state = dict(step=step, optimizer=opt.state_dict(), buffer=buffer.state_dict(), torch_rng=torch.get_rng_state(),
                     totals=dict(totals, elapsed=time.perf_counter() - t_start, loop=time.perf_counter() - t_loop,
                                 loop_cpu=time.process_time() - c_loop),
                     last_eval=last_eval, eval_start=eval_start, ref_version=ref["version"])
        path = os.path.join(ckpt_dir, name or f"step_{step}")
        checkpoint.save(path, model, tok, state, searchers, ref["state"])
        checkpoint.prune(ckpt_dir, cfg.keep_checkpoints)
        return path

    def announce(step, flags):
        """Tell the searchers a sync round for `step` is coming: each joins it after its current generation chunk.
        Returns the flags as sent."""
        if flags & C.WEIGHTS and cfg.ref_reset_every and step - ref["version"] >= cfg.ref_reset_every:
            flags |= C.REF  # TBA': the searchers' pi_ref becomes the weights pushed in this round
        comm.announce(step, flags)
        return flags

    def sync_round(step, flags, between=None, announced=False):
        """One collective round (announced now unless `announced`, then `flags` must be what announce() returned);
        `between` runs after the gather and before the weight push (synchronous mode)."""
        t0 = time.perf_counter()
        try:
            flags = flags if announced else announce(step, flags)
            gathered = comm.gather_object(None)[1:]
        except RuntimeError as e:  # gloo/NCCL: a searcher died, or the collective hit timeout_s
            raise interrupted(step, e) from None
        searchers.update({r + 1: place for r, (_, _, place) in enumerate(gathered)})
        samples = [s for traj, _, _ in gathered for s in traj]
        new = buffer.add(samples)
        t_gather = time.perf_counter() - t0
        if between is not None:
            between()
        t1 = time.perf_counter()
        if flags & C.REF:  # keep the reference the searchers are about to adopt (for checkpoints)
            ref.update(version=step, state={n: t.detach().to("cpu", copy=True) for n, t in model.state_dict().items()})
        try:
            push_s = weights.push() if flags & C.WEIGHTS else 0.0
            probes = comm.gather_object(None)[1:] if flags & C.WEIGHTS and cfg.check_sync else None
            t_eval = time.perf_counter()
            evals = comm.gather_object(None)[1:] if flags & C.EVAL else None
            if evals is not None:  # the trainer waits while the searchers evaluate
                totals["eval_s"] += time.perf_counter() - t_eval
        except RuntimeError as e:
            raise interrupted(step, e) from None
        if probes is not None:
            mine = greedy_probe()
            row["sync/probe_match"] = sum(p == mine for p in probes) / len(probes)
            with open(os.path.join(out, "sync_probe.jsonl"), "a") as f:
                f.write(json.dumps({"step": step, "trainer": mine, "searchers": probes}) + "\n")
        if evals is not None:  # each searcher sends (rows, {metric: [sum, count]}) for its share (eval.evaluate)
            results = sorted((r for rows, _ in evals for r in rows), key=lambda r: r["id"])
            sums = {}
            for _, part in evals:
                for name, (s, n) in part.items():
                    t = sums.setdefault(name, [0.0, 0])
                    t[0], t[1] = t[0] + s, t[1] + n
            metrics = {name: s / n if n else float("nan") for name, (s, n) in sums.items()}
            last_eval.update(metrics, step=step, n=len(results))
            row.update({f"eval/{name}": v for name, v in metrics.items()})
            with open(os.path.join(out, f"eval_step{step}.jsonl"), "w") as f:
                for r in results:
                    f.write(json.dumps(r) + "\n")
        sync_s = t_gather + time.perf_counter() - t1
        totals["sync_s"] += sync_s
        totals["rounds"] += 1
        tokens = sum(st["tokens"] for _, st, _ in gathered)
        gen_s = sum(st["gen_s"] for _, st, _ in gathered)
        row.update({"sync/seconds": sync_s, "sync/push_seconds": push_s, "sync/samples": len(samples),
                    "sync/new_samples": new, "search/tokens_per_s": tokens / gen_s if gen_s else 0.0,
                    "search/reward_errors": sum(st["reward_errors"] for _, st, _ in gathered)})
        if samples:
            row["search/reward_mean"] = sum(s.reward for s in samples) / len(samples)
        return samples

    def interrupted(step, e=None):
        """Why the run must end now: a searcher died or got stuck (named), else the signal that came, else the
        collective error `e` as is."""
        try:
            problems = comm.diagnose()
        except Exception:  # the rendezvous store itself is gone: nothing more to learn
            problems = []
        if problems:
            return Stop(f"error: at step {step}: {'; '.join(problems)}", 1)
        if stop:
            return Stop(f"stopped by {stop['signal']} at step {step}", 128 + signal.Signals[stop["signal"]])
        detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return Stop(f"error: the sync round at step {step} failed: {detail}", 1)

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
        finite = math.isfinite(logs["loss"]) and bool(torch.isfinite(grad_norm))
        if finite:
            opt.step()
        else:  # a non-finite loss or gradient: skip this update, count it, stop after max_bad_steps in a row
            opt.zero_grad(set_to_none=True)
            totals["skipped"] += 1
        totals["bad_in_a_row"] = 0 if finite else totals["bad_in_a_row"] + 1
        totals["done"] = step
        row["train/skipped"] = int(not finite)
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

    # ------------------------------------------------------------------ start (evaluate, or resume), fill the buffer
    t_start, t_loop = time.perf_counter() - totals["elapsed"], None
    step = totals["done"] = totals["logged"] = start  # done: the last step whose update (or skip) is complete
    try:
        if ctx.resume:
            sync_round(start, C.WEIGHTS)  # the searchers wait for the checkpoint's weights before generating
        else:
            sync_round(0, C.EVAL)
            eval_start.update(last_eval)
            log.log(0, dict(row))
            totals["eval_s"] = 0.0  # counts evaluation inside the training loop only
        while cfg.asynchronous and len(buffer) < cfg.initial_buffer:
            sync_round(start, 0)
        t_loop = time.perf_counter() - totals["loop"]
        c_loop = time.process_time() - totals["loop_cpu"]  # this process's CPU seconds, all threads
        pbar = tqdm(range(start + 1, cfg.steps + 1), initial=start, total=cfg.steps, disable=not cfg.progress,
                    desc="train", dynamic_ncols=True)
        for step in pbar:
            row.clear()
            t_step = time.perf_counter()
            over_budget = cfg.time_budget_min and (time.perf_counter() - t_start) / 60 > cfg.time_budget_min
            last = step == cfg.steps or bool(over_budget)
            due_eval = last or (cfg.eval_every and step % cfg.eval_every == 0)
            flags = C.WEIGHTS | (C.EVAL if due_eval else 0) | (C.STOP if last else 0)
            if not cfg.asynchronous:
                sync_round(step, flags, between=lambda: train_step(step))
            elif step % cfg.k == 0 or due_eval:
                # announce the round before this step trains, so the searchers finish their generation chunks while
                # it runs and are waiting in the gather when it is done (the trainer never waits out a chunk)
                try:
                    flags = announce(step, flags)
                except RuntimeError as e:
                    raise interrupted(step - 1, e) from None
                train_step(step)
                sync_round(step, flags, announced=True)
            else:
                train_step(step)
            step_s = time.perf_counter() - t_step
            row.update({"time/step_seconds": step_s, "time/wait_seconds": step_s - row["time/train_seconds"],
                        "time/elapsed_seconds": time.perf_counter() - t_start})
            log.log(step, dict(row))
            totals["logged"] = step
            pbar.set_postfix(loss=f"{row['train/loss']:.3g}", reward=f"{row['train/reward_mean']:.2f}",
                             acc=f"{last_eval.get('accuracy', float('nan')):.3f}")
            if totals["bad_in_a_row"] >= cfg.max_bad_steps:
                raise Stop(f"error: {cfg.max_bad_steps} updates in a row had a non-finite loss or gradient (last: step "
                           f"{step}, loss {row['train/loss']}, grad norm {row['train/grad_norm']}); all were skipped", 1)
            if stop:
                raise interrupted(step)
            if cfg.save_every and step % cfg.save_every == 0 and not last:
                save(step)
            if last:
                break
    except Stop as e:
        done = totals["done"]
        if done > totals["logged"]:  # the step trained but its sync round failed: its row still goes in the log
            log.log(done, dict(row))
        where = f"checkpoint {save(done)}" if t_loop is not None and done > start else "no new step to save"
        log.close()
        print(f"{e}; {where}; continue with resume=auto", file=sys.stderr, flush=True)
        sys.exit(e.code)
    save(step, "final")
    wall = time.perf_counter() - t_start
    loop = time.perf_counter() - t_loop
    summary = {"steps": step, "wall_seconds": wall, "loop_seconds": loop,
               "loop_cpu_seconds": time.process_time() - c_loop,  # the trainer's CPU time in the loop, all its threads
               "trainer_busy_fraction": totals["train_s"] / loop if loop else 0.0,
               "train_seconds_total": totals["train_s"], "sync_rounds": totals["rounds"],
               "sync_seconds_total": totals["sync_s"], "eval_seconds_total": totals["eval_s"],
               "skipped_updates": totals["skipped"], "resumed_from": ctx.resume,
               "eval_start": eval_start, "eval_end": dict(last_eval),
               "final": {k: v for k, v in row.items() if isinstance(v, (int, float))}}
    tmp = os.path.join(out, "summary.json.tmp")
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(tmp, os.path.join(out, "summary.json"))
    log.close()
    metrics = [k for k in last_eval if k not in ("step", "n")]
    print(f"done: {step} steps in {wall:.0f}s; eval " + ", ".join(
        f"{k} {eval_start.get(k, float('nan')):.3f} -> {last_eval[k]:.3f}" for k in metrics) + f"; out_dir {out}", flush=True)
