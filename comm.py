"""The control plane between ranks: private gloo process groups built from torchrun's rendezvous store.

We never call torch.distributed.init_process_group here, so the default process group stays free for a vLLM engine
that runs inside a searcher process (vLLM creates its own world of size 1 there and tears it down at shutdown; an
in-process engine that finds the default group already initialised joins it and hangs). Every call here is a real
torch.distributed collective on our own ProcessGroupGloo.

With n_trainers = T > 1 the trainer ranks 1..T-1 take no part here (they train with rank 0 in a default group of their
own, trainer_group.py): a Comm holds rank 0 and the searchers, numbered 0 and 1..N-T (job rank T - 1 + r), so a
searcher sees the same world as with one trainer.

Announcements: rank 0 announces round n as the store key "round/n" = "step,flags"; a searcher checks for that key
between generation chunks (a non-blocking store lookup) and then joins the round's collectives (sync.py says which).
"""
import datetime
import os
import pickle
import socket
import time

import torch
import torch.distributed as dist


WAIT_SLICE_S = 1.0  # Comm.wait_for: the longest a signal waits for its handler while a searcher waits for a round


def connect(timeout):
    """torchrun's rendezvous store (a TCPStore client), under a prefix of this restart's: every rank connects."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun hosts the store itself
    store = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", 29500)),
                          world, is_master=(rank == 0 and not agent_store), timeout=timeout)
    return dist.PrefixStore(f"tba/{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)}", store)


class Comm:
    def __init__(self, timeout_s, n_trainers=1):
        self.offset = n_trainers - 1  # job rank = comm rank + offset for a searcher (trainer ranks 1..T-1 are not here)
        rank = int(os.environ.get("RANK", 0))
        self.rank = rank - self.offset if rank else 0
        self.world = int(os.environ.get("WORLD_SIZE", 1)) - self.offset
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.store = connect(self.timeout)
        self.ctrl = self.new_gloo_group("ctrl")  # collectives: gather of trajectories, object broadcasts, barriers
        self.round = 0  # index of the next sync round
        self.store.set(f"pid/{self.rank}", f"{socket.gethostname()}:{os.getpid()}")  # for failures.diagnose

    def new_gloo_group(self, name):
        return dist.ProcessGroupGloo(dist.PrefixStore(name, self.store), self.rank, self.world, self.timeout)

    # ------------------------------------------------------------ collectives on the ctrl group
    def barrier(self):
        self.ctrl.barrier().wait()

    def gather_object(self, obj):
        """Pickled objects from every rank to rank 0 (a list there, None elsewhere): torch.distributed gather."""
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(self.world)]
        self.ctrl.allgather([sizes], [torch.tensor([data.numel()])]).wait()
        longest = int(max(sizes))
        buf = torch.zeros(longest, dtype=torch.uint8)
        buf[: data.numel()] = data
        opts = dist.GatherOptions()
        opts.rootRank = 0
        if self.rank != 0:
            self.ctrl.gather([], [buf], opts).wait()
            return None
        out = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.world)]
        self.ctrl.gather([out], [buf], opts).wait()
        return [pickle.loads(o[: int(n)].numpy().tobytes()) for o, n in zip(out, sizes)]

    def broadcast_object(self, obj=None):
        """An object from rank 0 to every rank."""
        size = torch.zeros(1, dtype=torch.long)
        if self.rank == 0:
            data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            size[0] = data.numel()
        self.ctrl.broadcast(size, 0).wait()
        if self.rank != 0:
            data = torch.zeros(int(size), dtype=torch.uint8)
        self.ctrl.broadcast(data, 0).wait()
        return pickle.loads(data.numpy().tobytes())

    # ------------------------------------------------------------ announcements
    def announce(self, step, flags):
        """Rank 0: a sync round for trainer step `step`, with integer `flags` (sync.Flag), starts now."""
        self.store.set(f"round/{self.round}", f"{step},{flags}")
        if self.round >= 2:
            self.store.delete_key(f"round/{self.round - 2}")  # every searcher has read it by now
        self.round += 1

    def ready(self):
        """Rank 0, at the gather of the round announced last: searchers that go on generating after the announcement
        (in-flight search, which joins within an engine step) join now."""
        self.store.set(f"ready/{self.round - 1}", "1")
        if self.round >= 3:
            self.store.delete_key(f"ready/{self.round - 3}")  # every searcher has joined that round by now

    def wait_for(self, key):
        """Wait until `key` is in the store, at most timeout_s, in slices of WAIT_SLICE_S: a C++ store wait is not
        interrupted by a signal, and a searcher that waits for a round must still leave on SIGTERM at once (its
        Python handler runs between two slices). Raises RuntimeError past timeout_s or when the store is gone."""
        deadline = time.monotonic() + self.timeout.total_seconds()
        while not self.store.check([key]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"waited timeout_s = {self.timeout.total_seconds():.0f} s for '{key}'")
            try:
                self.store.wait([key], datetime.timedelta(seconds=WAIT_SLICE_S))
            except RuntimeError:  # this slice timed out (or the store is gone: the next check raises)
                pass

    def is_ready(self, block=False):
        """Searchers, after poll() returned a round: has rank 0 reached its gather (`block`: wait until it has)?"""
        key = f"ready/{self.round - 1}"
        if block:
            self.wait_for(key)
        return self.store.check([key])

    def poll(self, block=False):
        """Searchers: (step, integer flags) if the next round was announced, else None (`block`: wait for it)."""
        key = f"round/{self.round}"
        if not block and not self.store.check([key]):
            return None
        self.wait_for(key)
        step, flags = self.store.get(key).decode().split(",")
        self.store.set(f"joined/{self.rank}", str(self.round))  # for failures.diagnose
        self.round += 1
        return int(step), int(flags)

    # ------------------------------------------------------------ start-up in turns (all ranks on one GPU)
    def wait_turn(self, rank=None):
        """Wait until `rank` (default: the previous one) has built what it keeps on the GPU: the trainer its model,
        optimizer and weight buffers, a searcher its engine. vLLM sizes its KV cache from the drop in the whole
        device's free memory over its profiling window, so engines built at the same moment on one GPU break each
        other. At most timeout_s: a rank that died before its turn ends cannot hang the others forever."""
        rank = self.rank - 1 if rank is None else rank
        try:
            self.wait_for(f"built/{rank}")
        except RuntimeError as e:  # DistStoreError: the wait timed out, or the store is gone
            raise RuntimeError(f"rank {self.rank}: rank {rank} did not finish building on the shared GPU within "
                               f"timeout_s ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None

    def end_turn(self):
        self.store.set(f"built/{self.rank}", "1")
