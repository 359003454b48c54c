"""The metrics the ablations read (docs/ablations.md): distinct responses per trained group, the trained samples'
staleness and reward, and the KL of the policy to its start model (eval_kl_sft), on hand-made batches, on the tiny
model's HF engine, and in a tiny run whose reference resets every step."""
import json
import os
import types

import numpy as np
import pytest
import torch

from buffer import Draw, Sample
from config import ConfigError, load_config
from conftest import ROOT, torchrun
from engine import HFEngine
from eval import evaluate
from learner import Learner, Update
from policy import load_model, load_tokenizer, sequence_logprobs
from rewards import arith


def sample(pid, response, reward, version):
    return Sample(pid, tuple(response), reward, np.zeros(len(response), np.float32),
                  np.zeros(len(response), np.float32), version, True)


def test_a_steps_row_has_distinct_responses_per_group_staleness_and_reward():
    """Two groups of K = 4: one response four times over (1 distinct), three responses with one repeated (3): 2 on
    average. Staleness counts the updates between a sample's weights and the step's (step - 1 - version)."""
    cfg = load_config(os.path.join(ROOT, "configs", "tiny.yaml"), ["K=4", "B=2"])
    batch = [Draw(0, [sample(0, [5, 6], 1.0, 9)] * 4, True),
             Draw(1, [sample(1, [5], 0.0, 7), sample(1, [6], 1.0, 7), sample(1, [7, 8], 0.0, 3),
                      sample(1, [6], 1.0, 7)], False)]
    items = [(g, s) for g, d in enumerate(batch) for s in d.samples]
    update = Update(0.05, 3e-5, {"loss": 0.1, "logp": -2.0, "logp_ref": -2.5, "logp_behav": -2.1},
                    torch.tensor(1.0), True)
    learner = types.SimpleNamespace(cfg=cfg, prompts=[[1, 2, 3], [1, 2, 4]], model=torch.nn.Linear(1, 1))
    row = Learner.metrics(learner, batch, items, update, 10, 0.5)
    assert row["train/distinct_per_group"] == 2.0
    assert row["staleness/mean"] == (4 * 0 + 3 * 2 + 6) / 8 and row["staleness/max"] == 6
    assert row["train/reward_mean"] == 6 / 8


def test_kl_sft_needs_eval_samples():
    with pytest.raises(ConfigError, match="eval_kl_sft=true estimates the KL on the evaluation's samples"):
        load_config(os.path.join(ROOT, "configs", "tiny.yaml"), ["eval_kl_sft=true"])
    assert load_config(os.path.join(ROOT, "configs", "tiny.yaml"), ["eval_kl_sft=true", "eval_samples=4"]).eval_kl_sft


def test_kl_sft_is_zero_at_the_start_model_and_positive_once_the_weights_move(tiny_model):
    """The HF engine's own log-probs of its samples against the start model's: about 0 while they are the same
    weights (sequence_logprobs in other batches: rounding), clearly above 0 once the engine's weights moved."""
    cfg = load_config(os.path.join(ROOT, "configs", "tiny.yaml"), ["engine=hf", "eval_samples=4", "eval_kl_sft=true"])
    tok = load_tokenizer(tiny_model)
    engine = HFEngine(cfg, "cpu", 0, tok.pad_token_id, tok.eos_token_id)
    start = load_model(tiny_model, "float32", "cpu").eval()
    sft = lambda prompts, responses: sequence_logprobs(start, prompts, responses, 0.7, 4096)  # noqa: E731
    records = arith.load("procedural:test:6", "test")
    rows, totals = evaluate(engine, tok, arith, records, 24, samples=4, temperature=0.7, sft=sft)
    assert totals["kl_sft"][1] == 6 and abs(totals["kl_sft"][0] / 6) < 1e-3
    assert all(abs(r["kl_sft"]) < 1e-3 for r in rows)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in engine.model.parameters():
            p.add_(0.5 * p.std() * torch.randn(p.shape, generator=gen))
    rows, totals = evaluate(engine, tok, arith, records, 24, samples=4, temperature=0.7, sft=sft)
    assert totals["kl_sft"][0] / 6 > 0.5


def test_a_run_with_reference_resets_measures_the_kl_to_its_start_model(tiny_model, tmp_path):
    """ref_reset_every=1: the reference is the policy of the last round, so a KL to it would read about 0 at the
    end; eval/kl_sft is to the start model (a copy each searcher keeps): about 0 at step 0, above 0 after 4 steps."""
    out = tmp_path / "run"
    rows, _ = torchrun(["engine=hf", "steps=4", "n_test=8", "eval_samples=2", "eval_kl_sft=true", "ref_reset_every=1",
                        "lr=3e-3", "initial_buffer=16", "time_budget_min=0"], out)
    evals = [r for r in rows if "eval/kl_sft" in r]
    assert [r["step"] for r in evals] == [0, 4]
    assert abs(evals[0]["eval/kl_sft"]) < 1e-3 and evals[1]["eval/kl_sft"] > 0.05, evals
    problems = [json.loads(line) for line in open(out / "eval_step4.jsonl")]
    assert evals[1]["eval/kl_sft"] == pytest.approx(sum(p["kl_sft"] for p in problems) / len(problems))
