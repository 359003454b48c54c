"""pass@k and distinct solutions at evaluation (eval_samples): the unbiased estimator against enumeration, the counts
per problem, the refusal of tasks that cannot grade one sample, eval.py on a checkpoint, and a tiny run whose logged
eval/pass@k and distinct counts are given back by its eval_stepN.jsonl."""
import itertools
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, torchrun
from config import ConfigError
from eval import check_samples, evaluate, pass_at_k, pass_ks, sampled_totals
from rewards import arith, tldr


def brute_pass_at_k(n, c, k):
    """The share of the k-subsets of n samples (c of them correct) that hold a correct one."""
    subsets = list(itertools.combinations([True] * c + [False] * (n - c), k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c", [(1, 0), (1, 1), (4, 0), (4, 1), (4, 4), (5, 2), (8, 3), (8, 7), (10, 10)])
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_correct_sample(n, c):
    for k in range(1, n + 1):  # k = n included
        assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_the_logged_k_are_powers_of_two_up_to_n_and_n():
    assert pass_ks(1) == [1] and pass_ks(16) == [1, 2, 4, 8, 16] and pass_ks(24) == [1, 2, 4, 8, 16, 24]


class Tok:
    """A stand-in tokenizer whose 'token ids' are the text itself."""

    def __call__(self, text):
        return {"input_ids": text}

    def decode(self, ids, skip_special_tokens=True):
        return ids


class Engine:
    """engine.generate answering each prompt with its prepared completions; greedy calls get the first one."""

    def __init__(self, completions):
        self.completions, self.calls = completions, []

    def generate(self, prompts, n, temperature, max_new_tokens):
        self.calls.append((n, temperature))
        return [[(text, None) for text in self.completions[p][:n]] for p in prompts]


def test_counts_per_problem_distinct_after_stripping_and_distinct_answers():
    records = [{"prompt": "a", "answer": "#### 5"}, {"prompt": "b", "answer": "#### 7"}]
    engine = Engine({"a": ["2 + 3 = 5. #### 5", " 2 + 3 = 5. #### 5\n", "1 + 4 = 5. #### 5", "#### 6"],
                     "b": ["#### 1", "#### 2", "#### 2", "no number"]})
    rows, totals = evaluate(engine, Tok(), arith, records, 8, samples=4, temperature=0.7)
    assert engine.calls == [(1, 0.0), (4, 0.7)]  # greedy accuracy first, then N samples at the run's temperature
    assert [r["correct"] for r in rows] == [True, False]
    assert [(r["samples"], r["samples_correct"], r["distinct_correct"], r["distinct_answers"]) for r in rows] == \
        [(4, 3, 2, 2), (4, 0, 0, 2)]
    assert totals["pass@1"] == [pytest.approx(0.75), 2] and totals["pass@2"] == [pytest.approx(1.0), 2]
    assert totals["pass@4"] == [1.0, 2] and totals["distinct_correct"] == [2, 2]
    assert totals["distinct_answers"] == [4, 2] and totals["accuracy"] == [1, 2]


def test_a_task_without_extract_answer_logs_no_distinct_answers():
    rows = [{"samples": 2, "samples_correct": 1, "distinct_correct": 1}]
    assert set(sampled_totals(rows, 2)) == {"pass@1", "pass@2", "distinct_correct"}
    assert sampled_totals([], 2) == {"pass@1": [0, 0], "pass@2": [0, 0]}  # a searcher with no test problems


def test_a_task_that_cannot_grade_one_sample_is_refused_in_one_line_before_the_run(tmp_path):
    """tldr grades with models, a batch at a time (make_scorer): no correct() or reward() for one sample."""
    with pytest.raises(ConfigError, match="eval_samples=4: task 'tldr' has no correct"):
        check_samples(4, tldr, "tldr")
    check_samples(0, tldr, "tldr")  # off: nothing to grade
    check_samples(4, arith, "arith")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--prepare", "configs/tldr_tiny.yaml",
                        "eval_samples=4", f"out_dir={tmp_path / 'run'}"], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1"), timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "eval_samples=4: task 'tldr'" in p.stderr


def test_eval_script_reports_pass_at_k_for_a_checkpoint(tiny_model):
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), tiny_model, "--task", "arith", "--n", "12",
                        "--engine", "hf", "--max-new-tokens", "24", "eval_samples=4", "temperature=1.0"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    values = {line.split()[0]: float(line.split()[1].rstrip("%")) for line in p.stdout.strip().splitlines()}
    assert set(values) == {"accuracy", "pass@1", "pass@2", "pass@4", "distinct_correct", "distinct_answers"}
    assert 0 <= values["pass@1"] <= values["pass@2"] <= values["pass@4"] <= 1
    assert values["distinct_correct"] <= 4 * values["pass@4"] and 1 <= values["distinct_answers"] <= 4


def test_a_tiny_run_logs_pass_at_k_that_its_eval_jsonl_gives_back(tiny_model, tmp_path):
    out = tmp_path / "run"
    rows, summary = torchrun(["engine=hf", "steps=2", "n_test=10", "eval_samples=4", "initial_buffer=16",
                              "time_budget_min=0"], out)
    evals = [r for r in rows if "eval/pass@4" in r]
    assert [r["step"] for r in evals] == [0, 2]
    for row in evals:
        problems = [json.loads(line) for line in open(out / f"eval_step{row['step']}.jsonl")]
        assert len(problems) == 10 and all(p["samples"] == 4 for p in problems)
        for k in (1, 2, 4):
            mean = sum(pass_at_k(4, p["samples_correct"], k) for p in problems) / 10
            assert row[f"eval/pass@{k}"] == pytest.approx(mean)
        for name in ("distinct_correct", "distinct_answers"):
            assert row[f"eval/{name}"] == pytest.approx(sum(p[name] for p in problems) / 10)
    assert summary["eval_end"]["pass@4"] == evals[-1]["eval/pass@4"]
