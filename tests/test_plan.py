"""Memory plan (plan.py, train.py --plan / --prepare): the verdicts, the layout, and each component's arithmetic."""
import json
import os
import subprocess
import sys

import pytest

import plan
import train
from config import ConfigError, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GB = 2**30
# a made-up shape small enough to check by hand: hidden 8, MLP 16 (gated), 2 layers, KV width 8, vocab 10
SHAPE = dict(params=1000, layers=2, hidden=8, intermediate=16, heads=2, kv_dim=8, vocab=10, positions=None, gated=True,
             source="by hand")
SMALL = ["dtype=bfloat16", "K=2", "B=3", "S=4", "micro_batch=4", "max_new_tokens=10", "n_searchers=3",
         "chunk_prompts=2", "vllm_gpu_memory_utilization=0.5"]


def run_plan(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--plan", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))


def rows(cfg, mode, kind, engine="vllm", gpu_gb=10):
    machine = dict(mode=mode, n_gpus=4 if mode == "own" else 1, gpu_bytes=gpu_gb * GB, engine=engine, kind=kind)
    return {title.split(" (")[0]: {part: b for part, b, _ in parts}
            for title, parts in plan.gpu_tables(cfg, SHAPE, 6, machine)}


def test_7b_trainer_on_one_40gb_gpu_is_refused():
    p = run_plan(os.path.join("configs", "math_tba_prime.yaml"), "--gpus", "1", "--gpu-memory-gb", "40")
    lines = p.stdout.strip().splitlines()
    assert p.returncode == 2, p.stdout + p.stderr
    assert "every rank on one GPU" in lines[0] and "7,615,616,512 parameters" in p.stdout
    verdicts = [line for line in lines if line.startswith(("fits", "does not fit"))]
    assert verdicts == [lines[-1]] and lines[-1].startswith("does not fit: shared GPU ") and "of 40 GB" in lines[-1]


def test_gsm8k_on_four_80gb_gpus_fits():
    p = run_plan(os.path.join("configs", "gsm8k.yaml"), "--gpus", "4", "--gpu-memory-gb", "80")
    assert p.returncode == 0, p.stdout + p.stderr
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("fits: trainer GPU ") and "searcher GPU" in last and "a GPU per rank" in p.stdout
    assert "1,100,048,384 parameters" in p.stdout and "weights by nccl" in p.stdout


def test_component_arithmetic_by_hand():
    cfg = load_config(None, SMALL)
    own = rows(cfg, "own", "nccl")
    seq, n = 6 + 10, 4  # prompt + max_new_tokens; micro_batch 4 samples, each padded to seq tokens
    layer = 2 * (8 * 8 + 4 * 16) + 8 * 8  # e (8h + 4i) + 8h = 320 bytes per token
    per_token = 2 * layer + (4 * 8 + 2 * 2 * 8) + layer // 2  # layers, final norm + gathered hidden, half a layer
    assert own["trainer GPU"] == {
        "weights": 1000 * 2, "gradients": 1000 * 2, "AdamW states": 2 * 1000 * 2, "weight transport buffers": 1000 * 2,
        "activations": n * seq * per_token, "LM-head chunk": n * seq * 10 * 16, "CUDA context": GB}
    n_seq = 2 * 4  # chunk_prompts x S sequences, fewer than the 64 of a reference batch
    live = 2 * (3 * 16 + 3 * 8)  # e (3i + 3h): no KV cache (token_logprobs runs with use_cache=False)
    body = n_seq * seq * live + n_seq * seq * seq  # the decoder blocks and the padding mask
    head = n_seq * seq * 2 * 2 * 8 + n_seq * seq * 10 * 8  # then the hidden states and one chunk's logits, 8 B each
    logprobs = max(body, head)
    # two buckets (here: the whole model, 2000 B) and a layer's copies, (1000 - 10 x 8) / 2 layers x 2 B
    assert own["searcher GPU"] == {"reference model": 2000, "vLLM engine": 0.5 * 10 * GB,
                                   "weight receive buffers": 2000 + 920, "log-probs, no grad": logprobs,
                                   "CUDA context": GB}
    f32 = rows(load_config(None, SMALL + ["dtype=float32"]), "own", "nccl")
    assert f32["trainer GPU"]["weights"] == 4000 and f32["trainer GPU"]["AdamW states"] == 8000
    hf = rows(cfg, "own", "nccl", engine="hf")["searcher GPU"]
    assert hf["HF engine"] == 2000 + n_seq * seq * 2 * 2 * 8 * 2  # weights + static KV cache (layers x K, V x kv x e)


def test_activation_checkpointing_keeps_each_layers_input_and_one_layer():
    """grad_checkpointing: every layer keeps only its input (e h bytes per token) until the backward recomputes it,
    one layer's saved tensors at a time; with it (and the searchers' reference log-probs logprob_tokens at a time) the
    7B MATH recipe fits 8 x 80 GB by the plan (its trainer rank 0 needs 258 GB without)."""
    cfg = load_config(None, SMALL + ["grad_checkpointing=true"])
    seq, n = 6 + 10, 4
    layer = 2 * (8 * 8 + 4 * 16) + 8 * 8
    per_token = 2 * (2 * 8) + layer + (4 * 8 + 2 * 2 * 8) + layer // 2  # 2 layers' inputs, one layer, as before
    assert rows(cfg, "own", "nccl")["trainer GPU"]["activations"] == n * seq * per_token
    math = ["n_trainers=4", "n_searchers=4", "micro_batch=16", "--gpus", "8", "--gpu-memory-gb", "80"]
    off, on = (run_plan("configs/math_tba_prime.yaml", *math, "grad_checkpointing=false"),
               run_plan("configs/math_tba_prime.yaml", *math))  # the config has grad_checkpointing: true
    assert off.returncode == 2 and "trainer GPU 258.2" in off.stdout.splitlines()[-1], off.stdout
    assert "it fits with grad_checkpointing=true" in off.stdout.splitlines()[-1]
    assert on.returncode == 0 and on.stdout.splitlines()[-1].startswith("fits: trainer GPU 44.9"), on.stdout
    assert "recomputed per layer" in on.stdout and "7 x 2304 tokens" in on.stdout  # logprob_tokens: 16384 at a time


@pytest.mark.parametrize("config, gpus, verdict", [
    ("math_tba_prime.yaml", ["--gpus", "4"], "fits: trainer GPU 74.5 of 80 GB, searcher GPU 60.8"),
    ("math_tba_prime.yaml", ["n_trainers=4", "n_searchers=4", "--gpus", "8"], "fits: trainer GPU 34.8 of 80 GB"),
    ("countdown.yaml", ["--gpus", "4"], "fits: trainer GPU 73.6 of 80 GB, searcher GPU 60.7")])
def test_the_7b_recipes_fit_80gb_gpus_at_their_own_lengths(config, gpus, verdict):
    """The paper's 7B recipes as the configs carry them (MATH: 2048 new tokens; Countdown: 4096-token sequences)
    fit 80 GB GPUs by the plan: activation checkpointing and micro-batches below K (a prediction; no GPU measured)."""
    p = run_plan(os.path.join("configs", config), *gpus, "--gpu-memory-gb", "80", "--prompt-tokens", "256")
    assert p.returncode == 0 and p.stdout.splitlines()[-1].startswith(verdict), p.stdout
    assert "recomputed per layer" in p.stdout


def test_token_budget_micro_batches_count_the_sequences_that_fit_it():
    seq = 6 + 10
    for budget, n in ((2 * seq + 3, 2), (5, 1)):  # 2 whole sequences; a budget below one still takes one
        cfg = load_config(None, SMALL + [f"micro_tokens={budget}"])
        assert rows(cfg, "own", "nccl")["trainer GPU"]["LM-head chunk"] == n * seq * 10 * 16


def test_host_memory_counts_the_weight_copies_rank_0_keeps():
    """weight_delay = D keeps D + 1 CPU copies of the weights, TBA's reset reference one, an fsdp save one."""
    cfg = load_config(None, SMALL + ["weight_delay=2", "ref_reset_every=50"])
    assert plan.host_rows(cfg, SHAPE) == [("weight_delay versions", 3 * 2000, "D + 1 = 3 copies of the weights"),
                                          ("reference weights", 2000, "TBA's reset reference, kept for checkpoints")]
    fsdp = load_config(None, SMALL + ["n_trainers=3"])
    assert plan.host_rows(fsdp, SHAPE) == [("assembled state dict", 2000, "while saving (and at a reference reset)")]
    assert plan.host_rows(load_config(None, SMALL), SHAPE) == []


def test_shared_layout_adds_every_ranks_parts():
    cfg = load_config(None, SMALL)
    own, shared = rows(cfg, "own", "nccl"), rows(cfg, "shared", "ipc")
    assert list(shared) == ["shared GPU"]
    trainer, searcher, one = own["trainer GPU"], own["searcher GPU"], shared["shared GPU"]
    assert {k: one[k] for k in trainer} == trainer
    for part in ("reference model", "log-probs, no grad", "CUDA context"):  # each of the 3 searchers' own
        assert one[f"searchers: {part}s" if part == "reference model" else f"searchers: {part}"] == 3 * searcher[part]
    assert one["searchers: vLLM engines"] == 0.5 * 10 * GB  # the fraction is what the engines take together
    receive = one["searchers: weight receive buffers"]  # ipc: a bucket's copies out of the trainer's buffers each
    assert 0 < receive / 3 <= searcher["weight receive buffers"]  # nccl: two buffers of its own besides
    assert sum(one.values()) == sum(trainer.values()) + 3 * (searcher["reference model"] + searcher[
        "log-probs, no grad"] + searcher["CUDA context"]) + 0.5 * 10 * GB + receive


def test_local_tiny_model_shape_from_config_json(tiny_model):
    from transformers import AutoModelForCausalLM
    shape = plan.model_shape(tiny_model)
    c = json.load(open(os.path.join(tiny_model, "config.json")))
    real = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model).parameters())
    assert (shape["hidden"], shape["layers"], shape["vocab"], shape["intermediate"], shape["positions"]) == (
        c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"], c["max_position_embeddings"])
    assert shape["params"] == real and shape["gated"] and shape["source"].endswith("config.json")
    p = run_plan(os.path.join("configs", "tiny.yaml"), "--gpus", "3", "--gpu-memory-gb", "16")
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"{real:,} parameters" in p.stdout and "the longest in the data" in p.stdout


def test_known_hub_shapes_match_published_counts():
    counts = {"realtreetune/rho-1b-sft-GSM8K": 1_100_048_384, "Qwen/Qwen2.5-7B": 7_615_616_512, "gpt2": 124_439_808}
    assert {m: plan.model_shape(m)["params"] for m in counts} == counts


def test_bad_gpu_count_is_the_layouts_refusal():
    with pytest.raises(ConfigError) as e:
        train.gpu_layout(3, 4, 0)
    p = run_plan(os.path.join("configs", "gsm8k.yaml"), "--gpus", "3", "--gpu-memory-gb", "80")
    assert p.returncode == 2 and p.stdout == "" and p.stderr == f"error: {e.value}\n"


@pytest.mark.parametrize("args, message", [
    (["--gpus", "4"], "--plan needs --gpus N and --gpu-memory-gb M"),
    (["--gpus", "two", "--gpu-memory-gb", "80"], "--gpus needs a number, got 'two'"),
    (["--gpus", "4", "--gpu-memory-gb", "80", "model=someone/unknown-model"], "give --params N --layers L --hidden H"),
    (["--gpus", "4", "--gpu-memory-gb", "80", "--params", "1e9"], "needs --layers --hidden --vocab too"),
])
def test_plan_mistakes_are_one_line(args, message):
    p = run_plan(os.path.join("configs", "gsm8k.yaml"), *args)
    assert p.returncode == 2 and p.stdout == "" and message in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_shape_by_hand_for_an_unknown_model():
    p = run_plan(os.path.join("configs", "gsm8k.yaml"), "model=someone/unknown-model", "--gpus", "4",
                 "--gpu-memory-gb", "80", "--params", "1100048384", "--layers", "22", "--hidden", "2048", "--vocab",
                 "32000", "--prompt-tokens", "100")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1,100,048,384 parameters, 22 layers" in p.stdout and "612 tokens = 100 prompt (--prompt-tokens)" in p.stdout


def test_prepare_check_refuses_in_one_line_and_passes_a_fitting_plan():
    """--prepare's check on a GPU node (train.prepare calls it with the GPUs present; on CPU it is never called)."""
    cfg = load_config(os.path.join(ROOT, "configs", "math_tba_prime.yaml"), ["grad_checkpointing=false"])
    with pytest.raises(ConfigError) as e:
        plan.prepare_check(cfg, "own", 4, 80 * GB, 300, "vllm")
    assert str(e.value).startswith("memory plan: does not fit: trainer GPU") and "\n" not in str(e.value)
    gsm8k = load_config(os.path.join(ROOT, "configs", "gsm8k.yaml"))
    assert plan.prepare_check(gsm8k, "own", 4, 80 * GB, 300, "vllm").startswith("memory plan: fits: trainer GPU")


def test_advice_names_a_change_that_fits():
    """The verdict's suggestions are checked: each one, applied, makes the plan fit."""
    cfg = load_config(os.path.join(ROOT, "configs", "gsm8k.yaml"))
    shape = plan.model_shape(cfg.model)
    shared = plan.machine(cfg, "shared", 1, 64 * GB, "vllm")
    ok, line = plan.verdict(cfg, shape, 256, shared)
    assert not ok and "4 GPUs (one per rank)" in line
    changes = [w for w in line.split() if "=" in w]
    assert {c.split("=")[0] for c in changes} == {"grad_checkpointing", "micro_batch", "vllm_gpu_memory_utilization",
                                                  "max_new_tokens"}
    for change in changes:
        assert plan.verdict(load_config(os.path.join(ROOT, "configs", "gsm8k.yaml"), [change]), shape, 256, shared)[0]


def test_prepare_plans_the_gpus_present_and_nothing_on_cpu(tiny_model, monkeypatch, capsys, tmp_path):
    """train.prepare on a (faked) node of 3 GPUs: refused in one line when they are too small, a 'fits' line on stderr
    when not; with device=cpu the plan is never made."""
    import types
    import torch
    monkeypatch.setattr(train, "GPUS", ["0", "1", "2"])
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    tiny = os.path.join(ROOT, "configs", "tiny.yaml")
    for gb, fits in ((1, False), (16, True)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=gb * GB))
        cfg = load_config(tiny, ["device=cuda", "n_searchers=2", f"out_dir={tmp_path}/run"])
        if not fits:
            with pytest.raises(ConfigError) as e:
                train.prepare(cfg)
            assert str(e.value).startswith("memory plan: does not fit: trainer GPU") and "\n" not in str(e.value)
            assert "of 1 GB" in str(e.value)
        else:
            train.prepare(cfg)
            out, err = capsys.readouterr()
            assert out == "3\n" and err.startswith("memory plan: fits: trainer GPU") and "of 16 GB" in err
    monkeypatch.setattr(plan, "prepare_check", lambda *a: pytest.fail("planned on CPU"))
    train.prepare(load_config(tiny, ["device=cpu", f"out_dir={tmp_path}/run"]))
    assert capsys.readouterr().out == "3\n"


def test_lora_counts_the_adapters_as_peft_makes_them_and_fits_the_7b_recipe_on_one_gpu(tiny_model):
    """lora_rank: gradients and AdamW states of the adapters only, as many as learner.lora_model makes (counted on
    the tiny model), float32 like the adapters whatever the base's dtype; the LoRA variant of the MATH recipe fits
    one 80 GB GPU by the plan, the recipe itself does not."""
    import types

    import torch

    from learner import lora_model
    from policy import load_model
    model = lora_model(load_model(tiny_model, "bfloat16", "cpu"), types.SimpleNamespace(lora_rank=4, lora_alpha=4.0,
                                                                                         seed=0))
    made = [p for p in model.parameters() if p.requires_grad]
    assert {p.dtype for p in made} == {torch.float32}
    assert plan.lora_params(plan.model_shape(tiny_model), 4) == sum(p.numel() for p in made)
    path = os.path.join(ROOT, "configs", "math_tba_prime_lora.yaml")
    cfg = load_config(path)
    shape = plan.model_shape(cfg.model)
    one = plan.machine(cfg, "shared", 1, 80 * GB, "vllm")
    rows = dict((part, b) for part, b, _ in plan.gpu_tables(cfg, shape, 256, one)[0][1])
    adapters = plan.lora_params(shape, 64) * 4  # float32 on the bfloat16 base
    assert cfg.dtype == "bfloat16" and rows["weights"] == shape["params"] * 2 + adapters
    assert rows["gradients"] == adapters and rows["AdamW states"] == 2 * adapters
    assert plan.verdict(cfg, shape, 256, one)[0]
    full = load_config(path, ["lora_rank=0"])
    ok, line = plan.verdict(full, shape, 256, one)
    assert not ok and "lora_rank=64" in line.split()
