"""Test task: the arith task, except that the reward is NAN_VALUE (default NaN; e.g. inf, or 1e300, finite but
overflowing the loss) for the first NAN_CALLS reward calls of each searcher process (every call when NAN_CALLS is
unset or negative), or with NAN_EVERY = k for every k-th call instead; evaluation (correct) is arith's. Used to
inject non-finite rewards and non-finite losses (tests/test_resilience.py)."""
import os

from rewards import arith
from rewards.arith import DEFAULT_TEST, DEFAULT_TRAIN, load  # noqa: F401  (the task interface)

calls = 0


def poisoned(n):
    """Whether reward call number n (from 1) gets NAN_VALUE."""
    every = int(os.environ.get("NAN_EVERY", "0"))
    if every > 0:
        return n % every == 0
    limit = int(os.environ.get("NAN_CALLS", "-1"))
    return limit < 0 or n <= limit


def reward(completion, answer):
    global calls
    calls += 1
    return float(os.environ.get("NAN_VALUE", "nan")) if poisoned(calls) else arith.reward(completion, answer)


def correct(completion, answer):
    return arith.reward(completion, answer) >= 1.0
