"""Rank 0: the TBA loop. Sample B prompts x K samples from the replay buffer, take one optimizer step on them
(learner.py), and every k steps run a sync round (sync.py): trajectories in from every searcher, current weights out.
Synchronous mode (async=false) runs a round every step with the train step inside it: gather the data the searchers
generated with the current weights, train on exactly that, push the new weights. With n_trainers = T > 1, ranks
1..T-1 train with rank 0 (trainer_group.follow), each on B / T prompts of every batch.

A stop (failures.py: a signal, a failed collective, max_bad_steps skipped updates in a row) ends the run with one line
and a resumable checkpoint (checkpoint.py; resume=auto continues from it), unless a trainer rank is gone: then the
last checkpoint saved is the one to resume from.
"""
import dataclasses
import json
import os
import time

import torch
import yaml

import checkpoint
import failures
import runlog
import sync
from buffer import ReplayBuffer
from config import config_to_dict
from eval import merge_evals
from failures import Stop
from learner import build as build_learner, finite
from rewards import get_task
from sync import Flag


class WeightDelay:
    """weight_delay = D (docs/staleness.md): every sync round sends the searchers the weights of D trainer steps ago,
    so each sample is at least D updates stale while everything else stays as it was. Keeps CPU copies of the last
    D + 1 versions (a checkpoint keeps them too)."""

    def __init__(self, delay):
        self.delay = delay
        self.versions = {}  # trainer step -> a CPU copy of the weights after it

    def keep(self, step, model):
        """After trainer step `step`: a copy of the model's weights; those older than step - D go."""
        if self.delay:
            self.versions[step] = {n: t.detach().to("cpu", copy=True) for n, t in model.state_dict().items()}
            for v in [v for v in self.versions if v < step - self.delay]:
                del self.versions[v]

    def weights_for(self, step):
        """The weights the round at `step` sends: (their step, {name: tensor}), or (step, None) for the model's
        current ones (D = 0). With D > 0 they are step - D's, or the start weights while step < D."""
        if not self.delay:
            return step, None
        version = max(step - self.delay, min(self.versions))
        return version, self.versions[version]


class TrainerState:
    """Rank 0's state: everything a checkpoint restores besides the weights (saved in HF format); save and resume
    both go through state_dict / load_state_dict. `learner`: learner.Learner (its model, optimizer and group)."""

    def __init__(self, cfg, learner):
        self.model, self.opt, self.group = learner.model, learner.opt, learner.group
        self.buffer = ReplayBuffer(cfg)
        self.step = 0  # the last step whose update (or skip) is complete
        self.places = {}  # searcher rank -> its sync.ShardPlace at the last round
        self.ref_version, self.ref_weights = 0, None  # TBA': step of the last reference reset, and those weights
        self.eval_start, self.last_eval = {}, {}  # metrics of the start-of-run and of the latest evaluation
        self.skipped = self.bad_in_a_row = 0  # updates skipped for a non-finite loss or gradient: in all, in a row
        self.generated = self.trained = 0  # samples gathered from the searchers / trained on, over the whole run
        self.rewards = failures.RewardWindow(cfg.max_reward_errors)  # the latest rounds' failed rewards
        self.delay = WeightDelay(cfg.weight_delay)
        self.timers = runlog.Timers()
        self.meta = checkpoint.contract(cfg)  # in the checkpoint's meta.json: what a resume must match

    def state_dict(self):
        optimizer = self.opt.state_dict() if self.group.size == 1 else None  # T > 1: Group.save_shards
        return dict(meta=self.meta, step=self.step, optimizer=optimizer, buffer=self.buffer.state_dict(),
                    torch_rng=torch.get_rng_state(), places=self.places, ref_version=self.ref_version,
                    ref_weights=self.ref_weights, eval_start=self.eval_start, last_eval=self.last_eval,
                    skipped=self.skipped, bad_in_a_row=self.bad_in_a_row, generated=self.generated,
                    trained=self.trained, versions=self.delay.versions, timers=self.timers.state_dict(),
                    rewards=self.rewards.state_dict())

    def load_state_dict(self, state):
        if state["optimizer"] is not None:
            self.opt.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        torch.set_rng_state(state["torch_rng"])
        self.timers.load_state_dict(state["timers"])
        self.delay.versions = state["versions"]
        self.rewards.load_state_dict(state.get("rewards", []))  # none in checkpoints written before it was saved
        for key in ("step", "places", "ref_version", "ref_weights", "eval_start", "last_eval", "skipped",
                    "bad_in_a_row", "generated", "trained"):
            setattr(self, key, state[key])


@dataclasses.dataclass
class Run:
    """What every part of the loop works with, made once by begin()."""
    cfg: object  # config.Config
    comm: object  # comm.Comm: rank 0's side of the job (its store, the searchers' group)
    transport: object  # transport.WeightTransport: how the weights go out
    learner: object  # learner.Learner: the model, its optimizer, the trainer group, the loss
    state: TrainerState  # what a checkpoint restores
    tok: object  # the tokenizer, saved with every checkpoint
    signalled: list  # the signals caught so far (failures.catch_signals)


def train_step(run, step):
    """One optimizer step on B x K samples drawn from the replay buffer (paper section 3.2: m / reward-weighted);
    a skipped update counts towards max_bad_steps. Returns the step's metrics row."""
    cfg, state, learner = run.cfg, run.state, run.learner
    t0 = time.perf_counter()
    batch = state.buffer.sample(cfg.B, cfg.K)
    items, update = learner.train(batch, step)
    state.skipped += not update.finite
    state.trained += len(items)
    state.bad_in_a_row = 0 if update.finite else state.bad_in_a_row + 1
    state.step = step
    state.delay.keep(step, state.model)
    seconds = time.perf_counter() - t0
    state.timers.train_s += seconds
    row = learner.metrics(batch, items, update, step, seconds)
    row.update({"buffer/size": len(state.buffer), "buffer/prompts": len(state.buffer.items)})
    row.update(state.buffer.successes.metrics())  # cumulative: the distinct successes received so far
    return row


# ---------------------------------------------------------------- the trainer's side of a sync round (sync.py)


def gather(run, step, flags, announced=False, logged=True):
    """Round steps 0-1: the searchers' trajectories into the buffer, their shard places kept for checkpoints, their
    failed rewards counted (max_reward_errors). Returns the round's search metrics. logged=False: a round whose row
    is not logged (wait_for_fresh's, the initial fill's); its weight-load seconds go into the next logged row."""
    state = run.state
    gathered = sync.trainer_gather(run.comm, step, flags, announced)
    samples = [s for report in gathered.reports for s in report.samples]
    new = state.buffer.add(samples, run.tok)  # the tokenizer: the count of distinct successes by text
    state.generated += len(samples)
    state.places.update({rank: report.place for rank, report in enumerate(gathered.reports, 1)})
    state.timers.sync_s += gathered.seconds
    reports = gathered.reports
    tokens, gen_s = sum(r.tokens for r in reports), sum(r.gen_s for r in reports)
    ref_s, reward_s, window_s = (sum(getattr(r, key) for r in reports) for key in ("ref_s", "reward_s", "window_s"))
    row = {"sync/seconds": gathered.seconds, "sync/samples": len(samples), "sync/new_samples": new,
           "sync/replay_ratio": state.trained / max(state.generated, 1),
           "search/tokens_per_s": tokens / gen_s if gen_s else 0.0,
           # per searcher since its last round: generation, reference log-probs, rewards; and the share of its
           # time (evaluations left out) that it did none of them: waiting for a round, in one, or for weights
           "search/generate_seconds": (gen_s - ref_s - reward_s) / len(reports),
           "search/ref_seconds": ref_s / len(reports), "search/reward_seconds": reward_s / len(reports),
           # the weights of the last round, and of those since the last logged row (wait_for_fresh's, the fill's)
           "search/load_seconds": sum(r.load_s for r in reports) / len(reports) + state.timers.load_s_unlogged,
           "search/idle_ratio": max(0.0, 1 - gen_s / window_s) if window_s > 0 else 0.0,
           "search/reward_errors": sum(r.reward_errors for r in gathered.reports),
           "search/reward_timeouts": sum(r.reward_timeouts for r in gathered.reports)}
    state.timers.load_s_unlogged = 0.0 if logged else row["search/load_seconds"]
    state.rewards.add(len(samples), row["search/reward_errors"])
    if samples:
        row["search/reward_mean"] = sum(s.reward for s in samples) / len(samples)
    return row


def push(run, step, flags):
    """Round steps 3-5: the weights out (kept as TBA's reference with REF), the probe compared, the evaluation
    merged and written to eval_stepN.jsonl. Returns the round's metrics from step 3 on."""
    cfg, transport, state = run.cfg, run.transport, run.state
    version, old = state.delay.weights_for(step)
    # the model's weights go out with every push (weight_delay: in CURRENT; the delayed version was the model's once,
    # and weights that turned non-finite stay so, so a check at every round catches them before they are sent)
    if flags & (Flag.WEIGHTS | Flag.CURRENT) and not finite(state.model):
        raise Stop(f"the weights after step {step} are not finite: not pushed", retry=False)
    source = old
    if source is None and flags & Flag.WEIGHTS:  # fsdp: assembled from the shards during the push
        source = state.group.gather_params()  # None with one trainer or ddp: the model's own weights
    # CURRENT (weight_delay): the evaluation is of the trainer's weights (one trainer or ddp: the model's own)
    current = state.group.gather_params() if flags & Flag.CURRENT else None
    pushed = sync.trainer_push(run.comm, transport, flags, source, current)
    state.timers.sync_s += pushed.seconds
    state.timers.eval_s += pushed.eval_s
    state.timers.rounds += 1
    row = {"sync/push_seconds": pushed.push_s, "sync/seconds": pushed.seconds}
    if transport.overlap and flags & Flag.WEIGHTS:  # of push_seconds: the wait for the previous push's broadcast
        row["sync/push_wait_seconds"] = transport.waited
    if flags & Flag.WEIGHTS:
        row["sync/pushed_version"] = version
    if flags & Flag.REF:  # the searchers' pi_ref is now the pushed weights: keep them for checkpoints
        state.ref_version = step
        with state.group.collectives():  # fsdp: assembled from every trainer rank's shard
            reference = old or state.group.gather_state()
        state.ref_weights = {n: t.detach().to("cpu", copy=True) for n, t in reference.items()}
    if pushed.probes is not None:
        with state.group.collectives():  # fsdp: every trainer rank generates in lock-step
            tokens = run.learner.probe(old)
        row["sync/probe_match"] = sum(p == tokens for p in pushed.probes) / len(pushed.probes)
        with open(os.path.join(cfg.out_dir, "sync_probe.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, "trainer": tokens, "searchers": pushed.probes}) + "\n")
    if pushed.evals is not None:
        row["time/eval_seconds"] = pushed.eval_s
        metrics, results = merge_evals(pushed.evals, get_task(cfg.task), cfg)
        state.last_eval = dict(metrics, step=step, n=len(results))
        row.update({f"eval/{name}": v for name, v in metrics.items()})
        with open(os.path.join(cfg.out_dir, f"eval_step{step}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in results)
    return row


def wait_for_fresh(run):
    """max_reuse, async mode: before a step, sync rounds without weights until the next B x K samples keep the samples
    trained on within max_reuse x those generated (0: never wait; synchronous mode trains on each round's data as it
    is). A signal stops the wait (and the run); past time_budget_min the step goes on without; rounds that bring no
    sample for timeout_s stop the run. Returns the step's waiting metrics."""
    cfg, state = run.cfg, run.state
    t0, rounds = time.perf_counter(), 0
    last_sample = t0
    while cfg.asynchronous and cfg.max_reuse and state.trained + cfg.B * cfg.K > cfg.max_reuse * state.generated:
        if run.signalled:
            raise failures.stop_reason(cfg, state, run.signalled, {})
        if cfg.time_budget_min and state.timers.elapsed() / 60 > cfg.time_budget_min:
            break
        if gather(run, state.step, Flag.NONE, logged=False)["sync/samples"]:
            last_sample = time.perf_counter()
        elif time.perf_counter() - last_sample > cfg.timeout_s:
            raise Stop(f"the searchers sent no sample for timeout_s = {cfg.timeout_s} s while max_reuse = "
                       f"{cfg.max_reuse} waited for fresh ones")
        rounds += 1
    return {"sync/reuse_wait_rounds": rounds, "time/reuse_wait_seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------- the run


def one_step(run, step):
    """Trainer step `step` with its sync round when one is due. Returns (its metrics row, whether it is the last)."""
    cfg, state = run.cfg, run.state
    t0 = time.perf_counter()
    waited = wait_for_fresh(run)
    last = step == cfg.steps or bool(cfg.time_budget_min and state.timers.elapsed() / 60 > cfg.time_budget_min)
    evaluate = last or bool(cfg.eval_every and step % cfg.eval_every == 0)
    flags = sync.flags_for(cfg, step, state.ref_version, evaluate=evaluate, stop=last)
    if not cfg.asynchronous:  # exactly the data of the current weights, then the new weights out
        row = runlog.joined(gather(run, step, flags), train_step(run, step))
        row = runlog.joined(row, push(run, step, flags))
    elif step % cfg.k == 0 or evaluate:
        # announced before this step trains, so the searchers finish their generation chunks meanwhile and
        # wait in the gather when it is done
        sync.announce(run.comm, step, flags)
        row = runlog.joined(train_step(run, step), gather(run, step, flags, announced=True))
        row = runlog.joined(row, push(run, step, flags))
    else:
        row = train_step(run, step)
    seconds = time.perf_counter() - t0
    row.update(waited)
    working = seconds - row.get("time/eval_seconds", 0.0)  # the step's clock, its evaluation left out
    row.update({"time/step_seconds": seconds, "time/wait_seconds": seconds - row["time/train_seconds"],
                "time/trainer_idle_ratio": max(0.0, 1 - row["time/train_seconds"] / working) if working > 0 else 0.0,
                "time/elapsed_seconds": state.timers.elapsed(), "time/loop_seconds": state.timers.loop(),
                "time/eval_seconds_total": state.timers.eval_s})  # the clock of time to accuracy: loop - evals
    return row, last


def save(run, name=None):
    """A resumable checkpoint of the state after state.step (the searchers' places as of the last round). Weights
    that are not finite are never saved: the newest checkpoint stays the last good one."""
    cfg, state = run.cfg, run.state
    if not finite(state.model):
        raise Stop(f"the weights after step {state.step} are not finite: not saved", retry=False)
    path = os.path.join(cfg.out_dir, "checkpoints", name or f"step_{state.step}")
    shards = None if state.group.size == 1 else lambda tmp: state.group.save_shards(state.opt, tmp)
    with state.group.collectives():
        checkpoint.save(path, state.model, run.tok, state.state_dict(), shards)
    checkpoint.prune(os.path.join(cfg.out_dir, "checkpoints"), cfg.keep_checkpoints, state.step)
    return path


def begin(cfg, comm, ctx):
    """The run's config.yaml, the learner, the weight transport and the state (from the checkpoint on resume), as
    the Run the loop works with."""
    os.makedirs(os.path.join(cfg.out_dir, "checkpoints"), exist_ok=True)
    with open(os.path.join(cfg.out_dir, "config.yaml"), "w") as f:
        yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
    learner = build_learner(cfg, ctx, comm.store)
    transport = ctx.make_transport(comm, learner.model)
    if ctx.gpu_mode == "shared":  # model, optimizer and weight buffers exist: the searchers' build turns start
        comm.end_turn()
    state = TrainerState(cfg, learner)
    if ctx.resume:
        state.load_state_dict(checkpoint.load_state(ctx.resume))
        print(f"resumed from {ctx.resume} (step {state.step}, buffer {len(state.buffer)} samples)", flush=True)
    if not state.delay.versions:  # weight_delay: the start weights (a resumed run has its last D + 1 versions)
        state.delay.keep(state.step, state.model)
    return Run(cfg, comm, transport, learner, state, ctx.tok, failures.catch_signals())


def run(cfg, comm, ctx):
    run = begin(cfg, comm, ctx)
    state = run.state
    start = state.step
    log = runlog.Logger(cfg.out_dir, start, cfg.trackers, config_to_dict(cfg))
    row, progress = {}, None  # the metrics of the step being run; rank 0's progress bar or lines (runlog.Progress)
    try:
        # start: the checkpoint's weights to the searchers (they wait for them), or the start-of-run evaluation
        flags = sync.flags_for(cfg, start, state.ref_version) if ctx.resume else Flag.EVAL
        row = runlog.joined(gather(run, start, flags), push(run, start, flags))
        if not ctx.resume:
            state.eval_start = dict(state.last_eval)
            log.log(0, row)
            state.timers.eval_s = 0.0  # counts evaluation inside the training loop only
        state.timers.start_loop()  # the loop's clock includes the initial buffer fill: an asynchronous head start
        while cfg.asynchronous and len(state.buffer) < cfg.initial_buffer:  # rounds that only gather
            gather(run, start, Flag.NONE, logged=False)
        saved_at = time.monotonic()  # save_minutes counts from here
        progress = runlog.Progress(start, cfg.steps, cfg.progress)
        for step in range(start + 1, cfg.steps + 1):
            row, last = one_step(run, step)
            log.log(step, row)
            progress.update(step, row, state.last_eval, last)
            stop = failures.stop_reason(cfg, state, run.signalled, row)
            if stop:
                raise stop
            if not last and (cfg.save_every and step % cfg.save_every == 0
                             or cfg.save_minutes and time.monotonic() - saved_at > 60 * cfg.save_minutes):
                save(run)
                saved_at = time.monotonic()
            if last:
                break
    except Exception as e:  # a Stop, or a bug, a bad sample, an OOM, a full disk (failures.as_stop)
        if progress:
            progress.close()  # the bar's line ends before the line that says why
        stop = failures.as_stop(e, cfg.out_dir, state.step + 1)
        end_stopped(run, log, stop, start, row)
    progress.close()
    run.transport.close()
    save(run, "final")
    state.group.close()
    runlog.write_summary(cfg, state, row, ctx.resume)
    log.close()
    runlog.say_done(cfg, state)


def end_stopped(run, log, stop, start, row):
    """A stopped run: its last step's row logged, a checkpoint when every trainer rank can take part, the line that
    says why, and the exit code (failures.reason)."""
    cfg, state = run.cfg, run.state
    line, code = failures.reason(run.comm, state.step, run.signalled, stop)
    if state.step > log.last_step:  # the step trained but its round failed: its row still goes in the log
        log.log(state.step, row)
    run.transport.close(failed=True)
    every_rank = failures.trainers_alive(run.comm, state.group)
    if state.step <= start:
        saved = "no new step to save"
    elif every_rank:
        try:
            saved = f"checkpoint {save(run)}"
        except Exception as e:  # a full disk, a trainer rank gone mid-save
            saved = f"no checkpoint: saving failed ({type(e).__name__}: {failures.first_line(e)})"
    else:
        saved = "no checkpoint: a trainer rank is gone (resume=auto takes the last one saved)"
    state.group.close(stop=every_rank)
    log.close()
    if not stop.retry:  # a restart would only stop again
        failures.final(cfg.out_dir, line, code)
    failures.say(f"{line}; {saved}; continue with resume=auto")
    failures.leave(code)
