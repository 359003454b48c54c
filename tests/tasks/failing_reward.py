"""Test task: the arith task, except that reward call number HANG_EVERY, 2 x HANG_EVERY, ... of each searcher process
hangs (sleeps an hour), and every call after the first FAIL_AFTER raises; evaluation (correct) is arith's. Used to
check the reward time limit and the stop for rewards that keep failing (tests/test_resilience.py)."""
import os
import time

from rewards import arith
from rewards.arith import DEFAULT_TEST, DEFAULT_TRAIN, load  # noqa: F401  (the task interface)

calls = 0


def reward(completion, answer):
    global calls
    calls += 1
    if calls > int(os.environ.get("FAIL_AFTER", "1000000000")):
        raise RuntimeError("the reward service is down")
    if calls % int(os.environ.get("HANG_EVERY", "1000000000")) == 0:
        time.sleep(3600)
    return arith.reward(completion, answer)


def correct(completion, answer):
    return arith.reward(completion, answer) >= 1.0
