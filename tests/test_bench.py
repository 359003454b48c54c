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
    assert "| whole job: CPU seconds of every process / (cores x launch seconds)" in r.stdout
    res = json.load(open(out / "bench.json"))
    a, s = res["async"], res["sync"]
    assert a["steps"] == s["steps"] == 3 and res["engine"] == "hf"
    assert res["speedup_sync_over_async"] == s["loop_seconds_mean"] / a["loop_seconds_mean"]
    assert a["loop_seconds_all"] == [a["loop_seconds"]] and 0 < a["eval_seconds"] < a["wall_seconds"]
    for arm in (a, s):  # every rank's CPU seconds (3 processes here) fit in the cores over the launch, and fill some
        assert 0.2 < arm["cores_busy_fraction"] <= 1.0 and arm["cores"] >= 1
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


def load_script(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_time_to_accuracy_clock_leaves_out_evaluations_and_the_target_is_the_sync_mean(tmp_path):
    """Hand-made runs: the target is the sync seeds' mean at --target-step (0.5), an arm's time is the clock (loop
    seconds - evaluation seconds so far) at its first evaluation at or above it, a run that never gets there is 'not
    reached'."""
    def run(name, evals):  # [(step, loop seconds, eval seconds so far, accuracy)]
        d = tmp_path / name
        d.mkdir()
        rows = [{"step": 0, "eval/accuracy": 0.4}] + [
            {"step": s, "time/loop_seconds": t, "time/eval_seconds_total": e, "eval/accuracy": a} for s, t, e, a in evals]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "summary.json").write_text("{}")
    run("sync_s0", [(50, 30, 1, 0.45), (100, 61, 2, 0.48), (150, 93, 3, 0.5)])
    run("sync_s1", [(50, 31, 1, 0.47), (100, 62, 2, 0.52)])  # target: (0.48 + 0.52) / 2 = 0.5
    run("async_s0", [(50, 12, 1, 0.49), (100, 25, 2, 0.51), (150, 40, 3, 0.6)])
    run("async_s1", [(50, 12, 1, 0.55)])
    run("inflight_s0", [(50, 12, 1, 0.42)])
    r = subprocess.run([sys.executable, "scripts/time_to_accuracy.py", "report", "--target-step", "100", "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "target: 50.0% held-out accuracy" in r.stdout
    lines = {line.split("|")[1].strip(): line for line in r.stdout.splitlines() if line.startswith("| ")}
    assert "| 90 / 60 | 75 ± 15 | 150 / 100 |" in lines["sync"]  # 93 - 3, 62 - 2
    assert "| 23 / 11 | 17 ± 6 | 100 / 50 |" in lines["async (chunks)"]  # 25 - 2, 12 - 1
    assert "| not reached |" in lines["async in-flight"]
    assert "async (chunks) reaches the target 4.41x sooner than sync" in r.stdout

