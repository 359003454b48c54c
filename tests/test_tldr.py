"""The TL;DR task (rewards/tldr.py): data, the reward-model reward with its non-EOS penalty, win rate and perplexity,
the seam that carries model-based rewards and metrics (rewards.score_batch, searcher.task_hook, eval.evaluate), and a
tiny run end to end. Models: the shipped tiny assets (assets/, made by scripts/make_tiny_models.py)."""
import json
import math
import os

import numpy as np
import pytest
import torch

import rewards
import searcher
from conftest import ROOT, TINY, task_run
from config import Config
from eval import evaluate
from policy import load_tokenizer
from rewards import DataError, arith, tldr

CACHE = os.path.join(ROOT, "assets")


class FakeEngine:
    """engine.generate that answers each prompt with the next prepared response (token ids), in order."""

    def __init__(self, responses):
        self.responses = list(responses)
        self.temperatures = []

    def generate(self, prompts, n, temperature, max_new_tokens):
        self.temperatures.append(temperature)
        return [[(self.responses.pop(0), np.zeros(0, dtype=np.float32))] for _ in prompts]


@pytest.fixture(scope="module")
def cfg(tiny_task_models):
    return Config(task="tldr", model=TINY, reward_model=os.path.join(CACHE, "tiny-tldr", "rm"),
                  judge_model=os.path.join(CACHE, "tiny-tldr", "judge"))


@pytest.fixture(scope="module")
def records(tiny_task_models):
    return tldr.load(os.path.join(CACHE, "tiny-tldr", "test.jsonl"), "test")


@pytest.fixture(scope="module")
def scorer(cfg):
    return tldr.make_scorer(cfg, "cpu")


@torch.no_grad()
def score_alone(clf, text):
    """A one-output classifier's score of one text, computed apart from Classifier.logits: no batch, no padding, the
    score head applied to the last hidden state of text + EOS."""
    ids = torch.tensor([clf.tok(text)["input_ids"] + [clf.tok.eos_token_id]])
    hidden = clf.model.model(input_ids=ids).last_hidden_state[0, -1]
    return clf.model.score(hidden)[0].item()


def test_load_jsonl_and_errors(tmp_path, records):
    assert len(records) == 32 and all(r["prompt"].endswith("\n\nTL;DR:") for r in records)
    assert all(r["answer"].startswith(" ") and r["answer"].endswith(" has " + r["answer"].split(" has ")[1])
               for r in records)
    path = tmp_path / "t.jsonl"
    path.write_text('{"query": "POST: hi\\n\\nTL;DR:", "reference_response": " hello", "extra": 1}\n')
    assert tldr.load(str(path), "train") == [{"prompt": "POST: hi\n\nTL;DR:", "answer": " hello"}]
    path.write_text('{"query": "q", "reference_response": " r"}\n{"query": "q"}\n')
    with pytest.raises(DataError, match=r"t\.jsonl:2:.*reference_response"):
        tldr.load(str(path), "train")
    with pytest.raises(DataError, match="git checkout -- assets"):
        tldr.load("assets/tiny-tldr/missing.jsonl", "train")


def test_reward_is_the_rm_score_when_finished_and_minus_one_otherwise(scorer, records):
    rs = records[:6]
    completions = [rs[0]["answer"], "", " Tom Tom Tom.", rs[3]["answer"] + " and more" * 20, " x", rs[5]["answer"]]
    finished = [True, True, True, True, False, False]
    rewards = scorer.score([r["prompt"] for r in rs], completions, rs, finished)  # one batch, lengths 1..70 tokens
    assert len(rewards) == 6 and all(isinstance(x, float) for x in rewards)
    for r, c, f, got in zip(rs, completions, finished, rewards):
        if f:
            assert got == pytest.approx(score_alone(scorer.rm, r["prompt"] + c), abs=1e-4)
        else:
            assert got == tldr.NON_EOS_PENALTY
    assert tldr.NON_EOS_PENALTY == -1.0


def test_reward_survives_malformed_completions(scorer, records):
    cases = ["", "</s>", "<s><pad></s><unk>", "</s></s></s>", "\n\n\n", " Tom has apples." * 2000, "🤖 ; \x00 \t"]
    p = records[0]["prompt"]
    for finished in (True, False):
        rewards = scorer.score([p] * len(cases), cases, [records[0]] * len(cases), [finished] * len(cases))
        assert len(rewards) == len(cases) and all(math.isfinite(x) for x in rewards)
        assert finished or rewards == [-1.0] * len(cases)
    assert scorer.score([], [], [], []) == []


def test_tiny_reward_model_prefers_the_reference_summary(scorer, records):
    """The tiny RM was trained to rank the reference above empty, repeated and copied-post summaries."""
    for r in records:
        main = r["answer"].split()[0]
        post = r["prompt"].split("POST: ")[1].split("\n")[0]
        summaries = [r["answer"], "", f" {main} {main} {main}.", " " + post]
        good, empty, repeated, copied = scorer.score([r["prompt"]] * 4, summaries, [r] * 4, [True] * 4)
        assert good > max(empty, repeated, copied)


def test_win_rate_and_perplexity(cfg, records):
    ev = tldr.make_evaluator(cfg, "cpu")
    tok = load_tokenizer(TINY)
    rs = records[:5]
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    responses = [enc(rs[0]["answer"]) + [tok.eos_token_id],  # the reference itself: a tie, not a win
                 [tok.eos_token_id],  # empty summary
                 enc(" 3 + 4 = 7."),  # unfinished
                 enc(" Tom Tom Tom.") + [tok.eos_token_id],
                 enc(rs[4]["answer"].replace(".", " and more.")) + [tok.eos_token_id]]
    engine = FakeEngine(responses)
    rows, totals = ev.evaluate(engine, tok, rs, 24)
    assert engine.temperatures == [0.0]  # greedy by default (the Config default eval_temperature)
    assert [r["summary"] for r in rows] == [tok.decode(x, skip_special_tokens=True) for x in responses]
    assert rows[0]["summary"] == rs[0]["answer"] and rows[0]["win"] is False
    assert rows[0]["judge_policy"] == pytest.approx(rows[0]["judge_reference"], abs=1e-5)
    for r, row, resp in zip(rs, rows, responses):
        p, q = score_alone(ev.judge, r["prompt"] + row["summary"]), score_alone(ev.judge, r["prompt"] + r["answer"])
        assert row["judge_policy"] == pytest.approx(p, abs=1e-4) and row["judge_reference"] == pytest.approx(q, abs=1e-4)
        assert row["win"] == (row["judge_policy"] > row["judge_reference"])
        # perplexity apart from token_logprobs: exp(mean NLL) of the response tokens under the SFT model at T = 1
        prompt = tok(r["prompt"])["input_ids"]
        with torch.no_grad():
            logits = ev.sft(input_ids=torch.tensor([prompt + resp])).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)[torch.arange(len(resp)), torch.tensor(resp)]
        assert row["perplexity"] == pytest.approx(math.exp(-logp.mean().item()), rel=1e-4)
    assert totals["win_rate"] == [sum(r["win"] for r in rows), 5]
    assert totals["perplexity"][1] == 5 and totals["perplexity"][0] == pytest.approx(sum(r["perplexity"] for r in rows))
    json.dumps(rows)  # rows go to eval_stepN.jsonl as they are


def test_seam_scorer_errors_count_as_zero_with_three_warnings(capsys):
    class Boom:
        def score(self, prompts, completions, records, finished):
            raise RuntimeError("boom")

    class Short:
        def score(self, prompts, completions, records, finished):
            return [1.0]

    class Numpy:
        def score(self, prompts, completions, records, finished):
            return np.array([0.5, -2.0], dtype=np.float32)

    stats = dict(reward_errors=0, reward_timeouts=0)
    args = (["p", "p"], ["a", "b"], [{}, {}], [True, False], stats, 60.0)
    assert rewards.score_batch(Numpy(), *args) == [0.5, -2.0] and stats["reward_errors"] == 0
    for _ in range(4):
        assert rewards.score_batch(Boom(), *args) == [0.0, 0.0]
    assert rewards.score_batch(Short(), *args) == [0.0, 0.0]
    assert stats["reward_errors"] == 10
    err = capsys.readouterr().err
    assert err.count("warning: the task's scorer raised") == 3 and "RuntimeError: boom" in err


def test_seam_task_hook_builds_once_and_evaluate_paths(capsys):
    class Task:
        __name__ = "fake_task_for_hooks"
        built = []

        @staticmethod
        def make_scorer(cfg, device):
            Task.built.append(device)
            return object()

    first = searcher.task_hook(Task, "make_scorer", None, "cpu")
    assert searcher.task_hook(Task, "make_scorer", None, "cpu") is first and Task.built == ["cpu"]
    assert searcher.task_hook(Task, "make_evaluator", None, "cpu") is None
    assert searcher.task_hook(arith, "make_scorer", None, "cpu") is None

    # default path: greedy accuracy as (rows, {"accuracy": [correct, n]})
    tok = load_tokenizer(TINY)
    recs = arith.load("procedural:test:2", "test")
    gold = recs[0]["answer"].split("####")[1].strip()
    right = tok(" " + gold, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    rows, totals = evaluate(FakeEngine([right, [tok.eos_token_id]]), tok, arith, recs, 24)
    assert totals == {"accuracy": [1, 2]} and [r["correct"] for r in rows] == [True, False]
    assert list(rows[0]) == ["correct", "completion"]

    class Broken:
        def evaluate(self, engine, tok, records, max_new_tokens):
            raise ValueError("judge fell over")

    class Missing:
        def evaluate(self, engine, tok, records, max_new_tokens):
            return [{}], {"x": [1, 1]}

    for bad in (Broken(), Missing()):
        rows, totals = evaluate(None, tok, arith, recs, 24, bad)
        assert totals == {} and len(rows) == 2 and "error" in rows[0]
    assert capsys.readouterr().err.count("warning: the task's evaluator raised") == 2


def test_tiny_config_end_to_end(tiny_task_models, tmp_path):
    """configs/tldr_tiny.yaml through torchrun (HF engine: starts faster than vLLM on a loaded CPU)."""
    rows, summary = task_run("tldr_tiny.yaml", tmp_path / "run", "engine=hf", reward=(-math.inf, math.inf))
    for r in (rows[0], rows[-1]):
        assert 0.0 <= r["eval/win_rate"] <= 1.0 and 1.0 <= r["eval/perplexity"] < 100 and "eval/accuracy" not in r
    for key in ("win_rate", "perplexity"):
        assert math.isfinite(summary["eval_start"][key]) and math.isfinite(summary["eval_end"][key])
    assert summary["eval_end"]["n"] == 16 and summary["eval_end"]["step"] == 4
    assert rows[1]["train/beta"] == 1.0 and rows[3]["train/beta"] == 0.05  # beta cut at step 3 (tldr_tiny.yaml)
    evals = [json.loads(line) for line in open(tmp_path / "run" / "eval_step4.jsonl")]
    assert [e["id"] for e in evals] == list(range(16)) and all("summary" in e and "win" in e for e in evals)
