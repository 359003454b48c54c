import json
import math
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ASSETS = os.path.join(ROOT, "assets")  # the tiny models and data the repository ships (assets/README.md)
TINY = os.path.join(ASSETS, "tiny-arith", "sft")


@pytest.fixture(autouse=True)
def fresh_task_warnings():
    """Each test counts the task-error warnings it causes from zero (rewards.warn_task_error)."""
    import rewards
    rewards.task_errors.clear()


@pytest.fixture(scope="session")
def tiny_model():
    """The tiny default's model, as shipped in assets/ (its files checked against assets/SHA256SUMS)."""
    from policy import check_shipped
    check_shipped(TINY)
    return TINY


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, out_dir, config="tiny.yaml", env=None, nproc=3):
    """configs/<config> through torchrun (1 trainer + 2 searchers: nproc 3) with overrides, as a running Popen (own
    session, output captured) for tests that signal or kill it."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               **(env or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
           os.path.join(ROOT, "train.py"), os.path.join(ROOT, "configs", config), f"out_dir={out_dir}",
           "progress=false", *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def torchrun(args, out_dir, timeout=900, config="tiny.yaml", env=None, nproc=3):
    """Run to the end (asserting exit code 0); returns (metrics rows, summary)."""
    p = start(args, out_dir, config, env, nproc)
    try:
        output, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
    assert p.returncode == 0, output[-6000:]
    return read_run(out_dir)


def task_run(config, out_dir, *overrides, reward=(0.0, 1.0)):
    """configs/<config> (a tiny task config) through torchrun for 4 steps, with what every task's run must show:
    every step logged once, searched and trained rewards within `reward` (NaN fails), no reward errors, a finite
    loss. Returns (metrics rows, summary) for the task's own checks."""
    rows, summary = torchrun(["steps=4", "initial_buffer=16", "time_budget_min=0", *overrides], out_dir, config=config)
    lo, hi = reward
    assert summary["steps"] == 4 and [r["step"] for r in rows] == list(range(5))
    searched = [r for r in rows if "search/reward_mean" in r]
    assert searched and all(r["search/reward_errors"] == 0 and lo <= r["search/reward_mean"] <= hi for r in searched)
    assert all(math.isfinite(r["train/loss"]) and lo <= r["train/reward_mean"] <= hi for r in rows[1:])
    return rows, summary


def assert_load_error(load, path, lines, where, message):
    """load(path, "train") of a file holding `lines` raises DataError naming the file and line (`where`) and `message`."""
    from rewards import DataError
    path.write_text(lines)
    with pytest.raises(DataError) as e:
        load(str(path), "train")
    assert f"{path}{where}" in str(e.value) and message in str(e.value)


def read_run(out_dir):
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    return rows, json.load(open(os.path.join(out_dir, "summary.json")))


@pytest.fixture(scope="session")
def tiny_task_models(tiny_model):
    """The shipped tiny assets of the model-based tasks tldr, redteam, redteam_modes and tldr_mini (checked against
    assets/SHA256SUMS): returns the assets folder."""
    from policy import check_shipped
    for path in ("tiny-tldr", "tiny-redteam", "tiny-redteam-modes", "tiny-tldr-mini"):
        check_shipped(os.path.join(ASSETS, path))
    return ASSETS


def workers(job):
    """{RANK: pid} of the torchrun job's worker processes."""
    found = {}
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == job.pid:
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                rank = next(int(e[5:]) for e in env if e.startswith(b"RANK="))
                found[rank] = int(pid)
        except (OSError, StopIteration, ValueError):
            continue
    return found
