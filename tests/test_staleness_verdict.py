"""scripts/staleness_test.sh and scripts/staleness_verdict.py: the registered staleness test's arms and its reading
(docs/staleness.md, "The test"): each run's value is the mean of its last three evaluations, the primary statistic is
TB's drop minus the baselines' mean drop, read only when the baselines' own mean drop is above zero, and the
secondaries go through Holm's step-down."""
import json
import os
import subprocess
import sys

import pytest
import yaml

import tables
from config import Config, config_to_dict
from conftest import ROOT


def run_dir(path, loss, delay, seed, value):
    """A finished (packed-style) run whose last three evaluations average `value` (an earlier one, 0.9, must not
    count)."""
    os.makedirs(path)
    cfg = Config(out_dir=str(path), loss=loss, weight_delay=delay, seed=seed, steps=300)
    yaml.safe_dump(config_to_dict(cfg), open(path / "config.yaml", "w"), sort_keys=False)
    evals = {0: 0.4, 150: 0.9, 200: value - 0.01, 250: value + 0.02, 300: value - 0.01}
    with open(path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps({"step": s, "eval/accuracy": a}) + "\n" for s, a in evals.items())
    json.dump({"steps": 300, "wall_seconds": 60.0, "eval_start": {"accuracy": 0.4}, "eval_end": {"accuracy": value}},
              open(path / "summary.json", "w"))


def grid_of(tmp_path, drops):
    """Runs at D = 0 (accuracy 50%) and D = 64 (50% - drop) for each objective's per-seed drops (points)."""
    for loss, per_seed in drops.items():
        for seed, drop in enumerate(per_seed):
            run_dir(tmp_path / f"{loss}_d0" / f"seed{seed}", loss, 0, seed, 0.5)
            run_dir(tmp_path / f"{loss}_d64" / f"seed{seed}", loss, 64, seed, 0.5 - drop / 100)


def verdict(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "staleness_verdict.py"), str(tmp_path),
                        "--plot", str(tmp_path / "forest.png")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in p.stdout.splitlines() if r.startswith("| ")]
    return {c[0]: c[1:] for c in cells}


def test_t_quantiles_and_holm_match_their_tables():
    assert tables.t_quantile(0.975, 3) == pytest.approx(3.182, abs=1e-3)  # the t tables' 95% two-sided values
    assert tables.t_quantile(0.975, 7) == pytest.approx(2.365, abs=1e-3)
    assert tables.t_quantile(1 - 0.0125 / 2, 7) == pytest.approx(3.335, abs=1e-3)
    adjusted, rejected, levels = tables.holm([0.01, 0.04, 0.03, 0.5])  # by hand: 4 x 0.01, max(3 x 0.03, ...), ...
    assert adjusted == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert rejected == [True, False, False, False] and levels == pytest.approx([0.9875, 0.975, 1 - 0.05 / 3, 0.95])
    assert tables.paired([0.0, 0.0, 0.0])[3] == 1.0 and tables.paired([1.0, 1.0, 1.0])[3] == 0.0  # no spread


def test_primary_control_and_secondaries_from_the_runs(tmp_path):
    drops = {"tb": (1, 2, 1, 2), "dr_grpo": (3, 4, 3, 5), "grpo": (2, 3, 4, 3), "rloo": (4, 3, 3, 4),
             "tba_prime": (2, 2, 3, 2)}
    grid_of(tmp_path, drops)
    rows = verdict(tmp_path)
    primary = [t - (d + g + r) / 3 for t, d, g, r in zip(*(drops[k] for k in ("tb", "dr_grpo", "grpo", "rloo")))]
    assert rows["PRIMARY: TB's drop minus the baselines' mean drop"][:2] == ["4", f"{sum(primary) / 4:+.1f}"]
    assert rows["PRIMARY: TB's drop minus the baselines' mean drop"][3] == "TB more robust to staleness"
    assert rows["control: the baselines' mean drop"][3] == "passes"
    assert rows["tb"][:2] == ["4", "+1.5"] and rows["dr_grpo"][:2] == ["4", "+3.8"]  # the last three evaluations
    holm = rows["tb's drop minus dr_grpo's"]  # -2 -2 -2 -3: the smallest p, tested at 1 - 0.05 / 4
    assert holm[:3] == ["4", "-2.2", "0.9875"] and holm[-1] == "tb more robust"
    assert rows["tba_prime's drop minus dr_grpo's"][-1].startswith("tba_prime not told apart at ±")
    assert (tmp_path / "forest.png").read_bytes()[:4] == b"\x89PNG"


def test_the_primary_is_not_read_when_staleness_hurts_no_baseline(tmp_path):
    grid_of(tmp_path, {"tb": (1, 2, 1, 2), "dr_grpo": (1, -1, 0, 1), "grpo": (-1, 1, 0, 0), "rloo": (0, 0, 1, -1),
                       "tba_prime": (0, 0, 0, 0)})
    rows = verdict(tmp_path)
    assert rows["control: the baselines' mean drop"][3] == "fails: no staleness effect to compare"
    assert rows["PRIMARY: TB's drop minus the baselines' mean drop"][3].startswith("not read (the control did not pass)")


def test_the_grid_lists_its_arms_and_skips_packed_runs(tmp_path):
    packed = tmp_path / "packed"
    run_dir(packed / "tb_d0" / "seed0", "tb", 0, 0, 0.5)

    def grid(*args, **env):
        return subprocess.run(["bash", os.path.join(ROOT, "scripts", "staleness_test.sh"), *args], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "OUT": str(tmp_path / "out"),
                                                          "PACKED": str(packed), "DRY_RUN": "1", **env})
    p = grid("test", D="128")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == f"skip {tmp_path}/out/tb_d0/seed0 (packed in {packed})"
    runs = [line for line in lines if line.startswith("== ")]
    assert len(runs) == 79 and runs[0].startswith("== tb_d128 seed 0") and runs[-1].startswith("== tba_prime_d128 seed 7")
    assert "lr=1e-5 weight_delay=128 loss=tba_prime ref_reset_every=50" in runs[-1]
    assert all("beta_start=0.05 beta_end=0.05 grad_clip=0" in r and "n_test=1000" in r for r in runs)
    assert len([r for r in grid("pilot", PACKED=str(tmp_path / "none")).stdout.splitlines() if r.startswith("== ")]) == 12
    p = grid()
    assert p.returncode == 2 and "usage: bash scripts/staleness_test.sh pilot|test|lr3e-5" in p.stderr
