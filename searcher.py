"""Ranks 1..N-1: search. Walk this rank's shard of the training prompts; per prompt visit generate S samples, score
them with the task's reward, and compute their behaviour and reference log-probs; hand them to the trainer at the
next sync round (sync.py). Between generation chunks, join a round if one was announced; with inflight=true (vLLM),
between engine steps once the trainer is at the round's gather, loading new weights under running sequences (InFlight).
"""
import dataclasses
import os
import signal
import sys
import time

import numpy as np
import torch

import checkpoint
import sync
from buffer import Sample
from engine import make_engine, position_limit
from eval import evaluate
from policy import encode_prompt, fit_new_tokens, load_model, longest_prompt, token_logprobs
from rewards import warn_task_error


def score(task, text, answer, stats):
    """The task's reward; a reward function that raises counts as 0 with a warning (the first few times) and a
    counter (search/reward_errors), never a crash."""
    try:
        return float(task.reward(text, answer))
    except Exception as e:
        stats["reward_errors"] += 1  # cumulative over the run
        warn_task_error("reward", e, f"completion {text[:80]!r}", "counted as 0 (search/reward_errors)")
        return 0.0


def score_batch(scorer, prompts, texts, records, finished, stats):
    """The task's batched scorer (make_scorer); a batch that raises (or returns the wrong number of rewards) counts
    as 0 for every sample in it, with a warning (the first few times) and the search/reward_errors counter."""
    try:
        rewards = [float(r) for r in scorer.score(prompts, texts, records, finished)]
        if len(rewards) != len(texts):
            raise ValueError(f"{len(rewards)} rewards for {len(texts)} completions")
        return rewards
    except Exception as e:
        stats["reward_errors"] += len(texts)  # cumulative over the run
        warn_task_error("task's scorer", e, f"a batch of {len(texts)}", "counted as 0 (search/reward_errors)")
        return [0.0] * len(texts)


_built = {}  # (task, hook) -> the object the task's make_scorer / make_evaluator built in this process


def task_hook(task, hook, cfg, device):
    """What the task's optional hook (make_scorer, make_evaluator) builds, once per searcher process, so its models
    load once; None when the task has no such hook (then its per-sample reward / greedy accuracy apply)."""
    if not hasattr(task, hook):
        return None
    key = (task.__name__, hook)
    if key not in _built:
        _built[key] = getattr(task, hook)(cfg, str(device))
    return _built[key]


def make_samples(cfg, ref_model, tok, task, records, prompts, flat, stats):
    """Generated responses -> Samples: scored (the task's per-sample reward, or its batched scorer), with reference
    log-probs. flat: (prompt id, response ids, behaviour log-probs, version, version_tokens) each. Adds to stats'
    tokens and reward_errors."""
    logp_ref = []
    with torch.no_grad():
        for s in range(0, len(flat), 64):
            part = flat[s : s + 64]
            lp, mask = token_logprobs(ref_model, [prompts[f[0]] for f in part], [f[1] for f in part],
                                      cfg.temperature)
            logp_ref += [lp[i][mask[i]].float().cpu().numpy() for i in range(len(part))]
    texts = [tok.decode(f[1], skip_special_tokens=True) for f in flat]
    finished = [bool(f[1] and f[1][-1] == tok.eos_token_id) for f in flat]
    scorer = task_hook(task, "make_scorer", cfg, next(ref_model.parameters()).device)
    if scorer is None:
        rewards = [score(task, text, records[f[0]]["answer"], stats) for f, text in zip(flat, texts)]
    else:
        rewards = score_batch(scorer, [records[f[0]]["prompt"] for f in flat], texts,
                              [records[f[0]] for f in flat], finished, stats)
    samples = [Sample(pid, tuple(resp), reward, logp_behav, lp_ref, version, fin, versions)
               for (pid, resp, logp_behav, version, versions), lp_ref, reward, fin
               in zip(flat, logp_ref, rewards, finished)]
    stats["tokens"] += sum(len(s.response) for s in samples)
    return samples


def search_chunk(cfg, engine, ref_model, tok, task, records, prompts, pids, version, stats):
    """One generation call: S samples for each prompt id, scored, with behaviour and reference log-probs
    (make_samples). Adds to stats' tokens, gen_s and reward_errors."""
    t0 = time.perf_counter()
    outs = engine.generate([prompts[p] for p in pids], cfg.S, cfg.temperature, cfg.max_new_tokens)
    flat = [(pid, resp, lp, version, ()) for pid, group in zip(pids, outs) for resp, lp in group]
    samples = make_samples(cfg, ref_model, tok, task, records, prompts, flat, stats)
    stats["gen_s"] += time.perf_counter() - t0
    return samples


class InFlight:
    """In-flight search with a vLLM engine (continuous batching with in-flight weight updates, as PipelineRL: Piche et
    al. 2025, arXiv 2509.19128). The engine runs one step at a time and is kept at max_inflight running sequences,
    topped up with prompt visits from the shard (a visit: S one-sample requests, so every sample keeps its own
    version bookkeeping). Samples that finish are scored chunk_prompts x S at a time between steps, the rest when
    the round takes them; new weights load between two steps while sequences run (engine.version labels them).

    A checkpoint's ShardPlace is the one from before the oldest visit still running: after a resume, the visits that
    were in flight are generated again (at most about a round's worth)."""

    def __init__(self, cfg, engine, shard, make, stats):
        self.cfg, self.engine, self.shard, self.make, self.stats = cfg, engine, shard, make, stats
        # default: twice a chunk. Fuller batches raise a small model's tokens per engine step on a CPU; the trainer
        # never waits for them to finish (measured: docs/performance.md)
        self.max = cfg.max_inflight or 2 * cfg.chunk_prompts * cfg.S
        self.visits = {}  # visit number -> [the shard's place before the visit, its samples still running]
        self.n_visits = 0
        self.done = []  # finished, not scored yet: (prompt id, response, log-probs, version, version_tokens)
        self.samples = []  # scored, for the next round

    def top_up(self, budget, prompts):
        """Start prompt visits while their S sequences fit within max_inflight (one at least when none runs), at most
        `budget` of them. Returns how many started."""
        started, S = 0, self.cfg.S
        while started < budget and (not self.engine.flight or len(self.engine.flight) + S <= self.max):
            place = self.shard.place(self.engine)
            pid = self.shard.take(1)[0]
            self.visits[self.n_visits] = [place, S]
            self.engine.add((self.n_visits, pid), prompts[pid], S, self.cfg.temperature, self.cfg.max_new_tokens)
            self.n_visits += 1
            started += 1
        return started

    def advance(self, round_due=False):
        """One engine step; the samples that finished (in it, or in a round's probe or evaluation) are kept, and
        scored once chunk_prompts x S wait, or at once when a round is due (announced): then the trainer, when it
        reaches the gather, waits for the rest of one engine step and that step's samples only."""
        t0 = time.perf_counter()
        self.engine.step()
        self.collect()
        if len(self.done) >= self.cfg.chunk_prompts * self.cfg.S or round_due:
            self.score()
        self.stats["gen_s"] += time.perf_counter() - t0

    def collect(self):
        for (visit, pid), tokens, lp, versions in self.engine.finished:
            self.visits[visit][1] -= 1
            if not self.visits[visit][1]:
                del self.visits[visit]
            self.done.append((pid, tokens, lp, versions[-1][0], versions))
        self.engine.finished = []

    def score(self):
        if self.done:
            self.samples += self.make(self.done)
            self.done = []

    def hand_over(self):
        """At a round: the samples that finished since the last one, all scored, and the shard place to resume from."""
        t0 = time.perf_counter()
        self.collect()
        self.score()
        self.stats["gen_s"] += time.perf_counter() - t0
        samples, self.samples = self.samples, []
        place = next(iter(self.visits.values()))[0] if self.visits else self.shard.place(self.engine)
        return samples, place


class Shard:
    """This searcher's share of the training prompts (round-robin over ranks, as in the reference code), visited in a
    random order that is reshuffled after each pass."""

    def __init__(self, rank, n_searchers, n_prompts, seed):
        self.n_searchers = n_searchers
        self.ids = list(range(rank - 1, n_prompts, n_searchers))
        self.rng = np.random.default_rng(seed)
        self.order, self.pos = self.rng.permutation(self.ids).tolist(), 0

    def take(self, n):
        """The next n prompt ids."""
        pids = []
        for _ in range(n):
            if self.pos == len(self.order):
                self.order, self.pos = self.rng.permutation(self.ids).tolist(), 0
            pids.append(self.order[self.pos])
            self.pos += 1
        return pids

    def place(self, engine):
        return sync.ShardPlace(self.n_searchers, list(self.order), self.pos, self.rng.bit_generator.state,
                               torch.get_rng_state(), engine.get_rng_state())

    def restore(self, place, engine):
        """Continue where a checkpoint's round left this shard, with the same random streams."""
        self.order, self.pos = list(place.order), place.pos
        self.rng.bit_generator.state = place.rng
        torch.set_rng_state(place.torch_rng)
        engine.set_rng_state(place.engine_rng)


def resume(path, rank, shard, engine, ref_model):
    """A searcher's part of resume=auto: its shard place and TBA's reset reference, as the checkpoint has them."""
    place = (checkpoint.load(path, "searchers.pth") or {}).get(rank)
    if place is not None and place.n_searchers == shard.n_searchers:
        shard.restore(place, engine)
    else:
        print(f"warning: rank {rank}: the checkpoint has no shard position for {shard.n_searchers} searchers; "
              "starting the shard afresh", file=sys.stderr, flush=True)
    ref_weights = checkpoint.load(path, "ref.pth")
    if ref_weights is not None:
        ref_model.load_state_dict(ref_weights)


def fit_lengths(cfg, tok, prompts, test):
    """cfg with max_new_tokens and eval_max_new_tokens lowered to what the model's positions leave after the longest
    prompt the engine will see (the training prompts, the probe among them, and the test prompts: all of them, so
    every searcher gets the same cap), the engine's max_model_len, and the warning line when it lowered them."""
    longest = max(max(map(len, prompts)), longest_prompt(tok, [r["prompt"] for r in test]))
    wanted = max(cfg.max_new_tokens, cfg.eval_max_new_tokens, sync.PROBE_TOKENS if cfg.check_sync else 0)
    new, max_len, warning = fit_new_tokens(position_limit(cfg.model, cfg.engine), longest, wanted)
    cfg = dataclasses.replace(cfg, max_new_tokens=min(cfg.max_new_tokens, new),
                              eval_max_new_tokens=min(cfg.eval_max_new_tokens, new))
    return cfg, max_len, warning


def build(cfg, comm, ctx, max_len):
    """The frozen reference model and the engine. With every rank on one GPU they are built in turns (comm.wait_turn
    says why), and this searcher goes on once every engine is built: its first generations would move the device's
    free memory during a later engine's profiling."""
    shared = ctx.gpu_mode == "shared"
    if shared:
        comm.wait_turn()
    ref_model = load_model(cfg.model, cfg.dtype, ctx.device).eval()  # pi_ref (frozen unless TBA' resets it)
    engine = make_engine(cfg, ctx.device, cfg.seed + comm.rank, ctx.tok.pad_token_id, ctx.tok.eos_token_id, max_len,
                         rank=comm.rank, engines_per_gpu=comm.world - 1 if shared else 1)
    if shared:
        comm.end_turn()
        comm.wait_turn(comm.world - 1)
    return ref_model, engine


def run(cfg, comm, ctx):
    rank, n_searchers = comm.rank, comm.world - 1
    task, train, test, tok, device = ctx.task, ctx.train, ctx.test, ctx.tok, ctx.device
    prompts = [encode_prompt(tok, r["prompt"]) for r in train]
    my_test = list(range(rank - 1, len(test), n_searchers))
    cfg, max_len, warning = fit_lengths(cfg, tok, prompts, test)
    if warning and rank == 1:  # the same on every searcher: one line
        print(warning, file=sys.stderr, flush=True)
    eval_tokens = cfg.eval_max_new_tokens or cfg.max_new_tokens

    def leave(signum, frame):  # SIGTERM / SIGINT: the trainer saves a checkpoint; a searcher just leaves, quietly
        comm.leaving(signum)
        os._exit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, leave)
    weights = ctx.make_transport(comm, None)  # first: the trainer starts the build turns after this collective
    ref_model, engine = build(cfg, comm, ctx, max_len)
    shard = Shard(rank, n_searchers, len(train), cfg.seed + rank)
    if ctx.resume:
        resume(ctx.resume, rank, shard, engine, ref_model)

    def evaluate_my_share():  # step 5 of a round: this rank's share of the test set
        rows, totals = evaluate(engine, tok, task, [test[i] for i in my_test], eval_tokens,
                                task_hook(task, "make_evaluator", cfg, device))
        return [{"id": i, **r} for i, r in zip(my_test, rows)], totals

    pending, version = [], 0  # trajectories generated since the last round; the weights' trainer step
    stats = dict(tokens=0, gen_s=0.0, reward_errors=0)
    # prompt visits per round before this searcher waits for the next round: in synchronous mode exactly its share of
    # the batch; in async mode max_prompts_per_round (0 = no cap). It waits for the first round before generating in
    # synchronous mode and after a resume (that round brings the checkpoint's weights).
    limit = cfg.B // n_searchers if not cfg.asynchronous else (cfg.max_prompts_per_round or float("inf"))
    done_prompts = limit if not cfg.asynchronous or ctx.resume else 0
    flight = None  # in-flight search (InFlight), or None: generation in chunks
    if cfg.inflight and cfg.asynchronous and engine.name == "vllm":
        flight = InFlight(cfg, engine, shard, lambda flat: make_samples(cfg, ref_model, tok, task, train, prompts,
                                                                        flat, stats), stats)
    elif cfg.inflight and cfg.asynchronous and rank == 1:
        print(f"note: inflight=true needs the vLLM engine; the {engine.name} engine generates in chunks",
              file=sys.stderr, flush=True)
    while True:
        if flight is not None:  # in flight: poll between engine steps (waiting only when nothing runs)
            announced = comm.poll(block=done_prompts >= limit and not engine.flight)
        else:  # synchronous mode joins a round only with its whole share generated; async mode polls between chunks
            share_left = not cfg.asynchronous and done_prompts < limit
            announced = None if share_left else comm.poll(block=done_prompts >= limit)
        if announced is None and flight is not None:  # top up with prompt visits, then one engine step
            done_prompts += flight.top_up(limit - done_prompts, prompts)
            flight.advance()
            continue
        if announced is None:
            pids = shard.take(int(min(cfg.chunk_prompts, limit - done_prompts)))
            pending += search_chunk(cfg, engine, ref_model, tok, task, train, prompts, pids, version, stats)
            done_prompts += len(pids)
            continue
        step, flags = announced[0], sync.Flag(announced[1])
        while flight is not None and not comm.is_ready(block=done_prompts >= limit and not engine.flight):
            # announced a train step ahead: generate on until the trainer is at the gather (joins within one step)
            done_prompts += flight.top_up(limit - done_prompts, prompts)
            flight.advance(round_due=True)
        pending, place = flight.hand_over() if flight is not None else (pending, shard.place(engine))
        if flight is not None and flags & sync.Flag.WEIGHTS:
            # the label of the tokens generated from the load on (the round's probe and evaluation step the running
            # sequences too); set here, as no engine step comes between this line and the load
            engine.version = max(step - cfg.weight_delay, 0)
        report = sync.Report(pending, stats["tokens"], stats["gen_s"], stats["reward_errors"], place)
        sync.searcher_round(comm, weights, flags, report, engine, ref_model, prompts[0], evaluate_my_share)
        pending, done_prompts = [], 0
        stats.update(tokens=0, gen_s=0.0)
        if flags & sync.Flag.WEIGHTS:  # the weights after trainer step `step`, or step - D with weight_delay = D
            version = max(step - cfg.weight_delay, 0)
        if flags & sync.Flag.STOP:
            break
    weights.close()
    if hasattr(engine, "shutdown"):
        engine.shutdown()
