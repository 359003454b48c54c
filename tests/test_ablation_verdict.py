"""scripts/ablation_verdict.py: the four ablation questions' registered readings (docs/ablations.md): Holm over each
question's primary family, the positive controls that label their contrasts when they fail, and the pilots' fallbacks
and seed counts, on synthetic grids of full runs (per-step rows) and of the same runs packed."""
import json
import os
import subprocess
import sys

import yaml

import tables
from config import Config, config_to_dict
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import pack_runs  # noqa: E402

KNOB = "the knob did not change what it should here"
SFT = "the schedule did not move the policy further from the SFT here"


def run_dir(path, seed, acc, stale=10.0, reward=0.5, distinct=4.0, kl=0.0, fresh=32.0, end=None, **cfg):
    """A finished full run: evaluations every 100 steps whose last three average `acc` points (an earlier one, 5
    points lower, must not count), step 1000's `end` points when given; per-step rows between them whose means are
    `stale`, `reward`, `distinct` (each row off by one step either way); eval/kl_sft rising to `kl` at step 1000."""
    os.makedirs(path)
    c = Config(out_dir=str(path), seed=seed, steps=1000, eval_every=100, eval_samples=16, time_budget_min=0, **cfg)
    yaml.safe_dump(config_to_dict(c), open(path / "config.yaml", "w"), sort_keys=False)
    rows = []
    for s in range(0, 1001, 50):
        k = 1 if s % 200 == 50 else -1
        if s % 100:
            rows.append({"step": s, "staleness/mean": stale + k, "train/reward_mean": reward + 0.01 * k,
                         "train/distinct_per_group": distinct + 0.1 * k, "train/distinct_prompts": 4.0})
            continue
        a = 39.8 if s == 0 else end if s == 1000 and end is not None else acc + {800: -0.5, 900: 1.0, 1000: -0.5}.get(
            s, -5)
        rows.append({"step": s, "eval/accuracy": a / 100, "eval/pass@1": a / 100, "eval/pass@16": a / 100 + 0.2,
                     "eval/kl_sft": kl * s / 1000})
    with open(path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    ends = [{k.split("/")[1]: v for k, v in r.items() if k.startswith("eval/")} for r in (rows[0], rows[-1])]
    json.dump({"steps": 1000, "wall_seconds": 60.0, "eval_start": ends[0], "eval_end": ends[1],
               "fresh_samples_per_step": fresh}, open(path / "summary.json", "w"))


def q1_grid(path, a, b, lo=0.5, it=1, stale_lo=(30, 30), reward_on=None):
    """Q1's four arms over len(a) seeds: (a) m = 0.95 minus m = lo at inv_temp 0 is a[seed] points, (b) inv_temp = it
    minus 0 at m = lo is b[seed]; staleness 10 at m = 0.95 and stale_lo[seed % 2] at lo; reward 0.5, and at inv_temp =
    it reward_on[seed] (default 0.55 + 0.01 x seed)."""
    for seed, (da, db) in enumerate(zip(a, b)):
        on = reward_on[seed] if reward_on else 0.55 + 0.01 * seed
        for m, i, acc in ((0.95, 0, 50 + da), (lo, 0, 50), (lo, it, 50 + db), (0.95, it, 50 + da + db)):
            run_dir(path / f"m{m:g}_it{i:g}" / f"seed{seed}", seed, acc, m=m, inv_temp=i,
                    stale=10.0 if m == 0.95 else stale_lo[seed % 2], reward=on if i else 0.5)


def q4_grid(path, anneal, reset, kl_reset=(0.5, 0.6, 0.4, 0.7), anneal_end=None):
    """Q4's three arms: accuracy anneal - const and reset - const per seed; eval/kl_sft at step 1000 const 1.0, anneal
    2.0, reset 1.0 + kl_reset[seed]; anneal_end: {seed: the anneal run's accuracy at step 1000}."""
    for seed, (da, dr) in enumerate(zip(anneal, reset)):
        run_dir(path / "const" / f"seed{seed}", seed, 50, kl=1.0, eval_kl_sft=True)
        run_dir(path / "anneal" / f"seed{seed}", seed, 50 + da, kl=2.0, eval_kl_sft=True, beta_end=0.0143,
                beta_decay_steps=500, end=(anneal_end or {}).get(seed))
        run_dir(path / "reset" / f"seed{seed}", seed, 50 + dr, kl=1.0 + kl_reset[seed], eval_kl_sft=True,
                ref_reset_every=50)


def verdict(q, path, *args, rc=0):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "ablation_verdict.py"), q, str(path), *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == rc, p.stderr
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in p.stdout.splitlines() if r.startswith("| ")]
    return {c[0]: c[1:] for c in cells}, p


def expected(a, b, diffs, level, word="accuracy"):
    """The rule's sentence for a contrast that Holm rejects, from tables.paired at its level."""
    _, mean, half, _ = tables.paired(diffs, level)
    if mean < 0:  # a fall reads as its size: "lowers ... by 3.5 [2.5, 4.6]"
        return f"{a} lowers {word} against {b} by {-mean:.1f} [{-mean - half:.1f}, {-mean + half:.1f}] points"
    return f"{a} raises {word} against {b} by {mean:+.1f} [{mean - half:+.1f}, {mean + half:+.1f}] points"


def test_seed_count_rule_gives_the_docs_examples():
    for family, sd, n in ((2, 1.0, 6), (2, 1.4, 8), (1, 1.0, 5), (1, 1.4, 6), (2, 3.0, None)):
        assert tables.seed_count({"sd": sd}, 1.5, family)[1] == n


def test_q1_holm_each_interval_at_its_step_and_the_rule(tmp_path):
    a, b = (3.0, 2.0, 4.0, 3.0), (1.0, -1.0, 0.6, -0.2)
    q1_grid(tmp_path, a, b)
    rows, p = verdict("q1", tmp_path, "--plot", str(tmp_path / "forest.png"))
    ra, rb = rows["(a) recency: m = 0.95 minus m = 0.5 at inv_temp = 0"], rows[
        "(b) reward priority: inv_temp = 1 minus 0 at m = 0.5"]
    assert ra[:2] == ["4", "+3.0"] and ra[3] == "0.9750"  # the smaller p: tested at 1 - 0.05 / 2
    assert ra[-1] == expected("m0.95_it0", "m0.5_it0", a, 0.975)
    half = tables.paired(b, 0.95)[2]
    assert rb[3] == "0.9500" and rb[-1] == f"not told apart at ±{half:.1f} points"
    assert rows["staleness/mean, m = 0.5 over m = 0.95, at inv_temp = 0"][1:] == [
        "3.00, 3.00, 3.00, 3.00", "-", "-", "holds"]
    assert rows["train/reward_mean, inv_temp = 1 minus 0 at m = 0.5"][-1] == "holds"
    inter = rows["interaction: (a) at inv_temp = 1 minus (a) at 0: accuracy (last three)"]
    assert inter[:2] == ["4", "+0.0"]  # (a) is the same at both inv_temps here
    assert rows["(b) at m = 0.95: pass@16 (last three)"][:2] == ["4", "+0.1"]
    assert rows["m0.95_it1"][:3] == ["4", "53.1", "53.1"]  # each arm's means: the last three evaluations
    assert rows["m0.5_it0"][4] == "30.0"  # its mean staleness over the per-step rows
    assert (tmp_path / "forest.png").read_bytes()[:4] == b"\x89PNG"


def test_q1_holm_stops_where_the_first_step_fails(tmp_path):
    # (b)'s p 0.036 > 0.025 at the first step: neither is rejected, though (a)'s 95% interval alone (p 0.046) lies
    # above 0
    a, b = (1.0, 3.0, 0.9, 3.1), (1.0, 3.0, 1.1, 2.9)
    q1_grid(tmp_path, a, b)
    rows, _ = verdict("q1", tmp_path)
    ra, rb = rows["(a) recency: m = 0.95 minus m = 0.5 at inv_temp = 0"], rows[
        "(b) reward priority: inv_temp = 1 minus 0 at m = 0.5"]
    assert float(rb[2]) < float(ra[2]) < 0.05 and rb[3] == "0.9750" and ra[3] == "0.9500"
    assert ra[-1].startswith("not told apart at ±") and rb[-1].startswith("not told apart at ±")
    assert ra[4].startswith("[+")  # its 95% interval is above 0, but Holm's step-down stopped before it


def test_q1_a_failed_control_labels_its_contrasts_not_the_others(tmp_path):
    a, b = (3.0, 2.0, 4.0, 3.0), (2.0, 3.0, 2.4, 3.4)  # (b) has the smaller p: tested at 1 - 0.05 / 2
    q1_grid(tmp_path, a, b, stale_lo=(30, 15))  # seeds 1 and 3: m = 0.5 only 1.5 times as stale
    rows, _ = verdict("q1", tmp_path)
    assert rows["staleness/mean, m = 0.5 over m = 0.95, at inv_temp = 0"][-1] == f"fails: {KNOB}"
    assert rows["(a) recency: m = 0.95 minus m = 0.5 at inv_temp = 0"][-1] == KNOB
    assert rows["(a) at inv_temp = 1: pass@16 (last three)"][-1] == KNOB  # its secondaries too
    assert rows["(b) reward priority: inv_temp = 1 minus 0 at m = 0.5"][-1] == expected("m0.5_it1", "m0.5_it0", b, 0.975)
    q1_grid(tmp_path / "r", a, b, reward_on=(0.55, 0.45, 0.56, 0.44))  # reward priority does not raise the reward
    rows, _ = verdict("q1", tmp_path / "r")
    assert rows["train/reward_mean, inv_temp = 1 minus 0 at m = 0.5"][-1] == f"fails: {KNOB}"
    assert rows["(b) reward priority: inv_temp = 1 minus 0 at m = 0.5"][-1] == KNOB
    assert rows["(a) recency: m = 0.95 minus m = 0.5 at inv_temp = 0"][-1].startswith("m0.95_it0 raises accuracy")


def test_q1_pilot_fallbacks_and_seed_count(tmp_path):
    q1_grid(tmp_path, (3.0, 7.0), (0.0, 0.5), stale_lo=(30, 15), reward_on=(0.49, 0.6))
    _, p = verdict("q1", tmp_path, "--pilot")
    out = p.stdout[p.stdout.index("PILOT DECISIONS"):]
    assert "at inv_temp = 0: per seed 3.00, 1.50 -> fails: the low arm becomes m = 0.1" in out
    assert "at m = 0.5: per seed -0.010, +0.100 -> fails: inv_temp becomes 3" in out
    assert "sd 2.83" in out and "sd 0.35" in out and ": 2.83;" in out  # the larger sd, above the 1.0 floor
    assert "n = 8: 2.84" in out and "seeds: n = 8 (no n from 4 to 8 is under 1.5 points: 8)" in out
    assert 'next: M_LOW=0.1 IT=3 SEEDS="0 1 2 3 4 5 6 7" bash scripts/ablation_grid.sh q1 test' in out
    q1_grid(tmp_path / "ok", (3.0, 3.5), (0.0, 0.5), lo=0.1, it=3)  # after the fallbacks: arms m0.1_it3 and so on
    _, p = verdict("q1", tmp_path / "ok", "--pilot")
    assert "m = 0.1 over m = 0.95, at inv_temp = 3: per seed 3.00, 3.00 -> holds: no change" in p.stdout
    assert "points, sd 0.35" in p.stdout and ": 1.00;" in p.stdout  # the floor: sd 1.0
    assert 'seeds: n = 6 (the smallest n' in p.stdout and 'next: SEEDS="0 1 2 3 4 5" bash' in p.stdout


def test_q4_controls_label_their_contrast_and_holm(tmp_path):
    anneal, reset = (3.0, 2.5, 3.5, 3.0), (2.0, 3.0, 2.0, 3.0)
    q4_grid(tmp_path, anneal, reset, kl_reset=(0.2, -0.3, 0.1, -0.1))
    rows, p = verdict("q4", tmp_path)
    assert rows["eval/kl_sft at step 1000, anneal minus const"][1:] == [
        "+1.000, +1.000, +1.000, +1.000", "+1.000", "[+1.000, +1.000]", "holds"]
    assert rows["eval/kl_sft at step 1000, reset minus const"][-1] == f"fails: {KNOB} ({SFT})"
    assert rows["anneal minus const"][3] == "0.9750"
    assert rows["anneal minus const"][-1] == expected("anneal", "const", anneal, 0.975)
    assert rows["reset minus const"][3] == "0.9500" and rows["reset minus const"][-1] == f"{KNOB} ({SFT})"
    assert rows["anneal minus reset: accuracy (last three)"][-1] == f"{KNOB} ({SFT})"
    assert rows["anneal minus const: accuracy at step 1000"][:2] == ["4", "+3.0"]
    assert rows["const"][:2] == ["0.000", "0.100"] and rows["anneal"][-1] == "2.000"  # the kl_sft curve from step 0
    q4_grid(tmp_path / "all", anneal, reset)
    rows, _ = verdict("q4", tmp_path / "all")
    assert rows["reset minus const"][-1] == expected("reset", "const", reset, 0.95)
    q4_grid(tmp_path / "wide", anneal, reset, kl_reset=(0.05, 2.0, 0.1, 1.9))  # every seed above 0, its interval not
    rows, _ = verdict("q4", tmp_path / "wide")
    assert rows["eval/kl_sft at step 1000, reset minus const"][-1] == f"fails: {KNOB} ({SFT})"
    assert "reset minus const: per seed +0.050, +2.000, +0.100, +1.900 -> holds" in verdict(
        "q4", tmp_path / "wide", "--pilot")[1].stdout  # the pilot's rule: above 0 in every seed


def test_q4_pilot_beta_end_fallback_and_seed_count(tmp_path):
    q4_grid(tmp_path, (3.0, 2.0), (1.0, 3.0), kl_reset=(0.5, -0.1))
    _, p = verdict("q4", tmp_path, "--pilot")
    out = p.stdout[p.stdout.index("PILOT DECISIONS"):]
    assert "reset minus const: per seed +0.500, -0.100 -> fails: the reset contrast is reported as" in out
    assert "and not stopped: per seed +12.7, +11.7 -> holds: no change" in out
    assert "sd 0.71" in out and "sd 1.41" in out
    assert 'next: SEEDS="0 1 2 3 4 5 6 7" bash scripts/ablation_grid.sh q4 test' in out
    q4_grid(tmp_path / "low", (3.0, 2.0), (1.0, 1.2), anneal_end={1: 39.0})  # seed 1 ends below its start
    _, p = verdict("q4", tmp_path / "low", "--pilot")
    assert "per seed +12.7, -0.8 -> fails: the end becomes 0.0167" in p.stdout
    assert 'next: BETA_END=0.0167 SEEDS="0 1 2 3 4 5 6 7" bash' in p.stdout
    stop = tmp_path / "stop" / "anneal" / "seed1"
    q4_grid(tmp_path / "stop", (3.0, 2.0), (1.0, 1.2))
    os.remove(stop / "summary.json")  # stopped on non-finite updates: no summary, a final stop mark
    (stop / ".final_stop").write_text("1 error: 5 updates in a row had a non-finite loss or gradient\n")
    _, p = verdict("q4", tmp_path / "stop", "--pilot")
    assert f"stopped (anneal, not finished): {stop}: 1 error: 5 updates in a row" in p.stdout
    assert f"per seed +12.7 (anneal seed 1; {stop} stopped: no finished run) -> fails: the end" in p.stdout
    assert 'next: BETA_END=0.0167 SEEDS="0 1 2 3 4 5" bash' in p.stdout  # seed 0 alone: the sd's floor


def test_q2_design_check_and_a_family_of_one(tmp_path):
    for seed, (d, fresh) in enumerate(((1.0, 32.0), (1.5, 33.5))):
        run_dir(tmp_path / "k8" / f"seed{seed}", seed, 50, K=8, B=8, S=8)
        run_dir(tmp_path / "k16" / f"seed{seed}", seed, 50 + d, K=16, B=4, S=16, max_prompts_per_round=2, fresh=fresh)
    _, p = verdict("q2", tmp_path, "--pilot")
    assert "k16 minus k8: per seed +0.00, +1.50 -> fails: the test waits for a design" in p.stdout
    assert "two-sided at 0.95:" in p.stdout and "seeds: n = 5" in p.stdout  # one contrast at sd 1.0
    assert "next: no test (the test waits for a design that holds it" in p.stdout
    rows, _ = verdict("q2", tmp_path)
    assert rows["K = 16 minus K = 8"][3] == "0.9500" and rows["K = 16 minus K = 8"][-1].startswith("not read:")
    for seed, d in enumerate((-3.6, -3.4, -3.0)):  # a design that holds, and K = 16 lower in every seed
        run_dir(tmp_path / "ok" / "k8" / f"seed{seed}", seed, 55, K=8, B=8, S=8)
        run_dir(tmp_path / "ok" / "k16" / f"seed{seed}", seed, 55 + d, K=16, B=4, S=16, max_prompts_per_round=2)
    rows, _ = verdict("q2", tmp_path / "ok")
    assert rows["K = 16 minus K = 8"][-1] == expected("k16", "k8", (-3.6, -3.4, -3.0), 0.95)
    assert rows["K = 16 minus K = 8"][-1].startswith("k16 lowers accuracy against k8 by 3.3 [")


def test_q3_pilot_and_the_s10_arms(tmp_path):
    for seed in (0, 1):
        for loss in ("tb", "grpo"):
            for s, groups, fresh in ((8, 4.0, 32.0), (10, 4.2, 32.2 if loss == "tb" else 30.5), (16, 4.0 + seed, 32)):
                run_dir(tmp_path / f"{loss}_s{s}" / f"seed{seed}", seed, 50 + s / 8, loss=loss, S=s,
                        distinct=groups, fresh=fresh)
    _, p = verdict("q3", tmp_path, "--pilot")
    assert "tb: S = 16 minus S = 8: per seed +0.00, +1.00 -> fails: the question is reported as" in p.stdout
    assert "grpo: S = 10 minus S = 8: per seed -1.50, -1.50 -> fails: the S = 10 arms are out" in p.stdout
    assert 'next: no test (the question is reported as "S did not change the groups here"' in p.stdout
    for s10 in ("tb_s10", "grpo_s10"):  # the test without them
        for seed in (0, 1):
            os.remove(tmp_path / s10 / f"seed{seed}" / "summary.json")
    rows, _ = verdict("q3", tmp_path)
    assert rows["TB: S = 10 minus S = 8: accuracy (last three)"][-1] == "not run: no runs of tb_s10"
    assert rows["TB: S = 16 minus S = 8"][-1] == f"{KNOB} (S did not change the groups here)"


def test_packed_runs_read_as_the_full_ones(tmp_path):
    q1_grid(tmp_path / "full", (3.0, 2.0, 4.0), (1.0, -1.0, 0.5), stale_lo=(30, 15))
    for arm in os.listdir(tmp_path / "full"):
        for seed in os.listdir(tmp_path / "full" / arm):
            pack_runs.pack_run(tmp_path / "full" / arm / seed, tmp_path / "packed" / arm / seed)
    assert "staleness/mean" not in (tmp_path / "packed" / "m0.5_it0" / "seed1" / "metrics.jsonl").read_text()
    full, packed = (verdict("q1", tmp_path / d)[1].stdout for d in ("full", "packed"))
    assert full == packed and "| m0.5_it0 | 1 | 50.0 | 50.0 | 70.0 | 15.0 | 0.500 | 32.00 |" in full


def test_errors_a_user_can_cause(tmp_path):
    _, p = verdict("q4", tmp_path, rc=2)
    assert p.stderr.strip() == f"error: no finished runs under {tmp_path}"
    q4_grid(tmp_path, (1.0, 2.0), (1.0, 2.0))
    for seed in (0, 1):
        os.remove(tmp_path / "reset" / f"seed{seed}" / "summary.json")
    _, p = verdict("q4", tmp_path, rc=2)
    assert p.stderr.strip() == f"error: no runs of reset under {tmp_path} (found: anneal, const)"
    q1_grid(tmp_path / "q1", (1.0, 2.0), (1.0, 2.0))
    run_dir(tmp_path / "q1" / "m0.6_it0" / "seed0", 0, 50, m=0.6)
    _, p = verdict("q1", tmp_path / "q1", rc=2)
    assert p.stderr.strip() == "error: q1: expected runs at m = 0.95 and one other m, found [0.5, 0.6]"
    _, p = verdict("q1", tmp_path / "q1", "--pilot", "--plot", "x.png", rc=2)
    assert "the pilot reads nothing" in p.stderr
    assert "invalid choice: 'q5'" in verdict("q5", tmp_path, rc=2)[1].stderr  # a question the doc does not register
