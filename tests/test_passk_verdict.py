"""scripts/passk_verdict.py: the pass@k question's registered reading (docs/diversity.md, "Does TB keep pass@k where
the maximisers lose it?"): pass@16 where pass@1 first reaches L (interpolated), the control's narrowing, the primary
family of two under Holm, and the pilot's level and power rules, on synthetic grids of packed-style runs."""
import json
import os
import subprocess
import sys

import yaml

from config import Config, config_to_dict
from conftest import ROOT

STEPS = range(0, 1001, 100)
RISE = [0.30 + 0.02 * i for i in range(11)]  # pass@1 from 0.30 to 0.50: crosses 0.40 at step 500


def run_dir(path, loss, seed, pass1, pass16, beta=0.05, distinct=1.0):
    """A finished run (config.yaml, metrics.jsonl with an evaluation every 100 steps, summary.json); pass1 and pass16
    are the 11 evaluations' values."""
    os.makedirs(path)
    cfg = Config(out_dir=str(path), loss=loss, seed=seed, steps=1000, beta_start=beta, beta_end=beta,
                 eval_every=100, eval_samples=16, time_budget_min=0)
    yaml.safe_dump(config_to_dict(cfg), open(path / "config.yaml", "w"), sort_keys=False)
    rows = [{"step": s, "eval/accuracy": a, "eval/pass@1": a, "eval/pass@16": b, "eval/distinct_answers": distinct}
            for s, a, b in zip(STEPS, pass1, pass16)]
    with open(path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    ends = [{k.split("/")[1]: v for k, v in r.items() if k.startswith("eval/")} for r in (rows[0], rows[-1])]
    json.dump({"steps": 1000, "wall_seconds": 60.0, "eval_start": ends[0], "eval_end": ends[1]},
              open(path / "summary.json", "w"))


def grid_of(tmp_path, at_level, control, pass1=None):
    """Per arm and seed, pass@16 (points) held from step 100 on (so also where pass@1 reaches 0.40) after 60 at step
    0; the control's grpo_nokl ends `control[seed]` points from its start. pass1: {(arm, seed): curve} to override."""
    pass1 = pass1 or {}
    for arm, per_seed in {**at_level, "grpo_nokl": [60 + c for c in control]}.items():
        for seed, value in enumerate(per_seed):
            run_dir(tmp_path / arm / f"seed{seed}", "grpo" if arm == "grpo_nokl" else arm, seed,
                    pass1.get((arm, seed), RISE), [0.60] + [value / 100] * 10, 0 if arm == "grpo_nokl" else 0.05,
                    distinct=1.0 + 0.1 * (arm == "tb") + 0.01 * seed)


def verdict(tmp_path, *args, rc=0):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "passk_verdict.py"), str(tmp_path), *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == rc, p.stderr
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in p.stdout.splitlines() if r.startswith("| ")]
    keyed = {c[0]: c[1:] for c in cells if c[0] == "control" or " - " in c[0]}  # the statistics' rows by name
    return {**keyed, **{(c[0], c[1]): c[2:] for c in cells if c[0] not in keyed}}, p  # runs by (arm, seed)


def test_pass16_is_read_where_pass1_first_reaches_the_level_interpolated(tmp_path):
    pass1 = [0.30, 0.34, 0.38, 0.42, 0.39, 0.45, 0.46, 0.47, 0.48, 0.49, 0.50]  # first reaches 0.40 in 200..300
    pass16 = [0.60, 0.62, 0.64, 0.70, 0.71, 0.72, 0.73, 0.74, 0.75, 0.76, 0.77]
    for arm in ("tb", "grpo", "rloo", "grpo_nokl"):
        for seed in (0, 1):
            run_dir(tmp_path / arm / f"seed{seed}", "grpo" if arm == "grpo_nokl" else arm, seed, pass1, pass16,
                    0 if arm == "grpo_nokl" else 0.05)
    rows, _ = verdict(tmp_path)
    # step 250, pass@16 halfway from 64 to 70 (not the later dip below 0.40); last three: pass@1 49, pass@16 76
    assert rows["tb", "0"] == ["250", "67.0", "50.0", "49.0", "76.0", "60.0", "1.00"]
    rows, _ = verdict(tmp_path, "--level", "0.41")
    assert rows["rloo", "1"][:2] == ["275", "68.5"]  # three quarters of the way


def test_primary_holm_and_control_from_the_runs(tmp_path):
    tb = [75, 76, 74, 77]
    grid_of(tmp_path, {"tb": tb, "grpo": [t - d for t, d in zip(tb, (5, 6, 5, 8))],
                       "rloo": [t - d for t, d in zip(tb, (1, -1, 2, 0))]}, control=(-10, -8, -12, -10))
    rows, p = verdict(tmp_path, "--plot", str(tmp_path / "forest.png"))
    assert rows["control"][:2] == ["4", "-10.0"] and rows["control"][-1] == "control holds"
    grpo, rloo = rows["tb - grpo"], rows["tb - rloo"]
    assert grpo[:2] == ["4", "+6.0"] and grpo[3] == "0.9750"  # the smaller p: tested at 1 - 0.05 / 2
    assert grpo[-1].startswith("TB keeps more pass@16 than grpo at equal pass@1 (pass@1 = 0.4): +6.0 points, [+")
    assert rloo[:2] == ["4", "+0.5"] and rloo[3] == "0.9500" and rloo[-1].startswith("not told apart at ±")
    assert rows["pass@16 (last three): tb - grpo"][:2] == ["4", "+6.0"]  # the secondaries, uncorrected
    assert rows["distinct_answers (last three): tb - rloo"][:3] == ["4", "+0.10", "[+0.10, +0.10]"]
    assert rows["distinct_answers (last three): tb - rloo"][3] == "above 0"
    assert "every run of tb, grpo and rloo reaches pass@1 = 0.4" in p.stdout
    assert (tmp_path / "forest.png").read_bytes()[:4] == b"\x89PNG"


def test_the_primary_is_not_read_when_the_control_does_not_narrow(tmp_path):
    tb = [75, 76, 74, 77]
    grid_of(tmp_path, {"tb": tb, "grpo": [t - d for t, d in zip(tb, (5, 6, 5, 7))], "rloo": tb},
            control=(-3, 2, -1, 1))
    rows, _ = verdict(tmp_path)
    assert rows["control"][-1] == "control fails: the question is not read on this setting"
    assert rows["tb - grpo"][-1].startswith("not read (the control fails): TB keeps more pass@16 than grpo")


def test_a_run_that_never_reaches_the_level_is_named_and_left_out(tmp_path):
    tb = [75, 76, 74, 77]
    grid_of(tmp_path, {"tb": tb, "grpo": [t - d for t, d in zip(tb, (5, 6, 5, 40))], "rloo": tb},
            control=(-10, -8, -12, -9), pass1={("tb", 3): [0.30 + 0.008 * i for i in range(11)]})  # tops at 0.38
    rows, p = verdict(tmp_path)
    assert "never reach pass@1 = 0.4, left out of the primary's pairs: tb seed 3 (highest pass@1 38.0)" in p.stdout
    assert rows["tb", "3"][:2] == ["never", "-"]
    assert rows["tb - grpo"][:2] == ["3", "+5.3"] and rows["tb - rloo"][0] == "3"  # seed 3's +40 does not count
    assert rows["pass@16 (last three): tb - grpo"][:2] == ["4", "+14.0"]  # the secondaries keep it


def test_pilot_moves_the_level_and_counts_the_seeds(tmp_path):
    # tb - grpo: +4, +6.83 (sd 2.0); tb - rloo: +1, +2 (sd 0.71): n = 6, the first with 3.163 x 2 / sqrt(6) < 3
    grid_of(tmp_path, {"tb": [80, 80], "grpo": [76, 76 - 2 * 2 ** 0.5], "rloo": [79, 78]}, control=(-5, -6),
            pass1={("grpo", 1): [0.30 + 0.007 * i for i in range(11)]})  # tops at 0.37
    _, p = verdict(tmp_path, "--pilot")
    assert "L becomes the lowest of the pilot runs' highest pass@1 minus 0.02 = 0.37 - 0.02 = 0.35" in p.stdout
    assert "read the test with --level 0.35" in p.stdout and "L = 0.35:" in p.stdout
    assert "sd 2.00" in p.stdout and "sd 0.71" in p.stdout
    assert "seeds: n = 6 (the smallest n from 4 to 8" in p.stdout and 'SEEDS="0 1 2 3 4 5"' in p.stdout
    assert "n = 5: tb - grpo 3.13" in p.stdout  # t(4) at 0.9875 is 3.495: 3.495 x 2 / sqrt(5)


def test_pilot_keeps_the_level_and_asks_for_eight_seeds_when_none_is_enough(tmp_path):
    grid_of(tmp_path, {"tb": [80, 80], "grpo": [70, 90], "rloo": [79, 78]}, control=(-5, -6))
    _, p = verdict(tmp_path, "--pilot")
    assert "every pilot run's pass@1 reaches L = 0.4; L stays 0.4" in p.stdout
    assert "seeds: n = 8 (no n from 4 to 8 gives a half-width below 0.03: 8)" in p.stdout


def test_errors_a_user_can_cause(tmp_path):
    _, p = verdict(tmp_path, rc=2)
    assert p.stderr.strip() == f"error: no finished runs under {tmp_path}"
    grid_of(tmp_path, {"tb": [75, 76], "grpo": [70, 71]}, control=(-5, -6))
    _, p = verdict(tmp_path, rc=2)
    assert p.stderr.strip() == f"error: no runs of rloo under {tmp_path} (found: grpo, grpo_nokl, tb)"


def test_the_pilot_draws_no_plot(tmp_path):
    grid_of(tmp_path, {"tb": [75, 76], "grpo": [70, 71], "rloo": [70, 71]}, control=(-5, -6))
    _, p = verdict(tmp_path, "--pilot", "--plot", str(tmp_path / "x.png"), rc=2)
    assert "the pilot reads nothing" in p.stderr
