"""TBA entry point: one torchrun job, rank 0 trains (trainer.py), ranks 1..N-1 search (searcher.py).

    torchrun --nproc_per_node=N train.py CONFIG [key=value ...]     (launch.sh builds this line)
    python train.py --prepare CONFIG [key=value ...]                 check config, data and model; print N
    python train.py --help                                           every config key: type, default, range, doc
"""
import logging
import os
import subprocess
import sys
import warnings


def quiet_known_warnings():
    """Silence the start-up messages every rank would print that are known to be harmless: vLLM's import touching
    torch's deprecated reduce_op (a FutureWarning), torch's note that Triton is absent (CPU), and the NUMA binding
    note of vLLM's CPU backend (a C++ warning, so TORCH_CPP_LOG_LEVEL, read when torch loads; set it yourself, e.g.
    to INFO, to see C++ warnings again)."""
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.reduce_op.*", category=FutureWarning)
    logging.getLogger("torch._library.triton").setLevel(logging.ERROR)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def pin_gpu():
    """Before torch touches CUDA: one GPU per rank when there are enough ('own'), else all ranks on one ('shared')."""
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
            visible = ",".join(str(i) for i in range(out.count("GPU ")))
        except (OSError, subprocess.SubprocessError):
            visible = ""
    gpus = [g for g in visible.split(",") if g.strip()]
    if not gpus:
        return "none"
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[local_rank % len(gpus)]
    return "own" if len(gpus) >= local_world else "shared"


quiet_known_warnings()
GPU_MODE = pin_gpu()

import torch  # noqa: E402  (after CUDA_VISIBLE_DEVICES is set)

import checkpoint  # noqa: E402
from config import ConfigError, help_text, load_config, parse_cli  # noqa: E402
from policy import ModelError, load_tokenizer  # noqa: E402
from rewards import DataError, get_task  # noqa: E402


class Context:
    """What both roles share: the task and its data, the tokenizer, the device, the weight transport, the checkpoint
    to resume from."""

    def __init__(self, cfg):
        self.resume = find_resume(cfg)
        self.task = get_task(cfg.task)
        self.train = self.task.load(cfg.train_data or self.task.DEFAULT_TRAIN, "train")
        self.test = self.task.load(cfg.test_data or self.task.DEFAULT_TEST, "test")
        self.train = self.train[: cfg.n_train] if cfg.n_train else self.train
        self.test = self.test[: cfg.n_test] if cfg.n_test else self.test
        self.tok = load_tokenizer(cfg.model)
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
        if self.device == "cuda":
            torch.cuda.set_device(0)  # pin_gpu made this rank's GPU the only visible one
        from transport import WeightTransport, pick_transport
        kind = pick_transport(cfg.weight_transport, self.device, GPU_MODE)
        self.make_transport = lambda comm, model: WeightTransport(comm, kind, cfg.dtype, cfg.bucket_mb, self.device,
                                                                  model)


def find_resume(cfg):
    """The checkpoint dir to continue from (resume=auto: the newest complete one in out_dir, None if there is none)."""
    if not cfg.resume:
        return None
    path = checkpoint.latest(os.path.join(cfg.out_dir, "checkpoints")) if cfg.resume == "auto" else cfg.resume
    step = checkpoint.step_of(path) if path else None
    if path and step is None:
        raise ConfigError(f"resume={cfg.resume}: {path} is not a complete checkpoint (no meta.json)")
    if step is not None and step >= cfg.steps:
        raise ConfigError(f"resume: {path} is at step {step} and steps={cfg.steps}; raise steps to continue")
    return path


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


def prepare(cfg):
    """Checks that need no process group, run by launch.sh before torchrun: one clear line on a bad input."""
    if not os.path.exists(cfg.model) and cfg.model.startswith(".cache/tiny-"):
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "scripts", "make_tiny.py"),
                        "--out", cfg.model], check=True, stdout=sys.stderr)
    for key in ("model", "reward_model", "judge_model", "victim_model", "embed_model"):  # local paths only
        path = getattr(cfg, key)
        if path.startswith((".", "/")) and not os.path.isdir(path):
            raise ModelError(f"{key} path not found: {path}")
    Context(cfg)
    print(cfg.n_searchers + 1)


def main():
    args = sys.argv[1:]
    if "--help" in args or "-h" in args:
        print(help_text(), end="")
        return
    prep = "--prepare" in args
    rank = int(os.environ.get("RANK", 0))
    try:
        cfg = load_config(*parse_cli([a for a in args if a != "--prepare"]))
        if prep:
            return prepare(cfg)
        world = int(os.environ.get("WORLD_SIZE", 1))
        if world != cfg.n_searchers + 1:
            raise ConfigError(f"n_searchers={cfg.n_searchers} needs {cfg.n_searchers + 1} processes, "
                              f"torchrun started {world}")
        if rank > 0 and cfg.searcher_nice:
            lower_priority(cfg.searcher_nice)
        ctx = Context(cfg)
    except (ConfigError, DataError, ModelError) as e:
        print(f"error: {e}" + (f" (rank {rank})" if rank else ""), file=sys.stderr)
        sys.exit(2)
    from comm import Comm
    comm = Comm(cfg.timeout_s)
    if comm.rank == 0:
        import trainer
        trainer.run(cfg, comm, ctx)
    else:
        import searcher
        searcher.run(cfg, comm, ctx)


if __name__ == "__main__":
    main()
