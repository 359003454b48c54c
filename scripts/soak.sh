#!/usr/bin/env bash
# Soak test: the tiny default made long (1800 steps, ~30 min on 2 cores) with a searcher killed (kill -9) twice,
# the job resumed with resume=auto each time. Prints one line per phase and the final result.
#   bash scripts/soak.sh [OUT_DIR] [KILL_AFTER_S]      (defaults: out/soak, 540 s into each of the first two phases)
# Compare its eval/accuracy at step 600 with an uninterrupted `bash launch.sh` (tiny default, 600 steps, seed 0).
set -u
cd "$(dirname "$0")/.."
out=${1:-out/soak}
kill_after=${2:-540}
rm -rf "$out" "$out".phase*.log
args=(configs/tiny.yaml steps=1800 time_budget_min=0 eval_every=100 save_every=100 progress=false "out_dir=$out")
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3

rank_pid() {  # the pid of torchrun job $1's worker with RANK=$2
  for c in $(pgrep -P "$1"); do tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null | grep -qx "RANK=$2" && echo "$c"; done
}
last_step() { [ -f "$out/metrics.jsonl" ] && tail -n 1 "$out/metrics.jsonl" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['step'])" || echo 0; }

t0=$(date +%s)
for phase in 1 2 3; do
  log="$out.phase$phase.log"
  bash launch.sh "${args[@]}" resume=auto > "$log" 2>&1 &
  job=$!
  if [ "$phase" -lt 3 ]; then
    sleep "$kill_after"
    victim=$(rank_pid "$job" $(( (phase - 1) % 2 + 1 )))
    step=$(last_step)
    tk=$(date +%s)
    kill -9 "$victim"
    wait "$job"; rc=$?
    echo "phase $phase: kill -9 of searcher rank $(( (phase - 1) % 2 + 1 )) (pid $victim) at step $step;" \
         "job exited rc=$rc after $(( $(date +%s) - tk )) s;" \
         "$(grep -m1 -o 'error: .*' "$log")"
    left=$(pgrep -f "out_dir=$out" | wc -l); echo "  processes left behind: $left"
  else
    wait "$job"; rc=$?
    echo "phase $phase: ran to the end, rc=$rc; $(grep -m1 -o 'done: .*' "$log")"
  fi
done
echo "soak: $(( ($(date +%s) - t0) / 60 )) min wall in total"
"$PY" - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
steps = [r["step"] for r in rows]
s = json.load(open(f"{out}/summary.json"))
evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
print(f"steps logged: {len(steps)} (unique {len(set(steps))}, 0..{max(steps)}); summary steps {s['steps']}; "
      f"skipped updates {s['skipped_updates']}")
print("eval accuracy by step: " + ", ".join(f"{k}: {100 * v:.1f}%" for k, v in sorted(evals.items())))
EOF
