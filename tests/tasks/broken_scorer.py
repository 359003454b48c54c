"""Test task: the arith task, except that building its batched scorer raises, so every searcher fails at its first
generation with an error of its own (tests/test_resilience.py)."""
from rewards.arith import DEFAULT_TEST, DEFAULT_TRAIN, load, reward  # noqa: F401  (the task interface)


def make_scorer(cfg, device):
    raise ValueError("the scorer's model is missing")
