"""Weight transport, trainer (rank 0) -> every searcher: the device-specific half of a sync round.

Weights travel in the engine dtype as a few flat buckets (at most bucket_mb each), not one collective per tensor:
  gloo  CPU ranks: torch.distributed broadcast of each bucket over a private gloo group
  nccl  one GPU per rank: broadcast of each bucket over a private NCCL group
        Both stream: each side holds two bucket buffers, not a copy of the model. The trainer fills one while the
        other's broadcast is in flight; a searcher receives the next bucket while the engine loads the current one.
  ipc   ranks sharing one GPU (NCCL refuses that): the trainer's two bucket buffers are shared once through CUDA
        IPC handles; each bucket is a device copy into one of them and a barrier, after which the searchers copy it
        out (and synchronise) while the trainer fills the other; the next barrier frees the first again
The receiver yields (name, tensor) pairs in Hugging Face checkpoint naming; the engine loads them as they come.
push_overlap (gloo / nccl): rank 0 fills every bucket into a snapshot of the whole model and starts all their
broadcasts at once; push returns while they run and the next train step goes on, and the next push (or close) waits
for them first (close(failed=True) does not: see close). The searchers' side is the same either way.
"""
import os
import time

import torch
import torch.distributed as dist

from config import ConfigError
from policy import DTYPES, base_weights, merged_weights


CHECK_NCCL_OVERLAP = "TBA_CHECK_NCCL_OVERLAP"  # =1 lifts the refusal of push_overlap beside an NCCL trainer group


def pick_transport(requested, device, gpu_mode, one_node=True, overlap=False, n_trainers=1):
    """The weight transport for this layout (gpu_mode from train.gpu_layout): auto is gloo on CPU, nccl with a GPU per
    rank, ipc with one GPU for every rank. An explicit choice that cannot work there raises ConfigError, and so does
    push_overlap with ipc, or with nccl and n_trainers > 1 (check_nccl_overlap)."""
    kind = requested
    if requested == "auto":
        kind = "gloo" if device == "cpu" else "ipc" if gpu_mode == "shared" else "nccl"
    if kind in ("nccl", "ipc") and device == "cpu":
        raise ConfigError(f"weight_transport={kind} needs GPUs and the device is cpu: use gloo or auto")
    if kind == "nccl" and gpu_mode == "shared":
        raise ConfigError("weight_transport=nccl: all ranks share one GPU and NCCL refuses two ranks on one GPU: "
                          "use ipc or auto")
    if kind == "ipc" and gpu_mode == "own":
        raise ConfigError("weight_transport=ipc: CUDA IPC works within one GPU and every rank has its own: "
                          "use nccl or auto")
    if kind == "ipc" and not one_node:
        raise ConfigError("weight_transport=ipc: CUDA IPC works within one GPU and the ranks span several nodes: "
                          "give every rank its own GPU (nccl)")
    if kind == "ipc" and overlap:
        raise ConfigError("push_overlap=true: with ipc (all ranks on one GPU) the searchers copy the weights out of "
                          "the trainer's buffers in lock-step with it, there is no broadcast to overlap: "
                          "push_overlap=false")
    if kind == "nccl" and overlap:
        check_nccl_overlap(n_trainers)
    return kind


def check_nccl_overlap(n_trainers):
    """push_overlap with nccl and n_trainers > 1: rank 0's weight broadcast, still in flight, runs beside the trainer
    group's FSDP / DDP collectives on another NCCL communicator, and NCCL documents concurrent operations on two
    communicators of one device as a possible deadlock. Refused (ConfigError) until a GPU run shows it safe;
    TBA_CHECK_NCCL_OVERLAP=1 runs it anyway (scripts/gpu_check.sh's own-<shape>-overlap-2trainers check)."""
    if n_trainers > 1 and os.environ.get(CHECK_NCCL_OVERLAP) != "1":
        raise ConfigError(f"push_overlap=true with weight_transport=nccl and n_trainers={n_trainers}: the weight "
                          "broadcast in flight would run beside the trainer group's NCCL collectives on another "
                          "communicator, which NCCL documents as a possible deadlock, and no GPU run has shown it safe "
                          f"yet: push_overlap=false or n_trainers=1 ({CHECK_NCCL_OVERLAP}=1 runs it anyway, to check "
                          "it)")


def plan_buckets(meta, bucket_bytes, elem_size):
    """meta: [(name, shape)] -> list of buckets, each a list of (name, shape, offset, numel)."""
    buckets, current, used = [], [], 0
    for name, shape in meta:
        numel = int(torch.Size(shape).numel())
        if current and (used + numel) * elem_size > bucket_bytes:
            buckets.append(current)
            current, used = [], 0
        current.append((name, tuple(shape), used, numel))
        used += numel
    if current:
        buckets.append(current)
    return buckets


def new_nccl_group(comm):
    """The NCCL group of the weight broadcasts, with comm's timeout (timeout_s). Its watchdog thread would end the
    process on a failed or timed-out collective (TORCH_NCCL_ASYNC_ERROR_HANDLING's default, 3) before the trainer
    could name the dead rank and save a checkpoint; 2 makes it abort the communicator only, and the failure is raised
    in the thread that waits on the broadcast (push / pull), where sync.py turns it into failures.Stop."""
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")  # read when the group is built
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = comm.timeout  # the API torch's own new_group uses (distributed_c10d._new_process_group_helper)
    return dist.ProcessGroupNCCL(dist.PrefixStore("weights", comm.store), comm.rank, comm.world, options)


class WeightTransport:
    """Collective on all ranks: construct everywhere, then call push(model) on rank 0 and pull() on searchers."""

    def __init__(self, comm, kind, dtype, bucket_mb, device, model=None, overlap=False):
        self.comm, self.kind, self.device = comm, kind, device
        self.overlap = overlap and kind != "ipc"
        self.dtype = DTYPES[dtype]
        meta = [(n, tuple(p.shape)) for n, p in base_weights(model).items()] \
            if comm.rank == 0 else None  # lora: the base model's names; the push sends its merged weights
        meta = comm.broadcast_object(meta)  # rank 0's parameter list is the authority
        elem = torch.empty(0, dtype=self.dtype).element_size()
        self.buckets = plan_buckets(meta, bucket_mb * 2**20, elem)
        self.params = merged_weights(model) if model is not None else None
        # two bucket buffers per side (streaming); a bucket is a view of its first numbers
        largest = max(sum(n for *_, n in b) for b in self.buckets)
        count = min(2, len(self.buckets))
        if kind == "ipc":  # the trainer's two, shared: a searcher's are views of them
            self._share_ipc(largest, count)
        else:
            self.flat = [torch.empty(largest, dtype=self.dtype, device=device) for _ in range(count)]
            self.pg = new_nccl_group(comm) if kind == "nccl" else comm.new_gloo_group("weights")
        self.bytes = count * largest * elem
        self.pending, self.waited = [], 0.0  # push_overlap: the broadcasts in flight, the last push's wait for them
        if self.overlap and comm.rank == 0:  # push_overlap: the whole model, bucket after bucket
            self.starts = [0]
            for bucket in self.buckets:
                self.starts.append(self.starts[-1] + sum(n for *_, n in bucket))
            self.snapshot = torch.empty(self.starts[-1], dtype=self.dtype, device=device)
            self.bytes += self.starts[-1] * elem

    def _share_ipc(self, numel, count):
        from torch.multiprocessing.reductions import reduce_tensor
        handles = None
        if self.comm.rank == 0:
            self.flat = [torch.empty(numel, dtype=self.dtype, device=self.device) for _ in range(count)]
            handles = [reduce_tensor(f) for f in self.flat]
        handles = self.comm.broadcast_object(handles)
        if self.comm.rank != 0:
            self.flat = [fn(*args) for fn, args in handles]  # views of the trainer's bucket buffers

    @staticmethod
    def _fill(flat, bucket, source):
        with torch.no_grad():
            for name, shape, off, numel in bucket:
                flat[off : off + numel].copy_(source[name].detach().reshape(-1))

    def push(self, source=None):
        """Rank 0: send the model's current weights, or `source` ({name: tensor}, e.g. an older version kept for
        weight_delay). Returns seconds spent."""
        t0 = time.perf_counter()
        source = self.params if source is None else source
        if self.overlap:
            return self._push_overlapped(source, t0)
        if self.kind == "ipc":
            for i, bucket in enumerate(self.buckets):  # buffer i % 2 held bucket i - 2, copied out before barrier i - 1
                self._fill(self.flat[i % len(self.flat)], bucket, source)
                torch.cuda.synchronize()
                self.comm.barrier()  # bucket i is ready; every searcher has copied bucket i - 1 out
            self.comm.barrier()  # every searcher has copied the last bucket out
            return time.perf_counter() - t0
        sending = [None] * len(self.flat)  # the broadcast in flight from each buffer
        for i, bucket in enumerate(self.buckets):
            k = i % len(self.flat)
            self._wait(sending[k])  # this buffer's previous bucket has left
            self._fill(self.flat[k], bucket, source)
            sending[k] = self._start(self.flat[k], bucket)
        for work in sending:
            self._wait(work)
        if self.kind == "nccl":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def _push_overlapped(self, source, t0):
        """push_overlap: wait for the previous push's broadcasts (self.waited: how long), then copy every bucket into
        the snapshot and start its broadcast; the trainer's weights are free to change as soon as this returns."""
        self.finish()
        self.waited = time.perf_counter() - t0
        for i, bucket in enumerate(self.buckets):
            flat = self.snapshot[self.starts[i] : self.starts[i + 1]]
            self._fill(flat, bucket, source)
            self.pending.append(self._start(flat, bucket))
        return time.perf_counter() - t0

    def finish(self):
        """push_overlap: block until the last push's broadcasts have left rank 0."""
        pending, self.pending = self.pending, []
        for work in pending:
            self._wait(work)

    def _start(self, flat, bucket):
        """The broadcast of `bucket` (its numbers at the start of `flat`) from rank 0 over self.pg, in flight."""
        return self.pg.broadcast(flat[: sum(n for *_, n in bucket)], 0)

    def _wait(self, work):
        """Each wait has the timeout (a wait with one blocks the CPU thread for NCCL too) and a failure raises
        RuntimeError, for sync.py's failures.Stop."""
        if work is not None and not work.wait(self.comm.timeout):
            raise RuntimeError(f"the weight broadcast ({self.kind}) did not finish within {self.comm.timeout}")

    def pull(self):
        """Searchers: receive the weights. Returns an iterator of (name, tensor) for the engine's load and a `done`
        callable to run once the engine has loaded them. The buckets arrive while the iterator is read (gloo /
        nccl: one ahead; ipc: the trainer fills the next while this one is copied out), and each tensor is a copy of
        its own, so a loader that keeps some until a layer is complete, as vLLM's layer-wise reload does, keeps valid
        ones."""
        if self.kind == "ipc":
            return self._ipc_stream(), self.comm.barrier  # the last barrier: the trainer's buffers are free
        return self._stream(), lambda: None

    def _stream(self):
        n = len(self.flat)
        arriving = [self._start(self.flat[i], self.buckets[i]) for i in range(n)]  # the first buckets, ahead
        for i, bucket in enumerate(self.buckets):
            k = i % n
            self._wait(arriving[k])
            named = [(name, self.flat[k][off : off + numel].view(shape).clone()) for name, shape, off, numel in bucket]
            if i + n < len(self.buckets):  # this buffer is free again: the bucket after next lands in it
                arriving[k] = self._start(self.flat[k], self.buckets[i + n])
            yield from named

    def _ipc_stream(self):
        for i, bucket in enumerate(self.buckets):
            self.comm.barrier()  # bucket i is in the trainer's buffer i % 2
            flat = self.flat[i % len(self.flat)]
            named = [(name, flat[off : off + numel].view(shape).clone()) for name, shape, off, numel in bucket]
            torch.cuda.synchronize()  # the copies are asynchronous: done before the next barrier frees the buffer
            yield from named

    def close(self, failed=False):
        """At exit: shut the NCCL group down (abort it after a failure: its peers may be gone). A failed exit does not
        wait for push_overlap's broadcasts in flight: a searcher that hangs alive mid-push would hold them until
        timeout_s. gloo cannot drop them, and its group's destructor drains its queue first, so a stopped rank 0
        leaves with failures.leave (os._exit), skipping that teardown."""
        if not failed:
            self.finish()
        if self.kind == "nccl" and failed:
            self.pg.abort()
        elif self.kind == "nccl":
            self.pg.shutdown()
