#!/usr/bin/env bash
# The staleness map (docs/staleness.md): 8 objectives x weight_delay D in {0, 4, 16, 64} on the tiny task, 300 steps
# each at a pinned replay ratio of 2 (64 trained samples per step, 32 fresh ones: max_prompts_per_round=4 caps what the
# 2 searchers generate per round of k=2 steps at 2 x 4 prompts x S=8 = 64, max_reuse=2 makes the trainer wait for at
# least that), so the figures do not depend on the machine's speed; seeds 0-2 for tb, grpo, dr_grpo, tba_prime and
# 0-1 for prime_ratio, rloo, online_dpo, m2po.
# One seed at a time over every cell, so a partial map is balanced. About 1.2-2.5 minutes per run on an idle 2-core box
# (88 runs with the S > K block: about 2.5 hours); rerunning skips finished runs (sweep.sh): build it in sittings.
#   bash scripts/staleness_map.sh
#   python tables.py --against weight_delay --plot docs/staleness.png \
#     out/staleness/seed*/loss* out/staleness/seed*/tba_prime/*
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/staleness}
M=(configs/tiny.yaml steps=300 time_budget_min=0 max_reuse=2 max_prompts_per_round=4 eval_every=50 progress=false)
for seed in 0 1 2; do
  bash sweep.sh "${M[@]}" seed=$seed loss=tb,grpo,dr_grpo weight_delay=0,4,16,64 out_dir="$OUT/seed$seed"
  bash sweep.sh "${M[@]}" seed=$seed loss=tba_prime ref_reset_every=50 weight_delay=0,4,16,64 \
    out_dir="$OUT/seed$seed/tba_prime"
  if [ $seed -lt 2 ]; then
    bash sweep.sh "${M[@]}" seed=$seed loss=prime_ratio,rloo,online_dpo,m2po weight_delay=0,4,16,64 \
      out_dir="$OUT/seed$seed"
  fi
done
# Does S > K change it? The paper samples S = 1.2 K (24 / 20); here S = 10 for K = 8, fresh samples pinned at 40 per
# step (2 x 4 prompts x 10 / 2 and max_reuse=1.6), for tb and grpo at D = 0 and 16, seeds 0-1.
bash sweep.sh "${M[@]}" S=10 max_reuse=1.6 seed=0,1 loss=tb,grpo weight_delay=0,16 out_dir="$OUT/s_gt_k"
