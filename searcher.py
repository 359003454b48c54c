"""Ranks 1..N-1: search. Walk this rank's shard of the training prompts; per prompt visit generate S samples, score
them with the task's reward, and compute their behaviour and reference log-probs; hand them to the trainer at the
next sync round (sync.py).

A Searcher holds what a searcher works with: the engine, the reference model, the task and its prompts, the shard and
the counters. A search strategy drives its generation between rounds, through one interface (idle, work,
until_ready, hand_over, new_weights):
  ChunkedSearch   one engine.generate call per chunk of prompt visits; an announced round is joined between chunks
  InFlightSearch  inflight=true (vLLM): the engine runs one step at a time and generates on until the trainer is at
                  the round's gather; new weights load under running sequences
run: poll for a round; none announced: one unit of the strategy's work; announced: join it (sync.searcher_round).
"""
import dataclasses
import sys
import time

import numpy as np
import torch

import checkpoint
import failures
import sync
from buffer import Sample
from engine import make_engine, position_limit
from eval import evaluate
from policy import encode_prompt, fit_new_tokens, load_model, longest_prompt, sequence_logprobs
from rewards import score, score_batch


_built = {}  # (task, hook) -> the object the task's make_scorer / make_evaluator built in this process


def new_stats():
    """A searcher's counters between two rounds (sync.Report carries them to the trainer). gen_s is all of its
    search work: generation, then scoring (ref_s: reference log-probs, reward_s: decoding and rewards); eval_s is
    its evaluation in a round, kept out of the search's idle ratio, and load_s the round's weight load: both
    happen in a round, after its report, so they go in the next one."""
    return dict(tokens=0, gen_s=0.0, ref_s=0.0, reward_s=0.0, eval_s=0.0, load_s=0.0, reward_errors=0,
                reward_timeouts=0)


def task_hook(task, hook, cfg, device):
    """What the task's optional hook (make_scorer, make_evaluator) builds, once per searcher process, so its models
    load once; None when the task has no such hook (then its per-sample reward / greedy accuracy apply)."""
    if not hasattr(task, hook):
        return None
    key = (task.__name__, hook)
    if key not in _built:
        _built[key] = getattr(task, hook)(cfg, str(device))
    return _built[key]


@dataclasses.dataclass
class Searcher:
    """What one searcher generates, scores and evaluates with; the strategies and the sync round use it."""
    cfg: object
    engine: object
    ref_model: object  # pi_ref: the reference log-probs (frozen unless TBA' resets it)
    tok: object
    task: object
    records: list  # the training records, by prompt id
    prompts: list  # their encoded prompts
    shard: object  # Shard: the prompt ids this searcher visits
    test: list = ()  # this searcher's share of the test set: (id, record) pairs
    device: object = None  # the rank's device, for the task's evaluator
    sft_model: object = None  # eval_kl_sft: the start model, frozen (the reference model itself while it never resets)
    stats: dict = dataclasses.field(default_factory=lambda: new_stats())

    def make_samples(self, flat):
        """Generated responses -> Samples: scored (the task's per-sample reward, or its batched scorer), with
        reference log-probs. flat: (prompt id, response ids, behaviour log-probs, version, version_tokens) each. Adds
        to stats' tokens and the reward counters."""
        cfg, tok, task, records = self.cfg, self.tok, self.task, self.records
        t0 = time.perf_counter()
        logp_ref = sequence_logprobs(self.ref_model, [self.prompts[f[0]] for f in flat], [f[1] for f in flat],
                                     cfg.temperature, cfg.logprob_tokens)
        t1 = time.perf_counter()
        texts = [tok.decode(f[1], skip_special_tokens=True) for f in flat]
        finished = [bool(f[1] and f[1][-1] == tok.eos_token_id) for f in flat]
        scorer = task_hook(task, "make_scorer", cfg, next(self.ref_model.parameters()).device)
        if scorer is None:
            rewards = [score(task, text, records[f[0]]["answer"], self.stats, cfg.reward_timeout_s)
                       for f, text in zip(flat, texts)]
        else:
            rewards = score_batch(scorer, [records[f[0]]["prompt"] for f in flat], texts,
                                  [records[f[0]] for f in flat], finished, self.stats, cfg.reward_timeout_s)
        self.stats["ref_s"] += t1 - t0
        self.stats["reward_s"] += time.perf_counter() - t1
        samples = [Sample(pid, tuple(resp), reward, logp_behav, lp_ref, version, fin, versions)
                   for (pid, resp, logp_behav, version, versions), lp_ref, reward, fin
                   in zip(flat, logp_ref, rewards, finished)]
        self.stats["tokens"] += sum(len(s.response) for s in samples)
        return samples

    def search(self, pids, version):
        """One engine.generate call: S samples for each prompt id, labelled with the weights' `version`, made into
        Samples (make_samples). Adds to stats' tokens, gen_s and the reward counters."""
        t0 = time.perf_counter()
        outs = self.engine.generate([self.prompts[p] for p in pids], self.cfg.S, self.cfg.temperature,
                                    self.cfg.max_new_tokens)
        flat = [(pid, resp, lp, version, ()) for pid, responses in zip(pids, outs) for resp, lp in responses]
        samples = self.make_samples(flat)
        self.stats["gen_s"] += time.perf_counter() - t0
        return samples

    def evaluate_share(self):
        """Step 5 of a round: this searcher's share of the test set, as (rows with their test ids, totals); with
        eval_samples = N also N samples per problem at the run's temperature (pass@k: eval.sampled_eval)."""
        rows, totals = evaluate(self.engine, self.tok, self.task, [record for _, record in self.test],
                                self.cfg.eval_max_new_tokens or self.cfg.max_new_tokens,
                                task_hook(self.task, "make_evaluator", self.cfg, self.device),
                                self.cfg.reward_timeout_s, self.cfg.eval_samples, self.cfg.temperature, self.sft())
        return [{"id": i, **r} for (i, _), r in zip(self.test, rows)], totals

    def sft(self):
        """eval_kl_sft: the start model's per-token log-probs at the run's temperature, as eval.kl_sft takes them."""
        if self.sft_model is None:
            return None
        return lambda prompts, responses: sequence_logprobs(self.sft_model, prompts, responses, self.cfg.temperature,
                                                            self.cfg.logprob_tokens)


class ChunkedSearch:
    """Generation in chunks: a unit of work is one engine.generate call for up to chunk_prompts prompt visits, its
    samples labelled with the weights the last round loaded. Nothing runs between two chunks."""

    def __init__(self, searcher):
        self.searcher = searcher
        self.version = 0  # the trainer step of the engine's weights
        self.samples = []  # generated since the last round

    def idle(self):
        """Whether nothing is being generated, so that a round can be waited for."""
        return True

    def work(self, budget):
        """One chunk of at most `budget` prompt visits; returns how many it made. Synchronous mode on vLLM makes its
        whole share in one call: no round can be joined between its chunks, and vLLM batches by itself (each call
        costs a pass over the engine's steps, so on a small model one call of 4 prompts takes about the time of one
        of 2); the HF engine keeps chunk_prompts, which bounds its batch's memory."""
        cfg = self.searcher.cfg
        whole = not cfg.asynchronous and self.searcher.engine.name == "vllm"
        pids = self.searcher.shard.take(int(budget if whole else min(cfg.chunk_prompts, budget)))
        self.samples += self.searcher.search(pids, self.version)
        return len(pids)

    def until_ready(self, comm, budget):
        """What to do between a round's announcement and the trainer's arrival at its gather: nothing, the round's
        gather waits for the trainer."""

    def hand_over(self):
        """At a round: the samples since the last one, and the shard place to resume from."""
        samples, self.samples = self.samples, []
        return samples, self.searcher.shard.place(self.searcher.engine)

    def new_weights(self, version):
        """The round loads the weights after trainer step `version`; they label the chunks from then on."""
        self.version = version


class InFlightSearch:
    """In-flight search with a vLLM engine (continuous batching with in-flight weight updates, as PipelineRL: Piche et
    al. 2025, arXiv 2509.19128). A unit of work tops the engine up to max_inflight running sequences with prompt
    visits from the shard (a visit: S one-sample requests, so every sample keeps its own version bookkeeping) and
    runs one engine step. Samples that finish are scored chunk_prompts x S at a time between steps, the rest when
    the round takes them; new weights load between two steps while sequences run (engine.version labels them).

    A checkpoint's ShardPlace is the one from before the oldest visit still running: after a resume, the visits that
    were in flight are generated again (at most about a round's worth)."""

    def __init__(self, searcher):
        self.searcher = searcher
        self.cfg, self.engine, self.shard, self.stats = searcher.cfg, searcher.engine, searcher.shard, searcher.stats
        # default: twice a chunk. Fuller batches raise a small model's tokens per engine step on a CPU; the trainer
        # never waits for them to finish (measured: docs/performance.md)
        self.max = self.cfg.max_inflight or 2 * self.cfg.chunk_prompts * self.cfg.S
        self.visits = {}  # visit number -> [the shard's place before the visit, its samples still running]
        self.n_visits = 0
        self.done = []  # finished, not scored yet: (prompt id, response, log-probs, version, version_tokens)
        self.samples = []  # scored, for the next round

    def idle(self):
        """Whether nothing is being generated, so that a round can be waited for."""
        return not self.engine.flight

    def work(self, budget):
        """Start prompt visits (at most `budget`), then one engine step; returns how many visits started."""
        started = self.top_up(budget)
        self.advance()
        return started

    def until_ready(self, comm, budget):
        """Between a round's announcement (a train step ahead) and the trainer's arrival at its gather: generate on
        (at most `budget` more visits), scoring what finishes at once, so that the searcher joins the gather within
        one engine step. Waits for the trainer only when the budget is spent and nothing runs."""
        started = 0
        while not comm.is_ready(block=started >= budget and not self.engine.flight):
            started += self.top_up(budget - started)
            self.advance(round_due=True)

    def top_up(self, budget):
        """Start prompt visits while their S sequences fit within max_inflight (one at least when none runs), at most
        `budget` of them. Returns how many started."""
        started, S = 0, self.cfg.S
        while started < budget and (not self.engine.flight or len(self.engine.flight) + S <= self.max):
            place = self.shard.place(self.engine)
            pid = self.shard.take(1)[0]
            self.visits[self.n_visits] = [place, S]
            self.engine.add((self.n_visits, pid), self.searcher.prompts[pid], S, self.cfg.temperature,
                            self.cfg.max_new_tokens)
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
            self.samples += self.searcher.make_samples(self.done)
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

    def new_weights(self, version):
        """The round loads the weights after trainer step `version`: the label of the tokens generated from the load
        on (the round's probe and evaluation step the running sequences too). Called before the round, as no engine
        step comes between this call and the load."""
        self.engine.version = version


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


def stream_seed(seed, rank):
    """The seed of searcher `rank`'s random streams (its engine's sampling, its shard's order) in the run of `seed`:
    distinct for every (seed, rank). With seed + rank, run s's searcher 2 and run s + 1's searcher 1 would draw the
    same numbers (vLLM on CPU samples from the torch generator the engine's seed starts), so seeds would not be
    independent repeats."""
    return int(np.random.SeedSequence((seed, rank)).generate_state(1)[0])


def build(cfg, comm, ctx, max_len):
    """The frozen reference model and the engine. With every rank on one GPU they are built in turns (comm.wait_turn
    says why), and this searcher goes on once every engine is built: its first generations would move the device's
    free memory during a later engine's profiling."""
    shared = ctx.gpu_mode == "shared"
    if shared:
        comm.wait_turn()
    ref_model = load_model(cfg.model, cfg.dtype, ctx.device).eval()  # pi_ref (frozen unless TBA' resets it)
    engine = make_engine(cfg, ctx.device, stream_seed(cfg.seed, comm.rank), ctx.tok.pad_token_id, ctx.tok.eos_token_id,
                         max_len, rank=comm.rank, engines_per_gpu=comm.world - 1 if shared else 1)
    if shared:
        comm.end_turn()
        comm.wait_turn(comm.world - 1)
    return ref_model, engine


def sft_model(cfg, ref_model, device):
    """eval_kl_sft: the model the KL is to, the start model. The reference model is it while the reference never
    resets (ref_reset_every = 0; with LoRA the reference is the base model, the policy's start); with resets a frozen
    copy of `model`, loaded once more on this searcher. None without eval_kl_sft."""
    if not cfg.eval_kl_sft:
        return None
    return ref_model if not cfg.ref_reset_every else load_model(cfg.model, cfg.dtype, device).eval()


def strategy_for(searcher, rank):
    """In-flight search with inflight=true in async mode on the vLLM engine; chunked search otherwise."""
    cfg, engine = searcher.cfg, searcher.engine
    if cfg.inflight and cfg.asynchronous and engine.name == "vllm":
        return InFlightSearch(searcher)
    if cfg.inflight and cfg.asynchronous and rank == 1:
        print(f"note: inflight=true needs the vLLM engine; the {engine.name} engine generates in chunks",
              file=sys.stderr, flush=True)
    return ChunkedSearch(searcher)


def run(cfg, comm, ctx):
    rank, n_searchers = comm.rank, comm.world - 1
    prompts = [encode_prompt(ctx.tok, r["prompt"]) for r in ctx.train]
    cfg, max_len, warning = fit_lengths(cfg, ctx.tok, prompts, ctx.test)
    if warning and rank == 1:  # the same on every searcher: one line
        print(warning, file=sys.stderr, flush=True)
    failures.leave_on_signal(comm.store, rank)  # SIGTERM / SIGINT: the trainer saves, a searcher leaves quietly
    transport = ctx.make_transport(comm, None)  # first: the trainer starts the build turns after this collective
    ref_model, engine = build(cfg, comm, ctx, max_len)
    shard = Shard(rank, n_searchers, len(ctx.train), stream_seed(cfg.seed, rank))
    if ctx.resume:
        resume(ctx.resume, rank, shard, engine, ref_model)
    test_share = [(i, ctx.test[i]) for i in range(rank - 1, len(ctx.test), n_searchers)]
    searcher = Searcher(cfg, engine, ref_model, ctx.tok, ctx.task, ctx.train, prompts, shard, test_share, ctx.device,
                        sft_model(cfg, ref_model, ctx.device))
    strategy, stats = strategy_for(searcher, rank), searcher.stats
    if hasattr(ctx.task, "warm_up"):  # e.g. a helper process to start: before the first reward, without its limit
        ctx.task.warm_up()
    # prompt visits per round before this searcher waits for the next round: in synchronous mode exactly its share of
    # the batch (B / n_searchers; the first B % n_searchers searchers take one more); in async mode
    # max_prompts_per_round (0 = no cap). It waits for the first round before generating in synchronous mode and
    # after a resume (that round brings the checkpoint's weights).
    share = cfg.B // n_searchers + (rank - 1 < cfg.B % n_searchers)
    limit = share if not cfg.asynchronous else (cfg.max_prompts_per_round or float("inf"))
    budget = 0 if not cfg.asynchronous or ctx.resume else limit  # prompt visits left to start before the next round
    handed = time.perf_counter()  # the last hand-over of samples (sync.Report's window_s counts from it)
    while True:
        if not cfg.asynchronous and budget > 0:  # synchronous mode joins a round only with its whole share generated
            announced = None
        else:  # between two units of work; waiting only with the budget spent and nothing generating
            announced = comm.poll(block=budget <= 0 and strategy.idle())
        if announced is None:
            budget -= strategy.work(budget)
            continue
        step, flags = announced[0], sync.Flag(announced[1])
        strategy.until_ready(comm, budget)
        samples, place = strategy.hand_over()
        if flags & sync.Flag.WEIGHTS:  # the weights after trainer step `step`, or step - D with weight_delay = D
            strategy.new_weights(max(step - cfg.weight_delay, 0))
        now = time.perf_counter()  # the window: since the last hand-over, its round's evaluation left out
        report = sync.Report(samples, stats["tokens"], stats["gen_s"], stats["ref_s"], stats["reward_s"],
                             now - handed - stats["eval_s"], stats["load_s"], stats["reward_errors"],
                             stats["reward_timeouts"], place)
        handed = now
        stats.update(new_stats())
        stats["load_s"], stats["eval_s"] = sync.searcher_round(  # eval_s: left out of the next report's window
            comm, transport, flags, report, engine, ref_model, prompts[0], searcher.evaluate_share,
            lambda current: strategy.new_weights(step if current else max(step - cfg.weight_delay, 0)))
        budget = limit
        if flags & sync.Flag.STOP:
            break
    transport.close()
    if hasattr(engine, "shutdown"):
        engine.shutdown()
