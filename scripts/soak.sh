#!/usr/bin/env bash
# Soak test of self-healing: the tiny default made long, launched once with max_restarts, while a searcher is killed
# (kill -9) every INTERVAL seconds of progress, ranks 1 and 2 in turn, KILLS times. The job must heal itself: one
# restart per kill, each resuming from the checkpoint saved at the failure, and finish with every step logged once.
#   bash scripts/soak.sh [OUT_DIR] [KILLS] [INTERVAL_S] [STEPS]      (defaults: out/soak 10 60 1500)
# Prints one line per kill (the step it hit, seconds until the resumed job trained again, steps redone) and a
# verdict; exits 1 when the run failed, a step is missing or doubled, a kill cost more than one restart, or a process
# was left behind.
set -u
cd "$(dirname "$0")/.."
out=${1:-out/soak}; kills=${2:-10}; interval=${3:-60}; steps=${4:-1500}
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
rm -rf "$out" "$out.log"; mkdir -p "$(dirname "$out")"
last_step() { [ -s "$out/metrics.jsonl" ] && tail -n 1 "$out/metrics.jsonl" | "$PY" -c \
  "import json,sys; print(json.loads(sys.stdin.read() or '{\"step\": 0}')['step'])" 2>/dev/null || echo 0; }
rank_pid() {  # the pid of the job's worker with RANK=$1 (the workers are children of torchrun's agent, $job)
  for c in $(pgrep -P "$job"); do tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null | grep -qx "RANK=$1" && echo "$c"; done
}

t0=$(date +%s)
bash launch.sh configs/tiny.yaml "steps=$steps" time_budget_min=0 eval_every=500 progress=false \
  "max_restarts=$kills" "out_dir=$out" > "$out.log" 2>&1 &
job=$!
failed=0
for k in $(seq 1 "$kills"); do
  sleep "$interval"
  rank=$(( (k - 1) % 2 + 1 )); victim=$(rank_pid "$rank"); step=$(last_step)
  [ -n "$victim" ] || { echo "kill $k: no searcher rank $rank running (the job: $(tail -n 2 "$out.log"))"; failed=1; break; }
  resumes=$(grep -c "^resumed from" "$out.log")
  tk=$(date +%s.%N)
  kill -9 "$victim"
  # the restarted attempt says where it resumed; the kill has cost its time once a step after that is logged
  until [ "$(grep -c "^resumed from" "$out.log")" -gt "$resumes" ] || ! kill -0 "$job" 2>/dev/null; do sleep 0.5; done
  resumed=$(grep -o "^resumed from [^ ]* (step [0-9]*" "$out.log" | tail -n 1 | grep -o "[0-9]*$")
  until [ "$(last_step)" -gt "${resumed:-0}" ] || ! kill -0 "$job" 2>/dev/null; do sleep 0.5; done
  stopped=$(grep -o "^error: at step [0-9]*" "$out.log" | tail -n 1 | grep -o "[0-9]*$")
  echo "kill $k: searcher rank $rank (pid $victim) near step $step; the trainer stopped at step ${stopped:-?}," \
       "saved, and trained again $("$PY" -c "import time; print(f'{time.time() - $tk:.0f}')") s after the kill;" \
       "resumed from step ${resumed:-?}: $(( ${stopped:-0} - ${resumed:-0} )) steps redone"
done
wait "$job"; rc=$?
left=$(pgrep -f "out_dir=$out" | wc -l)
echo "soak: rc $rc, $(( ($(date +%s) - t0) / 60 )) min wall, restarts $(grep -c '^restart [0-9]* of' "$out.log"), " \
     "processes left $left; $(grep -m1 -o 'done: .*' "$out.log")"
"$PY" - "$out" "$kills" "$rc" "$left" "$failed" <<'EOF'
import json, sys
out, kills, rc, left, failed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
steps = [json.loads(line)["step"] for line in open(f"{out}/metrics.jsonl")]
log = open(f"{out}.log").read()
restarts = log.count("resuming from the newest complete checkpoint")
ok = rc == 0 and not left and not failed and steps == list(range(len(steps))) and restarts == kills
print(f"steps logged 0..{max(steps)}, each once: {steps == list(range(len(steps)))}; restarts {restarts} for {kills} "
      f"kills; {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
EOF
