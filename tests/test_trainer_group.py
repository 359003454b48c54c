"""n_trainers > 1 on CPU (gloo): ranks 0..T-1 train one model (FSDP2 or DDP), ranks T..N-1 search.

The update equals one trainer's on the same batch (for every loss, whatever its normaliser), a resume continues it,
a dead trainer rank ends the job naming it, SIGTERM saves with every rank, a checkpoint refuses a resume with another
n_trainers, and the memory plan splits the trainer's states with fsdp.
"""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.torch import load_file

import checkpoint
import plan
from buffer import Sample
from config import load_config
from conftest import ROOT, TINY, read_run, start, torchrun
from losses import get_loss
from policy import load_model, token_logprobs
from test_resilience import kill_rank_1, leftovers, stop_with
from trainer import update

SYNC = ["engine=hf", "async=false", "n_test=4", "lr=3e-3"]  # HF sampling with fixed seeds: the same batches


def weights(out_dir, name="final"):
    return load_file(os.path.join(out_dir, "checkpoints", name, "model.safetensors"))


# ---------------------------------------------------------------- the losses' share of the batch, no processes


class FakeGroup:
    """trainer_group.Group's train-step methods for one process."""
    size = 1

    def __init__(self, model):
        self.model = model
        self.logprobs = lambda prompts, responses, temperature: token_logprobs(model, prompts, responses, temperature)

    def mean(self, sums):
        return sums

    def whole(self, tensor):
        return tensor


class Capture:
    """An optimizer that keeps the gradients it is asked to step with."""

    def __init__(self, params):
        self.params, self.param_groups, self.grads = list(params), [{}], None

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def step(self):
        self.grads = [p.grad.clone() for p in self.params]


@pytest.mark.parametrize("loss, extra", [("tb", {}), ("grpo", {"grpo_norm": "token_mean"}),
                                         ("grpo", {"grpo_norm": "seq_mean"}), ("dr_grpo", {}), ("rloo", {}),
                                         ("online_dpo", {}), ("tba_prime", {}), ("m2po", {})])
def test_every_loss_averaged_over_two_shares_is_the_whole_batchs(tiny_model, loss, extra):
    """trainer.update on each half of a batch (whole prompts, the whole batch's token and sample counts), gradients
    averaged as FSDP / DDP average them, equals update on the whole batch: for every loss, whatever its normaliser."""
    cfg = dataclasses.replace(load_config(os.path.join(ROOT, "configs", "tiny.yaml")), B=4, K=4, micro_batch=4,
                              loss=loss, **extra)
    rng = np.random.default_rng(0)
    prompts = [[1] + rng.integers(4, 100, 5).tolist() for _ in range(cfg.B)]
    flat = []
    for gid in range(cfg.B):
        for _ in range(cfg.K):
            n = int(rng.integers(2, 9))
            flat.append((gid, Sample(gid, tuple(rng.integers(4, 100, n).tolist()), float(rng.integers(0, 2)),
                                     -rng.random(n).astype(np.float32), -rng.random(n).astype(np.float32), 0, True)))
    totals = dict(batch_tokens=sum(len(s.response) for _, s in flat), batch_samples=len(flat))
    model = load_model(tiny_model, "float32", "cpu")
    grads = []
    for share in (flat, flat[: len(flat) // 2], flat[len(flat) // 2 :]):
        opt = Capture(model.parameters())
        update(cfg, FakeGroup(model), opt, prompts, get_loss(loss), share, totals, 1)
        grads.append(opt.grads)
    for whole, a, b in zip(*grads):  # float32 sums in another order: equal up to rounding
        assert (whole - (a + b) / 2).abs().max() <= 1e-5 * whole.abs().max(), loss


# ---------------------------------------------------------------- whole runs: 2 trainers + 2 searchers


@pytest.fixture(scope="module")
def one_trainer(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    torchrun(SYNC + ["steps=1"], out)
    return out


@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])
def test_two_trainers_make_one_trainers_update(one_trainer, tmp_path, parallel):
    """Synchronous mode, fixed seeds: the same batch, so after one update the weights equal one trainer's."""
    out = tmp_path / "run"
    rows, summary = torchrun(SYNC + ["steps=1", "n_trainers=2", f"trainer_parallel={parallel}"], out, nproc=4)
    ref_rows, _ = read_run(one_trainer)
    for key in ("buffer/size", "train/reward_mean", "train/response_len"):  # the same batch ...
        assert rows[1][key] == ref_rows[1][key], key
    assert rows[1]["train/loss"] == pytest.approx(ref_rows[1]["train/loss"], rel=1e-5)  # ... averaged over ranks
    a, b, start_weights = weights(one_trainer), weights(out), load_file(os.path.join(TINY, "model.safetensors"))
    assert sorted(a) == sorted(b)
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    moved = max((a[k] - start_weights[k]).abs().max().item() for k in a)
    print(f"{parallel}: max abs diff {diff:.2e} (the update moved weights by up to {moved:.1e})")
    assert diff <= 1e-5 and moved > 1e-3
    assert checkpoint.meta(str(out / "checkpoints" / "final"))["n_trainers"] == 2
    assert sorted(f for f in os.listdir(out / "checkpoints" / "final") if f.startswith("optimizer_")) == [
        "optimizer_rank0.pt", "optimizer_rank1.pt"]


def test_resume_with_two_trainers_continues_the_run(tiny_model, tmp_path):
    """A 2-step run with save_every=1, resumed (resume=auto) to 4 steps, replays an uninterrupted 4-step run: the
    same buffer and the same losses, so the weights, every rank's optimizer state and the buffer came back."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    two = SYNC + ["n_trainers=2", "save_every=1"]
    torchrun(two + ["steps=4"], whole, nproc=4)
    torchrun(two + ["steps=2"], cut, nproc=4)
    assert checkpoint.step_of(str(cut / "checkpoints" / "step_1")) == 1
    p = start(two + ["steps=4", "resume=auto"], cut, nproc=4)
    output, _ = p.communicate(timeout=900)
    assert p.returncode == 0, output[-4000:]
    assert f"resumed from {cut}/checkpoints/final (step 2, buffer" in output
    a, b = ({r["step"]: r for r in read_run(d)[0]} for d in (whole, cut))
    assert sorted(b) == [0, 1, 2, 3, 4] and read_run(cut)[1]["steps"] == 4
    for step in (3, 4):
        assert b[step]["buffer/size"] == a[step]["buffer/size"], step
        assert b[step]["train/loss"] == pytest.approx(a[step]["train/loss"], rel=1e-4), step
    diff = max((x - y).abs().max().item() for x, y in zip(weights(whole).values(), weights(cut).values()))
    assert diff <= 1e-5, diff


def test_killed_trainer_rank_ends_the_job_and_names_it(tiny_model, tmp_path):
    out = str(tmp_path / "run")
    job, pid, output, elapsed = kill_rank_1(["n_trainers=2", "timeout_s=60"], out, nproc=4)
    assert job.returncode != 0 and elapsed < 60, (job.returncode, elapsed, output[-3000:])  # within timeout_s
    assert f"trainer rank 1 (pid {pid}) died" in output, output[-3000:]
    assert "no checkpoint: a trainer rank is gone" in output, output[-3000:]
    time.sleep(1)
    assert leftovers(out) == []


def test_sigterm_to_the_job_saves_with_every_trainer_rank_and_stops_them(tiny_model, tmp_path):
    """Pre-emption: every rank gets SIGTERM; ranks 1..T-1 stay for rank 0's checkpoint (their optimizer states in it),
    then every rank leaves; one line, exit 143."""
    out = str(tmp_path / "run")
    rc, output, seconds = stop_with(signal.SIGTERM, out, 4, ("n_trainers=2",))
    lines = [line for line in output.splitlines() if line.strip()]
    assert rc == 143 and seconds < 30 and len(lines) == 1 and lines[0].startswith("stopped by SIGTERM"), output[-3000:]
    path = checkpoint.latest(os.path.join(out, "checkpoints"))
    assert {"optimizer_rank0.pt", "optimizer_rank1.pt", "model.safetensors"} <= set(os.listdir(path))
    time.sleep(1)
    assert leftovers(out) == []


def test_a_checkpoint_of_two_trainers_refuses_one(tiny_model, tmp_path):
    out = tmp_path / "run"
    launch = ["bash", os.path.join(ROOT, "launch.sh"), "configs/tiny.yaml", f"out_dir={out}", "n_test=4",
              "engine=hf", "progress=false"]
    p = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--prepare", "configs/tiny.yaml",
                        f"out_dir={out}", "n_trainers=2"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "4", p.stderr  # launch.sh starts n_trainers + n_searchers
    p = subprocess.run(launch + ["steps=1", "n_trainers=2"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0 and "done: 1 steps" in p.stdout, p.stderr[-3000:]
    p = subprocess.run(launch + ["steps=3", "resume=auto"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.strip() == (f"error: resume: {out}/checkpoints/final was written with n_trainers=2 "
                                "trainer_parallel=fsdp; resume with that, not n_trainers=1")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "config.py"), "configs/tiny.yaml", "n_trainers=3"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and p.stderr.strip() == ("error: B (8) must be a multiple of n_trainers (3): each "
                                                      "trainer rank takes B / n_trainers whole prompts of a batch")
    assert json.load(open(out / "summary.json"))["steps"] == 1


def test_memory_plan_splits_the_trainer_states_with_fsdp_only():
    shape = dict(params=1000, layers=2, hidden=8, intermediate=16, heads=2, kv_dim=8, vocab=10, positions=None,
                 gated=True, source="by hand")
    machine = dict(mode="own", n_gpus=8, gpu_bytes=80 * 2**30, engine="vllm", kind="nccl")

    def tables(*overrides):
        cfg = load_config(None, ["dtype=bfloat16", "K=2", "B=4", "S=4", "n_searchers=4", *overrides])
        return {title: {part: b for part, b, _ in rows} for title, rows in plan.gpu_tables(cfg, shape, 6, machine)}
    one = tables()["trainer GPU (rank 0)"]
    fsdp = tables("n_trainers=4")
    rank0, other = fsdp["trainer GPU (rank 0)"], fsdp["other trainer GPU (ranks 1..3, each)"]
    assert list(fsdp)[-1] == "searcher GPU (ranks 4..7, each)"
    for part in ("weights", "gradients", "AdamW states"):
        assert rank0[part] == other[part] == one[part] / 4
    root = 10 * 8 * 2 + 8  # untied embeddings and LM head, final norm: whole during a step, and 2 of the 2 layers
    assert rank0["FSDP gathered weights"] == (root + 2 * (1000 - root) / 2) * 2
    assert rank0["weight transport buffers"] == one["weight transport buffers"]  # rank 0 alone pushes
    assert "weight transport buffers" not in other
    ddp = tables("n_trainers=4", "trainer_parallel=ddp")["trainer GPU (rank 0)"]
    assert ddp["weights"] == one["weights"] and ddp["DDP gradient buckets"] == one["gradients"]
