"""Weight transport, trainer (rank 0) -> every searcher: the device-specific half of a sync round.

Weights travel in the engine dtype as a few flat buckets (at most bucket_mb each), not one collective per tensor:
  gloo  CPU ranks: torch.distributed broadcast of each bucket over a private gloo group
  nccl  one GPU per rank: broadcast of each bucket over a private NCCL group
  ipc   ranks sharing one GPU (NCCL refuses that): the trainer's bucket memory is shared once through CUDA IPC handles;
        each push is a device copy into the buckets, a barrier, the searchers copy out, and a second barrier
The receiver returns (name, tensor) pairs in Hugging Face checkpoint naming; the engine loads them.
"""
import time

import torch
import torch.distributed as dist

from policy import DTYPES


def pick_transport(requested, device, gpu_mode):
    if requested != "auto":
        return requested
    if device == "cpu":
        return "gloo"
    return "ipc" if gpu_mode == "shared" else "nccl"


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


class WeightTransport:
    """Collective on all ranks: construct everywhere, then call push(model) on rank 0 and pull() on searchers."""

    def __init__(self, comm, kind, dtype, bucket_mb, device, model=None):
        self.comm, self.kind, self.device = comm, kind, device
        self.dtype = DTYPES[dtype]
        meta = [(n, tuple(p.shape)) for n, p in model.named_parameters()] if comm.rank == 0 else None
        meta = comm.broadcast_object(meta)  # rank 0's parameter list is the authority
        elem = torch.empty(0, dtype=self.dtype).element_size()
        self.buckets = plan_buckets(meta, bucket_mb * 2**20, elem)
        self.params = dict(model.named_parameters()) if model is not None else None
        if kind == "ipc":
            self._setup_ipc()
        else:
            self.flat = [torch.empty(sum(n for *_, n in b), dtype=self.dtype, device=device) for b in self.buckets]
            if kind == "nccl":
                self.pg = dist.ProcessGroupNCCL(dist.PrefixStore("weights", comm.store), comm.rank, comm.world)
            else:
                self.pg = comm.new_gloo_group("weights")
        self.bytes = sum(f.numel() for f in self.flat) * elem

    def _setup_ipc(self):
        from torch.multiprocessing.reductions import reduce_tensor
        handles = None
        if self.comm.rank == 0:
            self.flat = [torch.empty(sum(n for *_, n in b), dtype=self.dtype, device=self.device) for b in self.buckets]
            handles = [reduce_tensor(f) for f in self.flat]
        handles = self.comm.broadcast_object(handles)
        if self.comm.rank != 0:
            self.flat = [fn(*args) for fn, args in handles]  # views of the trainer's bucket memory

    def _fill(self):
        with torch.no_grad():
            for flat, bucket in zip(self.flat, self.buckets):
                for name, shape, off, numel in bucket:
                    flat[off : off + numel].copy_(self.params[name].detach().reshape(-1))

    def push(self):
        """Rank 0: send the current weights. Returns seconds spent."""
        t0 = time.perf_counter()
        self._fill()
        if self.kind == "ipc":
            torch.cuda.synchronize()
            self.comm.barrier()  # buckets ready
            self.comm.barrier()  # every searcher has copied them out
        else:
            for flat in self.flat:
                self.pg.broadcast(flat, 0).wait()
            if self.kind == "nccl":
                torch.cuda.synchronize()
        return time.perf_counter() - t0

    def pull(self):
        """Searchers: receive the weights; returns [(name, tensor)] (views into receive buffers, valid until the next
        pull) and a `done` callable to run once the engine has loaded them."""
        if self.kind == "ipc":
            self.comm.barrier()
            done = self.comm.barrier
        else:
            for flat in self.flat:
                self.pg.broadcast(flat, 0).wait()
            if self.kind == "nccl":
                torch.cuda.synchronize()
            done = lambda: None
        named = [(name, flat[off : off + numel].view(shape))
                 for flat, bucket in zip(self.flat, self.buckets) for name, shape, off, numel in bucket]
        return named, done
