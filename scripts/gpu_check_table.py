"""The PASS/FAIL table of scripts/gpu_check.sh (and gpu_single.sh), one row per check, from the file of checks it
writes.

    python scripts/gpu_check_table.py OUT/checks.tsv        exit 0: every check passed, 1: one failed or did not run

Each line of checks.tsv: case, kind, exit status ("-": not run, its log says why), result path, log path
(tab-separated). By kind:
  train:     the run's out_dir; PASS when it exited 0, wrote summary.json, and what compared the searchers' weights with
             the trainer's agrees: with check_sync every sync/probe_match is 1.0 (greedy probe: runs of a trained
             model only, where ties are rare); in synchronous mode the teacher-forced log-probs agree (lp_gap)
  run:       the same, without a comparison of weights required (a deadlock check of a random-weight model)
  transport: scripts/check_transport.py's json; PASS when it exited 0 and the push was verified bit for bit
  bare:      the bare forward+backward json; PASS when it exited 0
  kill:      scripts/kill_check.py's json; PASS when the job healed or stopped as expected, leaving no process
  plan:      scripts/plan_vs_measured.py's json; PASS when every case's planned memory is within 25% of the measured
  labels, current: scripts/check_inflight.py's, scripts/check_current.py's json; PASS when it says passed
  bench:     bench.py's bench.json (sync against async at equal work); PASS when both arms ran at equal work
"""
import json
import os
import statistics
import sys

import yaml

COLUMNS = ["check", "result", "probe", "lp gap", "sync s", "push s", "MFU", "train tok/s", "search tok/s", "peak GB",
           "note"]


def last_line(log):
    """Why a check failed, shortened: the log's last line that names an error (torchrun's report of a failed child
    left out), else its last line."""
    if not os.path.exists(log):
        return ""
    lines = [line.strip() for line in open(log, errors="replace") if line.strip(" =-\n")]
    errors = [line for line in lines if any(w in line.lower() for w in ("error", "terminate called", "killed"))
              and not any(w in line for w in ("torch/distributed", "ChildFailedError", "error_file"))]
    return (errors or lines or [""])[-1][:120]


# Synchronous mode: a step trains on samples its searchers generated with the very weights it computes their
# log-probs with, so per token, E[log p_engine - log p_trainer] over the engine's samples is KL(engine || trainer):
# kernels and rounding only (bf16 engines and trainers do differ by rounding: Qi et al. 2025, arXiv 2510.26788).
# An engine that missed a push samples from older weights and shows their KL from the trainer's instead.
LP_TOL = 0.02  # nats per token, a choice (no GPU has measured the gap here yet; the table prints it): the most
# |train/logp_behav_minus_logp| / train/response_len a step on pushed weights may show
# ... and the check tells a load from none only when the weights moved: the policy's KL from the start weights
# (train/kl_seq per token, the reference being the start model) must reach DRIFT by the last step
DRIFT = 2 * LP_TOL


def lp_gaps(steps):
    """(per-token |logp_behav - logp| of each step after the first, the last step's per-token KL from the start).
    Step 1 samples the weights every engine loaded from disk; the later ones, pushed weights."""
    per_token = [(abs(r["train/logp_behav_minus_logp"]) / r["train/response_len"],
                  r["train/kl_seq"] / r["train/response_len"]) for r in steps if r.get("train/response_len")]
    return [gap for gap, _ in per_token[1:]], per_token[-1][1] if per_token else 0.0


def median(values, fmt):
    return fmt.format(statistics.median(values)) if values else "-"


def train_row(rc, path, compared=True):
    """(ok, figures, note) of one train.py run from its config.yaml, metrics.jsonl and summary.json; `compared`:
    something must have compared the searchers' weights with the trainer's."""
    metrics, summary, config = (os.path.join(path, f) for f in ("metrics.jsonl", "summary.json", "config.yaml"))
    rows = [json.loads(line) for line in open(metrics)] if os.path.exists(metrics) else []
    steps = [r for r in rows if "train/loss" in r]
    cfg = yaml.safe_load(open(config)) if os.path.exists(config) else {}  # the run's resolved config

    def values(key):
        return [r[key] for r in rows if r.get(key) is not None]

    probes = values("sync/probe_match")
    synchronous = cfg.get("asynchronous") is False  # asynchronous samples are older than the trainer's weights
    gaps, drift = lp_gaps(steps) if synchronous else ([], 0.0)
    figures = {"probe": " ".join(str(round(p, 2)) for p in probes) or "-",
               "lp gap": f"{max(gaps):.4f}" if gaps else "-",
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
    if cfg.get("check_sync") and (not probes or any(p != 1.0 for p in probes)):
        return False, figures, "a searcher's greedy probe differs from the trainer's" if probes else \
            "check_sync, but no sync/probe_match in metrics.jsonl"
    if synchronous:
        if not gaps:
            return False, figures, "synchronous, but no step after the first push to compare log-probs on"
        if max(gaps) > LP_TOL:
            return False, figures, f"teacher-forced log-probs differ by {max(gaps):.3f} nats per token (> {LP_TOL})"
        if drift < DRIFT:
            return False, figures, (f"the weights moved {drift:.3f} nats per token from the start (< {DRIFT}): too "
                                    "little to tell a weight load from none; raise lr")
    elif compared and not cfg.get("check_sync"):
        return False, figures, "nothing compared the searchers' weights with the trainer's (check_sync=false, async)"
    done = json.load(open(summary))
    moved = f", log-probs within {LP_TOL} with the weights {drift:.2f} nats/token from the start" if gaps else ""
    return True, figures, f"{done['steps']} steps in {done['wall_seconds']:.0f} s{moved}"


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


def verdict_row(rc, path):
    """scripts/check_inflight.py's or scripts/check_current.py's json: its own verdict and note."""
    res = json.load(open(path)) if os.path.exists(path) else {}
    if not res:
        return False, {}, f"exit {rc}" + (" (timeout)" if rc in (124, 137) else "")
    return bool(res["passed"]) and rc == 0, {}, res["note"][:160]


def bench_row(rc, path):
    """bench.py's bench.json, sync against async: the loop-time ratio at equal work, with its interval."""
    res = json.load(open(path)) if os.path.exists(path) else {}
    if rc != 0 or "speedup_sync_over_async" not in res:
        return False, {}, f"exit {rc}" + (" (timeout)" if rc in (124, 137) else "")
    low, high = res["speedup_sync_over_async_interval"]
    runs = len(res["async"]["loop_seconds_all"])
    spread = f"95% {low:.2f}-{high:.2f}" if low is not None else "no interval"
    figures = {"push s": f"{res['async']['push_seconds_mean']:.3f}",
               "search tok/s": f"{res['async']['searcher_tokens_per_s_median']:.0f}"}
    if not res["equal_work_sync_async"]:
        return False, figures, "the arms ran at unequal work: no ratio"
    return True, figures, (f"sync / async loop time at equal work {res['speedup_sync_over_async']:.2f} ({spread}, "
                           f"n = {runs}); loops {res['sync']['loop_seconds_mean']:.0f} s sync, "
                           f"{res['async']['loop_seconds_mean']:.0f} s async")


KINDS = {"train": train_row, "run": lambda rc, path: train_row(rc, path, compared=False),
         "transport": transport_row, "bare": bare_row, "kill": kill_row, "plan": plan_row,
         "labels": verdict_row, "current": verdict_row, "bench": bench_row}


def main(checks_file):
    table, failed, skipped = [], 0, 0
    for line in open(checks_file):
        if not line.strip():
            continue
        case, kind, rc, path, log = line.rstrip("\n").split("\t")
        if rc == "-":  # not run (gpu_single.sh's deadline, or a layout without what it needs): not a pass
            skipped += 1
            table.append([case, "SKIP"] + ["-"] * (len(COLUMNS) - 3) + [last_line(log)])
            continue
        try:
            ok, figures, note = KINDS[kind](int(rc), path)
        except Exception as e:  # an unreadable result is a failed check, not a crash of the table
            ok, figures, note = False, {}, f"unreadable result: {type(e).__name__}: {e}"[:100]
        if not ok:
            failed += 1
            note = f"{note}; log {log}: {last_line(log)}"
        table.append([case, "PASS" if ok else "FAIL"] + [figures.get(c, "-") for c in COLUMNS[2:-1]] + [note])
    widths = [max(len(str(r[i])) for r in table + [COLUMNS]) for i in range(len(COLUMNS) - 1)]
    for r in [COLUMNS] + table:
        print(" | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " | " + r[-1])
    print(f"{len(table) - failed - skipped} of {len(table)} checks passed" + (f", {failed} FAILED" if failed else "")
          + (f", {skipped} not run" if skipped else ""))
    return 1 if failed or skipped or not table else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
