"""tables.py on synthetic run directories (numbers checked by hand), and sweep.sh's grid in DRY_RUN mode."""
import csv
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys

import pytest
import yaml

from config import Config, config_to_dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 60
# (m, seed) -> (final accuracy, accuracy of the mid-run evaluation at step 30, wall seconds); start accuracy 0.40
RUNS = {
    (0.5, 0): (0.50, 0.56, 300.0), (0.5, 1): (0.52, 0.45, 300.0), (0.5, 2): (0.54, 0.45, 300.0),
    (0.95, 0): (0.60, 0.50, 600.0), (0.95, 1): (0.63, 0.50, 660.0), (0.95, 2): (0.69, 0.50, 720.0),
}
START = 0.40


def make_run(path, m, seed, final, mid, wall, finished=True, extra=None):
    """A finished (or crashed) run dir; `extra`: {metric: (start, mid, final)} evaluated alongside accuracy."""
    extra = extra or {}
    os.makedirs(path)
    with open(os.path.join(path, "config.yaml"), "w") as f:
        yaml.safe_dump(config_to_dict(Config(out_dir=path, m=m, seed=seed, steps=STEPS)), f, sort_keys=False)
    rows = [{"step": 0, "eval/accuracy": START, "sync/seconds": 1.0, **{f"eval/{k}": v[0] for k, v in extra.items()}}]
    for step in range(1, STEPS + 1):
        row = {"step": step, "train/reward_mean": m * step / STEPS + 0.01 * seed,
               "time/elapsed_seconds": wall * step / STEPS}
        if step in (30, STEPS):
            row["eval/accuracy"] = mid if step == 30 else final
            row.update({f"eval/{k}": v[1] if step == 30 else v[2] for k, v in extra.items()})
        rows.append(row)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    if finished:
        summary = {"steps": STEPS, "wall_seconds": wall,
                   "eval_start": {"accuracy": START, "step": 0, "n": 100, **{k: v[0] for k, v in extra.items()}},
                   "eval_end": {"accuracy": final, "step": STEPS, "n": 100, **{k: v[2] for k, v in extra.items()}}}
        with open(os.path.join(path, "summary.json"), "w") as f:
            json.dump(summary, f)


@pytest.fixture
def runs(tmp_path):
    dirs = []
    for (m, seed), (final, mid, wall) in RUNS.items():
        dirs.append(str(tmp_path / f"m{m}_seed{seed}"))
        make_run(dirs[-1], m, seed, final, mid, wall)
    return dirs


def tables(*args, cwd):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tables.py"), *args], cwd=cwd, capture_output=True,
                          text=True)


def table_rows(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[:1] + lines[2:]]


def by_hand(values, scale=100, digits=1):
    """mean ± s.e. (in percent, one decimal, by default), computed without numpy."""
    xs = [scale * v for v in values]
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs) / math.sqrt(len(xs)):.{digits}f}"


def test_table_numbers_and_grouping(runs, tmp_path):
    unfinished = str(tmp_path / "crashed")
    make_run(unfinished, 0.5, 3, 0.9, 0.9, 10.0, finished=False)
    r = tables(*runs, unfinished, "--no-plot", "--csv", "t.csv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "warning: skipping 1 unfinished run(s)" in r.stderr and "crashed" in r.stderr
    header, low, high = table_rows(r.stdout)  # exactly two groups: only m differs (seed and out_dir are excluded)
    assert header == ["m", "n", "final acc %", "best acc %", "start acc %", "gain (pts)", "wall min", "steps/min"]
    # m=0.5: final 50, 52, 54 -> mean 52, std 2, s.e. 2/sqrt(3) = 1.15; best 56, 52, 54 -> 54 ± 1.15;
    # gain 10, 12, 14 -> 12 ± 1.15; 5 minutes each, 60 steps / 5 min = 12 steps/min
    assert low == ["0.5", "3", "52.0 ± 1.2", "54.0 ± 1.2", "40.0", "12.0 ± 1.2", "5.0", "12.0"]
    # m=0.95: final 60, 63, 69 -> mean 64, var (16+1+25)/2 = 21, s.e. sqrt(21/3) = 2.65; best = final;
    # 10, 11, 12 minutes -> 11.0; steps/min (6 + 5.4545 + 5) / 3 = 5.48
    assert high == ["0.95", "3", "64.0 ± 2.6", "64.0 ± 2.6", "40.0", "24.0 ± 2.6", "11.0", "5.5"]
    assert low[2] == by_hand([0.50, 0.52, 0.54]) and high[2] == by_hand([0.60, 0.63, 0.69])
    assert high[5] == by_hand([0.60 - START, 0.63 - START, 0.69 - START])
    assert not (tmp_path / "tables.png").exists()
    with open(tmp_path / "t.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["m"] for row in rows] == ["0.5", "0.95"] and rows[1]["n"] == "3"
    assert rows[1]["metric"] == "accuracy" and float(rows[1]["final"]) == pytest.approx(64.0)
    assert float(rows[1]["final_se"]) == pytest.approx(math.sqrt(7), abs=1e-4)


def test_group_by_and_single_seed(runs, tmp_path):
    r = tables(*runs, "--group-by", "m,seed", "--no-plot", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = table_rows(r.stdout)
    assert rows[0][:3] == ["m", "seed", "n"] and len(rows) == 7
    assert rows[1][:5] == ["0.5", "0", "1", "50.0", "56.0"] and "±" not in r.stdout  # n=1: no error bar
    r = tables(*runs[:3], "--no-plot", cwd=tmp_path)  # nothing differs: one group
    assert table_rows(r.stdout)[1][:3] == ["all", "3", "52.0 ± 1.2"]


def test_other_eval_metrics(tmp_path):
    """--metric: a task's own metric; rates in percent, others as logged (perplexity's best is its lowest); a run
    without the metric is one line naming the metrics it has."""
    dirs = [str(tmp_path / f"seed{seed}") for seed in (0, 1)]
    make_run(dirs[0], 0.5, 0, 0.5, 0.5, 300.0, extra={"win_rate": (0.30, 0.50, 0.60), "perplexity": (1.50, 1.20, 1.30)})
    make_run(dirs[1], 0.5, 1, 0.5, 0.5, 300.0, extra={"win_rate": (0.30, 0.40, 0.70), "perplexity": (1.50, 1.10, 1.40)})
    r = tables(*dirs, "--metric", "win_rate", "--no-plot", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    header, row = table_rows(r.stdout)
    assert header[1:6] == ["n", "final win_rate %", "best win_rate %", "start win_rate %", "gain (pts)"]
    assert row[1:6] == ["2", "65.0 ± 5.0", "65.0 ± 5.0", "30.0", "35.0 ± 5.0"]
    r = tables(*dirs, "--metric", "perplexity", "--no-plot", "--csv", "p.csv", cwd=tmp_path)
    header, row = table_rows(r.stdout)
    assert header[2:6] == ["final perplexity", "best perplexity", "start perplexity", "gain"]
    assert row[1:6] == ["2", "1.350 ± 0.050", "1.150 ± 0.050", "1.500", "-0.150 ± 0.050"]  # best: 1.20 and 1.10
    with open(tmp_path / "p.csv") as f:
        rec = next(csv.DictReader(f))
    assert rec["metric"] == "perplexity" and rec["unit"] == "as logged" and float(rec["best"]) == pytest.approx(1.15)
    r = tables(*dirs, "--metric", "diversity", "--no-plot", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "no eval metric 'diversity'" in r.stderr and "accuracy, perplexity, win_rate" in r.stderr


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed")
def test_plot_written(runs, tmp_path):
    r = tables(*runs, cwd=tmp_path)  # default path: tables.png in the current directory
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "tables.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = tables(*runs, "--plot", "sub.png", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "sub.png").stat().st_size > 10_000


@pytest.mark.parametrize("args", [[], ["nowhere"], ["."], ["--group-by", "nonsense", "RUN"]])
def test_errors_are_one_line_exit_2(runs, tmp_path, args):
    args = [runs[0] if a == "RUN" else a for a in args]
    r = tables(*args, "--no-plot", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1


def sweep(*args):
    env = dict(os.environ, DRY_RUN="1", PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    return subprocess.run(["bash", os.path.join(ROOT, "sweep.sh"), *args], capture_output=True, text=True, env=env)


def test_sweep_dry_run_grid(tmp_path):
    r = sweep("configs/tiny.yaml", "m=0.5,0.95", "seed=0,1", "steps=5")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("[")]
    assert lines == ["[1/4] m=0.5 seed=0 -> out/tiny/m0.5_seed0", "[2/4] m=0.5 seed=1 -> out/tiny/m0.5_seed1",
                     "[3/4] m=0.95 seed=0 -> out/tiny/m0.95_seed0", "[4/4] m=0.95 seed=1 -> out/tiny/m0.95_seed1"]
    base = str(tmp_path / "grid")  # a single-valued out_dir is the base; names follow the command-line order
    r = sweep("configs/tiny.yaml", f"out_dir={base}", "seed=0,1", "model=a/b,c")
    lines = [line for line in r.stdout.splitlines() if line.startswith("[")]
    assert [line.split(" -> ")[1] for line in lines] == [f"{base}/seed0_modela-b", f"{base}/seed0_modelc",
                                                         f"{base}/seed1_modela-b", f"{base}/seed1_modelc"]
    assert not os.path.exists(base)
    r = sweep("configs/tiny.yaml", "mm=1,2")
    assert r.returncode == 2 and "unknown key 'mm'" in r.stderr


def test_a_rerun_sweep_skips_finished_runs_and_continues_unfinished_ones(tmp_path):
    base = tmp_path / "grid"
    (base / "seed0").mkdir(parents=True)
    (base / "seed0" / "summary.json").write_text('{"steps": 5}')
    (base / "seed1").mkdir()
    (base / "seed1" / "metrics.jsonl").write_text('{"step": 0}\n')
    r = sweep("configs/tiny.yaml", f"out_dir={base}", "seed=0,1,2")
    lines = [line for line in r.stdout.splitlines() if line.startswith("[")]
    assert lines == [f"[1/3] seed=0 -> {base}/seed0 (finished: skipped)",
                     f"[2/3] seed=1 -> {base}/seed1 (unfinished: resume=auto)", f"[3/3] seed=2 -> {base}/seed2"]
    r = sweep("configs/tiny.yaml", f"out_dir={base}", "seed=0,1", "overwrite=true")  # the user's choice stands
    assert [line for line in r.stdout.splitlines() if line.startswith("[")] == [
        f"[1/2] seed=0 -> {base}/seed0", f"[2/2] seed=1 -> {base}/seed1"]


def test_against_a_key_gives_the_drop_and_the_collapses(tmp_path):
    # (loss, D) -> finals of seeds 0, 1; start 0.40: grpo at D = 4 ends below its start once
    finals = {("tb", 0): (0.60, 0.62), ("tb", 4): (0.58, 0.60), ("grpo", 0): (0.64, 0.66), ("grpo", 4): (0.30, 0.50)}
    dirs = []
    for (loss, d), pair in finals.items():
        for seed, final in enumerate(pair):
            dirs.append(str(tmp_path / f"{loss}_{d}_{seed}"))
            make_run(dirs[-1], 0.95, seed, final, 0.5, 300.0)
            with open(os.path.join(dirs[-1], "config.yaml"), "w") as f:
                cfg = Config(out_dir=dirs[-1], seed=seed, steps=STEPS, loss=loss, weight_delay=d)
                yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
    p = tables(*dirs, "--against", "weight_delay", "--plot", "against.png", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = [line.strip("| ").split(" | ") for line in p.stdout.splitlines() if line.startswith(("| grpo", "| tb"))]
    assert [r[:2] for r in rows] == [["grpo", "0"], ["grpo", "4"], ["tb", "0"], ["tb", "4"]]
    assert rows[0][3:7] == ["65.0 ± 1.0", "65.0 ± 1.0", "+0.0", "0/2"]
    assert rows[1][3] == "40.0 ± 10.0" and rows[1][5:7] == ["-25.0", "1/2"]  # 0.30 < 0.40: collapsed
    assert rows[3][5:7] == ["-2.0", "0/2"]
    if importlib.util.find_spec("matplotlib"):
        assert os.path.getsize(tmp_path / "against.png") > 0
    p = tables(*dirs, "--against", "m", cwd=tmp_path)
    assert p.returncode == 2 and "does not differ" in p.stderr


def test_a_run_from_before_a_key_existed_groups_with_runs_at_its_default(runs, tmp_path):
    # an older run's config.yaml lacks keys added since (here inflight, at its default): the same group, not its own
    with open(os.path.join(runs[0], "config.yaml")) as f:
        cfg = yaml.safe_load(f)
    del cfg["inflight"]
    with open(os.path.join(runs[0], "config.yaml"), "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    p = tables(*runs, "--no-plot", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = table_rows(p.stdout)
    assert rows[0][:2] == ["m", "n"] and [r[:2] for r in rows[1:]] == [["0.5", "3"], ["0.95", "3"]]


def test_where_a_run_logged_is_no_reason_to_group_it_apart(runs, tmp_path):
    # trackers= and progress= change where the metrics go, not the run: seeds logged to wandb group with the others
    for path, change in ((runs[0], {"trackers": "tensorboard,wandb"}), (runs[1], {"progress": False})):
        with open(os.path.join(path, "config.yaml")) as f:
            cfg = yaml.safe_load(f)
        with open(os.path.join(path, "config.yaml"), "w") as f:
            yaml.safe_dump(dict(cfg, **change), f, sort_keys=False)
    p = tables(*runs, "--no-plot", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = table_rows(p.stdout)
    assert rows[0][:2] == ["m", "n"] and [r[:2] for r in rows[1:]] == [["0.5", "3"], ["0.95", "3"]]


def test_finals_table_puts_several_metrics_side_by_side(tmp_path):
    """--finals: a column per metric, its final value (mean ± s.e. over seeds; rates in percent, others as logged),
    the start row first."""
    dirs = []
    for (m, seed), (final, mid, wall) in RUNS.items():
        dirs.append(str(tmp_path / f"m{m}_seed{seed}"))
        extra = {"attack_success": (0.1 + 0.01 * seed, 0.5, final),
                 "modes_covered": (6, 5, 6 - seed if m == 0.5 else 6)}
        make_run(dirs[-1], m, seed, final, mid, wall, extra=extra)
    p = tables(*dirs, "--metric", "attack_success", "--finals", "attack_success,modes_covered", "--no-plot",
               cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = table_rows(p.stdout)
    assert rows[0] == ["m", "n", "attack_success", "modes_covered"]
    assert rows[1] == ["start", "-", "11.0", "6.000"]  # the start: the mean over every run (10, 11, 12% by seed)
    assert rows[2] == ["0.5", "3", by_hand([0.50, 0.52, 0.54]), "5.000 ± 0.577"]
    assert rows[3] == ["0.95", "3", by_hand([0.60, 0.63, 0.69]), "6.000 ± 0.000"]
    # --at 30: the values of the step-30 evaluation instead of the end (a step without one: NaN)
    p = tables(*dirs, "--metric", "attack_success", "--finals", "attack_success,modes_covered", "--no-plot",
               "--at", "30", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = table_rows(p.stdout)
    assert rows[2] == ["0.5", "3", "50.0 ± 0.0", "5.000 ± 0.000"] and rows[3][2] == "50.0 ± 0.0"
    p = tables(*dirs, "--metric", "attack_success", "--finals", "modes_covered", "--no-plot", "--at", "31",
               cwd=tmp_path)
    assert table_rows(p.stdout)[2][2] == "nan ± nan"
    p = tables(*dirs, "--finals", "train/reward_mean", "--no-plot", cwd=tmp_path)  # a logged scalar's mean over the run
    mean_over_steps = [0.5 * (STEPS + 1) / (2 * STEPS) + 0.01 * seed for seed in range(3)]
    assert table_rows(p.stdout)[2] == ["0.5", "3", by_hand(mean_over_steps, 1, 3)]
    for bad in ("best", "last"):  # no best-of-N peak: a step fixed in advance or the end
        p = tables(*dirs, "--finals", "modes_covered", "--no-plot", "--at", bad, cwd=tmp_path)
        assert p.returncode == 2 and p.stderr.strip() == f"error: --at: '{bad}' is not a step"


def test_front_plots_one_metric_against_another(tmp_path):
    """--front kl: a plot of the metric against eval/kl through the evaluations, instead of the curves."""
    pytest.importorskip("matplotlib")
    dirs = []
    for (m, seed), (final, mid, wall) in RUNS.items():
        dirs.append(str(tmp_path / f"m{m}_seed{seed}"))
        make_run(dirs[-1], m, seed, final, mid, wall, extra={"win_rate": (0.3, 0.4, final), "kl": (0.0, 1.0, 2.0)})
    p = tables(*dirs, "--metric", "win_rate", "--front", "kl", "--plot", "front.png", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "plot: front.png" in p.stdout and os.path.getsize(tmp_path / "front.png") > 1000
    for bad, why in ((["--matched", "1"], "--matched needs --front X"),
                     (["--front", "kl", "--matched", "a,b"], "--matched: 'a,b' is not a list of numbers")):
        p = tables(*dirs, "--metric", "win_rate", *bad, "--no-plot", cwd=tmp_path)
        assert p.returncode == 2 and why in p.stderr and p.stderr.count("\n") == 1


def make_front_run(path, loss, delay, seed, evals):
    """A finished run whose evaluations are `evals`: [(step, kl, win_rate)], the last at the run's end."""
    os.makedirs(path)
    with open(os.path.join(path, "config.yaml"), "w") as f:
        cfg = Config(out_dir=path, loss=loss, weight_delay=delay, seed=seed, steps=evals[-1][0])
        yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
    rows = [{"step": step, "eval/kl": kl, "eval/win_rate": win} for step, kl, win in evals]
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"steps": evals[-1][0], "wall_seconds": 60.0, "eval_start": {"win_rate": evals[0][2], "kl": 0.0},
                   "eval_end": {"win_rate": evals[-1][2], "kl": evals[-1][1]}}, f)


# (loss, weight_delay, seed) -> evaluations (step, kl, win rate). rloo d0 seed 1 is not monotone in KL: it passes kl 1
# twice (at its step-20 evaluation, and again between steps 40 and 60), and each pass counts.
FRONT = {
    ("rloo", 0, 0): [(0, 0.0, 0.30), (20, 0.4, 0.40), (40, 1.2, 0.36), (60, 2.0, 0.20)],
    ("rloo", 0, 1): [(0, 0.0, 0.30), (20, 1.0, 0.50), (40, 0.6, 0.20), (60, 3.0, 0.10)],
    ("rloo", 14, 0): [(0, 0.0, 0.30), (20, 0.5, 0.30), (40, 1.5, 0.30), (60, 2.5, 0.26)],
    ("rloo", 14, 1): [(0, 0.0, 0.30), (20, 0.5, 0.40), (40, 1.5, 0.20), (60, 2.5, 0.10)],
}
SEED1_AT_KL1 = (50 + (20 + (1.0 - 0.6) / (3.0 - 0.6) * (10 - 20))) / 2  # its two passes: 50 and 18.33


@pytest.fixture
def front_runs(tmp_path):
    dirs = []
    for (loss, delay, seed), evals in FRONT.items():
        dirs.append(str(tmp_path / f"{loss}_d{delay}_s{seed}"))
        make_front_run(dirs[-1], loss, delay, seed, evals)
    return dirs


def test_matched_reads_each_run_where_its_kl_passes_each_value(front_runs, tmp_path):
    """--front kl --matched: linear between the two evaluations around the value, the mean over every pass of a curve
    that comes back (an evaluation exactly at the value counted once), and "(k/n)" when only k runs reach it."""
    p = tables(*front_runs, "--metric", "win_rate", "--front", "kl", "--matched", "0.2,1,3", "--no-plot",
               cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = table_rows(p.stdout)
    assert rows[0] == ["weight_delay", "n", "kl = 0.2", "kl = 1", "kl = 3"]
    # D = 0: kl 0.2 -> seed 0: 30 + 0.5 (40 - 30) = 35, seed 1: 30 + 0.2 (50 - 30) = 34;
    # kl 1 -> seed 0: 40 + (0.6 / 0.8)(36 - 40) = 37, seed 1: SEED1_AT_KL1 = 34.17; kl 3: seed 1 only, 10
    assert rows[1] == ["0", "2", "34.5 ± 0.5", by_hand([0.37, SEED1_AT_KL1 / 100]), "10.0 (1/2)"]
    assert rows[1][3] == "35.6 ± 1.4"
    # D = 14: kl 0.2 -> 30 + 0.4 (30 - 30) = 30 and 30 + 0.4 (40 - 30) = 34; kl 1 -> 30 and 30; kl 3: none
    assert rows[2] == ["14", "2", "32.0 ± 2.0", "30.0 ± 0.0", "- (0/2)"]


def test_paired_at_a_matched_kl_and_at_a_fixed_step(front_runs, tmp_path):
    """--paired with --front kl --matched V (one value) or --at STEP: per seed, each run read there."""
    args = ("--metric", "win_rate", "--paired", "weight_delay=0,14", "--no-plot")
    p = tables(*front_runs, *args, "--front", "kl", "--matched", "1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "per seed: eval/win_rate where eval/kl passes 1 (interpolated, the mean over the run's passes)" in p.stdout
    row = table_rows(p.stdout)[1]
    diffs = [37 - 30, SEED1_AT_KL1 - 30]  # seeds 0, 1 at kl 1: 7 and 4.17 points; t = 12.706 at 1 degree of freedom
    mean, half = statistics.mean(diffs), 12.706 * statistics.stdev(diffs) / math.sqrt(2)
    assert row == ["all", "weight_delay=0 minus weight_delay=14", "2", f"{mean:+.1f}",
                   f"[{mean - half:+.1f}, {mean + half:+.1f}]", f"not told apart at ±{half:.1f}"]
    p = tables(*front_runs, *args, "--front", "kl", "--matched", "3", cwd=tmp_path)  # no D = 14 run reaches kl 3
    assert p.returncode == 2 and "no seed has runs with a value at both" in p.stderr
    p = tables(*front_runs, *args, "--front", "kl", "--matched", "0.2,1", cwd=tmp_path)
    assert p.returncode == 2 and "--paired takes one --matched value" in p.stderr
    p = tables(*front_runs, *args, "--at", "20", cwd=tmp_path)  # step 20: 40 - 30 and 50 - 40
    assert "per seed: eval/win_rate at step 20" in p.stdout
    assert table_rows(p.stdout)[1][2:4] == ["2", "+10.0"] and table_rows(p.stdout)[1][4] == "[+10.0, +10.0]"


# (loss, seed) -> per-seed drop in points, accuracy(weight_delay=0) - accuracy(weight_delay=64), each run's accuracy
# the mean of its last two evaluations; the drops' 95% t-intervals (t = 3.182 at 3 degrees of freedom) are worked below
DROPS = {"tb": (2, 3, 1, 2), "grpo": (8, 7, 10, 6), "rloo": (1, 4, 2, 1)}


def make_stale_run(path, loss, delay, seed, last_two):
    """A finished run of `loss` at weight_delay `delay` whose last two evaluations are `last_two` (an earlier one,
    0.9, must not count with --last 2)."""
    os.makedirs(path)
    with open(os.path.join(path, "config.yaml"), "w") as f:
        cfg = Config(out_dir=path, loss=loss, weight_delay=delay, seed=seed, steps=STEPS)
        yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
    evals = {0: START, 20: 0.9, 40: last_two[0], STEPS: last_two[1]}
    rows = [{"step": s, **({"eval/accuracy": evals[s]} if s in evals else {})} for s in range(STEPS + 1)]
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"steps": STEPS, "wall_seconds": 60.0, "eval_start": {"accuracy": START},
                   "eval_end": {"accuracy": last_two[1]}}, f)


def test_paired_differences_and_contrast(tmp_path):
    dirs = []
    for loss, drops in DROPS.items():
        for seed, drop in enumerate(drops):
            for delay, mean in ((0, 0.50), (64, 0.50 - drop / 100)):
                dirs.append(str(tmp_path / f"{loss}_d{delay}_s{seed}"))
                make_stale_run(dirs[-1], loss, delay, seed, (mean - 0.01, mean + 0.01))
    dirs.append(str(tmp_path / "grpo_d0_s4"))  # a seed without its D = 64 run: not paired, not counted
    make_stale_run(dirs[-1], "grpo", 0, 4, (0.1, 0.1))
    r = tables(*dirs, "--paired", "weight_delay=0,64", "--contrast", "loss=tb", "--last", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {(row[0], row[1]): row[2:] for row in table_rows(r.stdout)[1:]}

    def by_hand(xs):
        half = 3.182 * statistics.stdev(xs) / math.sqrt(len(xs))
        return f"{statistics.mean(xs):+.1f}", f"[{statistics.mean(xs) - half:+.1f}, {statistics.mean(xs) + half:+.1f}]"
    for loss, drops in DROPS.items():
        assert rows[(loss, "weight_delay=0 minus weight_delay=64")][:3] == ["4", *by_hand(drops)]
    grpo = [t - g for t, g in zip(DROPS["tb"], DROPS["grpo"])]  # -6 -4 -9 -4: TB loses less
    rloo = [t - g for t, g in zip(DROPS["tb"], DROPS["rloo"])]  # 1 -1 -1 1: level
    assert rows[("grpo", "(loss=tb) minus this")] == ["4", *by_hand(grpo), "below 0"]
    half = 3.182 * statistics.stdev(rloo) / 2
    assert rows[("rloo", "(loss=tb) minus this")] == ["4", *by_hand(rloo), f"not told apart at ±{half:.1f}"]
    assert rows[("tb", "weight_delay=0 minus weight_delay=64")][3] == "above 0"
    assert ("tb", "(loss=tb) minus this") not in rows
    assert "plot: tables.png" in r.stdout  # the forest plot: each seed a dot, the mean and its interval a bar
    assert (tmp_path / "tables.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_paired_refuses_a_key_that_does_not_differ(runs, tmp_path):
    r = tables(*runs, "--paired", "weight_delay=0,64", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: --paired: 'weight_delay' does not differ between these runs (they differ in: m)")
    r = tables(*runs, "--paired", "m=0.5", cwd=tmp_path)
    assert r.returncode == 2 and "is not KEY=A,B" in r.stderr


def test_ratio_interval_is_a_t_interval_on_the_log_of_paired_ratios():
    from tables import ratio_interval
    ratio, low, high = ratio_interval([(2.0, 1.0), (8.0, 1.0)])  # log ratios ln 2 and ln 8: geometric mean 4
    assert ratio == pytest.approx(4.0) and low * high == pytest.approx(16.0)  # symmetric about 4 on the log scale
    half = 12.706 * math.log(4.0) / 2  # t(0.975, 1 df) x sd / sqrt 2, sd = (ln 8 - ln 2) / sqrt 2
    assert high == pytest.approx(4.0 * math.exp(half), rel=1e-6)
    ratio, low, high = ratio_interval([(3.0, 2.0)])
    assert ratio == pytest.approx(1.5) and low is None and high is None


def make_success_run(path, loss, beta, seed, evals):
    """A finished run of `loss` at beta whose evaluations are `evals`: {step: (attack_success, mode_entropy)}."""
    os.makedirs(path)
    with open(os.path.join(path, "config.yaml"), "w") as f:
        cfg = Config(out_dir=path, loss=loss, beta_start=beta, beta_end=beta, seed=seed, steps=STEPS)
        yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
    rows = [{"step": s, **({"eval/attack_success": evals[s][0], "eval/mode_entropy": evals[s][1]} if s in evals
                           else {})} for s in range(STEPS + 1)]
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    end = {"attack_success": evals[STEPS][0], "mode_entropy": evals[STEPS][1]}
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"steps": STEPS, "wall_seconds": 60.0, "eval_start": end, "eval_end": end}, f)


def test_match_compares_runs_where_their_front_reaches_a_level(tmp_path):
    """--front attack_success --match 0.5: each run's mode entropy where its success first reaches 50%, linear
    between the evaluations around the crossing; a run that never reaches it is left out and counted."""
    # success 0.0 -> 0.4 -> 0.8 at steps 0 / 30 / 60: crosses 0.5 a quarter of the way from step 30 to 60
    # (step 37.5), where the entropy is 0.6 + 0.25 (0.2 - 0.6) = 0.5; the end value (0.2) must not be what counts
    tb = {0: {0: (0.0, 1.0), 30: (0.4, 0.6), 60: (0.8, 0.2)}, 1: {0: (0.0, 1.0), 30: (0.5, 0.9), 60: (0.9, 0.1)},
          2: {0: (0.0, 1.0), 30: (0.3, 0.8), 60: (0.7, 0.4)}}  # entropy at 0.5: 0.5, 0.9 (at step 30), 0.6
    rloo = {0: {0: (0.0, 1.0), 30: (0.4, 0.4), 60: (0.8, 0.0)}, 1: {0: (0.0, 1.0), 30: (0.6, 0.5), 60: (1.0, 0.5)},
            2: {0: (0.0, 1.0), 30: (0.2, 0.9), 60: (0.45, 0.9)}}  # 0.3, 1.0 - 5/6 x 0.5, never (0.45 at the end)
    dirs = []
    for beta, shift in ((0.1, 0.0), (1.0, 0.1)):  # at beta 1 every entropy 0.1 higher, the differences the same
        for loss, evals in (("tb", tb), ("rloo", rloo)):
            for seed, points in evals.items():
                dirs.append(str(tmp_path / f"{loss}_b{beta}_s{seed}"))
                make_success_run(dirs[-1], loss, beta, seed, {s: (x, y + shift) for s, (x, y) in points.items()})
    p = tables(*dirs, "--group-by", "loss,beta_end", "--metric", "mode_entropy", "--front", "attack_success",
               "--match", "0.5", "--finals", "mode_entropy", "--no-plot", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "where eval/attack_success first reaches 0.5:" in p.stdout
    rows = {(r[0], r[1]): r[2:] for r in table_rows(p.stdout)[1:]}
    assert rows[("tb", "0.1")] == ["3/3", by_hand([37.5, 30, 45], 1, 0), by_hand([0.5, 0.9, 0.6], 1, 3)]
    rloo_at = [0.3, 1.0 - 5 / 6 * 0.5]
    assert rows[("rloo", "0.1")] == ["2/3", by_hand([37.5, 30 - 30 / 6], 1, 0), by_hand(rloo_at, 1, 3)]
    assert rows[("tb", "1.0")][2] == by_hand([0.6, 1.0, 0.7], 1, 3)
    # paired by seed: tb minus rloo per beta (seeds 0 and 1: 0.2 and 0.9 - 0.5833), and both betas pooled (n = 4)
    p = tables(*dirs, "--group-by", "loss,beta_end", "--paired", "loss=tb,rloo", "--front", "attack_success",
               "--match", "0.5", "--metric", "mode_entropy", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "per seed: eval/mode_entropy where eval/attack_success first reaches 0.5" in p.stdout
    rows = {r[0]: r[1:] for r in table_rows(p.stdout)[1:]}
    diffs = [0.5 - rloo_at[0], 0.9 - rloo_at[1]]
    for beta in ("0.1", "1.0"):
        assert rows[beta][:3] == ["loss=tb minus loss=rloo", "2", f"{statistics.mean(diffs):+.3f}"]
    half = 3.182 * statistics.stdev(diffs * 2) / 2  # t at 3 degrees of freedom
    pooled = statistics.mean(diffs)
    assert rows["pooled"][1:4] == ["4", f"{pooled:+.3f}", f"[{pooled - half:+.3f}, {pooled + half:+.3f}]"]  # nats
    for bad, why in ((["--match", "0.5", "--finals", "mode_entropy"], "--match needs --front X"),
                     (["--front", "attack_success", "--match", "0.5"], "--match needs --front X"),
                     (["--front", "attack_success", "--match", "x", "--finals", "mode_entropy"], "is not V[,V2...]")):
        p = tables(*dirs, "--metric", "mode_entropy", *bad, "--no-plot", cwd=tmp_path)
        assert p.returncode == 2 and why in p.stderr, p.stderr


def test_packed_runs_give_the_same_tables_and_keep_only_evaluations(runs, tmp_path):
    """scripts/pack_runs.py: a grid's finished runs packed (config, summary, the evaluation rows) give tables.py the
    same table as the runs themselves; per-step rows and other files stay behind, an unfinished run is not packed."""
    grid = tmp_path / "grid"
    for d in runs:
        arm, seed = os.path.basename(d).split("_")
        os.makedirs(grid / arm, exist_ok=True)
        os.rename(d, grid / arm / seed)
    os.makedirs(grid / "m0.5" / "seed0" / "checkpoints")
    make_run(str(grid / "m0.5" / "seed9"), 0.5, 9, 0.9, 0.9, 1.0, finished=False)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "pack_runs.py"), str(grid),
                        str(tmp_path / "packed")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "packed 6 finished run(s)" in p.stdout and "skipped 1 unfinished" in p.stdout
    packed = tmp_path / "packed" / "m0.5" / "seed0"
    assert sorted(os.listdir(packed)) == ["config.yaml", "metrics.jsonl", "summary.json"]
    with open(packed / "metrics.jsonl") as f:
        kept = [json.loads(line) for line in f]
    assert [row["step"] for row in kept] == [0, 30, STEPS]
    assert {k for row in kept for k in row} == {"step", "time/elapsed_seconds", "eval/accuracy"}  # per-step keys left
    assert not (tmp_path / "packed" / "m0.5" / "seed9").exists()
    full = tables(*sorted(str(p) for p in grid.glob("*/seed[0-2]")), "--group-by", "m", "--no-plot", cwd=tmp_path)
    small = tables(*sorted(str(p) for p in (tmp_path / "packed").glob("*/seed*")), "--group-by", "m", "--no-plot",
                   cwd=tmp_path)
    assert full.returncode == small.returncode == 0, full.stderr + small.stderr
    assert table_rows(small.stdout) == table_rows(full.stdout) and len(table_rows(full.stdout)) == 3
    # a per-step scalar: the mean over every step of the run (kept in step_means), not over the evaluation rows
    finals = [tables(*sorted(str(p) for p in root.glob("*/seed[0-2]")), "--group-by", "m", "--finals",
                     "accuracy,train/reward_mean", "--no-plot", cwd=tmp_path) for root in (grid, tmp_path / "packed")]
    assert finals[0].returncode == finals[1].returncode == 0, finals[0].stderr + finals[1].stderr
    assert table_rows(finals[1].stdout) == table_rows(finals[0].stdout)
    m05 = table_rows(finals[0].stdout)[2]  # header, start, m = 0.5: reward_mean = 0.5 step / STEPS + 0.01 seed
    assert m05[0:2] == ["0.5", "3"] and m05[3] == by_hand([0.5 * (STEPS + 1) / (2 * STEPS) + 0.01 * s
                                                           for s in (0, 1, 2)], scale=1, digits=3)
    # packing a packed run (a grid finished beside copies of its packed runs) gives the same run back
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "pack_runs.py"), str(tmp_path / "packed"),
                        str(tmp_path / "repacked")], capture_output=True, text=True)
    assert p.returncode == 0 and "packed 6 finished run(s)" in p.stdout, p.stderr
    for name in ("summary.json", "metrics.jsonl", "config.yaml"):
        assert (tmp_path / "repacked" / "m0.5" / "seed0" / name).read_text() == (packed / name).read_text()
