import json
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
TINY = os.path.join(ROOT, ".cache", "tiny-arith", "sft")


@pytest.fixture(scope="session")
def tiny_model():
    """The tiny default's model (built once by scripts/make_tiny.py, cached under .cache/)."""
    if not os.path.isdir(TINY):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_tiny.py"), "--out", TINY], check=True)
    return TINY


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args, out_dir, timeout=900):
    """configs/tiny.yaml through torchrun (1 trainer + 2 searchers) with overrides; returns (metrics rows, summary)."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=3", f"--master_port={free_port()}",
           os.path.join(ROOT, "train.py"), os.path.join(ROOT, "configs", "tiny.yaml"), f"out_dir={out_dir}",
           "progress=false", *args]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    return rows, json.load(open(os.path.join(out_dir, "summary.json")))
