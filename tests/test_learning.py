"""TB learns: the tiny default, shortened, raises greedy accuracy on held-out problems by at least 5 points.

A regression in the loss, the buffer, the log-probs or the weight sync shows up here as no gain. Held-out: the arith
test split is disjoint from the training split (rewards/arith.py). 200 steps: in the search-scaling math test's runs of
this setting (docs/grids/scaling_math_test/tb_f32, 8 seeds) greedy accuracy gained 9.6-12.0 points by step 200 (seed
0: +10.2), twice the bar. The full default (1000 steps) gains more; see docs/results.md for the 3-seed figures.
"""
from conftest import torchrun


def test_tb_raises_held_out_greedy_accuracy(tiny_model, tmp_path):
    rows, summary = torchrun(["steps=200", "seed=0", "eval_every=0", "time_budget_min=0"], tmp_path / "run")
    start, end = summary["eval_start"], summary["eval_end"]
    assert start["n"] == end["n"] == 500 and summary["steps"] == 200
    gain = end["accuracy"] - start["accuracy"]
    print(f"held-out greedy accuracy {start['accuracy']:.3f} -> {end['accuracy']:.3f} ({100 * gain:+.1f} points)")
    assert gain >= 0.05, f"TB gained only {100 * gain:+.1f} points in 200 steps"
