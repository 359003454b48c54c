"""TBA entry point: one torchrun job, ranks 0..T-1 train (trainer.py; T = n_trainers, 1 by default), ranks T..N-1
search (searcher.py); N = n_trainers + n_searchers.

    torchrun --nproc_per_node=N train.py CONFIG [key=value ...]     (launch.sh builds this line)
    python train.py --prepare CONFIG [key=value ...]                 check config, data, model and GPU memory; print N
    python train.py --plan CONFIG [key=value ...] --gpus N --gpu-memory-gb M     the memory plan (plan.py); exit 2:
                                                                     it does not fit
    python train.py --help                                           every config key: type, default, range, doc
"""
import datetime
import os
import signal
import socket
import subprocess
import sys

from config import ConfigError, help_text, load_config, parse_cli, quiet_known_warnings  # no torch yet


def visible_gpus():
    """The GPUs this node's ranks may use, read before torch touches CUDA: CUDA_VISIBLE_DEVICES when set, else one
    per GPU that nvidia-smi lists; [] on a CPU machine."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
            visible = ",".join(str(i) for i in range(out.count("GPU ")))
        except (OSError, subprocess.SubprocessError):
            visible = ""
    return [g.strip() for g in visible.split(",") if g.strip()]


def gpu_layout(n_gpus, local_world, local_rank):
    """Where a rank runs, from the number of GPUs its node's ranks see (a pure function: tests feed it GPU counts).
    Returns (mode, this rank's GPU index): ('none', None) without a GPU (weights by gloo), ('own', local_rank) with a
    GPU per rank (weights by NCCL), ('shared', 0) with one GPU for every rank (weights by CUDA IPC). Any other count
    is refused: NCCL refuses two ranks on one GPU and CUDA IPC works only within one GPU, so the trainer alone on a
    GPU with the searchers sharing the others would need NCCL to one searcher per GPU and IPC on from it, a
    transport this codebase does not have."""
    if n_gpus == 0:
        return "none", None
    if n_gpus >= local_world:
        return "own", local_rank
    if n_gpus == 1:
        return "shared", 0
    raise ConfigError(f"{local_world} ranks on {n_gpus} GPUs: use {local_world} GPUs (one per rank, NCCL), or "
                      f"CUDA_VISIBLE_DEVICES=<one gpu> (all ranks share it, CUDA IPC), or {n_gpus} ranks per node "
                      f"(one node: n_trainers + n_searchers = {n_gpus})")


def pin_gpu(gpus, local_world, local_rank):
    """Before torch touches CUDA: this rank's GPU becomes the only one it sees. A layout gpu_layout refuses pins
    nothing: Context refuses it (ConfigError) once the config says that the run uses a GPU."""
    try:
        index = gpu_layout(len(gpus), local_world, local_rank)[1]
    except ConfigError:
        return
    if index is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index]


def stop_during_startup(rank):
    """Until the loop's own handlers replace it (trainer.begin: failures.catch_signals; searcher.run:
    failures.leave_on_signal), SIGINT / SIGTERM end a rank at once, rank 0 with one line: start-up (imports, model
    loads, engine builds: minutes on a GPU) has no step to save, and Python's SIGINT default is a traceback a rank."""
    def stop(signum, frame):
        if rank == 0:
            print(f"stopped by {signal.Signals(signum).name} during start-up, before the first step: nothing to save",
                  file=sys.stderr, flush=True)
        os._exit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)


if __name__ == "__main__" and "RANK" in os.environ:  # a torchrun rank, from before its torch import
    stop_during_startup(int(os.environ["RANK"]))
quiet_known_warnings()
LOCAL_RANK, LOCAL_WORLD = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
GPUS = visible_gpus()  # the node's GPUs, before pin_gpu narrows CUDA_VISIBLE_DEVICES (--prepare reads them)
pin_gpu(GPUS, LOCAL_WORLD, LOCAL_RANK)
# OpenMP threads that finish a parallel region sleep rather than spin (read when torch loads its OpenMP runtime): a
# trainer with a thread per core (train_threads) beside other busy processes on a few cores otherwise spins against
# them (a tiny train step at 2 threads beside a running job on 2 cores: 3.2 s spinning, 0.3 s sleeping, 0.9 s at 1)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after CUDA_VISIBLE_DEVICES and OMP_WAIT_POLICY are set)

import checkpoint  # noqa: E402
import failures  # noqa: E402
import runlog  # noqa: E402
from engine import engine_name, position_limit  # noqa: E402
from eval import check_samples  # noqa: E402
from policy import ModelError, check_shipped, fit_new_tokens, load_tokenizer, longest_prompt  # noqa: E402
from rewards import DataError, get_task, load_split  # noqa: E402


def gpu_mode(device, local_world):
    """'none' when the run uses no GPU, else this node's layout for `local_world` ranks ('own' | 'shared',
    gpu_layout); a layout it refuses, or GPUs that cannot be listed, raise ConfigError."""
    if device != "cuda":
        return "none"
    if not GPUS:
        raise ConfigError("CUDA is available but no GPU is listed (no nvidia-smi?): set CUDA_VISIBLE_DEVICES, "
                          "e.g. 0,1,2,3")
    return gpu_layout(len(GPUS), local_world, 0)[0]


class Context:
    """What both roles share: the task and its data, the tokenizer, the device and its GPU layout, the weight
    transport, the checkpoint to resume from. local_world / one_node: the ranks on this node, and whether that is
    every rank (--prepare passes the whole job's, before torchrun starts)."""

    def __init__(self, cfg, local_world=LOCAL_WORLD, one_node=None):
        one_node = int(os.environ.get("WORLD_SIZE", 1)) == local_world if one_node is None else one_node
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
        self.gpu_mode = gpu_mode(self.device, local_world)  # first: a refused layout stops before anything loads
        if cfg.n_trainers > 1 and self.gpu_mode == "shared":
            raise ConfigError(f"n_trainers={cfg.n_trainers} on one shared GPU: NCCL refuses two trainer ranks on one "
                              "GPU; give every rank its own GPU, or n_trainers=1")
        from transport import WeightTransport, pick_transport
        kind = pick_transport(cfg.weight_transport, self.device, self.gpu_mode, one_node, cfg.push_overlap,
                              cfg.n_trainers)
        self.resume = checkpoint.find_resume(cfg)
        self.task = get_task(cfg.task)
        check_samples(cfg.eval_samples, self.task, cfg.task)
        self.train, self.test = load_split(self.task, cfg, "train"), load_split(self.task, cfg, "test")
        self.tok = load_tokenizer(cfg.model)
        if self.device == "cuda":
            torch.cuda.set_device(0)  # pin_gpu made this rank's GPU the only visible one
        self.make_transport = lambda comm, model: WeightTransport(comm, kind, cfg.dtype, cfg.bucket_mb, self.device,
                                                                  model, cfg.push_overlap)


def lower_priority(nice):
    """A searcher's CPU niceness, for every thread it has now (Linux sets it per thread) and, by inheritance, every
    thread it starts later (the engine's, gloo's). torchrun starts each rank in its own session, and with the kernel's
    autogroup scheduling niceness only orders threads within a session, so the session's autogroup gets it too when
    the session is this rank's own (a launcher that keeps all ranks in one session needs only the per-thread one)."""
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else [0]:
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except OSError:
            pass
    try:
        if os.getsid(0) == os.getpid():
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(nice))
    except OSError:  # no autogroup scheduling (then the per-thread niceness above is what counts)
        pass


def trainer_threads(cfg):
    """Torch threads for a trainer rank on CPU: train_threads, or in synchronous mode the cores this process may use
    over the trainer ranks (nothing else computes while it trains: the searchers wait for its weights, and it waits
    for their samples); None in asynchronous mode, where every rank computes at once (OMP_NUM_THREADS holds)."""
    if cfg.train_threads:
        return cfg.train_threads
    return None if cfg.asynchronous else max(1, len(os.sched_getaffinity(0)) // cfg.n_trainers)


def prepare(cfg):
    """Checks that need no process group, run by launch.sh before torchrun: one clear line on a bad input. The GPU
    layout is the whole job's: n_trainers + n_searchers ranks on this node unless NPROC_PER_NODE says otherwise."""
    for key in ("model", "reward_model", "judge_model", "victim_model", "embed_model"):  # local paths only
        path = getattr(cfg, key)
        if path.startswith((".", "/", "assets/")) and not os.path.isdir(path):
            raise ModelError(f"{key} path not found: {path}")
    for key in ("model", "reward_model", "judge_model", "victim_model", "train_data", "test_data"):
        check_shipped(getattr(cfg, key))  # the shipped tiny models and data: the bytes assets/SHA256SUMS lists
    runlog.check_login(cfg.trackers)
    local_world = int(os.environ.get("NPROC_PER_NODE") or cfg.n_trainers + cfg.n_searchers)
    ctx = Context(cfg, local_world, one_node=int(os.environ.get("NNODES", 1)) == 1)
    longest = longest_prompt(ctx.tok, [r["prompt"] for r in ctx.train + ctx.test])
    fit_new_tokens(position_limit(cfg.model, cfg.engine), longest, 1)  # raises if a prompt leaves no room
    if ctx.device == "cuda":  # the memory plan for the GPUs present (plan.py); on CPU nothing
        import plan
        engine = engine_name(cfg.engine)
        gpu_bytes = torch.cuda.get_device_properties(0).total_memory  # the node's GPUs taken as alike
        print(plan.prepare_check(cfg, ctx.gpu_mode, len(GPUS), gpu_bytes, longest, engine), file=sys.stderr)
    lock_out_dir(cfg, hold=False)  # last: what is wrong with the config itself comes first
    claim_out_dir(cfg, clear=False)
    print(cfg.n_trainers + cfg.n_searchers, *([cfg.max_restarts] if cfg.max_restarts else []))


_held = []  # rank 0: the open lock file of its out_dir, held until the process ends


def lock_out_dir(cfg, hold):
    """One job per out_dir: an exclusive lock on out_dir/.lock (fcntl.flock), taken by rank 0 for the whole run
    (`hold`) and tried by --prepare. A second job there (a requeued Slurm job beside the old one, two sweeps) is
    refused with ConfigError naming the job that holds it."""
    import fcntl
    os.makedirs(cfg.out_dir, exist_ok=True)
    f = open(os.path.join(cfg.out_dir, ".lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise ConfigError(f"out_dir {cfg.out_dir} is in use by another job ({holder}): wait for it to end or choose "
                          "another out_dir") from None
    if not hold:
        return f.close()
    f.truncate(0)
    f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    _held.append(f)


def claim_out_dir(cfg, clear):
    """A run never writes over another run's results: an out_dir with its metrics, summary or checkpoints is refused
    in one line, unless resume= continues that run, or overwrite=true (then `clear` deletes them first: rank 0).
    A restart with no checkpoint to resume from (failures.attempt) is in the out_dir its first attempt claimed: what
    the failed attempt wrote goes, but its log, which runlog.Logger keeps as metrics.lost.K.jsonl."""
    if failures.restart_count() and not cfg.resume:
        return checkpoint.clear_run(cfg.out_dir, restart=True) if clear else None
    found = "" if cfg.resume else checkpoint.run_in(cfg.out_dir)
    if found and not cfg.overwrite:
        raise ConfigError(f"out_dir {cfg.out_dir} holds a run ({found}): continue it with resume=auto, choose another "
                          "out_dir, or overwrite=true to delete it first")
    if found and clear:
        checkpoint.clear_run(cfg.out_dir)


def plan_memory(args):
    """--plan: print the memory plan (plan.py) for --gpus N GPUs of --gpu-memory-gb M, a machine you may not have
    yet; True when it fits. The layout is gpu_layout's for n_trainers + n_searchers ranks (a count it refuses raises
    ConfigError)."""
    import plan
    rest, opts = plan.pop_flags([a for a in args if a != "--plan"])
    path, overrides = parse_cli(rest)
    cfg = load_config(path, overrides)
    mode = gpu_layout(opts["gpus"], cfg.n_trainers + cfg.n_searchers, 0)[0]
    if cfg.n_trainers > 1 and mode == "shared":
        raise ConfigError(f"n_trainers={cfg.n_trainers} needs a GPU per rank (NCCL refuses two trainer ranks on one "
                          f"GPU): --gpus {cfg.n_trainers + cfg.n_searchers}")
    text, ok = plan.plan_cli(cfg, path or "defaults", opts, mode)
    print(text)
    return ok


def main():
    args = sys.argv[1:]
    if "--help" in args or "-h" in args:
        print(help_text(), end="")
        return
    prep = "--prepare" in args
    rank, cfg = int(os.environ.get("RANK", 0)), None
    try:
        if "--plan" in args:
            sys.exit(0 if plan_memory(args) else 2)
        cfg = load_config(*parse_cli([a for a in args if a != "--prepare"]))
        if prep:
            return prepare(cfg)
        cfg = failures.attempt(cfg, rank)  # a restarted attempt resumes, or exits at once after a final stop
        if rank == 0:  # the trainer's job: the searchers write nothing into out_dir
            lock_out_dir(cfg, hold=True)
            failures.first_attempt(cfg.out_dir)  # a final mark an earlier job left goes (under the lock)
            claim_out_dir(cfg, clear=True)
        world, ranks = int(os.environ.get("WORLD_SIZE", 1)), cfg.n_trainers + cfg.n_searchers
        if world != ranks:
            raise ConfigError(f"n_trainers={cfg.n_trainers} and n_searchers={cfg.n_searchers} need {ranks} processes, "
                              f"torchrun started {world}")
        # a run started niced (`nice -n 19 bash launch.sh`) stays niced: torchrun gives each rank its own session,
        # and autogroup scheduling would otherwise weigh that session level with every other on the box
        nice = max(os.nice(0), cfg.searcher_nice if rank >= cfg.n_trainers else 0)
        if nice:
            lower_priority(nice)
        ctx = Context(cfg)
        if rank < cfg.n_trainers and ctx.device == "cpu" and trainer_threads(cfg):
            torch.set_num_threads(trainer_threads(cfg))
    except (ConfigError, DataError, ModelError) as e:
        line = f"error: {e}" + (f" (rank {rank})" if rank else "")
        print(line, file=sys.stderr)
        if _held:  # rank 0 holds out_dir: a restart would fail the same way, so the next attempt exits at once
            failures.final(cfg.out_dir, line, 2)
        sys.exit(2)
    from comm import Comm, connect
    if 0 < rank < cfg.n_trainers:  # trainer ranks 1..T-1 take no part in the sync rounds (comm.py)
        import learner
        import trainer_group
        store = connect(datetime.timedelta(seconds=cfg.timeout_s))
        return trainer_group.follow(learner.build(cfg, ctx, store))
    comm = Comm(cfg.timeout_s, cfg.n_trainers)
    if comm.rank == 0:
        import trainer
        return trainer.run(cfg, comm, ctx)
    import searcher
    try:
        searcher.run(cfg, comm, ctx)
    except failures.Stop:  # a collective of a round failed: rank 0 names the rank behind it
        sys.exit(1)
    except torch.distributed.DistNetworkError as e:  # torchrun's agent, which holds the store, is gone (kill -9)
        print(f"error: searcher rank {comm.rank + comm.offset}: the job's store is gone ({failures.first_line(e)})",
              file=sys.stderr)
        sys.exit(1)
    except Exception as e:  # this searcher's own failure: rank 0 names it with this error
        failures.report(comm.store, comm.rank, e)
        raise


if __name__ == "__main__":
    main()
