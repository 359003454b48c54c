"""The sync round's protocol (sync.py) and the trainer's pure pieces around it, without processes: both sides of a
round make the same collectives in the same order for every combination of flags, the reference reset is decided in
one place, and evaluation shares merge into one set of metrics."""
import itertools
import math
import time

import pytest
import torch

import sync
from config import Config
from eval import merge_evals
from failures import Stop
from sync import Flag


class Recorder:
    """Stands in for comm (gather_object, announce), the weight transport (push, pull) and an engine, and records
    each collective a side makes."""

    def __init__(self, rank):
        self.rank, self.calls = rank, []

    def announce(self, step, flags):
        self.calls.append("announce")

    def ready(self):  # a store key, not a collective
        pass

    def gather_object(self, obj):
        # a searcher's gathers are named by what it sends: its report (str here), probe tokens (list), eval (tuple)
        kind = {str: " report", list: " probe", tuple: " eval"}.get(type(obj), "")
        self.calls.append("gather" + kind)
        return [None, obj, obj] if self.rank == 0 else None

    def push(self, source=None):
        self.calls.append("weights")
        return 0.0

    def pull(self):
        self.calls.append("weights")
        return iter([("w", torch.tensor(1.0))]), lambda: self.calls.append("weights done")

    def load_weights(self, named):
        for _ in named:  # a real engine reads the transport's stream to its end
            pass

    def generate(self, prompts, n, temperature, max_new_tokens):
        return [[([1, 2], None)]]


class RefModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(0.0))

    @property
    def loaded(self):
        return self.w.item() == 1.0


@pytest.mark.parametrize("bits", list(itertools.product([0, 1], repeat=5)))
def test_both_sides_make_the_same_collectives_in_the_same_order(bits):
    flags = Flag.NONE
    for on, flag in zip(bits, (Flag.WEIGHTS, Flag.EVAL, Flag.PROBE, Flag.REF, Flag.CURRENT)):
        flags |= flag if on else Flag.NONE
    trainer = Recorder(0)
    sync.trainer_gather(trainer, 7, flags)
    sync.trainer_push(trainer, trainer, flags)
    searcher, ref = Recorder(1), RefModel()
    labels = []  # CURRENT: the evaluation's weights in, evaluated, the round's back in, each load labelled first
    evaluate = lambda: labels.append("evaluate") or ([], {})  # noqa: E731
    sync.searcher_round(searcher, searcher, flags, "report", searcher, ref, [1], evaluate, labels.append)
    current = bool(flags & Flag.EVAL and flags & Flag.CURRENT)
    expected = ["gather report"] + ["weights"] * bool(flags & Flag.WEIGHTS) + ["gather probe"] * bool(flags & Flag.PROBE) \
        + ["weights", "weights"] * current + ["gather eval"] * bool(flags & Flag.EVAL)
    assert labels == ([True, "evaluate", False] if current else ["evaluate"] * bool(flags & Flag.EVAL))
    assert [c for c in searcher.calls if c != "weights done"] == expected
    assert trainer.calls == ["announce"] + [c.split()[0] for c in expected]
    # the reference model takes the pushed weights only with REF and WEIGHTS, and the IPC release comes after loading
    assert ref.loaded == bool(flags & Flag.REF and flags & Flag.WEIGHTS)
    if flags & Flag.WEIGHTS:
        assert searcher.calls[searcher.calls.index("weights") + 1] == "weights done"


class SlowSender(Recorder):
    """The trainer sends its first tensor 0.3 s after the round opens (in synchronous mode it trains meanwhile); the
    engine then takes 0.05 s per tensor. The seconds pass on a clock of the test's own (sync.time.perf_counter), not
    the box's, so a loaded machine cannot stretch them."""

    def __init__(self, rank):
        super().__init__(rank)
        self.now = 100.0

    def perf_counter(self):
        return self.now

    def pull(self):
        def stream():
            self.now += 0.3
            yield from (("w", torch.tensor(1.0)), ("v", torch.tensor(2.0)))
        return stream(), lambda: None

    def load_weights(self, named):
        for _ in named:
            self.now += 0.05


def test_the_weight_load_is_timed_from_the_first_tensor_not_from_the_round(monkeypatch):
    """search/load_seconds: receiving and loading (2 x 0.05 s here), not the wait for the trainer (0.3 s)."""
    searcher = SlowSender(1)
    monkeypatch.setattr(sync, "time", searcher)
    loaded, evaluated = sync.searcher_round(searcher, searcher, Flag.WEIGHTS, "report", searcher, RefModel(), [1],
                                            lambda: ([], {}))
    assert loaded == pytest.approx(0.1) and evaluated == 0.0
    assert sync.searcher_round(searcher, searcher, Flag.EVAL, "report", searcher, RefModel(), [1],
                               lambda: ([], {}))[0] == 0.0


def test_an_evaluation_of_the_current_weights_counts_both_its_loads_as_evaluation(monkeypatch):
    """weight_delay's CURRENT round loads the trainer's weights, evaluates, and loads the round's back: all three are
    step 5, which the searcher leaves out of its search window (search/idle_ratio), not idle time."""
    searcher = SlowSender(1)
    monkeypatch.setattr(sync, "time", searcher)

    def evaluate():
        searcher.now += 0.1
        return [], {}
    loaded, evaluated = sync.searcher_round(searcher, searcher, Flag.EVAL | Flag.CURRENT, "report", searcher,
                                            RefModel(), [1], evaluate)
    assert loaded == 0.0 and evaluated == pytest.approx(2 * 0.4 + 0.1)  # two loads of 0.3 + 2 x 0.05 s, the evaluation
    assert sync.searcher_round(searcher, searcher, Flag.EVAL, "report", searcher, RefModel(), [1],
                               evaluate)[1] == pytest.approx(0.1)  # no load in it (each would add 0.4 s)


def test_a_failed_collective_stops_the_job_on_either_side():
    class Dead(Recorder):
        def gather_object(self, obj):
            raise RuntimeError("Connection closed by peer")
    with pytest.raises(Stop) as e:
        sync.trainer_gather(Dead(0), 3, Flag.WEIGHTS)
    assert e.value.where == "sync round" and "Connection closed by peer" in str(e.value.error)
    with pytest.raises(Stop) as e:  # a searcher's collective: rank 0's diagnosis names the rank behind it
        sync.searcher_round(Dead(1), Dead(1), Flag.WEIGHTS, "report", Dead(1), RefModel(), [1], lambda: ([], {}))
    assert e.value.where == "sync round"


def test_flags_decide_the_reference_reset_every_rho_steps():
    cfg = Config(ref_reset_every=50)
    assert sync.flags_for(cfg, 49, 0) == Flag.WEIGHTS
    assert sync.flags_for(cfg, 50, 0) == Flag.WEIGHTS | Flag.REF
    assert sync.flags_for(cfg, 60, 50) == Flag.WEIGHTS
    assert sync.flags_for(cfg, 100, 50, evaluate=True, stop=True) == Flag.WEIGHTS | Flag.REF | Flag.EVAL | Flag.STOP
    assert sync.flags_for(Config(), 10**6, 0) == Flag.WEIGHTS  # 0: the reference stays frozen
    assert sync.flags_for(Config(check_sync=True), 2, 0) == Flag.WEIGHTS | Flag.PROBE
    assert sync.flags_for(cfg, 50, 0, weights=False, evaluate=True) == Flag.EVAL  # no push, no reset
    # weight_delay: an evaluation after the start is of the trainer's weights, not the delayed ones step 3 sends
    delayed = Config(weight_delay=3)
    assert sync.flags_for(delayed, 5, 0, evaluate=True) == Flag.WEIGHTS | Flag.EVAL | Flag.CURRENT
    assert sync.flags_for(delayed, 5, 0) == Flag.WEIGHTS
    assert sync.flags_for(delayed, 0, 0, evaluate=True) == Flag.WEIGHTS | Flag.EVAL  # the start: the same weights


def test_merge_evals_adds_sums_and_counts_over_searchers():
    evals = [([{"id": 2, "correct": True}, {"id": 0, "correct": False}], {"accuracy": [1, 2], "win_rate": [0.5, 1]}),
             ([{"id": 1, "correct": True}], {"accuracy": [1, 1], "perplexity": [0.0, 0]})]
    metrics, rows = merge_evals(evals)
    assert [r["id"] for r in rows] == [0, 1, 2]
    assert metrics["accuracy"] == pytest.approx(2 / 3) and metrics["win_rate"] == 0.5
    assert math.isnan(metrics["perplexity"])  # counted by nobody
    assert merge_evals([]) == ({}, [])


def test_a_searcher_waiting_for_a_round_still_handles_a_signal_at_once():
    """A C++ store wait is not interrupted by a signal: a searcher blocked in poll() for the next round must wait in
    slices, so that its SIGTERM handler (leave at once) runs within a slice, not after timeout_s."""
    import datetime
    import signal
    import time

    import torch.distributed as dist

    from comm import WAIT_SLICE_S, Comm

    class Left(Exception):
        pass

    def leave(signum, frame):
        raise Left()

    comm = Comm.__new__(Comm)
    comm.store = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=60))
    comm.timeout, comm.round, comm.rank = datetime.timedelta(seconds=60), 0, 1
    before = signal.signal(signal.SIGALRM, leave)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        t0 = time.monotonic()
        with pytest.raises(Left):
            comm.poll(block=True)  # no round is ever announced
        assert time.monotonic() - t0 < 0.3 + WAIT_SLICE_S + 1.0
        comm.store.set("round/0", "4,1")
        assert comm.poll(block=True) == (4, 1) and comm.poll() is None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


class Reporting:
    """comm for rank 0 with two searchers that send the given Reports."""
    rank, world = 0, 3

    def __init__(self, reports):
        self.reports = reports

    def announce(self, step, flags):
        pass

    def ready(self):
        pass

    def gather_object(self, obj):
        return [None, *self.reports]


def test_a_round_breaks_the_searchers_time_down_and_says_how_idle_they_were():
    """search/generate_seconds, ref_seconds, reward_seconds: per searcher, generation apart from the scoring that
    gen_s includes; search/load_seconds: the last round's weight load; search/idle_ratio: the share of both
    searchers' windows spent on none of it."""
    import types
    import failures
    import runlog
    import trainer
    from buffer import ReplayBuffer, Sample
    sample = Sample(0, (5, 6), 1.0, -1.0, -1.2, 0, True, ())
    reports = [sync.Report([sample], 100, 2.0, 0.5, 0.3, 4.0, 0.1, 0, 0, None),  # busy 2 s of 4
               sync.Report([], 50, 1.0, 0.2, 0.2, 4.0, 0.3, 0, 0, None)]  # busy 1 s of 4
    state = types.SimpleNamespace(buffer=ReplayBuffer(Config()), trained=0, generated=0, step=1, places={},
                                  timers=runlog.Timers(), rewards=failures.RewardWindow(0.5))
    run = trainer.Run(Config(), Reporting(reports), None, None, state, None, [])
    row = trainer.gather(run, 1, Flag.NONE)
    assert row["search/generate_seconds"] == pytest.approx(((2.0 - 0.5 - 0.3) + (1.0 - 0.2 - 0.2)) / 2)
    assert row["search/ref_seconds"] == pytest.approx(0.35) and row["search/reward_seconds"] == pytest.approx(0.25)
    assert row["search/idle_ratio"] == pytest.approx(1 - 3.0 / 8.0)
    assert row["search/load_seconds"] == pytest.approx(0.2)
    assert row["search/tokens_per_s"] == pytest.approx(150 / 3.0) and row["sync/samples"] == 1
    # a round whose row is not logged (wait_for_fresh's) hands its weight-load seconds on to the next logged row
    run.comm.reports = [sync.Report([], 0, 0.0, 0.0, 0.0, 1.0, 0.4, 0, 0, None)] * 2
    assert trainer.gather(run, 1, Flag.NONE, logged=False)["search/load_seconds"] == pytest.approx(0.4)
    run.comm.reports = [sync.Report([], 0, 0.0, 0.0, 0.0, 1.0, 0.0, 0, 0, None)] * 2
    assert trainer.gather(run, 1, Flag.NONE, logged=False)["search/load_seconds"] == pytest.approx(0.4)
    assert trainer.gather(run, 2, Flag.NONE)["search/load_seconds"] == pytest.approx(0.4)
    assert trainer.gather(run, 3, Flag.NONE)["search/load_seconds"] == 0.0
