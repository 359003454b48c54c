"""Compare finished runs: one markdown row per group of seeds, and accuracy / reward curves.

    python tables.py out/sweep/*                                 # groups = config keys that differ (not seed, out_dir)
    python tables.py out/a out/b --group-by m,k --csv runs.csv   # explicit grouping, also write the table as CSV
    python tables.py out/sweep/* --plot curves.png               # default plot: tables.png here; --no-plot to skip
    python tables.py out/tldr/* --metric win_rate                # another eval metric the task logs (default accuracy)
    python tables.py out/staleness/seed*/* --against weight_delay  # final / best against one key, a line per group
    python tables.py out/rt/* --metric attack_success --finals attack_success,modes_covered,mode_tv  # several finals
    python tables.py out/tldr_mini/* --metric win_rate --front kl  # win rate against KL through each run (a front)
    python tables.py out/tldr_mini/* --metric win_rate --front kl --matched 0.25,0.5  # each run's curve at equal KL
    python tables.py out/stale/* --paired weight_delay=0,64 --contrast loss=tb --last 3  # paired seeds, 95% intervals
                                                                                          # (and a forest plot)
    python tables.py out/rt/* --front attack_success --match 0.5 --finals mode_entropy,mode_tv  # at equal success
    python tables.py out/rt/* --paired loss=tb,rloo --front attack_success --match 0.5 --metric mode_entropy

A run dir holds config.yaml, metrics.jsonl and summary.json (see README). Runs without summary.json (crashed or
unfinished) are named in one warning and skipped. Rates (accuracy, win_rate, attack_success_rate) are in percent,
other metrics as logged; "a ± b" is mean ± standard error over the seeds of a group (std / sqrt(n)); a group of one
seed shows the bare value. gain = final - start; best = the best evaluation of the run (lowest for perplexity).
With --against KEY: drop = final - final of the same group at KEY's smallest value; collapsed = runs that ended below
their start. With --front X --matched V: each run's metric where eval/X passes V, interpolated linearly between the
two evaluations around it and averaged over its passes (runs compared at equal KL, not at evaluations that happen to
fall near it). With --paired KEY=A,B: per seed, the metric at KEY=A minus the metric at KEY=B within each group of the
other keys, and (--contrast K=V) the group K=V's difference minus each other group's, per seed; mean and 95%
t-interval over the seeds (t with n - 1 degrees of freedom), and the verdict the interval gives; with more than one
group of the other keys, a last row pools every group's pairs. Each run's value there is read at --at STEP, at --front X
--matched V, at --front X --match V, or as the mean of its --last N evaluations. With --front X --match V, a run's value
of a metric is taken where the run's eval/X first reaches V (interpolated between the two evaluations around it): runs
compared at equal X, as on a front, instead of at their ends (--match: the level a run climbs to, such as attack
success; --matched: a level a run may cross several times, such as KL).
"""
import argparse
import csv
import dataclasses
import json
import math
import os
import sys

import numpy as np
import yaml

from config import Config

DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config)}
# never a reason to group runs apart
IGNORE = ("seed", "out_dir", "resume", "overwrite", "progress", "trackers")
ALIASES = {"async": "asynchronous"}  # command-line spelling -> config.yaml key
PERCENT = ("accuracy", "win_rate", "tie_rate", "attack_success_rate", "attack_success")  # fractions, shown in percent
LOWER_IS_BETTER = ("perplexity", "mode_tv", "kl")


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def load_run(path, metric="accuracy"):
    """The run as a dict, or None when it has not finished (no summary.json)."""
    if not os.path.isfile(os.path.join(path, "config.yaml")):
        fail(f"{path}: not a run directory (no config.yaml)")
    if not all(os.path.isfile(os.path.join(path, name)) for name in ("summary.json", "metrics.jsonl")):
        return None
    try:
        with open(os.path.join(path, "config.yaml")) as f:
            cfg = {**DEFAULTS, **(yaml.safe_load(f) or {})}  # a run from before a key existed ran its default
        with open(os.path.join(path, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        with open(os.path.join(path, "summary.json")) as f:
            s = json.load(f)
        if metric not in s["eval_start"] or metric not in s["eval_end"]:
            names = sorted(k for k in s["eval_end"] if k not in ("step", "n"))
            fail(f"{path}: no eval metric '{metric}' (this run has: {', '.join(names) or 'none'}); "
                 "pick one with --metric")
        start, final, minutes = s["eval_start"][metric], s["eval_end"][metric], s["wall_seconds"] / 60
        steps = s["steps"]
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as e:
        fail(f"{path}: unreadable run ({type(e).__name__}: {e})")
    evals = [r[f"eval/{metric}"] for r in rows if f"eval/{metric}" in r]
    best = (min if metric in LOWER_IS_BETTER else max)(evals, default=final)
    stats = dict(final=final, best=best, start=start, gain=final - start,
                 minutes=minutes, speed=steps / minutes if minutes > 0 else float("nan"))
    return dict(path=path, cfg=cfg, rows=rows, stats=stats, summary=s)


def sort_key(values):
    return tuple((0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for v in values)


def mean_se(xs, scale=100.0):
    """(mean, standard error or None for one seed), scaled (fractions -> percent)."""
    xs = np.asarray(xs, dtype=float) * scale
    return xs.mean(), (xs.std(ddof=1) / math.sqrt(len(xs)) if len(xs) > 1 else None)


def fmt(mean, se, digits=1):
    return f"{mean:.{digits}f}" if se is None else f"{mean:.{digits}f} ± {se:.{digits}f}"


def curve(run, metric, x):
    """(x, y) of one metric over a run: x = step or wall-clock minutes (the step-0 evaluation sits at minute 0);
    rates in percent."""
    xs, ys = [], []
    for row in run["rows"]:
        t = row.get("time/elapsed_seconds", 0.0 if row.get("step") == 0 else None)
        if metric in row and (x == "step" or t is not None):
            xs.append(row["step"] if x == "step" else t / 60)
            ys.append(row[metric] * (100 if metric.split("/")[-1] in PERCENT and metric.startswith("eval/") else 1))
    return np.array(xs, dtype=float), np.array(ys, dtype=float)


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (and a note) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed, no plot (pip install matplotlib)")
        return None
    return plt


def save(plt, fig, axes, path):
    """Legends where there are labelled lines, then the PNG."""
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot: {path}")


def plot(groups, path, metric="accuracy"):
    plt = pyplot()
    if plt is None:
        return
    panels = [(f"eval/{metric}", "time"), (f"eval/{metric}", "step"),
              ("train/reward_mean", "time"), ("train/reward_mean", "step")]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for i, (label, runs) in enumerate(groups.items()):
        color = f"C{i % 10}"
        for ax, (logged, x) in zip(axes.flat, panels):  # logged: a metrics.jsonl name, e.g. eval/accuracy
            curves = [c for c in (curve(r, logged, x) for r in runs) if len(c[0])]
            if not curves:
                continue
            if x == "step":  # align on step; a step some seeds lack (runs of different length) averages the others
                steps = sorted(set().union(*(c[0].tolist() for c in curves)))
                col = {s: j for j, s in enumerate(steps)}
                table = np.full((len(curves), len(steps)), np.nan)
                for k, (xs, ys) in enumerate(curves):
                    table[k, [col[s] for s in xs]] = ys
                ax.plot(steps, np.nanmean(table, axis=0), color=color, label=label,
                        marker="o" if len(steps) < 20 else None)
            else:  # every seed thin, the mean interpolated on the time span all seeds cover
                for xs, ys in curves:
                    ax.plot(xs, ys, color=color, lw=0.7, alpha=0.3)
                lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
                if hi > lo:
                    grid = np.linspace(lo, hi, 200)
                    mean = np.mean([np.interp(grid, xs, ys) for xs, ys in curves], axis=0)
                    ax.plot(grid, mean, color=color, label=label)
            ax.set_xlabel("wall-clock minutes" if x == "time" else "trainer step")
            pct = logged.split("/")[-1] in PERCENT and logged.startswith("eval/")
            ax.set_ylabel(f"{logged} (%)" if pct else logged)
            ax.grid(alpha=0.3)
    save(plt, fig, axes.flat, path)


def against_table(groups, keys, against, names, scale, digits, what):
    """--against: one row per (group of the other keys, value of `against`), with the drop from the group's smallest
    value and the runs that collapsed. Returns {group label: [(value, final (mean, se), best (mean, se))]}."""
    at = keys.index(against)
    others = [n for i, n in enumerate(names) if i != at]
    header = (others or ["group"]) + [names[at], "n", f"final {what}", f"best {what}", "drop (pts)", "collapsed"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    lines = {}

    def order(group):  # by the other keys' values, then by `against`'s
        values = group[0]
        return sort_key(values[:at] + values[at + 1:] + values[at:at + 1])
    for values, members in sorted(groups.items(), key=order):
        label = ", ".join(f"{n}={v}" for n, v in zip(others, values[:at] + values[at + 1:])) or "all"
        final, best = (mean_se([r["stats"][k] for r in members], scale) for k in ("final", "best"))
        lines.setdefault(label, []).append((values[at], final, best))
        drop = final[0] - lines[label][0][1][0]
        collapsed = sum(r["stats"]["final"] < r["stats"]["start"] for r in members)
        cells = [str(v) for i, v in enumerate(values) if i != at] or ["all"]
        cells += [str(values[at]), str(len(members)), fmt(*final, digits), fmt(*best, digits), f"{drop:+.{digits}f}",
                  f"{collapsed}/{len(members)}"]
        print("| " + " | ".join(cells) + " |")
    return lines


def plot_against(lines, against, path, what):
    """Final and best against `against` (its values evenly spaced), a plotted line per group, s.e. as error bars."""
    plt = pyplot()
    if plt is None:
        return
    ticks = sorted({v for points in lines.values() for v, _, _ in points}, key=lambda v: sort_key([v]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, which, title in zip(axes, (1, 2), ("final", "best")):
        for i, (label, points) in enumerate(lines.items()):
            xs = [ticks.index(p[0]) + (i - len(lines) / 2) * 0.03 for p in points]  # a little dodge per line
            ax.errorbar(xs, [p[which][0] for p in points], yerr=[p[which][1] or 0 for p in points], marker="o",
                        capsize=3, color=f"C{i % 10}", label=label)
        ax.set_xticks(range(len(ticks)), [str(t) for t in ticks])
        ax.set_xlabel(against)
        ax.set_ylabel(f"{title} {what}")
        ax.grid(alpha=0.3)
    save(plt, fig, axes[:1], path)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="*", help="run directories")
    p.add_argument("--group-by", default="", help="comma-separated config keys (default: the keys that differ)")
    p.add_argument("--plot", default="tables.png", help="PNG path for the curves (default: tables.png)")
    p.add_argument("--no-plot", action="store_true", help="skip the plot")
    p.add_argument("--csv", default="", help="also write the table (numbers, s.e. in own columns) to this CSV")
    p.add_argument("--against", default="", help="a numeric config key: final and best against it, a line per "
                   "group of the other keys that differ (e.g. weight_delay)")
    p.add_argument("--front", default="", help="an eval metric X: plot --metric against eval/X at every evaluation, a "
                   "line per group (mean over its seeds at each step), e.g. --metric win_rate --front kl")
    p.add_argument("--matched", default="", help="with --front X: V1,V2,...: a table of --metric in each run where "
                   "eval/X passes each V, interpolated between the two evaluations around it, the mean over its passes "
                   "(e.g. --front kl --matched 0.25,0.5: the groups at equal KL); with --paired, one V: the paired "
                   "differences there")
    p.add_argument("--match", default="", help="with --front X: V[,V2...]: each metric where each run's eval/X first "
                   "reaches V, interpolated between evaluations (a table per V with --finals; the paired values with "
                   "--paired), e.g. --front attack_success --match 0.5")
    p.add_argument("--at", default=None, help="with --finals: the values at this step's evaluation instead "
                   "of the run's end; with --paired: each run's --metric at this step")
    p.add_argument("--finals", default="", help="comma-separated eval metrics: one table of their final values "
                   "(mean ± s.e.), a column each, instead of the main table (e.g. attack_success,modes_covered); a "
                   "name with a slash is a logged scalar's mean over the run (e.g. staleness/mean)")
    p.add_argument("--paired", default="", help="KEY=A,B: per seed, --metric at KEY=A minus at KEY=B within each "
                   "group of the other keys (e.g. weight_delay=0,64: the drop staleness causes), mean and 95%% CI")
    p.add_argument("--contrast", default="", help="with --paired: K=V: per seed, group K=V's difference minus each "
                   "other group's (e.g. loss=tb), mean, 95%% CI and the verdict (below 0, above 0, not told apart)")
    p.add_argument("--last", type=int, default=1, help="with --paired (without --at or --matched): each run's metric "
                   "is the mean of its last N evaluations (default 1: the final one)")
    p.add_argument("--metric", default="accuracy", help="the eval metric to compare (accuracy, win_rate, perplexity, "
                   "attack_success_rate, diversity, log_p_toxic, or any eval/<name> the task logs)")
    args = p.parse_args()
    if not args.runs:
        fail("no run directories given "
             "(usage: python tables.py RUN_DIR... [--group-by k1,k2] [--plot out.png] [--csv out.csv])")
    return args


def load_finished(paths, metric):
    """The finished runs among `paths`; a warning names the unfinished ones, and no finished run at all is an error."""
    for path in paths:
        if not os.path.isdir(path):
            fail(f"{path}: not a run directory")
    loaded = [(path, load_run(path, metric)) for path in paths]
    unfinished = [path for path, r in loaded if r is None]
    runs = [r for _, r in loaded if r is not None]
    if unfinished:
        print(f"warning: skipping {len(unfinished)} unfinished run(s) (no summary.json): {' '.join(unfinished)}",
              file=sys.stderr)
    if not runs:
        fail("no finished runs to compare")
    return runs


def group_runs(runs, group_by):
    """(keys, groups): the config keys that group the runs (--group-by's, else those that differ) and
    {their values: [runs]}, in sorted order."""
    all_keys = list(dict.fromkeys(k for r in runs for k in r["cfg"]))
    if group_by:
        keys = [ALIASES.get(k.strip(), k.strip()) for k in group_by.split(",") if k.strip()]
        for k in keys:
            if k not in all_keys:
                fail(f"--group-by: '{k}' is not a key of these runs' config.yaml")
    else:
        keys = [k for k in all_keys if k not in IGNORE and len({repr(r["cfg"].get(k)) for r in runs}) > 1]
    groups = {}
    for r in sorted(runs, key=lambda r: sort_key([r["cfg"].get(k) for k in keys])):
        groups.setdefault(tuple(r["cfg"].get(k) for k in keys), []).append(r)
    return keys, groups


def group_table(groups, keys, names, metric, scale, digits, what):
    """The main table, one row per group (mean ± s.e. over its seeds); returns its rows as records for --csv."""
    pct = metric in PERCENT
    header = (names or ["group"]) + ["n", f"final {what}", f"best {what}", f"start {what}",
                                     "gain (pts)" if pct else "gain", "wall min", "steps/min"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    records = []
    for values, members in groups.items():
        stats = {k: [r["stats"][k] for r in members] for k in members[0]["stats"]}
        final, best, gain = (mean_se(stats[k], scale) for k in ("final", "best", "gain"))
        start, minutes, speed = np.mean(stats["start"]) * scale, np.mean(stats["minutes"]), np.mean(stats["speed"])
        cells = [str(v) for v in values] or ["all"]
        cells += [str(len(members)), fmt(*final, digits), fmt(*best, digits), f"{start:.{digits}f}", fmt(*gain, digits),
                  f"{minutes:.1f}", f"{speed:.1f}"]
        print("| " + " | ".join(cells) + " |")
        records.append(dict(zip(names or ["group"], cells[: max(1, len(keys))]), n=len(members), metric=metric,
                            unit="percent" if pct else "as logged", final=final[0], final_se=final[1], best=best[0],
                            best_se=best[1], start=start, gain=gain[0], gain_se=gain[1], wall_min=minutes,
                            steps_per_min=speed))
    return records


def plot_front(groups, path, metric, x):
    """--front: eval/<metric> against eval/<x>, one line per group through its evaluations (each point the mean over
    the group's seeds at one step; the step-0 point is marked with a square, the last with a circle)."""
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 5))
    for i, (label, runs) in enumerate(groups.items()):
        per_step = {}
        for r in runs:
            for row in r["rows"]:
                if f"eval/{metric}" in row and f"eval/{x}" in row:
                    per_step.setdefault(row["step"], []).append((row[f"eval/{x}"], row[f"eval/{metric}"]))
        if not per_step:
            continue
        steps = sorted(per_step)
        xs = [np.mean([p[0] for p in per_step[s]]) * (100 if x in PERCENT else 1) for s in steps]
        ys = [np.mean([p[1] for p in per_step[s]]) * (100 if metric in PERCENT else 1) for s in steps]
        color = f"C{i % 10}"
        ax.plot(xs, ys, color=color, label=label, marker=".")
        ax.plot(xs[0], ys[0], "s", color=color)
        ax.plot(xs[-1], ys[-1], "o", color=color, ms=8)
    ax.set_xlabel(f"eval/{x}" + (" (%)" if x in PERCENT else ""))
    ax.set_ylabel(f"eval/{metric}" + (" (%)" if metric in PERCENT else ""))
    ax.grid(alpha=0.3)
    save(plt, fig, [ax], path)


def value_at(run, metric, step):
    """eval/<metric> at the evaluation of `step` (None: the run's end, summary.json's eval_end); NaN if not logged.
    A name with a slash (staleness/mean, train/kl_seq) is a logged scalar instead: its mean over the run's steps (a
    packed run, scripts/pack_runs.py, carries that mean in summary.json's step_means)."""
    if "/" in metric:
        if metric in run["summary"].get("step_means", {}):
            return run["summary"]["step_means"][metric]
        values = [row[metric] for row in run["rows"] if isinstance(row.get(metric), (int, float))]
        return sum(values) / len(values) if values else float("nan")
    if step is None:
        return run["summary"]["eval_end"].get(metric, float("nan"))
    return next((row[f"eval/{metric}"] for row in run["rows"] if row.get("step") == step and f"eval/{metric}" in row),
                float("nan"))


def finals_table(groups, names, metrics, step=None):
    """--finals: a row per group, a column per eval metric: its value at the run's end (or at --at STEP; mean ± s.e.
    over seeds; rates in percent), and in the first row's cells its start value, the mean over every run given that
    logged one."""
    if step is not None:
        print(f"at step {step}:")
    print("| " + " | ".join((names or ["group"]) + ["n"] + list(metrics)) + " |")
    print("|" + "---|" * (len(names or ["group"]) + 1 + len(metrics)))
    runs = [run for members in groups.values() for run in members]
    starts = {m: [run["summary"]["eval_start"].get(m, float("nan")) for run in runs] for m in metrics}
    start = [np.mean([v for v in starts[m] if np.isfinite(v)] or [float("nan")]) * (100 if m in PERCENT else 1)
             for m in metrics]
    print("| " + " | ".join(["start"] * len(names or ["group"]) + ["-"]
                            + [f"{v:.{1 if m in PERCENT else 3}f}" for v, m in zip(start, metrics)]) + " |")
    for values, members in groups.items():
        cells = [str(v) for v in values] or ["all"]
        cells.append(str(len(members)))
        for m in metrics:
            ends = [value_at(r, m, step) for r in members]
            cells.append(fmt(*mean_se(ends, 100.0 if m in PERCENT else 1.0), 1 if m in PERCENT else 3))
        print("| " + " | ".join(cells) + " |")


def at_x(run, metric, x, value):
    """eval/<metric> where the run's eval/<x> passes `value`: its evaluations in step order, linear between two
    consecutive ones whose eval/<x> lie on either side of `value` (an evaluation exactly at it counts once), averaged
    over every such pass (a run that comes back to `value` counts each time); None if it never passes it."""
    points = [(row[f"eval/{x}"], row[f"eval/{metric}"]) for row in sorted(run["rows"], key=lambda r: r["step"])
              if f"eval/{x}" in row and f"eval/{metric}" in row]
    found = []
    for i, ((x0, y0), (x1, y1)) in enumerate(zip(points, points[1:])):
        if min(x0, x1) <= value <= max(x0, x1) and not (x0 == value and i > 0):  # an evaluation on it: once
            found.append(y0 if x1 == x0 else y0 + (value - x0) / (x1 - x0) * (y1 - y0))
    return float(np.mean(found)) if found else None


def matched_table(groups, names, metric, x, values):
    """--front X --matched V1,V2,...: per group and V, --metric where each run's eval/X passes V (at_x), mean ± s.e.
    over the runs that reach it; "(k/n)" when only k of the group's n runs do."""
    pct = 100.0 if metric in PERCENT else 1.0
    print(f"eval/{metric} where eval/{x} passes each value (interpolated in each run, the mean over its passes):")
    print("| " + " | ".join((names or ["group"]) + ["n"] + [f"{x} = {v:g}" for v in values]) + " |")
    print("|" + "---|" * (len(names or ["group"]) + 1 + len(values)))
    for group, members in groups.items():
        cells = ([str(v) for v in group] or ["all"]) + [str(len(members))]
        for v in values:
            found = [y for y in (at_x(r, metric, x, v) for r in members) if y is not None]
            cell = fmt(*mean_se(found, pct), 1 if pct > 1 else 3) if found else "-"
            cells.append(cell if len(found) == len(members) else f"{cell} ({len(found)}/{len(members)})")
        print("| " + " | ".join(cells) + " |")


def matched_value(run, metric, x, level):
    """eval/<metric> (or the step, metric "step") where the run's eval/<x> first reaches `level`, linear between the
    evaluation before and the one at the crossing; the first evaluation's value if it starts there, NaN if never."""
    points = [(row[f"eval/{x}"], row["step"] if metric == "step" else row.get(f"eval/{metric}", float("nan")))
              for row in sorted(run["rows"], key=lambda r: r["step"]) if f"eval/{x}" in row]
    for i, (xi, yi) in enumerate(points):
        if xi >= level:
            if i == 0:
                return yi
            x0, y0 = points[i - 1]
            return y0 + (level - x0) / (xi - x0) * (yi - y0)
    return float("nan")


def reached_table(groups, names, metrics, x, level):
    """--finals with --front X --match V: per group, each metric where each run's eval/<x> first reaches V (mean ±
    s.e. over the runs that reach it; `runs`: those of all; `step`: the mean step of the crossing)."""
    print(f"where eval/{x} first reaches {level:g}:")
    print("| " + " | ".join((names or ["group"]) + ["runs", "step"] + list(metrics)) + " |")
    print("|" + "---|" * (len(names or ["group"]) + 2 + len(metrics)))
    for values, members in groups.items():
        reached = [r for r in members if np.isfinite(matched_value(r, "step", x, level))]
        cells = ([str(v) for v in values] or ["all"]) + [f"{len(reached)}/{len(members)}"]
        for m in (["step"] + list(metrics)) if reached else []:
            ys = [matched_value(r, m, x, level) for r in reached]
            scale, digits = (1.0, 0) if m == "step" else (100.0, 1) if m in PERCENT else (1.0, 3)
            cells.append(fmt(*mean_se(ys, scale), digits))
        cells += [] if reached else ["-"] * (1 + len(metrics))
        print("| " + " | ".join(cells) + " |")


# t quantile 0.975 for 1..30 degrees of freedom; past 30, z + (z^3 + z) / (4 df) (within 0.003 of the exact value)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_interval(xs):
    """(mean, half-width of the 95% t-interval; None for fewer than two values)."""
    xs = np.asarray(xs, dtype=float)
    n = len(xs)
    if n < 2:
        return xs.mean(), None
    t = T975[n - 2] if n - 1 <= len(T975) else 1.96 + (1.96 ** 3 + 1.96) / (4 * (n - 1))
    return xs.mean(), t * xs.std(ddof=1) / math.sqrt(n)


def ratio_interval(pairs):
    """Paired ratios a / b (one pair per seed or repeat): (geometric mean, low, high of its 95% t-interval on the log
    scale; low and high None for fewer than two pairs)."""
    mean, half = t_interval([math.log(a / b) for a, b in pairs])
    if half is None:
        return math.exp(mean), None, None
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


ALPHA = 0.05  # the registered readers' (scripts/*_verdict.py) significance level: Holm's family-wise error


def t_cdf(x, df):
    """P(T <= x) for Student's t with df degrees of freedom (the density integrated numerically: no scipy here)."""
    grid = np.linspace(0.0, abs(x), 20001)
    pdf = (1 + grid ** 2 / df) ** (-(df + 1) / 2) * math.gamma((df + 1) / 2) / (
        math.sqrt(df * math.pi) * math.gamma(df / 2))
    half = float(np.sum((pdf[1:] + pdf[:-1]) / 2 * np.diff(grid)))
    return 0.5 + math.copysign(half, x)


def t_quantile(p, df):
    """The x with P(T <= x) = p (bisection on t_cdf)."""
    lo, hi = -1e3, 1e3
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def paired(xs, level=1 - ALPHA):
    """(n, mean, half-width of the two-sided t-interval at `level`, two-sided p of mean = 0) of paired values."""
    xs = np.asarray(xs, dtype=float)
    n, mean = len(xs), float(xs.mean())
    if n < 2:
        return n, mean, float("nan"), float("nan")
    se = float(xs.std(ddof=1)) / math.sqrt(n)
    half = t_quantile(1 - (1 - level) / 2, n - 1) * se
    # identical differences: p = 0, unless every one is 0 (then nothing differs: p = 1)
    p = 2 * (1 - t_cdf(abs(mean) / se, n - 1)) if se > 0 else float(mean == 0)
    return n, mean, half, p


def holm(ps):
    """Holm's step-down over a family of p-values: (adjusted p, rejected, the level each was tested at) per input."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, rejected, levels, running, going = [0.0] * len(ps), [False] * len(ps), [0.0] * len(ps), 0.0, True
    for rank, i in enumerate(order):
        m = len(ps) - rank
        running = max(running, min(1.0, m * ps[i]))
        adjusted[i], levels[i] = running, 1 - ALPHA / m
        going = going and ps[i] <= ALPHA / m
        rejected[i] = going
    return adjusted, rejected, levels


def seed_count(sds, goal, family, seeds=range(4, 9)):
    """A registered pilot's seed-count rule: ({n: {name: predicted half-width t(n - 1) x sd / sqrt(n), two-sided at
    Holm's first level 1 - 0.05 / family}} for each n in seeds and each named sd, the smallest n whose half-widths are
    all under goal or None when none is)."""
    halves = {n: {k: t_quantile(1 - ALPHA / (2 * family), n - 1) * sd / math.sqrt(n) for k, sd in sds.items()}
              for n in seeds}
    return halves, next((n for n in seeds if all(h < goal for h in halves[n].values())), None)


def load_arms(path, arm_of, needs=()):
    """A registered reader's runs: {arm: {seed: run}} of every finished run under path (any depth), arm_of(its config)
    naming its arm, and the unfinished run dirs; one line of error for no finished run, a run without one of the eval
    metrics `needs`, or a second run of an arm and seed."""
    runs, unfinished = {}, []
    for here, _, files in sorted(os.walk(path)):
        run = load_run(here) if "config.yaml" in files else False
        if run is None:
            unfinished.append(here)
        if not run:
            continue
        missing = [m for m in needs if not any(f"eval/{m}" in row for row in run["rows"])]
        if missing:
            fail(f"{here}: no eval/{', eval/'.join(missing)} in metrics.jsonl (run with eval_samples=16?)")
        arm, seed = arm_of(run["cfg"]), run["cfg"]["seed"]
        if seed in runs.get(arm, {}):
            fail(f"{here}: a second run of {arm} seed {seed} (the other: {runs[arm][seed]['path']})")
        runs.setdefault(arm, {})[seed] = run
    if not runs:
        fail(f"no finished runs under {path}")
    return runs, unfinished


def interval(mean, half, digits=1):
    """A registered reader's interval [lo, hi], signed; "-" without one (fewer than two seeds)."""
    return "-" if not math.isfinite(half) else f"[{mean - half:+.{digits}f}, {mean + half:+.{digits}f}]"


def markdown(header, rows):
    """A markdown table (rows of cells as text) and a blank line."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()


def plot_forest(forest, path, xlabel):
    """A registered reader's forest plot: a line per (label, {seed: value}, mean, half-width), top to bottom."""
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(forest) + 1))
    for y, (label, xs, mean, half) in enumerate(reversed(forest)):
        ax.plot(list(xs.values()), [y] * len(xs), "o", color="0.6", ms=3)
        if math.isfinite(half):
            ax.errorbar([mean], [y], xerr=[[half], [half]], fmt="s", color="k", capsize=3)
    ax.axvline(0, color="0.3", lw=0.8)
    ax.set_yticks(range(len(forest)), [label for label, *_ in reversed(forest)])
    ax.set_xlabel(xlabel)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # long axis labels stay whole
    print(f"plot: {path}")


def last_mean(run, metric, last):
    """The mean of the run's last `last` evaluations of eval/<metric> (fewer when it has fewer)."""
    values = [row[f"eval/{metric}"] for row in sorted(run["rows"], key=lambda r: r["step"]) if f"eval/{metric}" in row]
    return float(np.mean(values[-last:]))


def parse_pair(text, flag, n_values):
    """'KEY=A,B' (n_values 2) or 'KEY=V' (1) -> (key, [values as text])."""
    key, _, values = text.partition("=")
    values = [v.strip() for v in values.split(",") if v.strip()]
    if not key.strip() or len(values) != n_values:
        fail(f"{flag}: '{text}' is not KEY={','.join('AB'[:n_values])}")
    return ALIASES.get(key.strip(), key.strip()), values


def same(value, text):
    """Whether a config value is the one written on the command line ('64' is 64, '1e-5' is 1e-05)."""
    try:
        return str(value) == text or float(value) == float(text)
    except (TypeError, ValueError):
        return False


def paired_diffs(runs, keys, value, pair, scale):
    """{values of the other keys: {seed: value(run at KEY=A) - value(run at KEY=B)}} over the seeds where both runs have
    a value (value gives None or NaN where a run has none: it never reached the level, it has no such step)."""
    key, (a, b) = pair
    others = [k for k in keys if k != key]
    cells = {}
    for r in runs:
        side = 0 if same(r["cfg"].get(key), a) else 1 if same(r["cfg"].get(key), b) else None
        x = value(r) if side is not None else None
        if x is not None and math.isfinite(x):
            cell = cells.setdefault(tuple(r["cfg"].get(k) for k in others), {}).setdefault(r["cfg"]["seed"], [None] * 2)
            cell[side] = x * scale
    diffs = {values: {s: v[0] - v[1] for s, v in seeds.items() if None not in v} for values, seeds in cells.items()}
    if not any(diffs.values()):
        fail(f"--paired: no seed has runs with a value at both {key}={a} and {key}={b}")
    return others, {values: d for values, d in sorted(diffs.items(), key=lambda kv: sort_key(kv[0])) if d}


def paired_table(runs, keys, value, pair, contrast, scale, what, digits):
    """--paired KEY=A,B [--contrast K=V]: the paired differences of each group (and, over several groups, all their
    pairs pooled) and, with a contrast, the differences of differences against the group K=V, each as mean [95% CI]
    over the seeds, with the verdict its interval gives. value(run): a run's number (`what` says which), shown with
    `digits` decimals."""
    others, diffs = paired_diffs(runs, keys, value, pair, scale)
    (key, (a, b)), names = pair, [{"asynchronous": "async"}.get(k, k) for k in others] or ["group"]
    table = [(values, f"{key}={a} minus {key}={b}", d) for values, d in diffs.items()]
    if len(diffs) > 1:
        pooled = {(values, s): x for values, d in diffs.items() for s, x in d.items()}
        table.append((["pooled"] * len(names), f"{key}={a} minus {key}={b}", pooled))
    if contrast:
        ck, (cv,) = contrast
        if ck not in others:
            fail(f"--contrast: '{ck}' is not a key that differs between the groups (they differ in: "
                 f"{', '.join(names)})")
        i = others.index(ck)
        base = {v[:i] + v[i + 1:]: d for v, d in diffs.items() if same(v[i], cv)}
        for values, d in diffs.items():
            ref = base.get(values[:i] + values[i + 1:])
            if ref is not None and not same(values[i], cv):
                table.append((values, f"({ck}={cv}) minus this", {s: ref[s] - d[s] for s in d if s in ref}))
    print(f"per seed: {what}; mean and 95% t-interval over the paired seeds")
    print("| " + " | ".join(names + ["difference", "n", "mean", "95% CI", "verdict"]) + " |")
    print("|" + "---|" * (len(names) + 5))
    for values, label, d in table:
        mean, half = t_interval(list(d.values()))
        ci = "-" if half is None else f"[{mean - half:+.{digits}f}, {mean + half:+.{digits}f}]"
        verdict = ("-" if half is None else "below 0" if mean + half < 0 else "above 0" if mean - half > 0
                   else f"not told apart at ±{half:.{digits}f}")
        print("| " + " | ".join([str(v) for v in values] or ["all"]) + f" | {label} | {len(d)} | {mean:+.{digits}f} | {ci} | "
              f"{verdict} |")
    return [("pooled" if list(values[:1]) == ["pooled"] else ", ".join(f"{n}={v}" for n, v in zip(names, values)) or
             "all", label, d) for values, label, d in table]


def plot_paired(table, path, what):
    """--paired: a forest plot, one row per difference of the table: each seed's value as a dot, the mean and its 95%
    interval as a bar, a line at zero (a panel for the differences, one for the contrasts)."""
    plt = pyplot()
    if plt is None:
        return
    panels = [[row for row in table if "minus this" not in row[1]], [row for row in table if "minus this" in row[1]]]
    panels = [rows for rows in panels if rows]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 0.45 * max(map(len, panels)) + 1.5),
                             squeeze=False)
    for ax, rows in zip(axes[0], panels):
        for y, (name, _, d) in enumerate(rows):
            mean, half = t_interval(list(d.values()))
            ax.scatter(list(d.values()), [y] * len(d), s=12, color="0.6", zorder=2)
            ax.errorbar([mean], [y], xerr=[[half or 0], [half or 0]], fmt="o", color="C0", capsize=4, zorder=3)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(range(len(rows)), [name for name, _, _ in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(rows[0][1].replace("this", "each row") + f" ({what})", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    save(plt, fig, [], path)


def paired_reader(args, levels):
    """(value, what) for --paired: each run's --metric at --at STEP, where --front X passes --matched V, where it
    first reaches --match V, or the mean of its --last N evaluations."""
    metric = args.metric
    if args.at is not None:
        return (lambda r: value_at(r, metric, args.at)), f"eval/{metric} at step {args.at}"
    if args.matched:
        if len(args.matched) != 1:
            fail(f"--paired takes one --matched value, not {len(args.matched)}")
        v = args.matched[0]
        return (lambda r: at_x(r, metric, args.front, v)), (f"eval/{metric} where eval/{args.front} passes {v:g} "
                                                            "(interpolated, the mean over the run's passes)")
    if levels:
        return ((lambda r: matched_value(r, metric, args.front, levels[0])),
                f"eval/{metric} where eval/{args.front} first reaches {levels[0]:g}")
    last = max(1, args.last)
    what = f"eval/{metric}, mean of the last {last} evaluations" if last > 1 else f"eval/{metric}"
    return (lambda r: last_mean(r, metric, last)), what


def write_csv(records, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(records[0]))
        w.writeheader()
        w.writerows([{k: "" if v is None else round(v, 4) if isinstance(v, float) else v for k, v in rec.items()}
                     for rec in records])
    print(f"csv: {path}")


def match_levels(args):
    """--match's levels (numbers), checked: it needs --front, and --finals or --paired to say what to show."""
    if not args.match:
        return []
    try:
        levels = [float(v) for v in args.match.split(",") if v.strip()]
    except ValueError:
        fail(f"--match: '{args.match}' is not V[,V2...]")
    if not args.front or not (args.finals or args.paired) or not levels:
        fail("--match needs --front X (the metric whose level it is) and --finals or --paired (what to show there)")
    if args.paired and len(levels) > 1:
        fail("--paired takes one --match level")
    return levels


def check_args(args):
    """--at as a step and --matched as numbers (with the --front they need), or one line of error."""
    if args.at is not None:
        if not args.at.isdigit():
            fail(f"--at: '{args.at}' is not a step")
        args.at = int(args.at)
    if args.matched:
        try:
            args.matched = [float(v) for v in args.matched.split(",")]
        except ValueError:
            fail(f"--matched: '{args.matched}' is not a list of numbers V1,V2,...")
        if not args.front:
            fail("--matched needs --front X (the metric whose values it matches)")


def units(metric):
    """(scale, digits, what) of a metric's tables: rates in percent with one decimal, others as logged with three."""
    pct = metric in PERCENT
    scale, digits = (100.0, 1) if pct else (1.0, 3)
    return scale, digits, ("acc" if metric == "accuracy" else metric) + (" %" if pct else "")


def show_paired(args, runs, keys, names, levels):
    """--paired KEY=A,B (and --contrast): the paired differences per seed, their 95% intervals, and their plot."""
    scale, digits, _ = units(args.metric)
    pair = parse_pair(args.paired, "--paired", 2)
    if pair[0] not in keys:
        fail(f"--paired: '{pair[0]}' does not differ between these runs (they differ in: "
             f"{', '.join(names) or 'nothing'})")
    contrast = parse_pair(args.contrast, "--contrast", 1) if args.contrast else None
    value, what = paired_reader(args, levels)
    table = paired_table(runs, keys, value, pair, contrast, scale, what, digits)
    if not args.no_plot:
        plot_paired(table, args.plot, what)


def show_against(args, groups, keys, names):
    """--against KEY: final and best against a numeric key, a line per group of the other keys, and their plot."""
    scale, digits, what = units(args.metric)
    against = ALIASES.get(args.against, args.against)
    if against not in keys:
        fail(f"--against: '{args.against}' does not differ between these runs (they differ in: "
             f"{', '.join(names) or 'nothing'})")
    lines = against_table(groups, keys, against, names, scale, digits, what)
    if not args.no_plot:
        plot_against(lines, args.against, args.plot, what)


def show_groups(args, groups, keys, names, levels):
    """A table per group of runs: at --matched levels, at --match levels (--finals), the --finals, or the main table
    (and --csv); the curves' plot, or with --front the metric against eval/X."""
    labels = {", ".join(f"{n}={v}" for n, v in zip(names, values)) or "all": members
              for values, members in groups.items()}
    if args.front and not args.no_plot:
        plot_front(labels, args.plot, args.metric, args.front)
    if args.matched:
        return matched_table(groups, names, args.metric, args.front, args.matched)
    if args.finals and levels:
        for level in levels:
            reached_table(groups, names, [m.strip() for m in args.finals.split(",") if m.strip()], args.front, level)
        return
    if args.finals:
        finals_table(groups, names, [m.strip() for m in args.finals.split(",") if m.strip()], args.at)
    else:
        records = group_table(groups, keys, names, args.metric, *units(args.metric))
        if args.csv:
            write_csv(records, args.csv)
    if not args.no_plot and not args.front:
        plot(labels, args.plot, args.metric)


def main():
    args = parse_args()
    check_args(args)
    levels = match_levels(args)
    runs = load_finished(args.runs, args.metric)
    keys, groups = group_runs(runs, args.group_by)
    names = [{"asynchronous": "async"}.get(k, k) for k in keys]
    if args.paired:
        show_paired(args, runs, keys, names, levels)
    elif args.against:
        show_against(args, groups, keys, names)
    else:
        show_groups(args, groups, keys, names, levels)


if __name__ == "__main__":
    main()
