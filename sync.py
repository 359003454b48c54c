"""One sync round, both sides, step by step (paper section 3: every k trainer steps, trajectories in, weights out).

Every rank runs the round's collectives in the same order, or the job hangs, so the trainer's side (rank 0) and the
searchers' side are written here next to each other, with the same numbered steps:

  0. announce      rank 0 stores the round's (step, Flag) in torchrun's store (comm.announce); a searcher polls for it
                   between generation chunks (comm.poll). In async mode the trainer announces one train step ahead,
                   so the searchers finish their chunks while that step trains; in-flight searchers (inflight=true)
                   poll between engine steps and go on generating until rank 0 reaches the gather (comm.ready).
  1. trajectories  each searcher's Report (samples since the last round, counters, its ShardPlace) -> rank 0
  2. train         synchronous mode only: the trainer trains on exactly that data; the searchers wait in step 3
  3. weights       (WEIGHTS) bucketed broadcast from rank 0 (transport.py) -> engine.load_weights; with REF the
                   searchers' reference model becomes these weights too (TBA', paper section 6). They are the
                   weights after trainer step `step`, or with weight_delay = D after step - D
  4. probe         (PROBE) each searcher's greedy completion of the first training prompt -> rank 0 (check_sync)
  5. evaluation    (EVAL) each searcher's share of the test set -> rank 0 (eval.evaluate). With CURRENT (weight_delay
                   = D, whose step 3 sends weights D steps old) the trainer's current weights are pushed first, so
                   the evaluation is of the policy the run has trained, and the round's weights again after it
After a round with STOP the searchers leave. The trainer's side is split in two (gather: 0-1, push: 3-5) so that
synchronous mode can train between them. A collective of the round that fails, on either side, raises
failures.Stop(where="sync round") with the error: the job must stop, and rank 0's diagnosis names the rank behind it.
"""
import enum
import time
from typing import NamedTuple

import torch

from failures import Stop

PROBE_TOKENS = 16  # check_sync compares this many greedy tokens (long bf16 greedy runs diverge by rounding alone)


class Flag(enum.IntFlag):
    """What a round does besides step 1 (announced with it)."""
    NONE = 0
    WEIGHTS = 1  # 3: push the current weights
    EVAL = 2  # 5: evaluate on the test set
    STOP = 4  # the searchers leave after this round
    REF = 8  # 3: the searchers' pi_ref becomes the pushed weights (TBA')
    PROBE = 16  # 4: greedy probe of every searcher's engine (check_sync)
    CURRENT = 32  # 5: evaluate the trainer's current weights, not the older ones of step 3 (weight_delay)


class ShardPlace(NamedTuple):
    """Where a searcher is in its prompt shard, with its random streams, as of a round: a checkpoint keeps one per
    searcher, so a resumed run continues each shard where it was."""
    n_searchers: int  # the shards are only valid for the same number of searchers
    order: list  # this pass's order of the shard's prompt ids
    pos: int  # the next index into order
    rng: dict  # numpy bit generator state (the shuffles)
    torch_rng: object  # torch CPU RNG state
    engine_rng: object  # the engine's sampling RNG state (None: vLLM keeps its own)


class Report(NamedTuple):
    """What a searcher sends at step 1."""
    samples: list  # buffer.Sample: the trajectories generated since the last round
    tokens: int  # response tokens generated since the last round
    gen_s: float  # seconds spent generating and scoring them (searcher work)
    ref_s: float  # of gen_s: the reference log-probs
    reward_s: float  # of gen_s: decoding and rewards
    window_s: float  # seconds since the last round's hand-over, its evaluation left out: gen_s / window_s is busy
    load_s: float  # seconds from the last round's first weight tensor to the engine loaded (in window_s)
    reward_errors: int  # rewards that raised, timed out or were not finite since the last round
    reward_timeouts: int  # of those, the ones that timed out
    place: ShardPlace


class Gathered(NamedTuple):
    reports: list  # one Report per searcher, rank 1 first
    seconds: float


class Pushed(NamedTuple):
    push_s: float  # step 3
    probes: list  # step 4: each searcher's greedy token ids, or None
    evals: list  # step 5: each searcher's (rows, {metric: [sum, count]}), or None
    seconds: float  # steps 3-5
    eval_s: float  # step 5 alone (the trainer waits while the searchers evaluate)


def flags_for(cfg, step, ref_version, weights=True, evaluate=False, stop=False):
    """The flags of the round at trainer step `step`. The one place that decides TBA's reference reset: every
    ref_reset_every steps the searchers' pi_ref becomes the policy pushed in that round (paper section 6, rho)."""
    flags = Flag.NONE
    if weights:
        flags |= Flag.WEIGHTS | (Flag.PROBE if cfg.check_sync else Flag.NONE)
        if cfg.ref_reset_every and step - ref_version >= cfg.ref_reset_every:
            flags |= Flag.REF
        if evaluate and cfg.weight_delay and step > 0:  # step 3 sends the weights of step - D, the trainer has step's
            flags |= Flag.CURRENT
    return flags | (Flag.EVAL if evaluate else Flag.NONE) | (Flag.STOP if stop else Flag.NONE)


def _collective(fn, *args):
    try:
        return fn(*args)
    except RuntimeError as e:  # gloo / NCCL: a peer died, or timeout_s passed
        raise Stop(where="sync round", error=e) from None


# ---------------------------------------------------------------- the trainer's side (rank 0)


def announce(comm, step, flags):
    """0. The round for trainer step `step` starts now (or, in async mode, after the step being trained)."""
    _collective(comm.announce, step, int(flags))


def trainer_gather(comm, step, flags, announced=False):
    """0-1. Announce the round (unless done already) and gather every searcher's Report."""
    t0 = time.perf_counter()
    if not announced:
        announce(comm, step, flags)
    _collective(comm.ready)  # in-flight searchers generate until rank 0 is here, then join within an engine step
    reports = _collective(comm.gather_object, None)[1:]  # 1
    return Gathered(reports, time.perf_counter() - t0)


def trainer_push(comm, transport, flags, source=None, current=None):
    """3-5. Push the weights (the model's current ones, or `source`: weight_delay); gather the probes and the
    evaluation results the flags ask for. With CURRENT the evaluation is of `current` (None: the model's own weights),
    pushed before it, and `source` is pushed again after it (the searchers send their results after that)."""
    t0 = time.perf_counter()
    push_s = _collective(transport.push, source) if flags & Flag.WEIGHTS else 0.0  # 3
    probes = _collective(comm.gather_object, None)[1:] if flags & Flag.PROBE else None  # 4
    t_eval = time.perf_counter()
    evals = None
    if flags & Flag.EVAL:  # 5
        if flags & Flag.CURRENT:  # the searchers evaluate between the two pushes
            _collective(transport.push, current)
            _collective(transport.push, source)
        evals = _collective(comm.gather_object, None)[1:]
    t_end = time.perf_counter()
    return Pushed(push_s, probes, evals, t_end - t0, t_end - t_eval)


# ---------------------------------------------------------------- a searcher's side (ranks 1..N-1)


def through(named, model):
    """(name, tensor) pairs passed on unchanged, each first copied into `model`'s parameter of that name."""
    params = dict(model.named_parameters())
    for name, tensor in named:
        if name in params:
            with torch.no_grad():
                params[name].copy_(tensor)
        yield name, tensor


def first_arrival(named, at):
    """(name, tensor) pairs passed on unchanged; at[0] becomes the moment the first one arrived."""
    for name, tensor in named:
        if not at:
            at.append(time.perf_counter())
        yield name, tensor


def pull_into(transport, engine, ref_model=None):
    """Receive pushed weights into the engine (and `ref_model` on the way, when given). Returns the seconds from the
    first tensor's arrival to the engine loaded."""
    named, release = _collective(transport.pull)
    at = []  # the first tensor's arrival: the clock starts there, not while the trainer still trains
    named = first_arrival(named, at)
    if ref_model is not None:  # the reference takes each tensor on its way to the engine
        named = through(named, ref_model)
    _collective(engine.load_weights, named)  # the buckets arrive (gloo / nccl) while the engine loads
    _collective(release)  # ipc: the trainer's buffers are free once every engine copied them
    return time.perf_counter() - at[0] if at else 0.0


def searcher_round(comm, transport, flags, report, engine, ref_model, probe_prompt, evaluate, relabel=None):
    """1-5 for one announced round: send `report`, take the new weights into the engine (and the reference model
    with REF), answer the probe, evaluate (`evaluate()` returns this searcher's (rows, totals); with CURRENT on the
    trainer's weights, `relabel(True)` before they load and `relabel(False)` before the round's load again, so that
    tokens an in-flight engine generates meanwhile carry the right version). Returns (loaded, evaluated): the
    seconds step 3 took here from the first tensor's arrival (receiving and loading the weights, not waiting for the
    trainer to send them: in synchronous mode that wait is its train step; 0 without WEIGHTS), and the seconds of
    step 5, CURRENT's two loads included (0 without EVAL)."""
    _collective(comm.gather_object, report)  # 1
    loaded = evaluated = 0.0
    if flags & Flag.WEIGHTS:  # 3
        loaded = pull_into(transport, engine, ref_model if flags & Flag.REF else None)
    if flags & Flag.PROBE:  # 4
        _collective(comm.gather_object, engine.generate([probe_prompt], 1, 0.0, PROBE_TOKENS)[0][0][0])
    if flags & Flag.EVAL:  # 5
        t0 = time.perf_counter()
        relabel = relabel or (lambda current: None)
        if flags & Flag.CURRENT:
            relabel(True)
            pull_into(transport, engine)
        result = evaluate()
        if flags & Flag.CURRENT:
            relabel(False)
            pull_into(transport, engine)
        evaluated = time.perf_counter() - t0
        _collective(comm.gather_object, result)
    return loaded, evaluated
