"""Test task: the arith task, except that the reward is NaN for the first NAN_CALLS reward calls of each searcher
process (every call when NAN_CALLS is unset or negative); evaluation (correct) is arith's. Used to inject non-finite
rewards (tests/test_resilience.py)."""
import os

from rewards import arith
from rewards.arith import DEFAULT_TEST, DEFAULT_TRAIN, load  # noqa: F401  (the task interface)

calls = 0


def reward(completion, answer):
    global calls
    calls += 1
    limit = int(os.environ.get("NAN_CALLS", "-1"))
    return float("nan") if limit < 0 or calls <= limit else arith.reward(completion, answer)


def correct(completion, answer):
    return arith.reward(completion, answer) >= 1.0
