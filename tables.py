"""Compare finished runs: one markdown row per group of seeds, and accuracy / reward curves.

    python tables.py out/sweep/*                                 # groups = config keys that differ (not seed, out_dir)
    python tables.py out/a out/b --group-by m,k --csv runs.csv   # explicit grouping, also write the table as CSV
    python tables.py out/sweep/* --plot curves.png               # default plot: tables.png here; --no-plot to skip

A run dir holds config.yaml, metrics.jsonl and summary.json (see README). Runs without summary.json (crashed or
unfinished) are named in one warning and skipped. Accuracies are in percent, "a ± b" is mean ± standard error over
the seeds of a group (std / sqrt(n)); a group of one seed shows the bare value. gain = final - start, in points.
"""
import argparse
import csv
import json
import math
import os
import sys

import numpy as np
import yaml

IGNORE = ("seed", "out_dir")
ALIASES = {"async": "asynchronous"}  # command-line spelling -> config.yaml key


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def load_run(path):
    """The run as a dict, or None when it has not finished (no summary.json)."""
    if not os.path.isfile(os.path.join(path, "config.yaml")):
        fail(f"{path}: not a run directory (no config.yaml)")
    if not os.path.isfile(os.path.join(path, "summary.json")) or not os.path.isfile(os.path.join(path, "metrics.jsonl")):
        return None
    try:
        with open(os.path.join(path, "config.yaml")) as f:
            cfg = yaml.safe_load(f) or {}
        with open(os.path.join(path, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        with open(os.path.join(path, "summary.json")) as f:
            s = json.load(f)
        start, final, minutes = s["eval_start"]["accuracy"], s["eval_end"]["accuracy"], s["wall_seconds"] / 60
        steps = s["steps"]
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as e:
        fail(f"{path}: unreadable run ({type(e).__name__}: {e})")
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    stats = dict(final=final, best=max(evals, default=final), start=start, gain=final - start,
                 minutes=minutes, speed=steps / minutes if minutes > 0 else float("nan"))
    return dict(path=path, cfg=cfg, rows=rows, stats=stats)


def sort_key(values):
    return tuple((0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for v in values)


def mean_se(xs, scale=100.0):
    """(mean, standard error or None for one seed), scaled (fractions -> percent)."""
    xs = np.asarray(xs, dtype=float) * scale
    return xs.mean(), (xs.std(ddof=1) / math.sqrt(len(xs)) if len(xs) > 1 else None)


def fmt(mean, se):
    return f"{mean:.1f}" if se is None else f"{mean:.1f} ± {se:.1f}"


def curve(run, metric, x):
    """(x, y) of one metric over a run: x = step or wall-clock minutes (the step-0 evaluation sits at minute 0)."""
    xs, ys = [], []
    for row in run["rows"]:
        t = row.get("time/elapsed_seconds", 0.0 if row.get("step") == 0 else None)
        if metric in row and (x == "step" or t is not None):
            xs.append(row["step"] if x == "step" else t / 60)
            ys.append(row[metric] * (100 if metric == "eval/accuracy" else 1))
    return np.array(xs, dtype=float), np.array(ys, dtype=float)


def plot(groups, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed, no plot (pip install matplotlib)")
        return
    panels = [("eval/accuracy", "time"), ("eval/accuracy", "step"), ("train/reward_mean", "time"), ("train/reward_mean", "step")]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for i, (label, runs) in enumerate(groups.items()):
        color = f"C{i % 10}"
        for ax, (metric, x) in zip(axes.flat, panels):
            curves = [c for c in (curve(r, metric, x) for r in runs) if len(c[0])]
            if not curves:
                continue
            if x == "step":  # align on step; a step some seeds lack (runs of different length) averages the others
                steps = sorted(set().union(*(c[0].tolist() for c in curves)))
                col = {s: j for j, s in enumerate(steps)}
                table = np.full((len(curves), len(steps)), np.nan)
                for k, (xs, ys) in enumerate(curves):
                    table[k, [col[s] for s in xs]] = ys
                ax.plot(steps, np.nanmean(table, axis=0), color=color, label=label, marker="o" if len(steps) < 20 else None)
            else:  # every seed thin, the mean interpolated on the time span all seeds cover
                for xs, ys in curves:
                    ax.plot(xs, ys, color=color, lw=0.7, alpha=0.3)
                lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
                if hi > lo:
                    grid = np.linspace(lo, hi, 200)
                    ax.plot(grid, np.mean([np.interp(grid, xs, ys) for xs, ys in curves], axis=0), color=color, label=label)
            ax.set_xlabel("wall-clock minutes" if x == "time" else "trainer step")
            ax.set_ylabel("eval accuracy (%)" if metric == "eval/accuracy" else metric)
            ax.grid(alpha=0.3)
    for ax in axes.flat:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot: {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="*", help="run directories")
    p.add_argument("--group-by", default="", help="comma-separated config keys (default: the keys that differ)")
    p.add_argument("--plot", default="tables.png", help="PNG path for the curves (default: tables.png)")
    p.add_argument("--no-plot", action="store_true", help="skip the plot")
    p.add_argument("--csv", default="", help="also write the table (numbers, s.e. in own columns) to this CSV")
    args = p.parse_args()
    if not args.runs:
        fail("no run directories given (usage: python tables.py RUN_DIR... [--group-by k1,k2] [--plot out.png] [--csv out.csv])")
    for path in args.runs:
        if not os.path.isdir(path):
            fail(f"{path}: not a run directory")
    loaded = [(path, load_run(path)) for path in args.runs]
    unfinished = [path for path, r in loaded if r is None]
    runs = [r for _, r in loaded if r is not None]
    if unfinished:
        print(f"warning: skipping {len(unfinished)} unfinished run(s) (no summary.json): {' '.join(unfinished)}", file=sys.stderr)
    if not runs:
        fail("no finished runs to compare")

    all_keys = list(dict.fromkeys(k for r in runs for k in r["cfg"]))
    if args.group_by:
        keys = [ALIASES.get(k.strip(), k.strip()) for k in args.group_by.split(",") if k.strip()]
        for k in keys:
            if k not in all_keys:
                fail(f"--group-by: '{k}' is not a key of these runs' config.yaml")
    else:
        keys = [k for k in all_keys if k not in IGNORE and len({repr(r["cfg"].get(k)) for r in runs}) > 1]
    groups = {}
    for r in sorted(runs, key=lambda r: sort_key([r["cfg"].get(k) for k in keys])):
        groups.setdefault(tuple(r["cfg"].get(k) for k in keys), []).append(r)
    names = [{"asynchronous": "async"}.get(k, k) for k in keys]

    header = (names or ["group"]) + ["n", "final acc %", "best acc %", "start acc %", "gain (pts)", "wall min", "steps/min"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    records = []
    for values, members in groups.items():
        st = {k: [r["stats"][k] for r in members] for k in members[0]["stats"]}
        final, best, gain = mean_se(st["final"]), mean_se(st["best"]), mean_se(st["gain"])
        start, minutes, speed = np.mean(st["start"]) * 100, np.mean(st["minutes"]), np.mean(st["speed"])
        cells = [str(v) for v in values] or ["all"]
        cells += [str(len(members)), fmt(*final), fmt(*best), f"{start:.1f}", fmt(*gain), f"{minutes:.1f}", f"{speed:.1f}"]
        print("| " + " | ".join(cells) + " |")
        records.append(dict(zip(names or ["group"], cells[: max(1, len(keys))]), n=len(members),
                            final_pct=final[0], final_se=final[1], best_pct=best[0], best_se=best[1], start_pct=start,
                            gain_pts=gain[0], gain_se=gain[1], wall_min=minutes, steps_per_min=speed))

    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(records[0]))
            w.writeheader()
            w.writerows([{k: "" if v is None else round(v, 4) if isinstance(v, float) else v for k, v in rec.items()}
                         for rec in records])
        print(f"csv: {args.csv}")
    if not args.no_plot:
        labels = {", ".join(f"{n}={v}" for n, v in zip(names, values)) or "all": m for values, m in groups.items()}
        plot(labels, args.plot)


if __name__ == "__main__":
    main()
