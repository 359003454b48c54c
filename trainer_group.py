"""The trainer group: with n_trainers = T > 1, job ranks 0..T-1 train one model together.

They form a default process group of their own over a prefix of torchrun's store (init_process_group(store=...),
https://pytorch.org/docs/stable/distributed.html#initialization), so FSDP2 and DDP work as documented; the searchers
never join it (comm.py: their default group is left to vLLM). trainer_parallel picks how the model is shared:
  fsdp  FSDP2: fully_shard on every decoder layer, then on the root
        (https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html): each rank keeps 1/T of the weights,
        gradients and AdamW states; a whole parameter is DTensor.full_tensor(), a collective
  ddp   DistributedDataParallel (https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel
        .html): a whole replica on every rank, gradients all-reduced; for small models
Both average the gradients over the ranks, so each rank's loss is the mean over its own share of the batch (the
shares are equal: B / T whole prompts) and the update is the whole batch's mean, as with one trainer.

Rank 0 drives. It owns the buffer and samples each batch; it alone logs, saves and runs the sync rounds (comm.py
holds rank 0 and the searchers only). Ranks 1..T-1 follow (follow() below): rank 0 sets each Command as a store key,
which a follower waits for however long a sync round or an evaluation takes (a collective would time out), and every
trainer rank then runs the command's collectives in the same order. Both sides call the same method for a command
(FOLLOW holds the followers' side); tell() is a no-op except on rank 0, so a method reads the same on every rank.
With T = 1 the Group is rank 0 alone: no commands, no collectives.
"""
import contextlib
import datetime
import enum
import functools
import os
import pickle
import socket
import sys
from collections.abc import Mapping

import torch
import torch.distributed as dist

import failures
from failures import Stop
from policy import decoder_layers, merged_weights, token_logprobs

POLL_S = 5  # ranks 1..T-1 waiting for a command check this often that rank 0 is still alive


class Command(enum.Enum):
    """What rank 0 tells ranks 1..T-1 to run with it next."""
    STEP = "step"  # a train step: rank 0 scatters each rank its share (scatter_object_list), then Learner.update
    PARAMS = "params"  # fsdp: the whole parameters for a weight push, one at a time in named_parameters order
    STATE = "state"  # fsdp: the whole state dict, to rank 0 only (TBA's reference weights)
    PROBE = "probe"  # a greedy generation (check_sync); fsdp: every rank in lock-step
    SAVE = "save"  # a checkpoint: each rank's optimizer state to optimizer_rank{r}.pt; fsdp: whole weights to rank 0
    STOP = "stop"  # the run is over


class LogProbs(torch.nn.Module):
    """policy.token_logprobs as the forward of a module, the unit FSDP2 and DDP wrap: FSDP2's root gathers the
    parameters outside the decoder layers (embeddings, final norm, LM head) in its forward, and DDP readies its
    gradient all-reduce in its forward."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, prompts, responses, temperature):
        return token_logprobs(self.model, prompts, responses, temperature)

    def generate(self, **kwargs):  # fsdp: registered as a forward method (register_fsdp_forward_method)
        return self.model.generate(**kwargs)


class FullParams(Mapping):
    """Rank 0, a weight push under fsdp: {name: whole parameter}, each assembled (DTensor.full_tensor) when the
    transport reads it. A collective: ranks 1..T-1 assemble the same parameters in named_parameters order
    (Group.assemble_params), so the transport must read them in that order too (its buckets follow it)."""

    def __init__(self, model):
        self.params = dict(model.named_parameters())
        self.order = iter(self.params)

    def __getitem__(self, name):
        expected = next(self.order, None)
        if name != expected:
            raise RuntimeError(f"weight push: {name} read out of order ({expected} is next on every trainer rank)")
        return self.params[name].full_tensor()

    def __iter__(self):
        return iter(self.params)

    def __len__(self):
        return len(self.params)


class Group:
    """Every trainer rank has one. model: the HF model (under fsdp its parameters become DTensor shards); store: the
    job's store (comm.connect). logprobs(prompts, responses, temperature) is what train steps call."""

    def __init__(self, cfg, model, device, store):
        self.size, self.parallel = cfg.n_trainers, cfg.trainer_parallel
        self.rank = int(os.environ.get("RANK", 0))  # the trainer ranks are the job's ranks 0..T-1
        self.model = model
        self.logprobs = functools.partial(token_logprobs, model)
        self.failed = False  # a collective of the group failed: no checkpoint can be assembled any more
        self.n = 0  # the index of the next command
        if self.size == 1:
            return
        self.root, self.store = store, dist.PrefixStore("trainers", store)
        self.store.set(f"pid/{self.rank}", f"{socket.gethostname()}:{os.getpid()}")  # for failures.diagnose
        # gloo for CPU tensors (commands, metrics, barriers), NCCL for the model's on GPUs. NCCL reads its error
        # handling when the group is built: 2 aborts the communicator on a failure and raises it in the waiting thread
        # (the default, 3, ends the process before rank 0 can name the dead rank), as transport.new_nccl_group does
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        backend = "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.PrefixStore("pg", self.store), rank=self.rank,
                                world_size=self.size, timeout=datetime.timedelta(seconds=cfg.timeout_s))
        self.net = LogProbs(model)
        if self.parallel == "fsdp":
            from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh(device, (self.size,))
            for layer in decoder_layers(model):
                fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)  # the root: embeddings, final norm, LM head
            register_fsdp_forward_method(self.net, "generate")
        else:
            import inspect
            from torch.nn.parallel import DistributedDataParallel
            # every rank loaded the same weights: no buffer broadcast before each forward (torch 2.13 renamed the
            # argument and warns on the old name; 2.11, the GPU nodes' torch, knows only the old one)
            known = inspect.signature(DistributedDataParallel).parameters
            name = "forward_sync_buffers" if "forward_sync_buffers" in known else "broadcast_buffers"
            self.net = DistributedDataParallel(self.net, device_ids=[0] if device == "cuda" else None, **{name: False})
        self.logprobs = self.net

    # ------------------------------------------------------------ commands, rank 0 -> ranks 1..T-1
    def tell(self, command, arg=None, shares=None):
        """Rank 0: ranks 1..T-1 run `command` (a Command, with `arg`) next; for a train step every rank gets its
        element of `shares` (scatter_object_list). Returns rank 0's share. Ranks 1..T-1 (and T = 1): nothing to
        tell; they get their share from receive()."""
        if self.size == 1 or self.rank != 0:
            return shares[0] if shares else None
        self.store.set(f"cmd/{self.n}", pickle.dumps((command, arg)))
        if self.n >= 2:
            self.store.delete_key(f"cmd/{self.n - 2}")  # read by every rank: each command has a collective
        self.n += 1
        if shares is not None:
            return self.scatter(shares)
        return None

    def receive(self):
        """Ranks 1..T-1: (the next Command, its arg, this rank's share or None), waiting as long as rank 0 lives."""
        key = f"cmd/{self.n}"
        while True:
            try:
                self.store.wait([key], datetime.timedelta(seconds=POLL_S))
                break
            except dist.DistStoreError:  # the wait timed out (a store that is gone raises another error)
                if failures.dead(failures.rank_state(self.root, "pid/0")[1]):
                    raise Stop("rank 0 is gone") from None
        command, arg = pickle.loads(self.store.get(key))
        self.n += 1
        return command, arg, self.scatter(None) if command is Command.STEP else None

    def scatter(self, shares):
        out = [None]
        dist.scatter_object_list(out, shares, src=0)
        return out[0]

    @contextlib.contextmanager
    def collectives(self):
        """Rank 0: a failed collective of the group (a trainer rank died or hit timeout_s) raises Stop."""
        try:
            yield
        except RuntimeError as e:
            if self.size == 1:
                raise
            self.failed = True  # no checkpoint can be assembled any more
            raise Stop(where="trainer group", error=e) from None
        except Exception:  # rank 0 failed mid-command: ranks 1..T-1 may wait in its collectives
            self.failed = self.size > 1
            raise

    # ------------------------------------------------------------ a train step, on every trainer rank
    def split(self, flat):
        """Rank 0: the batch's (group id, Sample) list -> T equal shares of whole prompts (flat is prompt-major)."""
        n = len(flat) // self.size
        return [flat[r * n : (r + 1) * n] for r in range(self.size)]

    def average(self, sums):
        """Each rank's metric sums (means over its share) -> their mean over the ranks: the whole batch's."""
        if self.size == 1:
            return sums
        keys = sorted(sums)
        values = torch.tensor([float(sums[k]) for k in keys], dtype=torch.float64)
        dist.all_reduce(values)  # a sum: gloo has no average
        mean = dict(zip(keys, (values / self.size).tolist()))
        return {k: mean[k] for k in sums}

    def assemble(self, tensor):
        """A DTensor (fsdp: clip_grad_norm_'s total norm) as a plain tensor: a collective; others as they are."""
        return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor

    # ------------------------------------------------------------ whole weights out of the shards (fsdp)
    def sharded(self):
        return self.size > 1 and self.parallel == "fsdp"

    def gather_params(self):
        """Rank 0, before a weight push: the parameters to send, each assembled when the push reads it
        (FullParams), or None when the model's own are whole (T = 1, ddp)."""
        if not self.sharded():
            return None
        self.tell(Command.PARAMS)
        return FullParams(self.model)

    def assemble_params(self):
        """Ranks 1..T-1: their part of FullParams, in the same order."""
        for _, p in self.model.named_parameters():
            p.full_tensor()

    def gather_state(self):
        """The model's state dict with whole tensors: under fsdp on rank 0 only, on the CPU, and every trainer rank
        calls it (rank 0 tells the others): torch.distributed.checkpoint.state_dict.get_model_state_dict with
        full_state_dict and cpu_offload (https://pytorch.org/docs/stable/distributed.checkpoint.html)."""
        if not self.sharded():
            return merged_weights(self.model, buffers=True)  # lora: adapters merged, under the base's names
        self.tell(Command.STATE)
        return self.full_state_dict()

    def full_state_dict(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def start_probe(self):
        """The module a probe generates with: the model, or under fsdp the FSDP2 root, with which every trainer rank
        generates in lock-step (rank 0 tells the others)."""
        if not self.sharded():
            return self.model
        self.tell(Command.PROBE)
        return self.net

    # ------------------------------------------------------------ checkpoints
    def save_shards(self, opt, tmp):
        """A checkpoint being written into `tmp` (rank 0 made it; a shared filesystem across nodes): every trainer
        rank writes its optimizer state there as optimizer_rank{r}.pt (fsdp: its shard), and rank 0 gets the whole
        weights for the HF files (returned; None: the model's own are whole)."""
        self.tell(Command.SAVE, tmp)
        weights = self.full_state_dict() if self.sharded() else None
        state = opt.state_dict()
        state["state"] = {i: {k: v.to_local() if hasattr(v, "to_local") else v for k, v in s.items()}
                          for i, s in state["state"].items()}
        torch.save(state, os.path.join(tmp, f"optimizer_rank{self.rank}.pt"))
        dist.barrier()  # every rank's file is written before rank 0 completes the checkpoint
        return weights

    def load_optimizer(self, opt, path):
        """Resume with T > 1: this rank's optimizer_rank{r}.pt into `opt`; fsdp: the states become DTensors shaped
        like their parameters again (DTensor.from_local)."""
        if self.size == 1 or not path:
            return
        state = torch.load(os.path.join(path, f"optimizer_rank{self.rank}.pt"), map_location="cpu",
                           weights_only=True)
        params = [p for g in opt.param_groups for p in g["params"]]
        for i, s in state["state"].items():
            p = params[i]
            if hasattr(p, "device_mesh"):  # a DTensor
                from torch.distributed.tensor import DTensor
                for k, v in s.items():
                    if k != "step":
                        s[k] = DTensor.from_local(v.to(p.device), p.device_mesh, p.placements, shape=p.shape,
                                                  stride=p.stride())
        opt.load_state_dict(state)

    def close(self, stop=True):
        """At the end of the run: rank 0 tells ranks 1..T-1 to leave (not when a trainer rank is gone: then they
        leave on their own), and every rank takes its default group down."""
        if self.size == 1:
            return
        if stop:
            self.tell(Command.STOP)
        dist.destroy_process_group()


# ---------------------------------------------------------------- ranks 1..T-1

# A follower's side of each command: the same call rank 0 makes (or, for PARAMS, the reads of rank 0's weight push)
FOLLOW = {
    Command.STEP: lambda learner, arg, share: learner.optimizer_step(share, *arg),
    Command.PARAMS: lambda learner, arg, share: learner.group.assemble_params(),
    Command.STATE: lambda learner, arg, share: learner.group.gather_state(),
    Command.PROBE: lambda learner, arg, share: learner.probe(),
    Command.SAVE: lambda learner, arg, share: learner.group.save_shards(learner.opt, arg),
}


def follow(learner):
    """Trainer ranks 1..T-1: rank 0's commands, run in lock-step with it until it says STOP. SIGTERM / SIGINT are
    rank 0's to act on: it saves a checkpoint with these ranks' optimizer states, then stops them. A failure ends
    this rank with exit code 1; rank 0 names it (failures.diagnose)."""
    group, signalled = learner.group, failures.catch_signals()
    try:
        while True:
            command, arg, share = group.receive()
            if command is Command.STOP:
                break
            FOLLOW[command](learner, arg, share)
    except Exception as e:  # rank 0 or another trainer rank is gone, or this one failed
        if not isinstance(e, (Stop, RuntimeError)):
            failures.report(group.store, group.rank, e)
        if not signalled:
            failures.say(f"error: trainer rank {group.rank}: {failures.first_line(e)}")
        sys.exit(1)
    group.close(stop=False)
