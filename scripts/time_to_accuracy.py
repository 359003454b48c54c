"""Time to accuracy (the paper's Fig. 1 framing): how many training seconds each mode needs before its held-out
accuracy first reaches a target, every arm at its own settings (reuse allowed where the mode uses it).

    python scripts/time_to_accuracy.py run [--seeds 0,1,2] [--minutes 6] [key=value ...]   # about 20 min per seed
    python scripts/time_to_accuracy.py report [--target-step 400] [--plot docs/time_to_accuracy.png]

run: the tiny default (configs/tiny.yaml) in three arms, alternating within each seed so a slow spell of the machine
hits every arm: sync (async=false: the searchers generate B x K samples with the current weights, the trainer trains
on exactly them, then pushes), async (the config's chunks with max_reuse=2) and in-flight (async with inflight=true).
Every run gets the same wall-clock budget (time_budget_min, from the run's start) and evaluates every 50 steps on the
500 held-out problems; out/time_to_accuracy/<arm>_s<seed>/. Needs an otherwise idle machine: the figures are seconds.

report: the clock is the training loop's seconds without the evaluations inside it (time/loop_seconds -
time/eval_seconds_total of the evaluating step; the start-of-run evaluation and the initial buffer fill are before
the loop). The target is fixed by the synchronous arm: its mean accuracy over seeds at --target-step. Each run's time
to target is the clock at its first evaluation at or above the target (a run that never reaches it within the budget
is counted as not reached). One evaluation on 500 problems has a standard error of about 2.2 points, so a crossing is
located to within an evaluation or two.
"""
import argparse
import glob
import json
import math
import os
import statistics as st
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = {"sync": ["async=false", "inflight=false"], "async": ["async=true", "inflight=false"],
        "inflight": ["async=true", "inflight=true"]}
NAMES = {"sync": "sync", "async": "async (chunks)", "inflight": "async in-flight"}


def run(args, overrides):
    for seed in args.seeds.split(","):
        for arm, keys in ARMS.items():
            out_dir = os.path.join(args.out, f"{arm}_s{seed}")
            if os.path.isfile(os.path.join(out_dir, "summary.json")):
                print(f"{out_dir}: done, skipped")
                continue
            cmd = ["bash", os.path.join(ROOT, "launch.sh"), os.path.join(ROOT, "configs", "tiny.yaml"), *keys,
                   f"seed={seed}", "eval_every=50", f"time_budget_min={args.minutes}", "progress=false",
                   "overwrite=true", f"out_dir={out_dir}", *overrides]
            print(" ".join(cmd[1:]), flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def evals(out_dir):
    """[(clock seconds, step, accuracy)] of one run's evaluations; clock 0 is the start-of-run evaluation."""
    points = []
    for line in open(os.path.join(out_dir, "metrics.jsonl")):
        r = json.loads(line)
        if "eval/accuracy" not in r:
            continue
        clock = r["time/loop_seconds"] - r["time/eval_seconds_total"] if r["step"] else 0.0
        points.append((clock, r["step"], r["eval/accuracy"]))
    return points


def mean_se(xs):
    return st.mean(xs), (st.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan"))


def report(args):
    runs = {arm: {} for arm in ARMS}
    for path in sorted(glob.glob(os.path.join(args.out, "*_s*"))):
        arm, seed = os.path.basename(path).rsplit("_s", 1)
        if arm in runs and os.path.isfile(os.path.join(path, "summary.json")):
            runs[arm][int(seed)] = evals(path)
    if not runs["sync"]:
        sys.exit(f"error: no finished sync run under {args.out} (python scripts/time_to_accuracy.py run)")
    at = [acc for points in runs["sync"].values() for _, step, acc in points if step == args.target_step]
    if len(at) < len(runs["sync"]):
        sys.exit(f"error: not every sync run evaluated step {args.target_step}")
    target = st.mean(at)
    print(f"target: {target:.1%} held-out accuracy, the sync arm's mean at step {args.target_step} "
          f"({len(at)} seeds)\n")
    print("| arm | seeds | time to target, s (each seed) | mean ± s.e., s | steps at target | "
          "best accuracy within the budget | loop seconds (no evals) |")
    print("|---|---|---|---|---|---|---|")
    means = {}
    for arm, seeds in runs.items():
        if not seeds:
            continue
        times, steps = [], []
        for seed in sorted(seeds):
            hit = next(((c, s) for c, s, acc in seeds[seed] if acc >= target), None)
            times.append(hit[0] if hit else None)
            steps.append(str(hit[1]) if hit else "-")
        reached = [t for t in times if t is not None]
        m, se = mean_se(reached) if len(reached) == len(times) else (float("nan"), float("nan"))
        means[arm] = m
        best = mean_se([max(a for _, _, a in p) for p in seeds.values()])
        loop = mean_se([p[-1][0] for p in seeds.values()])
        each = " / ".join("not reached" if t is None else f"{t:.0f}" for t in times)
        print(f"| {NAMES[arm]} | {len(seeds)} | {each} | {m:.0f} ± {se:.0f} | {' / '.join(steps)} | "
              f"{best[0]:.1%} ± {best[1]:.1%} | {loop[0]:.0f} |")
    print()
    for arm in ("async", "inflight"):
        if arm in means and not math.isnan(means[arm]) and not math.isnan(means["sync"]):
            ratio = means["sync"] / means[arm]
            print(f"{NAMES[arm]} reaches the target " + (f"{ratio:.2f}x sooner than sync" if ratio >= 1 else
                  f"in {1 / ratio:.2f}x the time sync takes") + " (mean times over seeds)")
    if args.plot:
        plot(runs, target, args.plot)


def plot(runs, target, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (arm, seeds) in enumerate(runs.items()):
        for j, points in enumerate(seeds.values()):
            ax.plot([c for c, _, _ in points], [100 * a for _, _, a in points], color=f"C{i}", lw=1, alpha=0.8,
                    marker=".", label=NAMES[arm] if j == 0 else None)
    ax.axhline(100 * target, color="k", ls="--", lw=0.8, label=f"target {target:.1%}")
    ax.set_xlabel("training seconds (loop without evaluations), 2-core CPU")
    ax.set_ylabel("held-out accuracy (%), 500 problems")
    ax.set_title("tiny default: accuracy against wall-clock, 3 seeds per arm")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("run", "report"))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--minutes", type=float, default=6.0, help="each run's wall-clock budget (time_budget_min)")
    ap.add_argument("--target-step", type=int, default=400, help="report: the sync arm's step that sets the target")
    ap.add_argument("--plot", default=None, help="report: write the accuracy-against-seconds plot here")
    ap.add_argument("--out", default="out/time_to_accuracy")
    args, overrides = ap.parse_known_args()
    run(args, overrides) if args.what == "run" else report(args)


if __name__ == "__main__":
    main()
