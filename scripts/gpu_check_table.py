"""The PASS/FAIL table of scripts/gpu_check.sh, one row per check, from the file of checks it writes.

    python scripts/gpu_check_table.py OUT/checks.tsv        exit 0: every check passed, 1: one failed

Each line of checks.tsv: case, kind (train | transport | bare | kill), exit status, result path, log path (tab-separated).
  train:     the run's out_dir; PASS when it exited 0, wrote summary.json, and every sync/probe_match is 1.0
  transport: scripts/check_transport.py's json; PASS when it exited 0 and the push was verified bit for bit
  bare:      the bare forward+backward json; PASS when it exited 0
  kill:      scripts/kill_check.py's json; PASS when the job healed or stopped as expected, leaving no process
  plan:      scripts/plan_vs_measured.py's json; PASS when every case's planned memory is within 25% of the measured
"""
import json
import os
import statistics
import sys

COLUMNS = ["check", "result", "probe", "sync s", "push s", "MFU", "train tok/s", "search tok/s", "peak GB", "note"]


def last_line(log):
    """Why a check failed, shortened: the log's last line that names an error (torchrun's report of a failed child
    left out), else its last line."""
    if not os.path.exists(log):
        return ""
    lines = [line.strip() for line in open(log, errors="replace") if line.strip(" =-\n")]
    errors = [line for line in lines if any(w in line.lower() for w in ("error", "terminate called", "killed"))
              and not any(w in line for w in ("torch/distributed", "ChildFailedError", "error_file"))]
    return (errors or lines or [""])[-1][:120]


def median(values, fmt):
    return fmt.format(statistics.median(values)) if values else "-"


def train_row(rc, path):
    """(ok, figures, note) of one train.py run from its metrics.jsonl and summary.json."""
    metrics, summary = os.path.join(path, "metrics.jsonl"), os.path.join(path, "summary.json")
    rows = [json.loads(line) for line in open(metrics)] if os.path.exists(metrics) else []
    steps = [r for r in rows if "train/loss" in r]

    def values(key):
        return [r[key] for r in rows if r.get(key) is not None]

    probes = values("sync/probe_match")
    figures = {"probe": " ".join(str(round(p, 2)) for p in probes) or "-",
               "sync s": median(values("sync/seconds"), "{:.2f}"),
               "push s": median(values("sync/push_seconds"), "{:.3f}"),
               "MFU": median([r["perf/mfu"] for r in steps if "perf/mfu" in r], "{:.1%}"),
               "train tok/s": median(values("perf/train_tokens_per_s"), "{:.0f}"),
               "search tok/s": median([v for v in values("search/tokens_per_s") if v], "{:.0f}"),
               "peak GB": f"{max(values('perf/peak_memory_gb')):.1f}" if values("perf/peak_memory_gb") else "-"}
    if rc != 0:
        return False, figures, f"exit {rc}" + (" (timeout)" if rc in (124, 137) else "")
    if not os.path.exists(summary):
        return False, figures, "no summary.json"
    if not probes:
        return False, figures, "no sync/probe_match in metrics.jsonl"
    if any(p != 1.0 for p in probes):
        return False, figures, "a searcher's greedy probe differs from the trainer's"
    done = json.load(open(summary))
    return True, figures, f"{done['steps']} steps in {done['wall_seconds']:.0f} s"


def transport_row(rc, path):
    res = json.load(open(path)) if os.path.exists(path) else {}
    figures = {"push s": f"{res['push_seconds_median']:.3f}"} if res else {}
    if rc != 0 or not res.get("verified"):
        return False, figures, f"exit {rc}" + (" (timeout)" if rc in (124, 137) else "")
    return True, figures, f"{res['transport']}, {res['bytes'] / 1e6:.1f} MB, {res['buckets']} bucket(s), bit-exact"


def bare_row(rc, path):
    res = json.load(open(path)) if os.path.exists(path) else {}
    if rc != 0 or not res:
        return False, {}, f"exit {rc}" + (" (timeout)" if rc in (124, 137) else "")
    mfu = f"{res['mfu']:.1%}" if res.get("mfu") else "-"
    return True, {"MFU": mfu, "train tok/s": f"{res['tokens_per_s']:.0f}",
                  "peak GB": f"{res['peak_memory_gb']:.1f}" if res.get("peak_memory_gb") else "-"}, res["what"]


def kill_row(rc, path):
    res = json.load(open(path)) if os.path.exists(path) else {}
    if not res:
        return False, {}, f"exit {rc}" + (" (timeout)" if rc in (124, 137) else "")
    after = f"; exit {res['seconds_to_exit']} s after the kill" if "seconds_to_exit" in res else ""
    return bool(res["passed"]), {}, res["note"][:100] + after


def plan_row(rc, path):
    rows = json.load(open(path)) if os.path.exists(path) else []
    if rc != 0 or not rows:
        return False, {}, f"exit {rc}" + (" (timeout)" if rc in (124, 137) else "")
    ratios = [r["plan_over_measured"] for r in rows]
    peak = max(r.get("peak_gb", 0.0) for r in rows)
    note = f"plan / measured {min(ratios):.2f}..{max(ratios):.2f} over {len(rows)} cases"
    return all(0.75 <= x <= 1.25 for x in ratios), {"peak GB": f"{peak:.1f}" if peak else "-"}, note


def main(checks_file):
    table, failed = [], 0
    for line in open(checks_file):
        if not line.strip():
            continue
        case, kind, rc, path, log = line.rstrip("\n").split("\t")
        try:
            ok, figures, note = {"train": train_row, "transport": transport_row, "bare": bare_row,
                                "kill": kill_row, "plan": plan_row}[kind](int(rc), path)
        except Exception as e:  # an unreadable result is a failed check, not a crash of the table
            ok, figures, note = False, {}, f"unreadable result: {type(e).__name__}: {e}"[:100]
        if not ok:
            failed += 1
            note = f"{note}; log {log}: {last_line(log)}"
        table.append([case, "PASS" if ok else "FAIL"] + [figures.get(c, "-") for c in COLUMNS[2:-1]] + [note])
    widths = [max(len(str(r[i])) for r in table + [COLUMNS]) for i in range(len(COLUMNS) - 1)]
    for r in [COLUMNS] + table:
        print(" | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " | " + r[-1])
    print(f"{len(table) - failed} of {len(table)} checks passed" + (f", {failed} FAILED" if failed else ""))
    return 1 if failed or not table else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
