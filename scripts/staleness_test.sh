#!/usr/bin/env bash
# The pre-registered staleness test (docs/staleness.md, "Does TB tolerate stale data better? The test"): tb, dr_grpo,
# grpo and rloo at weight_delay D in {0, 64}, at lr 1e-5 (the paper's) and 3e-5, seeds 0-3, on the tiny task with the
# shipped model; 300 steps at a pinned replay ratio of 2 (32 fresh of 64 trained samples per step), every objective at
# beta 0.05 (TB's reward temperature, the baselines' KL coefficient; dr_grpo has none), no gradient clipping;
# evaluation on 1,000 held-out problems every 50 steps. One seed at a time over every cell, so a partial grid stays
# balanced; rerunning skips finished runs and continues unfinished ones (sweep.sh). PILOT=1 runs the pilot only
# (seed 0, tb and grpo, lr 1e-5, both D).
#   bash scripts/staleness_test.sh
#   python tables.py out/stale_test/seed*/* --paired weight_delay=0,64 --contrast loss=tb --last 3
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/stale_test}
M=(configs/tiny.yaml steps=300 time_budget_min=0 max_reuse=2 max_prompts_per_round=4 eval_every=50 progress=false
   test_data=procedural:test:1000 n_test=1000 beta_start=0.05 beta_end=0.05 grad_clip=0)
if [ "${PILOT:-0}" = 1 ]; then
  exec bash sweep.sh "${M[@]}" seed=0 lr=1e-5 loss=tb,grpo weight_delay=0,64 out_dir="$OUT/pilot"
fi
status=0
for seed in 0 1 2 3; do
  bash sweep.sh "${M[@]}" seed=$seed lr=1e-5,3e-5 loss=tb,dr_grpo,grpo,rloo weight_delay=0,64 \
    out_dir="$OUT/seed$seed" || status=1
done
exit $status
