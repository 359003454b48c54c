"""bench.py kept working (a few steps, HF engine): it must produce its table and a consistent bench.json. It asserts
no speed; the figures are measured with the full benchmark (README, performance section)."""
import json
import os
import subprocess
import sys

from conftest import ROOT


def bench(out, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench.py"), "--steps", "3", "--chunks", "2", "--out",
                        str(out), *args, "engine=hf", "n_test=8", "initial_buffer=16"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r


def test_bench_runs_both_modes_and_writes_bench_json(tiny_model, tmp_path):
    out = tmp_path / "bench"
    r = bench(out, "--modes", "sync,async")  # --work equal: the async arm at max_reuse=1, B x K fresh per step
    assert "| training loop seconds" in r.stdout and "| trainer floor seconds" in r.stdout
    res = json.load(open(out / "bench.json"))
    a, s = res["async"], res["sync"]
    assert a["steps"] == s["steps"] == 3 and res["engine"] == "hf"
    assert res["speedup_sync_over_async"] == s["loop_seconds_mean"] / a["loop_seconds_mean"]
    assert a["loop_seconds_all"] == [a["loop_seconds"]] and 0 < a["eval_seconds"] < a["wall_seconds"]
    assert set(s["staleness_hist"]) == {"0"} and s["staleness_hist"]["0"] == 3 * 8 * 8  # sync: all on-policy, B x K
    assert sum(a["staleness_hist"].values()) == 3 * 8 * 8 and s["fresh_samples_per_step"] == 8 * 8  # B x S
    # equal work, said in the speedup's line; 3 steps are few, so the async arm may fetch a round more or less
    equal = res["equal_work_sync_async"]
    assert equal == (max(a["fresh_samples_per_step"], 64) <= 1.1 * min(a["fresh_samples_per_step"], 64))
    assert ("faster than sync at equal work" if equal else "at UNEQUAL work") in r.stdout
    for mode in (a, s):
        assert 0 < mode["trainer_busy_fraction"] <= 1 and mode["sync_seconds_max"] >= mode["sync_seconds_mean"] > 0
        assert mode["loop_over_trainer_floor"] >= 0.99  # no loop is shorter than the trainer's own work
        assert mode["train_seconds_per_step"] > 0 and mode["searcher_tokens_per_s_median"] > 0
    assert res["standalone_tokens_per_s"] > 0 and a["trainer_cores"] > 0
    assert (out / "async" / "metrics.jsonl").exists() and (out / "sync" / "summary.json").exists()


def test_bench_with_one_arm_reports_it_without_speedups(tiny_model, tmp_path):
    out = tmp_path / "bench"
    r = bench(out, "--modes", "sync")
    res = json.load(open(out / "bench.json"))
    assert not set(res) & {"async", "inflight", "pipeline_vs_standalone", "cpu_cores"} and res["sync"]["steps"] == 3
    assert not any(key.startswith("speedup_") for key in res) and "faster than" not in r.stdout
    assert "equal work" not in r.stdout
    assert "| training loop seconds" in r.stdout and " | sync |" in r.stdout
