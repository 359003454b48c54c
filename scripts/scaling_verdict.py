"""The search-scaling question's registered reading (docs/diversity.md, "Does more search find more?"): from a grid's
runs (scripts/search_scaling_grid.sh), the pace of each arm, the positive control, the one primary statistic per task
with the verdict its rule gives, the secondaries (labelled so), and the real searcher ranks beside the emulated ones.

    python scripts/scaling_verdict.py docs/grids/scaling_redteam_test [--read-step S] [--plot PNG]
    python scripts/scaling_verdict.py docs/grids/scaling_redteam_pilot --pilot     # the pilot's rules

An arm is (loss, n_searchers, F), F = n_searchers x max_prompts_per_round x S / k fresh samples per step; the data
factor is F / 16 and x = log2(F / 16) = 0, 1, 2. Per seed and loss, a metric's slope is the least-squares slope of its
three values (one per F, 2 searchers) against x, i.e. (value at F = 64 - value at F = 16) / 2: the F = 32 arm enters
only the curvature, value(16) - 2 value(32) + value(64) (> 0: the second doubling gains more than the first). Mean and
95% t-interval over the seeds that have all three arms.
  redteam_modes  primary: buffer/distinct_success (distinct successful (prompt id, attack) pairs received so far) at
                 the read step (default: the run's last step; the pilot's rule sets it)
  arith          primary: eval/pass@16 at the last evaluation (step 300)
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tables  # noqa: E402

FACTORS = (16, 32, 64)
COUNT, TEXT = "buffer/distinct_success", "buffer/distinct_success_text"
# per task: the primary; the secondaries, each with its own read step (None: the read step; LAST: the runs' last
# step, where red-teaming's registration reads mode entropy and attack success whatever the read step); the count
# the control reads, its ceiling per prompt id (redteam_modes: the grammar's 48 successful attacks) and the pilot's
# target half-width of the primary's slope (a fraction of TB's F = 16 value for a count, else absolute)
LAST = "last"
TASKS = {"redteam_modes": dict(primary=COUNT, secondary=[(TEXT, 50), ("eval/mode_entropy", LAST),
                                                         ("eval/attack_success", LAST)],
                               control=COUNT, ceiling=48, target=0.05),
         "arith": dict(primary="eval/pass@16", secondary=[("eval/pass@1", None), (COUNT, None)], control=COUNT,
                       ceiling=None, target=0.01)}


def prompt_ids(cfg):
    """The training prompts a run drew from: n_train, or the n of a procedural:<split>:<n> source."""
    return cfg["n_train"] or int(str(cfg["train_data"]).rsplit(":", 1)[-1])


def load(paths):
    """Every finished run under paths: dicts of cfg, rows (by step), summary, F, arm."""
    runs = []
    for path in paths:
        for here, _, files in sorted(os.walk(path)):
            if not {"summary.json", "config.yaml", "metrics.jsonl"} <= set(files):
                continue
            with open(os.path.join(here, "config.yaml")) as f:
                cfg = {**tables.DEFAULTS, **(yaml.safe_load(f) or {})}
            with open(os.path.join(here, "metrics.jsonl")) as f:
                rows = {}
                for line in f:
                    if line.strip():
                        row = json.loads(line)
                        rows.setdefault(row["step"], {}).update(row)
            with open(os.path.join(here, "summary.json")) as f:
                summary = json.load(f)
            F = cfg["n_searchers"] * cfg["max_prompts_per_round"] * cfg["S"] / cfg["k"]
            runs.append(dict(path=here, cfg=cfg, rows=rows, summary=summary, F=F,
                             arm=(cfg["loss"], cfg["n_searchers"], int(F))))
    return runs


def value(run, key, step):
    """`key` (eval/<name> or buffer/<name>) at `step`: its row, or the summary's last row at the run's last step;
    NaN if not logged there."""
    if key in run["rows"].get(step, {}):
        return float(run["rows"][step][key])
    if step == run["summary"]["steps"]:
        final = run["summary"].get("final", {})
        if key in final:
            return float(final[key])
        name = key.split("/", 1)[1]
        if key.startswith("eval/") and name in run["summary"].get("eval_end", {}):
            return float(run["summary"]["eval_end"][name])
    return float("nan")


def eval_steps(run):
    return sorted(s for s, row in run["rows"].items() if any(k.startswith("eval/") for k in row))


def by_arm(runs):
    """{arm: {seed: run}}."""
    arms = {}
    for run in runs:
        arms.setdefault(run["arm"], {})[run["cfg"]["seed"]] = run
    return arms


def slopes(arms, loss, key, step):
    """({seed: least-squares slope against log2(F / 16)}, {seed: curvature}) over the seeds with all three arms."""
    runs = [arms.get((loss, 2, f), {}) for f in FACTORS]
    seeds = sorted(set.intersection(*(set(r) for r in runs)))
    slope, curve = {}, {}
    for s in seeds:
        y = [value(r[s], key, step) for r in runs]
        if all(math.isfinite(v) for v in y):
            slope[s] = (y[2] - y[0]) / 2  # least squares over x = 0, 1, 2, exactly (np.polyfit's rounding aside)
            curve[s] = y[0] - 2 * y[1] + y[2]
    return slope, curve


def stat_row(name, xs, digits, rule=("falls", "rises")):
    n, mean, half, _ = tables.paired(list(xs.values())) if xs else (0, float("nan"), float("nan"), float("nan"))
    if n < 2:
        return [name, str(n), f"{mean:+.{digits}f}", "-", "-"], (n, mean, half)
    reading = rule[0] if mean + half < 0 else rule[1] if mean - half > 0 else f"not told apart at ±{half:.{digits}f}"
    return [name, str(n), f"{mean:+.{digits}f}", f"[{mean - half:+.{digits}f}, {mean + half:+.{digits}f}]",
            reading], (n, mean, half)


def digits_of(key):
    return 0 if key.startswith("buffer/") else 3


def pace_table(arms):
    rows = []
    for arm in sorted(arms):
        fresh = [r["summary"].get("fresh_samples_per_step", float("nan")) for r in arms[arm].values()]
        ok = all(abs(x - arm[2]) <= 0.05 * arm[2] for x in fresh)
        rows.append([f"pace {arm[0]} n={arm[1]} F={arm[2]}", str(len(fresh)), f"{np.mean(fresh):.2f}",
                     "yes" if ok else "NO: the arithmetic is off, these runs do not count"])
    print("Pace: fresh samples per step (summary.json: samples generated / steps, the initial buffer included)")
    tables.markdown(["arm", "runs", "fresh per step", "within 5% of F"], rows)


def control_rows(arms, key, step):
    """Per TB run (2 searchers): the count at `step` over its count at the last evaluation at or before step / 2."""
    rows, passed = [], True
    for f in FACTORS:
        for seed, run in sorted(arms.get(("tb", 2, f), {}).items()):
            half = max((s for s in eval_steps(run) if s <= step / 2), default=None)
            now, then = value(run, key, step), value(run, key, half) if half is not None else float("nan")
            ok = math.isfinite(now) and math.isfinite(then) and now >= 1.1 * then
            passed &= ok
            rows.append([f"tb F={f} seed {seed}", f"{then:.0f} at {half}", f"{now:.0f} at {step}",
                         "rises" if ok else "FLAT (or missing)"])
    return rows, passed


def report(runs, read_step, plot):
    task = {r["cfg"]["task"] for r in runs}
    if len(task) != 1 or next(iter(task)) not in TASKS:
        tables.fail(f"expected the runs of one task of {', '.join(TASKS)}, found {sorted(task)}")
    task = next(iter(task))
    spec, arms = TASKS[task], by_arm(runs)
    steps = max(r["summary"]["steps"] for r in runs)
    step = read_step or steps
    pace_table(arms)
    print("Per arm, mean over seeds at the read step (wall: minutes of the training loop without evaluations)")
    keys = [(spec["primary"], step)] + [(k, steps if s == LAST else s or step) for k, s in spec["secondary"]]
    rows = []
    for arm in sorted(arms, key=lambda a: (a[1] != 2, a)):
        rs = arms[arm].values()
        wall = [(r["summary"].get("loop_seconds", float("nan")) - r["summary"].get("eval_seconds_total", 0)) / 60
                for r in rs]
        rows.append([f"{arm[0]} n={arm[1]} F={arm[2]}", str(len(rs))]
                    + [f"{np.nanmean([value(r, k, s) for r in rs]):.{digits_of(k)}f}" for k, s in keys]
                    + [f"{np.mean(wall):.1f}"])
    tables.markdown(["arm", "runs"] + [f"{k} at {s}" for k, s in keys] + ["wall min"], rows)

    c_rows, passed = control_rows(arms, spec["control"], step)
    print(f"Positive control: in every TB run {spec['control']} still rises with the samples generated "
          "(at the read step >= 1.1 x at half of it)")
    tables.markdown(["run", "before", "at the read step", "reading"], c_rows)
    tb_count, _ = slopes(arms, "tb", spec["control"], step)
    print(f"control: {'passes' if passed and c_rows else 'FAILS: the primary is not read'}; and across the arms, "
          f"TB's per-seed slope of {spec['control']}: {', '.join(f'{v:+.0f}' for v in tb_count.values()) or '-'}\n")

    primary, _ = slopes(arms, "tb", spec["primary"], step)
    p_row, (n, mean, half) = stat_row(f"PRIMARY: TB's slope of {spec['primary']} per doubling of F", primary,
                                      digits_of(spec["primary"]), ("more search finds less", "more search finds more"))
    if not passed:
        p_row[-1] = "not read (the control did not pass): " + p_row[-1]
    print(f"The primary statistic (per seed, the least-squares slope against log2(F / 16), read at step {step}; "
          "95% t-interval over the seeds)")
    tables.markdown(["statistic", "n", "mean", "95% CI", "verdict (the rule)"], [p_row])
    forest = [("PRIMARY: TB slope", primary, mean, half)]

    rows = []
    for key, at in keys:
        d = digits_of(key)
        tb, tb_curve = slopes(arms, "tb", key, at)
        grpo, _ = slopes(arms, "grpo", key, at)
        diff = {s: tb[s] - grpo[s] for s in sorted(set(tb) & set(grpo))}
        for name, xs in ((f"TB slope of {key} at {at}", tb), (f"GRPO slope of {key} at {at}", grpo),
                         (f"TB minus GRPO slope of {key} at {at}", diff), (f"TB curvature of {key} at {at}", tb_curve)):
            if key == spec["primary"] and name.startswith("TB slope"):
                continue
            r, (_, m, h) = stat_row(name, xs, d, ("below 0", "above 0"))
            rows.append(r)
            if key == spec["primary"]:
                forest.append((name, xs, m, h))
    print("Secondary, labelled so (no verdict; each 95% t-interval on its own, no correction)")
    tables.markdown(["statistic", "n", "mean", "95% CI", "reading"], rows)
    ranks(arms, spec["primary"], step)
    if plot:
        tables.plot_forest(forest, plot, f"{spec['primary']} per doubling of fresh samples (seeds: dots)")


def ranks(arms, key, step):
    """Real searcher ranks (tb with n_searchers 1, 2, 4 at 16 fresh a step each) beside the emulated arms of the same
    F: the wall-clock of the training loop without evaluations, and the primary, real minus emulated per seed."""
    real = {f: arms.get(("tb", n, f), {}) for n, f in ((1, 16), (2, 32), (4, 64))}
    if not real[16] and not real[64]:
        return
    rows, seeds = [], set(real[16]) | set(real[64])  # n = 2's wall-clock on the same seeds (machines, loads)
    for (n, f) in ((1, 16), (2, 32), (4, 64)):
        emulated = arms.get(("tb", 2, f), {})
        if n == 2:
            real[f] = {s: r for s, r in real[f].items() if s in seeds}
        wall = [(r["summary"]["loop_seconds"] - r["summary"].get("eval_seconds_total", 0)) / 60
                for r in real[f].values()]
        diff = {s: value(real[f][s], key, step) - value(emulated[s], key, step)
                for s in sorted(set(real[f]) & set(emulated))} if n != 2 else {}
        r, _ = stat_row("", diff, digits_of(key), ("below 0", "above 0"))
        if n == 2:
            r = ["", "-", "(the same runs)", "-", "-"]
        rows.append([f"{n} searcher(s), F={f}", str(len(real[f])), f"{np.mean(wall) if wall else float('nan'):.1f}"]
                    + r[1:])
    print(f"Real searcher ranks (reported, no verdict): loop minutes without evaluations, and {key} at {step} real "
          "minus emulated (2 searchers, same F) per seed; n = 2 is the emulated F = 32 arm itself, on the seeds the "
          "real ranks ran")
    tables.markdown(["ranks", "runs", "wall min", "n paired", "real - emulated", "95% CI", "reading"], rows)


def pilot(runs):
    """The pilot's rules: the read step (the control and the ceiling) and the number of seeds for the test."""
    task = runs[0]["cfg"]["task"]
    spec, arms = TASKS[task], by_arm(runs)
    steps = max(r["summary"]["steps"] for r in runs)
    pace_table(arms)
    read = steps
    if spec["ceiling"]:
        ceiling = spec["ceiling"] * prompt_ids(runs[0]["cfg"])
        top = list(arms.get(("tb", 2, 64), {}).values())
        candidates = sorted({s for r in top for s in eval_steps(r)} | {steps}, reverse=True)
        read = next((s for s in candidates if s >= 100
                     and np.mean([value(r, spec["control"], s) for r in top]) <= 0.9 * ceiling
                     and control_rows(arms, spec["control"], s)[1]), None)
        print(f"read step: the last evaluation step >= 100 where the TB F=64 runs' mean {spec['control']} is at most "
              f"90% of its ceiling ({ceiling}) and every TB run's count still rises: "
              f"{read if read else 'NONE: the question is not testable on this setting'}")
    else:
        print(f"control at step {steps}: {'passes' if control_rows(arms, spec['control'], steps)[1] else 'FAILS'}")
    if not read:
        return
    slope, _ = slopes(arms, "tb", spec["primary"], read)
    if len(slope) < 2:
        print("seeds: fewer than 2 seeds with all three TB arms; no spread")
        return
    sd = float(np.std(list(slope.values()), ddof=1))
    target = spec["target"] * (np.mean([value(r, spec["primary"], read) for r in arms[("tb", 2, 16)].values()])
                               if spec["primary"].startswith("buffer/") else 1.0)
    halves = {n: tables.t_quantile(0.975, n - 1) * sd / math.sqrt(n) for n in range(4, 9)}
    n = next((n for n, h in halves.items() if h <= target), 8)
    print(f"seeds: the TB slope's sd over {len(slope)} pilot seeds {sd:.4g}; predicted half-widths "
          + ", ".join(f"n={k}: {h:.3g}" for k, h in halves.items()) + f"; target {target:.3g} -> {n} seeds")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="folders holding the grid's finished runs (any depth)")
    p.add_argument("--read-step", type=int, default=0, help="the step the buffer counts are read at (the pilot's "
                   "rule sets it; default: the runs' last step)")
    p.add_argument("--pilot", action="store_true", help="apply the pilot's rules: read step and number of seeds")
    p.add_argument("--plot", default="", help="also draw the forest plot into this PNG")
    args = p.parse_args()
    runs = load(args.runs)
    if not runs:
        tables.fail(f"no finished runs under {' '.join(args.runs)}")
    if args.pilot:
        pilot(runs)
    else:
        report(runs, args.read_step, args.plot)


if __name__ == "__main__":
    main()
