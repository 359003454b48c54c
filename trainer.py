"""Rank 0: learn. Sample B prompts x K samples from the replay buffer, take one optimizer step on the loss, and every
k steps run a sync round (sync.py): trajectories in from every searcher, current weights out to every searcher.
Synchronous mode (async=false) runs a round every step with the train step inside it: gather the data the searchers
generated with the current weights, train on exactly that, push the new weights.
With n_trainers = T > 1, ranks 1..T-1 train with rank 0 (follow(); trainer_group.py): each takes B / T prompts of
every batch, and they run what needs the whole model (weight push, checkpoint) together when rank 0 says so.

Failures: a non-finite loss or gradient skips the update; a dead or stuck searcher, SIGTERM, or max_bad_steps skips in
a row end the run with one line and a resumable checkpoint (checkpoint.py; resume=auto continues from it). A dead or
stuck trainer rank ends it with one line and no new checkpoint (its shards are gone): resume=auto takes the last one.
"""
import datetime
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
import runlog
import sync
import trainer_group
from buffer import ReplayBuffer
from config import config_to_dict
from losses import beta_at, get_loss, lr_at, masked
from policy import encode_prompt, load_model, trim_at_eos
from sync import Flag


class TrainerState:
    """Everything a checkpoint restores besides the weights (saved in HF format): save and resume both go through
    state_dict / load_state_dict."""

    def __init__(self, cfg, model, opt, group):
        self.model, self.opt, self.group = model, opt, group  # group: trainer_group.Group (n_trainers)
        self.buffer = ReplayBuffer(cfg)
        self.step = 0  # the last step whose update (or skip) is complete
        self.places = {}  # searcher rank -> its sync.ShardPlace at the last round
        self.ref_version, self.ref_weights = 0, None  # TBA': step of the last reference reset, and those weights
        self.eval_start, self.last_eval = {}, {}  # metrics of the start-of-run and of the latest evaluation
        self.skipped = self.bad_in_a_row = 0  # updates skipped for a non-finite loss or gradient: in all, in a row
        self.generated = self.trained = 0  # samples gathered from the searchers / trained on, over the whole run
        self.versions = {}  # weight_delay: trainer step -> a CPU copy of the weights after it (the last D + 1)
        self.timers = runlog.Timers()
        self.meta = {"weight_delay": cfg.weight_delay}  # in the checkpoint's meta.json: a resume must match it
        if group.size > 1:  # the optimizer state is in one file per trainer rank, for the same T and parallelism
            self.meta.update(n_trainers=group.size, trainer_parallel=group.parallel)

    def state_dict(self):
        optimizer = self.opt.state_dict() if self.group.size == 1 else None  # T > 1: Group.save_shards
        return dict(meta=self.meta, step=self.step, optimizer=optimizer, buffer=self.buffer.state_dict(),
                    torch_rng=torch.get_rng_state(), places=self.places, ref_version=self.ref_version,
                    ref_weights=self.ref_weights, eval_start=self.eval_start, last_eval=self.last_eval,
                    skipped=self.skipped, bad_in_a_row=self.bad_in_a_row, generated=self.generated,
                    trained=self.trained, versions=self.versions, timers=self.timers.state_dict())

    def load_state_dict(self, state):
        if state["optimizer"] is not None:
            self.opt.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        torch.set_rng_state(state["torch_rng"])
        self.timers.load_state_dict(state["timers"])
        for key in ("step", "places", "ref_version", "ref_weights", "eval_start", "last_eval", "skipped",
                    "bad_in_a_row", "generated", "trained", "versions"):
            setattr(self, key, state[key])

    def keep_version(self, delay):
        """weight_delay = D: keep a CPU copy of the weights after self.step, drop those older than step - D."""
        if delay:
            weights = self.model.state_dict()
            self.versions[self.step] = {n: t.detach().to("cpu", copy=True) for n, t in weights.items()}
            for v in [v for v in self.versions if v < self.step - delay]:
                del self.versions[v]

    def version_for(self, step, delay):
        """The weights the round at `step` sends: (their step, {name: tensor}), or (step, None) for the model's
        current ones (D = 0). With D > 0 they are step - D's, or the start weights while step < D."""
        if not delay:
            return step, None
        version = max(step - delay, min(self.versions))
        return version, self.versions[version]


class Stop(Exception):
    """Ends the run early: a signal, a failed collective or too many skipped updates. Carries the exit code."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- one train step


def padded(arrays, like):
    """Per-token numpy arrays -> one zero-padded float32 tensor shaped like `like` (N, L), on its device."""
    out = torch.zeros_like(like, dtype=torch.float32)
    for i, a in enumerate(arrays):
        out[i, : len(a)] = torch.from_numpy(a)
    return out


def micro_batch(logprobs, prompts, part, temperature, beta):
    """The loss's input (losses.py documents the keys) for `part`, a list of (group id, Sample) of whole prompts;
    logprobs: policy.token_logprobs on the model (trainer_group.Group.logprobs)."""
    samples = [s for _, s in part]
    logp, mask = logprobs([prompts[s.prompt_id] for s in samples], [s.response for s in samples], temperature)
    return dict(logp=logp.float(), mask=mask, logp_behav=padded([s.logp_behav for s in samples], logp),
                logp_ref=padded([s.logp_ref for s in samples], logp), beta=beta,
                reward=torch.tensor([s.reward for s in samples], device=logp.device),
                group=torch.tensor([g for g, _ in part], device=logp.device))


def update(cfg, group, opt, prompts, loss_fn, share, totals, step):
    """The optimizer step of trainer step `step`, on `share`: this trainer rank's whole prompts of the batch (all of
    it with n_trainers = 1; every trainer rank runs this in lock-step). The loss is the mean over the share; FSDP / DDP
    average the gradients over the ranks' equal shares, so the update is the whole batch's mean, as with one rank
    (`totals` are the whole batch's, for the losses normalised by its token count). A non-finite loss or gradient
    skips the update. Returns (beta, lr, the metric sums averaged over the ranks, grad norm, whether finite)."""
    beta = beta_at(step, cfg.beta_start, cfg.beta_end, cfg.beta_decay_steps, cfg.beta_cut_step)
    lr = lr_at(step, cfg.lr, cfg.lr_schedule, cfg.warmup_steps, cfg.stable_steps, cfg.decay_steps, cfg.steps)
    for g in opt.param_groups:
        g["lr"] = lr
    per_mb = max(1, (cfg.micro_batch or cfg.K) // cfg.K) * cfg.K  # whole prompts per micro-batch
    opt.zero_grad(set_to_none=True)
    sums = {}  # the loss, its metrics and the mean sequence log-probs, each weighted by micro-batch size
    for start in range(0, len(share), per_mb):
        part = share[start : start + per_mb]
        mb = dict(micro_batch(group.logprobs, prompts, part, cfg.temperature, beta), **totals)
        loss, metrics = loss_fn(mb, cfg)
        w = len(part) / len(share)
        (loss * w).backward()
        seq = {k: masked(mb[k].detach(), mb["mask"]).sum(1).mean().item() for k in ("logp", "logp_ref", "logp_behav")}
        for k, v in {"loss": loss.item(), **metrics, **seq}.items():
            sums[k] = sums.get(k, 0.0) + v * w
    sums = group.mean(sums)
    grad_norm = torch.nn.utils.clip_grad_norm_(group.model.parameters(),
                                               cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
    grad_norm = group.whole(grad_norm)  # fsdp: the norm over every rank's shard
    finite = math.isfinite(sums["loss"]) and bool(torch.isfinite(grad_norm))
    if finite:
        opt.step()
    else:  # skip this update; max_bad_steps in a row stop the run (stop_reason)
        opt.zero_grad(set_to_none=True)
    return beta, lr, sums, grad_norm, finite


def train_step(cfg, state, prompts, loss_fn, step):
    """One optimizer step on B x K samples from the buffer; the loss is the mean over all of them. A non-finite loss
    or gradient skips the update (counted in state). With n_trainers = T > 1 every trainer rank takes B / T of the
    batch's prompts (update). Returns the step's metrics row."""
    t0 = time.perf_counter()
    model, opt = state.model, state.opt
    batch = state.buffer.sample(cfg.B, cfg.K)
    flat = [(gid, s) for gid, draw in enumerate(batch) for s in draw.samples]  # group id: the draw, as paper Eq. 5
    totals = dict(batch_tokens=sum(len(s.response) for _, s in flat), batch_samples=len(flat))  # losses.py docstring
    with state.group.collectives():
        share = state.group.tell("step", (totals, step), state.group.split(flat))
        beta, lr, sums, grad_norm, finite = update(cfg, state.group, opt, prompts, loss_fn, share, totals, step)
    state.skipped += not finite
    state.trained += len(flat)
    state.bad_in_a_row = 0 if finite else state.bad_in_a_row + 1
    state.step = step
    state.keep_version(cfg.weight_delay)
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()
    train_s = time.perf_counter() - t0
    state.timers.train_s += train_s
    samples = [s for _, s in flat]
    tokens = sum(len(prompts[s.prompt_id]) + len(s.response) for s in samples)
    # updates between the (oldest, for a sample that spans an in-flight weight update) sampling weights and these
    stale = [step - 1 - s.version_first for s in samples]
    row = {f"train/{k}": v for k, v in sums.items() if k not in ("logp_ref", "logp_behav")}
    row.update({"train/skipped": int(not finite), "train/beta": beta, "train/lr": lr,
                "train/grad_norm": float(grad_norm),
                "train/reward_mean": sum(s.reward for s in samples) / len(samples),
                "train/accuracy": sum(s.reward >= 1.0 for s in samples) / len(samples),
                "train/kl_seq": sums["logp"] - sums["logp_ref"],
                "train/logp_behav_minus_logp": sums["logp_behav"] - sums["logp"],
                "train/response_len": sum(len(s.response) for s in samples) / len(samples),
                "train/recent_fraction": sum(d.recent for d in batch) / len(batch),
                "buffer/size": len(state.buffer), "buffer/prompts": len(state.buffer.items),
                "staleness/mean": sum(stale) / len(stale), "staleness/max": max(stale),
                "staleness/hist": [stale.count(i) for i in range(max(stale) + 1)],
                "staleness/mixed_fraction": sum(s.mixed for s in samples) / len(samples),
                "time/train_seconds": train_s, "perf/train_tokens_per_s": tokens / train_s})
    if cfg.peak_tflops:  # forward + backward ~ 6 FLOPs per parameter per token (the log-prob recompute ignored)
        n_params = sum(p.numel() for p in model.parameters())
        row["perf/mfu"] = 6 * n_params * tokens / train_s / (cfg.peak_tflops * 1e12)
    if next(model.parameters()).is_cuda:
        row["perf/peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return row


# ---------------------------------------------------------------- the trainer's side of a sync round (sync.py)


def gather(comm, state, step, flags, announced=False):
    """Round steps 0-1: the searchers' trajectories into the buffer, their shard places kept for checkpoints.
    Returns the round's search metrics."""
    got = sync.trainer_gather(comm, step, flags, announced)
    samples = [s for report in got.reports for s in report.samples]
    new = state.buffer.add(samples)
    state.generated += len(samples)
    state.places.update({rank: report.place for rank, report in enumerate(got.reports, 1)})
    state.timers.sync_s += got.seconds
    tokens, gen_s = sum(r.tokens for r in got.reports), sum(r.gen_s for r in got.reports)
    row = {"sync/seconds": got.seconds, "sync/samples": len(samples), "sync/new_samples": new,
           "sync/replay_ratio": state.trained / max(state.generated, 1),
           "search/tokens_per_s": tokens / gen_s if gen_s else 0.0,
           "search/reward_errors": sum(r.reward_errors for r in got.reports)}
    if samples:
        row["search/reward_mean"] = sum(s.reward for s in samples) / len(samples)
    return row


def push(cfg, comm, weights, state, tok, probe_prompt, step, flags, row):
    """Round steps 3-5: the weights out (kept as TBA's reference with REF), the probe compared, the evaluation
    merged and written to eval_stepN.jsonl. Returns `row` (the step's metrics so far, from gather() on) with the
    round's: sync/seconds counts steps 0-1 and 3-5, not a train step between them."""
    version, old = state.version_for(step, cfg.weight_delay)
    source = old
    if source is None and flags & Flag.WEIGHTS:  # fsdp: assembled from the shards during the push (sync/push_seconds)
        source = state.group.full_params()  # None with one trainer or ddp: the model's own weights
    got = sync.trainer_push(comm, weights, flags, source)
    state.timers.sync_s += got.seconds
    state.timers.eval_s += got.eval_s
    state.timers.rounds += 1
    row = dict(row, **{"sync/push_seconds": got.push_s, "sync/seconds": row["sync/seconds"] + got.seconds})
    if flags & Flag.WEIGHTS:
        row["sync/pushed_version"] = version
    if flags & Flag.REF:  # the searchers' pi_ref is now the pushed weights: keep them for checkpoints
        state.ref_version = step
        with state.group.collectives():  # fsdp: assembled from every trainer rank's shard
            whole = old or state.group.full_state()
        state.ref_weights = {n: t.detach().to("cpu", copy=True) for n, t in whole.items()}
    if got.probes is not None:
        with state.group.collectives():  # fsdp: every trainer rank generates in lock-step
            mine = greedy_probe(state.group.probe_model(), tok, probe_prompt, old)
        row["sync/probe_match"] = sum(p == mine for p in got.probes) / len(got.probes)
        with open(os.path.join(cfg.out_dir, "sync_probe.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, "trainer": mine, "searchers": got.probes}) + "\n")
    if got.evals is not None:
        metrics, results = merge_evals(got.evals)
        state.last_eval = dict(metrics, step=step, n=len(results))
        row.update({f"eval/{name}": v for name, v in metrics.items()})
        with open(os.path.join(cfg.out_dir, f"eval_step{step}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in results)
    return row


def merge_evals(evals):
    """Each searcher's (rows, {metric: [sum, count]}) for its share of the test set -> ({metric: sum / count over
    all searchers}, all rows sorted by test id). A metric no searcher counted is NaN."""
    results = sorted((r for rows, _ in evals for r in rows), key=lambda r: r["id"])
    sums = {}
    for _, part in evals:
        for name, (s, n) in part.items():
            total = sums.setdefault(name, [0.0, 0])
            total[0], total[1] = total[0] + s, total[1] + n
    return {name: s / n if n else float("nan") for name, (s, n) in sums.items()}, results


@torch.no_grad()
def greedy_probe(model, tok, prompt, weights=None):
    """The trainer's greedy completion of `prompt` (check_sync: every searcher's engine must give the same), with
    the model's weights or, for weight_delay, with `weights` ({name: tensor}) loaded for the probe only."""
    current = {n: t.detach().clone() for n, t in model.state_dict().items()} if weights is not None else None
    if weights is not None:
        model.load_state_dict(weights, strict=False)
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=sync.PROBE_TOKENS, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    if current is not None:
        model.load_state_dict(current, strict=False)
    return trim_at_eos(out[0, ids.shape[1]:].tolist(), tok.eos_token_id)


def wait_for_fresh(cfg, comm, state):
    """max_reuse, async mode: before a step, sync rounds without weights until the next B x K samples keep the samples
    trained on within max_reuse x those generated (0: never wait; synchronous mode trains on each round's data as it
    is). Returns the step's waiting metrics."""
    t0, rounds = time.perf_counter(), 0
    while cfg.asynchronous and cfg.max_reuse and state.trained + cfg.B * cfg.K > cfg.max_reuse * state.generated:
        gather(comm, state, state.step, Flag.NONE)
        rounds += 1
    return {"sync/reuse_wait_rounds": rounds, "time/reuse_wait_seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------- why a run stops


def stop_reason(cfg, comm, state, signalled, error=None, row=None, where="sync round"):
    """Why the run must end now, as a Stop with its exit code, or None to go on. After a failed collective (of
    `where`) or a signal: a trainer rank or searcher that died or is stuck (named), else the signal (resumable), else
    the collective's error. Otherwise: max_bad_steps updates in a row skipped for a non-finite loss or gradient."""
    step = state.step
    if error is not None or signalled:
        try:
            problems = comm.diagnose()
            if error is not None and not problems:  # a rank killed a moment ago closes its sockets before it dies
                time.sleep(1)
                problems = comm.diagnose()
        except Exception:  # the rendezvous store itself is gone: nothing more to learn
            problems = []
        if problems:
            return Stop(f"error: at step {step}: {'; '.join(problems)}", 1)
        if signalled:
            return Stop(f"stopped by {signalled[0]} at step {step}", 128 + signal.Signals[signalled[0]])
        detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        return Stop(f"error: the {where} at step {step} failed: {detail}", 1)
    if state.bad_in_a_row >= cfg.max_bad_steps:
        return Stop(f"error: {cfg.max_bad_steps} updates in a row had a non-finite loss or gradient "
                    f"(last: step {step}, loss {row['train/loss']}, grad norm {row['train/grad_norm']}); "
                    "all were skipped", 1)
    return None


def trainers_alive(comm, group):
    """After a failure: whether every trainer rank can still take part in a checkpoint (always with n_trainers = 1)."""
    if group.size == 1:
        return True
    try:
        return not group.failed and not comm.trainer_problems()
    except Exception:  # the rendezvous store itself is gone
        return False


def catch_signals():
    """SIGTERM / SIGINT set a flag (the list gets the signal's name): the loop finishes its step, saves and exits."""
    signalled = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: signalled.append(signal.Signals(signum).name))
    return signalled


def save(cfg, state, tok, name=None):
    """A resumable checkpoint of the state after state.step (the searchers' places as of the last round)."""
    path = os.path.join(cfg.out_dir, "checkpoints", name or f"step_{state.step}")
    shards = None if state.group.size == 1 else lambda tmp: state.group.save_shards(state.opt, tmp)
    with state.group.collectives():
        checkpoint.save(path, state.model, tok, state.state_dict(), shards)
    checkpoint.prune(os.path.join(cfg.out_dir, "checkpoints"), cfg.keep_checkpoints)
    return path


# ---------------------------------------------------------------- the run


def run(cfg, comm, ctx):
    os.makedirs(os.path.join(cfg.out_dir, "checkpoints"), exist_ok=True)
    with open(os.path.join(cfg.out_dir, "config.yaml"), "w") as f:
        yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
    torch.manual_seed(cfg.seed)
    tok, prompts = ctx.tok, [encode_prompt(ctx.tok, r["prompt"]) for r in ctx.train]
    model = load_model(ctx.resume or cfg.model, cfg.dtype, ctx.device).train()
    group = trainer_group.Group(cfg, model, ctx.device, comm.store)  # n_trainers > 1: FSDP2 / DDP over ranks 0..T-1
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, cfg.adam_beta2), weight_decay=cfg.weight_decay)
    loss_fn = get_loss(cfg.loss)
    weights = ctx.make_transport(comm, model)
    if ctx.gpu_mode == "shared":  # model, optimizer and weight buffers exist: the searchers' build turns start
        comm.end_turn()
    state = TrainerState(cfg, model, opt, group)
    if ctx.resume:
        state.load_state_dict(checkpoint.load_state(ctx.resume))
        group.load_optimizer(opt, ctx.resume)  # n_trainers > 1: every trainer rank loads its own
        print(f"resumed from {ctx.resume} (step {state.step}, buffer {len(state.buffer)} samples)", flush=True)
    start = state.step
    if not state.versions:  # weight_delay: the start weights (a resumed run has its last D + 1 versions)
        state.keep_version(cfg.weight_delay)
    log = runlog.Logger(cfg.out_dir, start)
    signalled = catch_signals()
    row = {}  # the metrics of the step being run
    try:
        # start: the checkpoint's weights to the searchers (they wait for them), or the start-of-run evaluation
        flags = sync.flags_for(cfg, start, state.ref_version) if ctx.resume else Flag.EVAL
        row = push(cfg, comm, weights, state, tok, prompts[0], start, flags, gather(comm, state, start, flags))
        if not ctx.resume:
            state.eval_start = dict(state.last_eval)
            log.log(0, row)
            state.timers.eval_s = 0.0  # counts evaluation inside the training loop only
        while cfg.asynchronous and len(state.buffer) < cfg.initial_buffer:  # rounds that only gather
            gather(comm, state, start, Flag.NONE)
        state.timers.start_loop()
        pbar = tqdm(range(start + 1, cfg.steps + 1), initial=start, total=cfg.steps, disable=not cfg.progress,
                    desc="train", dynamic_ncols=True)
        for step in pbar:
            t_step = time.perf_counter()
            waited = wait_for_fresh(cfg, comm, state)
            last = step == cfg.steps or bool(cfg.time_budget_min and state.timers.elapsed() / 60 > cfg.time_budget_min)
            evaluate = last or bool(cfg.eval_every and step % cfg.eval_every == 0)
            flags = sync.flags_for(cfg, step, state.ref_version, evaluate=evaluate, stop=last)
            if not cfg.asynchronous:  # exactly the data of the current weights, then the new weights out
                row = gather(comm, state, step, flags)
                row.update(train_step(cfg, state, prompts, loss_fn, step))
                row = push(cfg, comm, weights, state, tok, prompts[0], step, flags, row)
            elif step % cfg.k == 0 or evaluate:
                # announced before this step trains, so the searchers finish their generation chunks meanwhile and
                # wait in the gather when it is done (the trainer never waits out a chunk)
                sync.announce(comm, step, flags)
                row = train_step(cfg, state, prompts, loss_fn, step)
                row.update(gather(comm, state, step, flags, announced=True))
                row = push(cfg, comm, weights, state, tok, prompts[0], step, flags, row)
            else:
                row = train_step(cfg, state, prompts, loss_fn, step)
            step_s = time.perf_counter() - t_step
            row.update(waited)
            row.update({"time/step_seconds": step_s, "time/wait_seconds": step_s - row["time/train_seconds"],
                        "time/elapsed_seconds": state.timers.elapsed()})
            log.log(step, row)
            pbar.set_postfix(loss=f"{row['train/loss']:.3g}", reward=f"{row['train/reward_mean']:.2f}",
                             acc=f"{state.last_eval.get('accuracy', float('nan')):.3f}")
            stop = stop_reason(cfg, comm, state, signalled, row=row)
            if stop:
                raise stop
            if cfg.save_every and step % cfg.save_every == 0 and not last:
                save(cfg, state, tok)
            if last:
                break
    except (Stop, sync.RoundFailed) as e:
        stop = e if isinstance(e, Stop) else stop_reason(cfg, comm, state, signalled, error=e.error,
                                                          where=getattr(e, "where", "sync round"))
        if state.step > log.last_step:  # the step trained but its round failed: its row still goes in the log
            log.log(state.step, row)
        weights.close(failed=True)
        whole = trainers_alive(comm, group)
        if state.step <= start:
            where = "no new step to save"
        elif whole:
            where = f"checkpoint {save(cfg, state, tok)}"
        else:
            where = "no checkpoint: a trainer rank is gone (resume=auto takes the last one saved)"
        group.close(stop=whole)
        log.close()
        print(f"{stop}; {where}; continue with resume=auto", file=sys.stderr, flush=True)
        sys.exit(stop.code)
    weights.close()
    save(cfg, state, tok, "final")
    group.close()
    runlog.write_summary(cfg, state, row, ctx.resume)
    log.close()
    metrics = [k for k in state.last_eval if k not in ("step", "n")]
    print(f"done: {state.step} steps in {state.timers.elapsed():.0f}s; eval " + ", ".join(
        f"{k} {state.eval_start.get(k, float('nan')):.3f} -> {state.last_eval[k]:.3f}" for k in metrics)
        + f"; out_dir {cfg.out_dir}", flush=True)
    print(f"look: python tables.py {cfg.out_dir}  |  tensorboard --logdir {cfg.out_dir}/tb", flush=True)


# ---------------------------------------------------------------- trainer ranks 1..T-1


def follow(cfg, ctx):
    """Trainer ranks 1..T-1 (n_trainers = T > 1): the same model as rank 0's, sharded with it (fsdp) or replicated
    (ddp), and rank 0's commands (trainer_group.py) run in lock-step with it until it says stop. SIGTERM / SIGINT are
    rank 0's to act on: it saves a checkpoint with these ranks' optimizer states, then stops them."""
    from comm import connect
    torch.manual_seed(cfg.seed)
    tok, prompts = ctx.tok, [encode_prompt(ctx.tok, r["prompt"]) for r in ctx.train]
    model = load_model(ctx.resume or cfg.model, cfg.dtype, ctx.device).train()
    group = trainer_group.Group(cfg, model, ctx.device, connect(datetime.timedelta(seconds=cfg.timeout_s)))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, cfg.adam_beta2), weight_decay=cfg.weight_decay)
    group.load_optimizer(opt, ctx.resume)
    loss_fn = get_loss(cfg.loss)
    signalled = catch_signals()
    try:
        while True:
            command, arg, share = group.next_command()
            if command == "step":
                totals, step = arg
                update(cfg, group, opt, prompts, loss_fn, share, totals, step)
            elif command == "params":
                group.assemble_params()
            elif command == "state":
                group.full_state()
            elif command == "probe":
                greedy_probe(group.probe_model(), tok, prompts[0])
            elif command == "save":
                group.save_shards(opt, arg)
            elif command == "stop":
                break
    except (RuntimeError, trainer_group.Left) as e:  # rank 0 or another trainer rank is gone: rank 0 says why
        if not signalled:
            detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            print(f"error: trainer rank {group.rank}: {detail}", file=sys.stderr, flush=True)
        sys.exit(1)
    group.close(stop=False)
