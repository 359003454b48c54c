"""scripts/gpu_model.py on hand-made inputs: one arm's arithmetic against a hand computation, the bounds of the
asynchronous arms, staleness's cost moving the asynchronous arms only, the strong synchronous arm at its best batch,
and the range containing the point estimate. It asserts the model's arithmetic, not any GPU figure."""
import importlib.util
import os
import random
import subprocess
import sys

import pytest

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("gpu_model", os.path.join(ROOT, "scripts", "gpu_model.py"))
m = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(m)
DEFAULTS = {name: value for name, (value, *_) in m.INPUTS.items()}
# round numbers, none of them the defaults
HAND = {"train_1": 1.4, "push": 0.02, "allreduce": 0.01, "decode_ms": 2.0, "decode_full_ms": 4.0, "L_tail": 300,
        "ell": 100, "score": 0.1, "t_1": 0.03, "switch": 0.5, "max_inflight": 200, "c": 0.2, "batch_exp": 1.0}


def rows(x):
    return {(name, split): (step, supply) for name, split, step, supply in m.model(x)}


def test_every_input_has_a_range_around_its_value_and_a_reason():
    assert set(HAND) == set(m.INPUTS) and set(m.MEASURED) <= set(m.INPUTS)
    for name, (value, lo, hi, why) in m.INPUTS.items():
        assert lo <= value <= hi, name
        assert why.startswith("measured" if name in m.MEASURED else "assumed") and "range:" in why, name


def test_one_arm_against_a_hand_computation():
    x = HAND | {"B": 14}
    r = rows(x)
    assert {split for _, split in r} == {"1 + 15", "16 (all)", "2 + 14", "7 + 9", "14 + 2"}  # T divides B = 14
    # strong sync: generation 300 tokens x 2 ms = 0.6 s (a GPU's 14 x 20 / 16 = 17.5 sequences at 200 / (100 x 4 ms)
    # = 500 samples/s would take 0.035 s: latency bound) + scoring 0.1, training 1.4 x 14 / 7 / 16 = 0.175 +
    # all-reduce 0.01, switch 0.5
    assert r[(m.STRONG, "16 (all)")][0] == pytest.approx(0.6 + 0.1 + 0.175 + 0.01 + 0.5)  # 1.385 s
    # our sync: the same round on 15 searchers (one prompt each), one trainer 1.4 x 2 = 2.8 s, push 0.02
    assert r[(m.OURS, "1 + 15")][0] == pytest.approx(0.7 + 2.8 + 0.02)  # 3.52 s
    # async in-flight, 7 + 9: 1.4 x 2 / 7 = 0.4 + 0.01 all-reduce, then (push 0.02 + an engine step 0.004 + t_1 0.03)
    # / k = 2 = 0.027; the 9 searchers' 9 x 500 samples/s would supply 280 samples in 0.062 s: trainer bound
    step, supply = r[(m.INFLIGHT, "7 + 9")]
    assert step == pytest.approx(0.437) and supply == pytest.approx(9 * 500 * 0.437 / 280)
    # 14 + 2: training 1.4 x 2 / 14 + 0.01 = 0.21 s, but 2 searchers take 280 / (2 x 500) = 0.28 s: generation bound,
    # and still the fastest in-flight split at B = 14
    step, supply = r[(m.INFLIGHT, "14 + 2")]
    assert step == pytest.approx(0.28) and supply == 1.0
    # to the recipe's accuracy: 700 x (7 / 14) steps, x 1.2 for staleness, at 0.28 s: 1.96 minutes
    t = m.to_accuracy(HAND)
    assert t[14][m.INFLIGHT] == ("14 + 2", pytest.approx(0.28), pytest.approx(1.96))
    assert t[14][m.STRONG][2] == pytest.approx(350 * 1.385 / 60)  # 8.079 minutes, no staleness cost


def test_the_asynchronous_arms_are_bound_by_the_trainer_or_by_generation():
    x = DEFAULTS | {"B": 7}
    r = rows(x)
    assert {split for _, split in r} == {"1 + 15", "16 (all)", "7 + 9"}  # B = 7: 1 or 7 trainer ranks
    d = x["decode_ms"] / 1000
    assert r[(m.OURS, "1 + 15")][0] == x["L_tail"] * d + x["score"] + x["train_1"] + x["push"]
    step, supply = r[(m.INFLIGHT, "7 + 9")]
    assert step == x["train_1"] / 7 + x["allreduce"] + (x["push"] + x["decode_full_ms"] / 1000 + x["t_1"]) / 2
    assert supply > 1  # trainer bound
    step, supply = rows(x | {"B": 28, "ell": 2000})[(m.INFLIGHT, "14 + 2")]  # two searchers of long responses
    assert supply == 1.0 and step == 28 * 20 / (2 * x["max_inflight"] / (2000 * x["decode_full_ms"] / 1000))
    # an engine step at full load is never taken as faster than at a smaller batch
    assert rows(x | {"decode_full_ms": 1.0}) == rows(x | {"decode_full_ms": x["decode_ms"]})


def test_staleness_cost_moves_the_asynchronous_arms_only():
    for x in (HAND, DEFAULTS):
        fresh, stale = m.to_accuracy(x | {"c": 0.0}), m.to_accuracy(x | {"c": 0.3})
        for B in m.BATCHES:
            for arm in (m.OURS, m.STRONG):
                assert stale[B][arm] == fresh[B][arm]
            for arm in (m.CHUNKS, m.INFLIGHT):
                assert stale[B][arm][:2] == fresh[B][arm][:2]  # same split, same seconds per step
                assert stale[B][arm][2] == pytest.approx(1.3 * fresh[B][arm][2])
        assert m.headline(x | {"c": 0.3})[0] == pytest.approx(m.headline(x | {"c": 0.0})[0] / 1.3)


def test_strong_sync_at_its_best_batch_is_never_worse_than_at_7():
    rng = random.Random(1)
    draws = [{n: rng.uniform(lo, hi) for n, (_, lo, hi, _) in m.INPUTS.items()} for _ in range(50)]
    for x in [HAND, DEFAULTS, DEFAULTS | {"batch_exp": 0.5}] + draws:
        _, b_sync, _ = m.headline(x)
        t = m.to_accuracy(x)
        assert t[b_sync][m.STRONG][2] <= t[7][m.STRONG][2]
        assert all(t[b_sync][m.STRONG][2] <= t[B][m.STRONG][2] for B in m.BATCHES)
    # at equal total samples (batch_exp = 1) the latency of a round is shared by more samples: a larger B pays
    assert m.headline(DEFAULTS)[1] == 56 and m.headline(HAND)[1] == 56


def test_the_range_contains_the_point_estimate():
    for x in (HAND, DEFAULTS):
        varied = ["decode_ms", "switch", "c", "batch_exp"]
        point, (lo, hi), (p5, p50, p95), one = m.ranges(x, varied, draws=200)
        assert point == m.headline(x)[0]
        assert lo <= point <= hi and lo <= p5 <= p50 <= p95 <= hi and lo < hi
        assert sorted(n for n, *_ in one) == sorted(varied)
        swings = [abs(b - a) for _, a, b in one]
        assert swings == sorted(swings, reverse=True)
        c_row = next(r for r in one if r[0] == "c")  # c at 0 and at 0.4, the rest at x
        assert c_row[1] == pytest.approx(point * (1 + x["c"])) and c_row[2] == pytest.approx(point * (1 + x["c"]) / 1.4)


def test_the_script_prints_its_tables_and_the_range():
    script = os.path.join(ROOT, "scripts", "gpu_model.py")
    r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| 56 (1120) |" in r.stdout and "Headline:" in r.stdout and "- c = 0.1, range 0-0.4" in r.stdout
    # --ranges with all but three inputs held at (changed) command-line values: 8 corners, 50 draws
    held = [f"--{n.replace('_', '-')}={v * 1.0001:g}" for n, v in DEFAULTS.items() if n not in ("c", "switch", "ell")]
    r = subprocess.run([sys.executable, script, "--ranges", "--draws", "50", *held], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "(8 corners)" in r.stdout and "| c | assumed |" in r.stdout and "| train_1 |" not in r.stdout
