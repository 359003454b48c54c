"""scripts/scaling_verdict.py on synthetic runs (docs/diversity.md, "Does more search find more?"): the fresh samples
per step of each arm from its config, the per-seed least-squares slope against log2(F / 16) with its interval and the
rule's verdict, the positive control that gates it, the pilot's read step and seed count, and the real ranks beside
the emulated arms; scripts/pack_runs.py keeps the buffer counts the reader needs."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from config import Config, config_to_dict
from conftest import ROOT

P = {16: 2, 32: 4, 64: 8}  # max_prompts_per_round of each F with 2 searchers, S = 8, k = 2


def run_dir(path, loss, F, seed, count, half=None, n_searchers=2, entropy=1.0):
    """A finished packed-style red-teaming run of 1200 steps whose buffer/distinct_success is `count` at step 1200
    (`half` at 600, default half of it; 100 at 50)."""
    os.makedirs(path)
    P_ = P[F] if n_searchers == 2 else 4
    cfg = Config(out_dir=str(path), task="redteam_modes", train_data="procedural:train:64", loss=loss, seed=seed,
                 steps=1200, n_searchers=n_searchers, max_prompts_per_round=P_, max_reuse=64 / F)
    yaml.safe_dump(config_to_dict(cfg), open(path / "config.yaml", "w"), sort_keys=False)
    counts = {0: 0, 25: 40, 50: 100, 600: count / 2 if half is None else half, 1200: count}
    with open(path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps({"step": s, "eval/mode_entropy": entropy * s / 1200, "eval/attack_success": 0.5,
                                 "buffer/distinct_success": c, "buffer/distinct_success_text": min(c, 48)}) + "\n"
                     for s, c in counts.items())
    json.dump({"steps": 1200, "fresh_samples_per_step": F + 0.05, "loop_seconds": 200.0 + F,
               "eval_seconds_total": 80.0, "eval_end": {"mode_entropy": entropy},
               "final": {"buffer/distinct_success": count}}, open(path / "summary.json", "w"))


def grid(root, tb=None, seeds=range(4), flat=None, top=None):
    """TB: 1000 / 1100 / 1300 + (10, 10, 12) x seed at F = 16 / 32 / 64 (slope 150 + seed, curvature 100 + 2 seed);
    GRPO: 1000 everywhere plus seed (slope 0)."""
    for s in seeds:
        for F, base, per in ((16, 1000, 10), (32, 1100, 10), (64, 1300, 12)):
            count = top if top and F == 64 else base + per * s
            run_dir(root / f"tb_f{F}" / f"seed{s}", "tb", F, s, count, half=count if flat == (F, s) else None)
            run_dir(root / f"grpo_f{F}" / f"seed{s}", "grpo", F, s, 1000 + s)


def verdict(*args):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "scaling_verdict.py"), *map(str, args)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in p.stdout.splitlines() if r.startswith("| ")]
    return {c[0]: c[1:] for c in cells}, p.stdout


def test_primary_slope_interval_and_verdict(tmp_path):
    grid(tmp_path)
    for n, F in ((1, 16), (4, 64)):  # the real ranks: 20 more than the emulated arm of the same F in every seed
        for s in range(4):
            run_dir(tmp_path / f"tb_n{n}" / f"seed{s}", "tb", F, s, {16: 1000, 64: 1300}[F] + {16: 10, 64: 12}[F] * s
                    + 20, n_searchers=n)
    table, out = verdict(tmp_path, "--plot", tmp_path / "forest.png")
    assert table["pace tb n=2 F=16"] == ["4", "16.05", "yes"]
    assert table["pace tb n=4 F=64"][:2] == ["4", "64.05"]  # F from n_searchers x max_prompts_per_round x S / k
    primary = table["PRIMARY: TB's slope of buffer/distinct_success per doubling of F"]
    # slopes 150, 151, 152, 153: mean 151.5, sd 1.291, half-width t(3) 3.182 x 1.291 / 2 = 2.05
    assert primary[:3] == ["4", "+152", "[+149, +154]"] and primary[3] == "more search finds more"
    assert table["GRPO slope of buffer/distinct_success at 1200"][3].startswith("not told apart")  # slope 0 each seed
    assert table["TB minus GRPO slope of buffer/distinct_success at 1200"][1] == "+152"
    assert table["TB curvature of buffer/distinct_success at 1200"][1] == "+103"  # 100 + 2 seed
    assert "control: passes" in out and table["tb F=64 seed 3"] == ["668 at 600", "1336 at 1200", "rises"]
    assert table["1 searcher(s), F=16"][:4] == ["4", "2.3", "4", "+20"]  # (200 + 16 - 80) / 60 minutes
    assert table["2 searcher(s), F=32"][3] == "(the same runs)"
    # real ranks on seeds 0-1 only: n = 2's wall-clock is read on those seeds, not on the emulated arm's others
    for s in (2, 3):
        for n in (1, 4):
            shutil.rmtree(tmp_path / f"tb_n{n}" / f"seed{s}")
        summary = tmp_path / "tb_f32" / f"seed{s}" / "summary.json"
        json.dump({**json.load(open(summary)), "loop_seconds": 9999.0}, open(summary, "w"))
    table, _ = verdict(tmp_path)
    assert table["2 searcher(s), F=32"][:2] == ["2", "2.5"]  # (200 + 32 - 80) / 60 on seeds 0-1
    assert table["1 searcher(s), F=16"][:4] == ["2", "2.3", "2", "+20"]
    assert os.path.isfile(tmp_path / "forest.png") or "plot:" not in out


def test_mode_entropy_and_attack_success_are_read_at_the_last_step_whatever_the_read_step(tmp_path):
    """As registered: the pilot moved red-teaming's read step (to 375), not these two secondaries (1200)."""
    grid(tmp_path)
    table, _ = verdict(tmp_path, "--read-step", 600)
    runs, count, _, entropy = table["tb n=2 F=16"][:4]
    assert (runs, count) == ("4", "508")  # the count at the read step 600: (1000 + 10 s) / 2, seeds 0-3
    assert entropy == "1.000"  # mode entropy at 1200 (0.500 at 600)
    assert "TB slope of eval/mode_entropy at 1200" in table and "TB slope of eval/attack_success at 1200" in table


def test_a_flat_count_fails_the_control_and_the_primary_is_not_read(tmp_path):
    grid(tmp_path, flat=(16, 2))
    table, out = verdict(tmp_path)
    assert table["tb F=16 seed 2"][-1] == "FLAT (or missing)" and "FAILS: the primary is not read" in out
    assert table["PRIMARY: TB's slope of buffer/distinct_success per doubling of F"][3].startswith("not read")


def test_pilot_sets_the_read_step_below_the_ceiling_and_the_seed_count(tmp_path):
    grid(tmp_path, seeds=(0, 1))
    _, out = verdict(tmp_path, "--pilot")
    assert "at most 90% of its ceiling (3072) and every TB run's count still rises: 1200" in out
    # seeds 0, 1: slopes 150, 151 (sd 0.707); target 5% of TB's F = 16 mean 1005 = 50.25: 4 seeds do
    assert "target 50.2 -> 4 seeds" in out or "target 50.3 -> 4 seeds" in out
    saturated = tmp_path / "saturated"
    grid(saturated, seeds=(0, 1), top=3000)  # past 90% of 3072 at step 1200: read where it was not, step 600
    _, out = verdict(saturated, "--pilot")
    assert "still rises: 600" in out


def test_pack_runs_keeps_the_buffer_counts_on_evaluation_rows(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import pack_runs
    src = tmp_path / "run"
    os.makedirs(src)
    (src / "config.yaml").write_text("seed: 0\n")
    (src / "summary.json").write_text(json.dumps({"steps": 2}))
    rows = [{"step": 0, "eval/accuracy": 0.3}, {"step": 1, "buffer/distinct_success": 3, "train/loss": 1.0},
            {"step": 2, "buffer/distinct_success": 5, "buffer/distinct_success_text": 4, "buffer/size": 9,
             "eval/accuracy": 0.4}]
    (src / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert pack_runs.pack_run(str(src), str(tmp_path / "packed"))
    kept = [json.loads(line) for line in open(tmp_path / "packed" / "metrics.jsonl")]
    assert kept == [{"step": 0, "eval/accuracy": 0.3}, {"step": 2, "buffer/distinct_success": 5,
                                                         "buffer/distinct_success_text": 4, "eval/accuracy": 0.4}]
    assert json.load(open(tmp_path / "packed" / "summary.json"))["step_means"]["buffer/distinct_success"] == \
        pytest.approx(4.0)
