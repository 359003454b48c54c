"""The Countdown task (rewards/countdown.py): procedural data, .jsonl loading, the safe reward, and a tiny run."""
import json
import random
import time

import pytest

from conftest import assert_load_error, task_run
from rewards import DataError, countdown

ANSWER = json.dumps({"numbers": [3, 5, 2], "target": 16})


def score(text, answer=ANSWER):
    return countdown.reward(text, answer)


def test_procedural_data_is_deterministic_disjoint_and_solvable():
    train = countdown.load("procedural:train:3000", "train")
    test = countdown.load(countdown.DEFAULT_TEST, "test")
    assert train == countdown.load("procedural:train:3000", "train") and len(test) == 500
    assert countdown.load("procedural:train:10", "train") == train[:10]  # a prefix, whatever n
    assert not {r["answer"] for r in train} & {r["answer"] for r in test}
    assert not {r["answer"] for r in countdown.load("procedural:dev:200", "dev")} & {r["answer"] for r in test}
    for r in train + test:  # solvable by construction: the generator's own solution scores 1
        numbers, target = json.loads(r["answer"])["numbers"], json.loads(r["answer"])["target"]
        assert 3 <= len(numbers) <= 4 and all(1 <= x <= 99 for x in numbers) and 1 <= target <= countdown.MAX_TARGET
        assert score(f"Some work.\nAnswer: {r['solution']}", r["answer"]) == 1.0
    p = test[0]["prompt"]
    assert p.startswith("[MATH TASK] Problem:\nUsing the numbers ") and p.endswith("\n\nSolution:\n")
    assert '"Answer: <expression>"' in p


def test_reward_correct_answers():
    assert score("Answer: (3 + 5) * 2") == 1.0
    assert score("3 + 5 = 8, times 2.\nAnswer: (3+5)*2") == 1.0  # only the final answer counts
    assert score("answer: 2*(5+3)") == 1.0  # case-insensitive, any order
    assert score("Answer: $(3 + 5) \u00d7 2$.") == 1.0  # math delimiters, a final period, the × sign
    assert score("Answer: (3 + 5) * 2 = 16") == 1.0  # "= target" may follow
    assert score("Answer: -(3 - 5) * (2 * 4)", json.dumps({"numbers": [3, 5, 2, 4], "target": 16})) == 1.0  # unary minus
    assert score("Answer: 6 / (3 / 4)", json.dumps({"numbers": [3, 4, 6], "target": 8})) == 1.0  # exact fractions
    assert score("Answer: 3 * 3 - 1", json.dumps({"numbers": [3, 3, 1], "target": 8})) == 1.0  # a repeated number, twice
    assert score("Answer: 5 * 3 + 1", json.dumps({"numbers": [5, 3, 1, 7], "target": 16})) == 1.0  # not all used


def test_reward_wrong_answers():
    assert score("Answer: (3 + 5) * 2 + 0") == 0.0  # 0 is not a given number
    assert score("Answer: 3 + 5 + 2") == 0.0  # wrong value
    assert score("Answer: (3 + 5) * 2 = 17") == 0.0  # wrong right-hand side
    assert score("Answer: 8 * 2") == 0.0  # 8 not given
    assert score("Answer: 16") == 0.0
    assert score("Answer: (5 + 3) * 2 - 2 + 2") == 0.0  # 2 used three times
    assert score("Answer: 5 * 3 + 2 / 2") == 0.0  # 2 reused
    assert score("Answer: (3 + 5) * 2\nAnswer: 3 + 5") == 0.0  # the last answer counts
    assert score("(3 + 5) * 2") == 0.0  # no "Answer:"
    assert score("Answer: 2 / (5 - 5)", json.dumps({"numbers": [2, 5, 5], "target": 0})) == 0.0  # division by zero
    assert score("Answer: 5 / 2 * 2", json.dumps({"numbers": [5, 2, 2], "target": 5})) == 1.0  # (but 5/2 is fine)


@pytest.mark.parametrize("text", [
    "Answer: 2**3 + 8", "Answer: 9**9**9", "Answer: 16 // 1", "Answer: 3 % 2", "Answer: +16", "Answer: 0x10",
    "Answer: 1_6", "Answer: 16.0", "Answer: __import__('os').system('true')", "Answer: (lambda: 16)()",
    "Answer: [16][0]", "Answer: 3 < 5", "Answer: 2 ^ 3", "Answer: abs(-16)", "Answer: 16;16", "Answer: 16 if 1 else 0",
])
def test_reward_rejects_unsafe_or_foreign_syntax(text):
    assert score(text, json.dumps({"numbers": [2, 3, 5, 8, 16, 1, 0], "target": 16})) == 0.0


def test_reward_never_raises_or_hangs_on_malformed_text():
    cases = ["", "Answer:", "Answer: ", "Answer: (3 + 5", "Answer: ((((3)))", "Answer: )(", "<|endoftext|>",
             "<|im_end|><|endoftext|></s>", "Answer: " + "(" * 300 + "3" + ")" * 300, "Answer: " + "-" * 150 + "3",
             "Answer: " + "9" * 5000, "Answer: " + " + ".join(["3"] * 1000), "x" * 10**7, "Answer: " * 10**5,
             "Answer: \udcff", "Answer: 9**9**9**9**9", "Answer: 3 +\x00 5"]
    rng = random.Random(0)
    alphabet = "0123456789+-*/()= .Answer:\n*^%"
    cases += ["Answer: " + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(3000)]
    t0 = time.perf_counter()
    for text in cases:
        assert score(text) in (0.0, 1.0)
    assert time.perf_counter() - t0 < 30
    for bad_answer in ["", "16", "{}", json.dumps({"numbers": "3 5", "target": 16}), None]:
        assert countdown.reward("Answer: (3 + 5) * 2", bad_answer) == 0.0


def test_load_jsonl(tmp_path):
    path = tmp_path / "cd.jsonl"
    path.write_text('{"numbers": [3, 5, 2], "target": 16}\n\n{"nums": [25, 4, 1], "target": 99, "extra": 1}\n')
    records = countdown.load(str(path), "train")
    assert [json.loads(r["answer"]) for r in records] == [{"numbers": [3, 5, 2], "target": 16},
                                                          {"numbers": [25, 4, 1], "target": 99}]
    assert "Using the numbers 25, 4, 1, make 99." in records[1]["prompt"]
    assert countdown.reward("Answer: 25 * 4 - 1", records[1]["answer"]) == 1.0


@pytest.mark.parametrize("lines, where, message", [
    ('{"numbers": [3, 5], "target": 8}\n{"numbers": [3, 5], "target": 8\n', ":2:", "malformed JSON"),
    ('{"numbers": [3, 5], "target": 8}\n{"target": 8}\n', ":2:", "'numbers'"),
    ('{"numbers": [3, "5"], "target": 8}\n', ":1:", "'numbers'"),
    ('{"numbers": [3, 0], "target": 8}\n', ":1:", "'numbers'"),
    ('{"numbers": [3, 5], "target": "8"}\n', ":1:", "'target'"),
    ('{"numbers": [3, 5]}\n', ":1:", "'target'"),
    ('[3, 5, 8]\n', ":1:", "JSON object"),
])
def test_load_jsonl_errors_name_the_line(tmp_path, lines, where, message):
    assert_load_error(countdown.load, tmp_path / "cd.jsonl", lines, where, message)


def test_load_bad_sources(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    for source in ["procedural:train", "procedural:valid:10", "procedural:train:0", "procedural:train:x",
                   str(tmp_path / "missing.jsonl"), str(tmp_path / "empty.jsonl")]:
        with pytest.raises(DataError):
            countdown.load(source, "train")


def test_tiny_config_end_to_end(tiny_model, tmp_path):
    """configs/countdown_tiny.yaml through torchrun (HF engine: starts faster than vLLM on a loaded CPU)."""
    _, summary = task_run("countdown_tiny.yaml", tmp_path / "run", "engine=hf", "n_test=8")
    assert 0.0 <= summary["eval_end"]["accuracy"] <= 1.0
