"""n_trainers > 1 on CPU (gloo): ranks 0..T-1 train one model (FSDP2 or DDP), ranks T..N-1 search.

The update equals one trainer's on the same batch (for every loss, whatever its normaliser), a resume continues it,
a dead trainer rank ends the job naming it, SIGTERM saves with every rank, a checkpoint refuses a resume with another
n_trainers, and the memory plan splits the trainer's states with fsdp.
"""
import dataclasses
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

import checkpoint
import plan
import trainer_group
from buffer import Draw, Sample
from config import Config, load_config
from conftest import ROOT, TINY, read_run, start, torchrun
from learner import Learner, checkpointing
from policy import load_model, load_tokenizer, token_logprobs
from test_resilience import kill_rank_1, leftovers, stop_with
from trainer_group import Command

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

    def average(self, sums):
        return sums

    def assemble(self, tensor):
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
    """Learner.update on each half of a batch (whole prompts, the whole batch's token and sample counts), gradients
    averaged as FSDP / DDP average them, equals update on the whole batch: for every loss, whatever its normaliser."""
    cfg = dataclasses.replace(load_config(os.path.join(ROOT, "configs", "tiny.yaml")), B=4, K=4, micro_batch=4,
                              loss=loss, **extra)
    rng = np.random.default_rng(0)
    prompts = [[1] + rng.integers(4, 100, 5).tolist() for _ in range(cfg.B)]
    items = []
    for gid in range(cfg.B):
        for _ in range(cfg.K):
            n = int(rng.integers(2, 9))
            items.append((gid, Sample(gid, tuple(rng.integers(4, 100, n).tolist()), float(rng.integers(0, 2)),
                                     -rng.random(n).astype(np.float32), -rng.random(n).astype(np.float32), 0, True)))
    totals = dict(batch_tokens=sum(len(s.response) for _, s in items), batch_samples=len(items))
    model = load_model(tiny_model, "float32", "cpu")
    learner = Learner(cfg, None, prompts, model, FakeGroup(model))
    grads = []
    for share in (items, items[: len(items) // 2], items[len(items) // 2 :]):
        learner.opt = Capture(model.parameters())
        learner.optimizer_step(share, totals, 1)
        grads.append(learner.opt.grads)
    for whole, a, b in zip(*grads):  # float32 sums in another order: equal up to rounding
        assert (whole - (a + b) / 2).abs().max() <= 1e-5 * whole.abs().max(), loss


def random_batch(cfg, seed, rewards):
    """(prompts, items, totals): B random prompts, K random responses each (2-8 tokens, integer rewards below
    `rewards`, random behaviour and reference log-probs), as Learner.optimizer_step takes them."""
    rng = np.random.default_rng(seed)
    prompts = [[1] + rng.integers(4, 100, 5).tolist() for _ in range(cfg.B)]
    items = [(gid, Sample(gid, tuple(rng.integers(4, 100, n).tolist()), float(rng.integers(0, rewards)),
                         -rng.random(n).astype(np.float32), -rng.random(n).astype(np.float32), 0, True))
            for gid in range(cfg.B) for n in rng.integers(2, 9, cfg.K).tolist()]
    return prompts, items, dict(batch_tokens=sum(len(s.response) for _, s in items), batch_samples=len(items))


@pytest.mark.parametrize("loss, extra", [("tb", {}), ("grpo", {}), ("dr_grpo", {}), ("rloo", {}), ("tba_prime", {}),
                                         ("prime_ratio", {}), ("online_dpo", {}),
                                         ("online_dpo", {"dpo_pairs": "adjacent"})])
def test_micro_batches_below_k_give_the_whole_prompts_update(tiny_model, loss, extra):
    """micro_batch 3 with K = 4 (a prompt's samples over two or three micro-batches, 4 prompts in 6 calls) gives the
    same loss and gradient as whole-prompt micro-batches (float32, rel 1e-5): the group statistics come from the
    whole share first (losses.share_values)."""
    cfg = dataclasses.replace(load_config(os.path.join(ROOT, "configs", "tiny.yaml")), B=4, K=4, micro_batch=4,
                              loss=loss, beta_start=0.5, dpo_beta=0.5, **extra)
    prompts, items, totals = random_batch(cfg, seed=2, rewards=3)
    model = load_model(tiny_model, "float32", "cpu")
    runs = []
    for micro in (4, 3, 16):
        group, sizes = FakeGroup(model), []
        group.logprobs = lambda p, r, t: sizes.append((len(p), torch.is_grad_enabled())) or token_logprobs(model, p,
                                                                                                              r, t)
        learner = Learner(dataclasses.replace(cfg, micro_batch=micro), None, prompts, model, group)
        learner.opt = Capture(model.parameters())
        update = learner.optimizer_step(items, totals, 1)
        runs.append((update.sums["loss"], learner.opt.grads))
        first = [(3, False)] * 5 + [(1, False)] if micro == 3 and loss in ("tb", "tba_prime", "online_dpo") else []
        assert sizes == first + {4: [(4, True)] * 4, 3: [(3, True)] * 5 + [(1, True)], 16: [(16, True)]}[micro]
    (loss_k, grads_k), *others = runs
    for loss_m, grads_m in others:
        assert abs(loss_m - loss_k) <= 1e-5 * max(abs(loss_k), 1e-3), loss
        for a, b in zip(grads_k, grads_m):
            assert (a - b).abs().max() <= 1e-5 * a.abs().max(), loss


@pytest.mark.parametrize("loss", ["tb", "grpo", "online_dpo"])
def test_micro_batches_by_token_budget_give_the_whole_prompts_update(tiny_model, loss):
    """micro_tokens=30: the share's samples sorted by length and packed while count x longest (prompt + response)
    stays within 30 tokens; the same loss and gradient as whole-prompt micro-batches (float32, rel 1e-5)."""
    cfg = dataclasses.replace(load_config(os.path.join(ROOT, "configs", "tiny.yaml")), B=4, K=4, micro_batch=4,
                              loss=loss, beta_start=0.5, dpo_beta=0.5)
    prompts, items, totals = random_batch(cfg, seed=3, rewards=3)
    model = load_model(tiny_model, "float32", "cpu")
    runs = []
    for budget in (0, 30):
        group, calls = FakeGroup(model), []
        group.logprobs = lambda p, r, t: calls.append(len(p) * max(len(a) + len(b) for a, b in zip(p, r))) \
            or token_logprobs(model, p, r, t)
        learner = Learner(dataclasses.replace(cfg, micro_tokens=budget), None, prompts, model, group)
        learner.opt = Capture(model.parameters())
        update = learner.optimizer_step(items, totals, 1)
        runs.append((update.sums["loss"], learner.opt.grads))
        if budget:
            assert len(calls) >= 6 and max(calls) <= budget, calls  # several micro-batches, none over the budget
    (loss_a, grads_a), (loss_b, grads_b) = runs
    assert abs(loss_b - loss_a) <= 1e-5 * max(abs(loss_a), 1e-3)
    for a, b in zip(grads_a, grads_b):
        assert (a - b).abs().max() <= 1e-5 * a.abs().max()


def test_activation_checkpointing_leaves_the_update_unchanged(tiny_model):
    """grad_checkpointing=true recomputes every decoder layer in the backward pass: the same loss and gradient as
    without (float32, rel 1e-5), for a batch of several micro-batches."""
    cfg = dataclasses.replace(load_config(os.path.join(ROOT, "configs", "tiny.yaml")), B=4, K=4, micro_batch=8)
    prompts, items, totals = random_batch(cfg, seed=1, rewards=2)
    runs = []
    for on in (False, True):
        run_cfg = dataclasses.replace(cfg, grad_checkpointing=on)
        model = checkpointing(load_model(tiny_model, "float32", "cpu").train(), run_cfg)
        assert model.is_gradient_checkpointing == on
        learner = Learner(run_cfg, None, prompts, model, FakeGroup(model))
        learner.opt = Capture(model.parameters())
        saved = []  # the tensors autograd keeps for the backward: the activations, unless recomputed
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            update = learner.optimizer_step(items, totals, 1)
        runs.append((update.sums["loss"], learner.opt.grads, sum(saved)))
    (loss_off, grads_off, saved_off), (loss_on, grads_on, saved_on) = runs
    assert saved_on < saved_off / 2, (saved_on, saved_off)
    assert abs(loss_on - loss_off) <= 1e-5 * abs(loss_off)
    for off, on in zip(grads_off, grads_on):
        assert (on - off).abs().max() <= 1e-5 * off.abs().max()


# ---------------------------------------------------------------- the commands' protocol, no processes


class Store:
    """torchrun's store between rank 0 and one follower, run one after the other in this process."""

    def __init__(self):
        self.keys = {}

    def set(self, key, value):
        self.keys[key] = value if isinstance(value, bytes) else str(value).encode()

    def get(self, key):
        return self.keys[key]

    def check(self, keys):
        return all(k in self.keys for k in keys)

    def wait(self, keys, timeout=None):
        if not self.check(keys):
            raise dist.DistStoreError("the follower waits for a command rank 0 never gave")

    def delete_key(self, key):
        self.keys.pop(key, None)


class Recorder:
    """Stands in for torch.distributed in trainer_group.py and records each collective a side makes; the shares of a
    scatter pass from rank 0 to the follower."""
    DistStoreError = dist.DistStoreError

    def __init__(self):
        self.calls, self.shares = [], None

    def scatter_object_list(self, out, shares, src=0):
        self.calls.append("scatter")
        if shares is not None:
            self.shares = shares
        out[0] = self.shares[0 if shares is not None else 1]

    def all_reduce(self, tensor):
        self.calls.append("all_reduce")
        tensor *= 2  # the sum of two equal ranks' values

    def barrier(self):
        self.calls.append("barrier")

    def destroy_process_group(self):
        self.calls.append("destroy")


def rank_of_two(model, rank, store):
    """A trainer_group.Group of rank `rank` in a group of two under fsdp, without a process group."""
    group = trainer_group.Group.__new__(trainer_group.Group)
    group.size, group.parallel, group.rank, group.model, group.failed, group.n = 2, "fsdp", rank, model, False, 0
    group.root = group.store = store
    group.net = group.logprobs = trainer_group.LogProbs(model)
    return group


# rank 0's side of each command, as trainer.py and learner.py make it; close() ends every sequence (STOP)
RANK0 = {
    Command.STEP: lambda learner, batch, tmp: learner.train(batch, 1),
    Command.PARAMS: lambda learner, batch, tmp: [p for p in learner.group.gather_params().values()],
    Command.STATE: lambda learner, batch, tmp: learner.group.gather_state(),
    Command.PROBE: lambda learner, batch, tmp: learner.probe(),
    Command.SAVE: lambda learner, batch, tmp: learner.group.save_shards(learner.opt, tmp),
    Command.STOP: lambda learner, batch, tmp: None,
}


def both_sides(command, tiny_model, tmp_path, monkeypatch):
    """The collectives rank 0 makes for `command` and those a follower makes for it (trainer_group.follow)."""
    recorder = Recorder()
    monkeypatch.setattr(trainer_group, "dist", recorder)
    monkeypatch.setattr(trainer_group.failures, "catch_signals", lambda: [])
    monkeypatch.setattr(torch.nn.Parameter, "full_tensor", lambda p: recorder.calls.append("param") or p, raising=False)
    monkeypatch.setattr(trainer_group.Group, "full_state_dict", lambda group: recorder.calls.append("state") or {})
    forward, generate = trainer_group.LogProbs.forward, trainer_group.LogProbs.generate
    monkeypatch.setattr(trainer_group.LogProbs, "forward",
                        lambda net, *a: recorder.calls.append("forward") or forward(net, *a))
    monkeypatch.setattr(trainer_group.LogProbs, "generate",
                        lambda net, **kw: recorder.calls.append("generate") or generate(net, **kw))
    cfg = dataclasses.replace(load_config(os.path.join(ROOT, "configs", "tiny.yaml")), B=4, K=4, micro_batch=4)
    rng = np.random.default_rng(0)
    prompts = [[1] + rng.integers(4, 100, 5).tolist() for _ in range(cfg.B)]
    batch = [Draw(gid, [Sample(gid, tuple(rng.integers(4, 100, 3).tolist()), 1.0, -np.ones(3, np.float32),
                          -np.ones(3, np.float32), 0, True) for _ in range(cfg.K)], False) for gid in range(cfg.B)]
    tok, store, sides = load_tokenizer(tiny_model), Store(), []
    for rank in (0, 1):
        model = load_model(tiny_model, "float32", "cpu")
        learner = Learner(cfg, tok, prompts, model, rank_of_two(model, rank, store))
        recorder.calls = []
        if rank == 0:
            RANK0[command](learner, batch, str(tmp_path))
            learner.group.close()
        else:
            trainer_group.follow(learner)
        sides.append(recorder.calls)
    return sides


@pytest.mark.parametrize("command", list(Command))
def test_rank_0_and_a_follower_make_the_same_collectives_for_every_command(tiny_model, tmp_path, monkeypatch,
                                                                          command):
    assert set(RANK0) == set(Command)  # a new command needs its rank-0 side here
    rank0, follower = both_sides(command, tiny_model, tmp_path, monkeypatch)
    assert rank0 == follower and rank0[-1] == "destroy"
    assert len(rank0) > 1 or command is Command.STOP  # every other command makes collectives of its own


def test_the_protocol_test_sees_two_sides_drift_apart(tiny_model, tmp_path, monkeypatch):
    """A follower whose save skips the barrier (rank 0 would wait in it until timeout_s) is caught."""
    def save_without_barrier(learner, arg, share):
        trainer_group.dist.barrier = lambda: None
        learner.group.save_shards(learner.opt, arg)
    monkeypatch.setitem(trainer_group.FOLLOW, Command.SAVE, save_without_barrier)
    rank0, follower = both_sides(Command.SAVE, tiny_model, tmp_path, monkeypatch)
    assert rank0 != follower and rank0.count("barrier") == 1 and "barrier" not in follower


def test_every_trainer_rank_sets_nccl_error_handling_before_its_group_is_built(monkeypatch):
    """NCCL reads TORCH_NCCL_ASYNC_ERROR_HANDLING when a group is built: every trainer rank (followers too) must have
    2 by then, or a dead trainer rank ends rank 0 in NCCL's watchdog before it can name it."""
    seen = []

    class Built(Exception):
        pass

    def init_process_group(backend, **kwargs):
        seen.append((backend, os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")))
        raise Built
    monkeypatch.setattr(trainer_group.dist, "init_process_group", init_process_group)
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    cfg = Config(n_trainers=2)
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(Built):
            trainer_group.Group(cfg, torch.nn.Linear(2, 2), "cuda", dist.HashStore())
    assert seen == [("cpu:gloo,cuda:nccl", "2")] * 2


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
    job = start(SYNC + ["steps=1", "n_trainers=2", f"trainer_parallel={parallel}"], out, nproc=4)
    output, _ = job.communicate(timeout=900)
    assert job.returncode == 0, output[-6000:]
    assert "Warning" not in output, output[-6000:]  # our lines only (torch 2.13's DDP warned on broadcast_buffers)
    rows, summary = read_run(out)
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
    # its checkpoint refuses one trainer: launch.sh (the user's command) says so in one line, before any rank starts
    p = subprocess.run(["bash", os.path.join(ROOT, "launch.sh"), "configs/tiny.yaml", f"out_dir={cut}", *SYNC,
                        "progress=false", "steps=6", "resume=auto"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.strip() == (f"error: resume: {cut}/checkpoints/final was written with n_trainers=2 "
                                "trainer_parallel=fsdp; resume with that, not n_trainers=1")
    assert read_run(cut)[1]["steps"] == 4


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


def test_n_trainers_adds_ranks_and_divides_the_batch(tmp_path):
    """launch.sh starts n_trainers + n_searchers ranks (train.py --prepare says how many); B must split into whole
    prompts per trainer rank. (A checkpoint of two trainers refusing one: test_resume_with_two_trainers_...)"""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--prepare", "configs/tiny.yaml",
                        f"out_dir={tmp_path / 'run'}", "n_trainers=2"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "4", p.stderr
    p = subprocess.run([sys.executable, os.path.join(ROOT, "config.py"), "configs/tiny.yaml", "n_trainers=3"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and p.stderr.strip() == ("error: B (8) must be a multiple of n_trainers (3): each "
                                                      "trainer rank takes B / n_trainers whole prompts of a batch")


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
