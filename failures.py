"""Why a job stops, in one place: signals, the stop reasons, which ranks are alive, and the diagnosis that names the
rank behind a failed collective.

Every rank registers "pid/<rank>" (comm.py; trainer ranks under "trainers/", trainer_group.py) in torchrun's store. A
rank that raises writes "failed/<rank>" with its error before it tears down (report), and a searcher that leaves on
SIGTERM / SIGINT writes "left/<rank>" (leave_on_signal), so rank 0 can tell a crash from a requested exit. After a
collective fails, diagnose() waits at most DIAGNOSE_S for one of those keys or a dead process, instead of guessing how
long a dying rank takes to go.
"""
import collections
import dataclasses
import os
import signal
import socket
import sys
import time
import traceback

import checkpoint

DIAGNOSE_S = 5.0  # how long rank 0 waits, after a failed collective, for the rank behind it to show itself
POLL_S = 0.1


class Stop(Exception):
    """The job must stop. `why`: the line the user reads, or None for a failed collective, whose `where` ("sync
    round", "trainer group") and `error` the diagnosis turns into one (reason()). `code`: the exit code. `retry`:
    whether a restarted attempt (max_restarts) may get further."""

    def __init__(self, why=None, code=1, where=None, error=None, retry=True):
        super().__init__(why or f"the {where} failed: {first_line(error)}")
        self.why, self.code, self.where, self.error, self.retry = why, code, where, error, retry


def as_stop(error, out_dir, step):
    """`error` as a Stop: itself, or for any other exception one line naming it, with its traceback written to
    out_dir/error.txt (call it in the except block that caught it)."""
    if isinstance(error, Stop):
        return error
    path = os.path.join(out_dir, "error.txt")
    with open(path, "w") as f:
        f.write(traceback.format_exc())
    return Stop(f"step {step} failed: {type(error).__name__}: {first_line(error)} (traceback: {path})")


def first_line(error):
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


# ---------------------------------------------------------------- restarts (max_restarts)

FINAL = ".final_stop"  # in out_dir: "<exit code> <line>" of a stop that a restart would only repeat


def final(out_dir, line, code):
    """Mark the run stopped for good (a bad config, max_bad_steps): a restarted attempt exits at once. A signal is
    not final: torchrun's agent sends SIGTERM to every rank when one fails, and does not restart when it got one."""
    try:
        with open(os.path.join(out_dir, FINAL), "w") as f:
            f.write(f"{code} {line}\n")
    except OSError:  # no out_dir yet: nothing of the run to protect
        pass


def first_attempt(out_dir):
    """Rank 0 of a job's first attempt, holding out_dir's lock: a final mark an earlier job left is not this job's."""
    path = os.path.join(out_dir, FINAL)
    if not restart_count() and os.path.exists(path):
        os.remove(path)


def restart_count():
    """0 in a job's first attempt, N in its Nth restart (torchrun --max-restarts)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))


def attempt(cfg, rank):
    """The config of this attempt of the job. The first runs as configured. A restart resumes from the newest
    complete checkpoint in out_dir, exits at once with the code of a stop marked final, or with 0 when that
    checkpoint is at `steps` (training finished; a rank failed after the save, e.g. in its teardown). With no
    checkpoint yet it starts over as the first attempt did (resume=auto finds nothing to resume), but never with
    overwrite, which would delete the failed attempt's log (train.claim_out_dir clears that attempt's other files)."""
    n, path = restart_count(), os.path.join(cfg.out_dir, FINAL)
    if not n:
        return cfg
    if os.path.exists(path):
        code, line = open(path).read().split(" ", 1)
        if rank == 0:
            say(f"{line.strip()} (restart {n}: not retried)")
        sys.exit(int(code))
    found = checkpoint.latest(os.path.join(cfg.out_dir, "checkpoints"))
    if found and checkpoint.step_of(found) >= cfg.steps:
        if rank == 0:
            say(f"restart {n} of {cfg.max_restarts}: {found} is at step {cfg.steps}: training finished, nothing to do")
        sys.exit(0)
    if rank == 0:
        say(f"restart {n} of {cfg.max_restarts}: " + ("resuming from the newest complete checkpoint" if found else
                                                      "no complete checkpoint yet: starting over as the first "
                                                      "attempt did"))
    resume = "auto" if found else ("" if cfg.resume == "auto" else cfg.resume)  # "": claim_out_dir clears
    return dataclasses.replace(cfg, resume=resume, overwrite=False)


# ---------------------------------------------------------------- signals


def catch_signals():
    """Trainer ranks: SIGTERM / SIGINT append the signal's name to the returned list; the loop finishes its step,
    saves and exits (rank 0), or waits for rank 0's stop (ranks 1..T-1)."""
    signalled = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: signalled.append(signal.Signals(signum).name))
    return signalled


def mark(store, key, value):
    """store.set that returns only once the store holds the key. A TCPStore client sends a set without waiting for a
    reply, so a rank that sets and exits can be gone before its mark lands, and rank 0 would read a requested exit
    or a reported error as a death; the check after it, on the same connection, is answered only after the set."""
    store.set(key, value)
    store.check([key])


def leave_on_signal(store, rank):
    """Searchers: SIGTERM / SIGINT mark this exit as requested ("left/<rank>", not a crash) and leave at once; the
    trainer saves the checkpoint."""
    def leave(signum, frame):
        try:
            mark(store, f"left/{rank}", str(signum))
        except Exception:  # the store may be gone already (the whole job is stopping)
            pass
        os._exit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, leave)


def report(store, rank, error):
    """A rank that raised: its error under "failed/<rank>" before it tears down, for rank 0's diagnosis."""
    try:
        mark(store, f"failed/{rank}", f"{type(error).__name__}: {first_line(error)}")
    except Exception:  # the store is gone: rank 0 finds the dead process instead
        pass


# ---------------------------------------------------------------- liveness


def process_state(pid):
    """The one-letter state from /proc (R, S, D, T, Z, ...), 'gone', or None when it cannot be told."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"
    except OSError:
        return None


def rank_state(store, key):
    """(pid, state) of the process registered under `key` ("host:pid"): state as process_state for a process on this
    node, None on another node; (None, None) when it never registered."""
    if not store.check([key]):
        return None, None
    host, pid = store.get(key).decode().rsplit(":", 1)
    return pid, process_state(int(pid)) if host == socket.gethostname() else None


def dead(state):
    return state in ("gone", "Z", "X")


def problems(store, prefix, name, ranks, world_rank):
    """(dead or stopped, failed) phrases for the ranks registered under prefix + "pid/<r>": a rank that wrote
    prefix + "failed/<r>" (report), gone yet or not; else a process on this node that is gone or stopped. A rank that
    left on a signal (leave_on_signal) did not die."""
    broken, failed = [], []
    for r in ranks:
        pid, state = rank_state(store, f"{prefix}pid/{r}")
        if store.check([f"{prefix}failed/{r}"]):  # its own error says more than its death after it
            failed.append(f"{name} rank {world_rank(r)} failed: {store.get(f'{prefix}failed/{r}').decode()}")
        elif dead(state) and not store.check([f"{prefix}left/{r}"]):
            broken.append(f"{name} rank {world_rank(r)} (pid {pid}) died")
        elif state == "T":
            broken.append(f"{name} rank {world_rank(r)} (pid {pid}) is stopped")
    return broken, failed


def late(comm):
    """The live searchers that did not join the current round."""
    found = []
    for r in range(1, comm.world):
        pid, state = rank_state(comm.store, f"pid/{r}")
        joined = int(comm.store.get(f"joined/{r}")) if comm.store.check([f"joined/{r}"]) else -1
        if not dead(state) and joined < comm.round - 1:
            found.append(f"searcher rank {r + comm.offset} (pid {pid}) did not join sync round {comm.round - 1}")
    return found


def trainer_problems(store, n_trainers):
    """The trainer ranks 1..T-1 that died, are stopped or failed, one phrase each."""
    broken, failed = problems(store, "trainers/", "trainer", range(1, n_trainers), lambda r: r)
    return broken + failed


def diagnose(comm, wait_s=0.0):
    """Rank 0: the ranks that died or are stopped, else those that failed (report), one phrase each, waiting up to
    `wait_s` for one to show: a rank that was killed closes its sockets before its process is gone. Without any, the
    searchers that did not join the round (their lateness is only a consequence when another rank broke)."""
    deadline = time.monotonic() + wait_s
    while True:
        t_broken, t_failed = problems(comm.store, "trainers/", "trainer", range(1, comm.offset + 1), lambda r: r)
        s_broken, s_failed = problems(comm.store, "", "searcher", range(1, comm.world), lambda r: r + comm.offset)
        found = (t_broken + s_broken) or (t_failed + s_failed)
        if found or time.monotonic() >= deadline:
            return found or late(comm)
        time.sleep(POLL_S)


def trainers_alive(comm, group):
    """After a failure: whether every trainer rank can still take part in a checkpoint (always with T = 1)."""
    if group.size == 1:
        return True
    try:
        return not group.failed and not trainer_problems(comm.store, group.size)
    except Exception:  # the rendezvous store itself is gone
        return False


# ---------------------------------------------------------------- why the run stops


REWARD_WINDOW = 256  # max_reward_errors is judged over at least this many of the latest rewards


class RewardWindow:
    """max_reward_errors' rule: the (rewards, failed) counts of the fewest latest sync rounds that hold REWARD_WINDOW
    rewards. add() after each round; verdict() gives the line that stops the run when more than max_reward_errors of
    them failed (raised, timed out or were not finite), else None."""

    def __init__(self, max_errors):
        self.max_errors = max_errors
        self.rounds = collections.deque()  # (rewards, failed) per round, oldest first

    def state_dict(self):  # checkpoints: a resumed run judges the rounds it had seen before
        return list(self.rounds)

    def load_state_dict(self, rounds):
        self.rounds = collections.deque(rounds)

    def add(self, n, failed):
        if n:
            self.rounds.append((n, failed))
        while len(self.rounds) > 1 and sum(r[0] for r in self.rounds) - self.rounds[0][0] >= REWARD_WINDOW:
            self.rounds.popleft()

    def verdict(self):
        total, bad = sum(r[0] for r in self.rounds), sum(r[1] for r in self.rounds)
        if self.max_errors < 1 and total >= REWARD_WINDOW and bad > self.max_errors * total:
            return (f"the task's rewards keep failing: {bad} of the latest {total} raised, timed out or were not "
                    f"finite (max_reward_errors = {self.max_errors}; the warnings above say why)")
        return None


def stop_reason(cfg, state, signalled, row):
    """After a trainer step: a Stop for a signal, for max_bad_steps updates in a row skipped for a non-finite loss
    or gradient, or for rewards that keep failing; None to go on."""
    if signalled:
        return Stop(f"stopped by {signalled[0]}", 128 + signal.Signals[signalled[0]])  # torchrun's agent decides
    if state.bad_in_a_row >= cfg.max_bad_steps:
        return Stop(f"{cfg.max_bad_steps} updates in a row had a non-finite loss or gradient (last: step "
                    f"{state.step}, loss {row['train/loss']}, grad norm {row['train/grad_norm']}); all were skipped",
                    retry=False)
    failing = state.rewards.verdict()
    if failing:
        return Stop(failing, retry=False)
    return None


def reason(comm, step, signalled, stop):
    """(the line that ends the run, its exit code) for `stop` at trainer step `step`. After a failed collective or
    a signal: a rank that died, is stopped or failed (named), else the signal (exit 128 + its number: resumable),
    else the collective's error. Otherwise the stop's own why."""
    if stop.error is None and not signalled:
        return f"error: {stop}", stop.code
    try:
        found = diagnose(comm, DIAGNOSE_S if stop.error is not None else 0.0)
    except Exception:  # the rendezvous store itself is gone: nothing more to learn
        found = []
    if found:
        return f"error: at step {step}: {'; '.join(found)}", 1
    if signalled:
        return f"stopped by {signalled[0]} at step {step}", 128 + signal.Signals[signalled[0]]
    return f"error: the {stop.where} at step {step} failed: {first_line(stop.error)}", 1


def say(line):
    """A line for the user on stderr, at once."""
    print(line, file=sys.stderr, flush=True)


def leave(code):
    """A stopped rank 0, its checkpoint saved, its log closed and its line said: exit with `code` at once, skipping
    Python's teardown. There the private gloo groups' destructors drain their queues first, and with push_overlap a
    weight broadcast to a searcher that hangs alive mid-push stays queued until timeout_s (or the launcher's SIGKILL:
    torchrun's grace after its SIGTERM) though the run is over."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
