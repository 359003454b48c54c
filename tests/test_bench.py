"""bench.py kept working (a few steps, HF engine): it must produce its table and a consistent bench.json. It asserts
no speed; the figures are measured with the full benchmark (README, performance section)."""
import json
import os
import subprocess
import sys
import types

import pytest

from conftest import ROOT


def bench(out, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench.py"), "--steps", "3", "--chunks", "2", "--out",
                        str(out), *args, "engine=hf", "n_test=8", "initial_buffer=16"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r


@pytest.fixture(scope="module")
def both_modes(tiny_model, tmp_path_factory):
    """One bench.py run of both arms (--work equal: the async arm at max_reuse=1, B x K fresh per step): (its folder,
    its output)."""
    out = tmp_path_factory.mktemp("bench") / "bench"
    return out, bench(out, "--modes", "sync,async")


def test_bench_runs_both_modes_and_writes_bench_json(both_modes):
    out, r = both_modes
    assert "| training loop seconds" in r.stdout and "| trainer floor seconds" in r.stdout
    assert "| whole job: CPU seconds of every process / (cores x launch seconds)" in r.stdout
    res = json.load(open(out / "bench.json"))
    a, s = res["async"], res["sync"]
    assert a["steps"] == s["steps"] == 3 and res["engine"] == "hf"
    assert abs(res["speedup_sync_over_async"] - s["loop_seconds_mean"] / a["loop_seconds_mean"]) < 1e-9  # one pair
    assert res["speedup_sync_over_async_interval"] == [None, None]
    assert a["loop_seconds_all"] == [a["loop_seconds"]] and 0 < a["eval_seconds"] < a["wall_seconds"]
    for arm in (a, s):  # every rank's CPU seconds (3 processes here) fit in the cores over the launch, and fill some
        assert 0.2 < arm["cores_busy_fraction"] <= 1.0 and arm["cores"] >= 1
    assert set(s["staleness_hist"]) == {"0"} and s["staleness_hist"]["0"] == 3 * 8 * 8  # sync: all on-policy, B x K
    assert sum(a["staleness_hist"].values()) == 3 * 8 * 8 and s["fresh_samples_per_step"] == 8 * 8  # B x S
    # equal work, said in the speedup's line; 3 steps are few, so the async arm may fetch a round more or less
    equal = res["equal_work_sync_async"]
    assert equal == (max(a["fresh_samples_per_step"], 64) <= 1.1 * min(a["fresh_samples_per_step"], 64))
    assert ("one run per arm: no interval, no claim" if equal else "at UNEQUAL work") in r.stdout
    for mode in (a, s):
        assert 0 < mode["trainer_busy_fraction"] <= 1 and mode["sync_seconds_max"] >= mode["sync_seconds_mean"] > 0
        assert mode["loop_over_trainer_floor"] >= 0.99  # no loop is shorter than the trainer's own work
        assert mode["train_seconds_per_step"] > 0 and mode["searcher_tokens_per_s_median"] > 0
    assert res["standalone_tokens_per_s"] > 0 and a["trainer_cores"] > 0
    assert (out / "async" / "metrics.jsonl").exists() and (out / "sync" / "summary.json").exists()


def test_bench_with_one_arm_reports_it_without_speedups(both_modes, monkeypatch, capsys):
    """bench.json and the report of the sync arm alone, built by bench.py's own functions from the measured sync run
    above (a run of its own took 40 s of CI for what only the reporting decides)."""
    import bench as bench_py
    from config import load_config
    out, _ = both_modes
    measured = json.load(open(out / "bench.json"))["sync"]
    monkeypatch.setattr(bench_py, "standalone_tokens_per_s", lambda cfg, n_chunks: (100.0, "hf"))
    cfg = load_config(os.path.join(ROOT, "configs", "tiny.yaml"), ["engine=hf"])
    res = bench_py.results({"sync": [measured]}, cfg, 2)
    bench_py.print_table(res, ["sync"], types.SimpleNamespace(steps=3, repeats=1), cfg)
    bench_py.print_ratios(res, cfg)
    stdout = capsys.readouterr().out
    assert not set(res) & {"async", "inflight", "pipeline_vs_standalone", "cpu_cores"} and res["sync"]["steps"] == 3
    assert not any(key.startswith("speedup_") for key in res) and "faster than" not in stdout
    assert "equal work" not in stdout and "UNEQUAL" not in stdout
    assert "| training loop seconds" in stdout and " | sync |" in stdout


def test_time_to_accuracy_smooths_over_three_evaluations_and_pairs_the_arms_by_seed(tmp_path):
    """Hand-made runs: the clock leaves out evaluations (loop - evaluation seconds so far); an arm reaches the fixed
    target at the first evaluation where the mean of it and the two before reaches it (one lucky evaluation does
    not); a run that never gets there is 'not reached'; ratios against TRL are per seed, with an interval."""
    def run(name, evals, fresh=64):  # [(step, loop seconds, eval seconds so far, accuracy)]
        d = tmp_path / name
        d.mkdir()
        rows = [{"step": 0, "eval/accuracy": 0.4}] + [
            {"step": s, "time/loop_seconds": t, "time/eval_seconds_total": e, "eval/accuracy": a} for s, t, e, a in evals]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "summary.json").write_text(json.dumps({"fresh_samples_per_step": fresh}))
    run("trl_s0", [(100, 60, 0, 0.45), (200, 120, 0, 0.5), (300, 180, 0, 0.52), (400, 240, 0, 0.56)])
    run("trl_s1", [(100, 62, 0, 0.48), (200, 124, 0, 0.51), (300, 186, 0, 0.53), (400, 248, 0, 0.5)])
    # s0: 0.7 at step 100 is one lucky evaluation: the three-evaluation mean first reaches 0.5 at step 300
    run("async_s0", [(100, 31, 1, 0.7), (200, 62, 2, 0.3), (300, 93, 3, 0.5), (400, 124, 4, 0.5)], fresh=32)
    run("async_s1", [(100, 33, 1, 0.5), (200, 64, 2, 0.5), (300, 95, 3, 0.51), (400, 126, 4, 0.52)], fresh=32)
    run("sync_s0", [(100, 100, 1, 0.41)])
    with open(tmp_path / "sync_s0" / "metrics.jsonl", "a") as f:  # the per-role breakdown: medians over steps 10-300
        f.writelines(json.dumps({"step": s, "time/train_seconds": t, "search/idle_ratio": 0.5}) + "\n"
                     for s, t in ((5, 9.0), (10, 0.2), (11, 0.3), (12, 0.25), (301, 9.0)))
    r = subprocess.run([sys.executable, "scripts/time_to_accuracy.py", "report", "--target", "0.5", "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = {line.split("|")[1].strip(): line for line in r.stdout.split("per role")[0].splitlines()
             if line.startswith("| ")}
    # trl: three-evaluation means 0.49 (s0 at 300: (0.45 + 0.5 + 0.52) / 3) then 0.527 at 400; s1 0.507 at 300
    assert "| 0.610 | 105 | 46.5% / 50.5% / 52.5% | 240 / 186 | 400 / 300 |" in lines["TRL GRPOTrainer"]
    assert "| 90 / 92 | 300 / 300 |" in lines["ours async (tb, default)"]  # 93 - 3, 95 - 3
    assert "| not reached |" in lines["ours sync (grpo)"]
    # per seed: s / step 90 / 300 = 0.30 and 92 / 300 against 180 / 300 = 0.6 and 186 / 300 = 0.62
    assert "s / step, ours async (tb, default) / TRL GRPOTrainer: at unequal work (32 vs 64" in r.stdout
    assert "s / step, ours sync (grpo) / TRL GRPOTrainer: 1.65 (n = 1: no interval)" in r.stdout  # (99 / 100) / 0.6
    assert "time to target, ours async (tb, default) / TRL GRPOTrainer: 0.43 (95% " in r.stdout  # 90/240, 92/186
    assert "n = 2): not told apart from 1" in r.stdout
    assert "time to target, ours sync (grpo) / TRL GRPOTrainer: 1 of 1 seeds did not reach it" in r.stdout
    parts = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in r.stdout.split("per role")[1].splitlines()
             if line.startswith("| ours")}
    assert [x.strip() for x in parts["ours sync (grpo)"]] == ["-", "0.250", "-", "-", "-", "-", "-", "-", "-",
                                                               "0.500"]
    assert "TRL GRPOTrainer" not in r.stdout.split("per role")[1]  # TRL logs no roles: it is one process


def test_step_floors_times_each_part_of_a_step_alone(tmp_path):
    """scripts/step_floors.py on the tiny config: generation, the weight load, reference log-probs, reward and the
    train step, each timed alone, in its table and its json (the HF engine at one thread keeps the test short)."""
    out = tmp_path / "floors.json"
    r = subprocess.run([sys.executable, "scripts/step_floors.py", "--repeats", "1", "--engines", "hf", "--threads",
                        "1", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(x["part"], x["engine"], x["threads"]) for x in rows] == [
        ("generate", "hf", 1), ("load", "hf", 1), ("ref", "", 1), ("reward", "", 1), ("train", "", 1)]
    assert all(0 < x["fastest_s"] <= x["median_s"] <= x["slowest_s"] for x in rows)
    assert "| train | - | 1 |" in r.stdout
