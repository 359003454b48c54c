"""Copy a grid's finished runs into a small tree that tables.py reads as it reads the runs themselves, so the tables in
docs/tasks.md rebuild from a fresh clone in seconds instead of hours of runs (docs/grids/ holds the grids' runs).

    python scripts/pack_runs.py out/tldr_mini docs/grids/tldr_mini   # every <arm>/seed<s> with a summary.json
    python scripts/pack_runs.py --run out/stale2/tb_d0/seed0 docs/grids/staleness_test/tb_d0/seed0   # one run

Each packed run keeps config.yaml, summary.json and, of metrics.jsonl, the rows that carry an evaluation (their step,
time/elapsed_seconds, eval/* values and the cumulative buffer/distinct_* counts of the successes found so far);
checkpoints, tensorboard events, eval samples and the per-step rows are left out (about 10 KB a run instead of MBs).
A per-step scalar (staleness/mean, train/clip_fraction) survives as its mean over the run's steps, in summary.json's
"step_means", which tables.py --finals reads as it would the full run's rows.
Unfinished runs are skipped; packing again overwrites what it packed before, and a packed run packs to itself (so
a grid finished beside copies of its packed runs packs whole).
"""
import json
import os
import shutil
import sys


def pack_run(src, dst):
    """Pack one finished run from src into dst; False (nothing written) if src has no summary.json."""
    if not os.path.isfile(os.path.join(src, "summary.json")):
        return False
    with open(os.path.join(src, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    logged = {}  # per-step scalar -> its values over the rows that log it, averaged as tables.value_at averages them
    for row in rows:
        for key, value in row.items():
            if "/" in key and not key.startswith("eval/") and isinstance(value, (int, float)):
                logged.setdefault(key, []).append(value)
    with open(os.path.join(src, "summary.json")) as f:
        summary = json.load(f)
    if "step_means" not in summary:  # a packed run (re-packed) has lost its per-step rows: keep the means it carries
        summary["step_means"] = {key: sum(values) / len(values) for key, values in sorted(logged.items())}
    os.makedirs(dst, exist_ok=True)
    shutil.copyfile(os.path.join(src, "config.yaml"), os.path.join(dst, "config.yaml"))
    with open(os.path.join(dst, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(dst, "metrics.jsonl"), "w") as out:
        for row in rows:
            if any(key.startswith("eval/") for key in row):
                keep = {k: v for k, v in row.items() if k in ("step", "time/elapsed_seconds") or k.startswith("eval/")
                        or k.startswith("buffer/distinct_")}  # the distinct successes found so far, at each evaluation
                out.write(json.dumps(keep) + "\n")
    return True


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--run":  # one run, as scripts/grid.sh packs each when it finishes
        if not pack_run(*sys.argv[2:]):
            sys.exit(f"error: {sys.argv[2]} has not finished (no summary.json): not packed")
        print(f"packed {sys.argv[2]} into {sys.argv[3]}")
        return
    if len(sys.argv) != 3:
        sys.exit("usage: python scripts/pack_runs.py GRID_OUT DEST   (GRID_OUT holds <arm>/seed<s> run dirs)")
    src, dst = sys.argv[1:]
    if not os.path.isdir(src):
        sys.exit(f"error: {src} is not a directory")
    packed, skipped = 0, []
    for arm in sorted(os.listdir(src)):
        if not os.path.isdir(os.path.join(src, arm)):
            continue
        for seed in sorted(os.listdir(os.path.join(src, arm))):
            run = os.path.join(src, arm, seed)
            if os.path.isdir(run) and seed.startswith("seed"):
                if pack_run(run, os.path.join(dst, arm, seed)):
                    packed += 1
                else:
                    skipped.append(run)
    print(f"packed {packed} finished run(s) into {dst}" + (f"; skipped {len(skipped)} unfinished" if skipped else ""))


if __name__ == "__main__":
    main()
