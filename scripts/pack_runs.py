"""Copy a grid's finished runs into a small tree that tables.py reads as it reads the runs themselves, so the tables in
docs/tasks.md rebuild from a fresh clone in seconds instead of hours of runs (docs/grids/ holds the grids' runs).

    python scripts/pack_runs.py out/tldr_mini docs/grids/tldr_mini   # every <arm>/seed<s> with a summary.json

Each packed run keeps config.yaml, summary.json and the rows of metrics.jsonl that carry an evaluation (eval/*), whole;
checkpoints, tensorboard events, eval samples and the per-step rows are left out (about 10 KB a run instead of MBs).
A per-step scalar (staleness/mean, train/clip_fraction) is therefore not in a packed run: tables.py --finals reads it
from the full run only. Unfinished runs are skipped; packing again overwrites what it packed before.
"""
import json
import os
import shutil
import sys


def pack_run(src, dst):
    """Pack one finished run from src into dst; False (nothing written) if src has no summary.json."""
    if not os.path.isfile(os.path.join(src, "summary.json")):
        return False
    os.makedirs(dst, exist_ok=True)
    for name in ("config.yaml", "summary.json"):
        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    with open(os.path.join(src, "metrics.jsonl")) as f, open(os.path.join(dst, "metrics.jsonl"), "w") as out:
        for line in f:
            if line.strip() and any(key.startswith("eval/") for key in json.loads(line)):
                out.write(line if line.endswith("\n") else line + "\n")
    return True


def main():
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
