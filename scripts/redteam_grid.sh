#!/usr/bin/env bash
# The red-teaming grid (docs/tasks.md, "Red-teaming with known modes"): configs/redteam_modes.yaml, 600 steps, seeds
# 0-2, one seed at a time over every arm so a partial grid is balanced; rerunning skips finished runs (summary.json).
# About 2.5-4 minutes a run on an idle 2-core box, 36 runs (about 1.5 hours). Every asynchronous arm trains on 64 samples per step at a
# pinned replay ratio (max_reuse: the trainer waits for fresh samples), so the figures do not depend on the machine.
#   bash scripts/redteam_grid.sh                 # every arm;  ARMS="tb dr_grpo" SEEDS="0" for a part
#   python tables.py out/redteam_modes/{tb,tb_beta0.1,tb_sync,grpo,dr_grpo,rloo,online_dpo}/seed* \
#     --finals attack_success,modes_covered,mode_entropy,mode_tv,unique_success,diversity,diversity_success
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/redteam_modes}
SEEDS=${SEEDS:-"0 1 2"}
declare -A ARM=(
  # The objectives (the paper's Table 6 rows): TB at the beta that defines its target and at a tenth of it, TB
  # synchronous (on-policy, 64 fresh samples a step, no replay: the one-actor GFlowNet row), and reward maximisers at
  # their sources' KL coefficients (TRL: GRPO 0.04, RLOO 0.05; Dr. GRPO none; online DPO its DPO beta 0.1).
  [tb]=""
  [tb_beta0.1]="beta_start=0.1 beta_end=0.1"
  [tb_sync]="async=false"
  [grpo]="loss=grpo beta_start=0.04 beta_end=0.04"
  [dr_grpo]="loss=dr_grpo"
  [rloo]="loss=rloo beta_start=0.05 beta_end=0.05"
  [online_dpo]="loss=online_dpo"
  # RLOO at TB's beta: KL-regularised RL whose optimum is TB's target; does the objective or the coefficient matter?
  [rloo_beta1]="loss=rloo"
  # The paper's two scaling claims, at beta = 0.1 (the middle arm is tb_beta0.1). Searchers (fresh samples per step):
  # 1, 2 or 4 searchers, the replay ratio pinned at 4, 2, 1, so 16, 32 or 64 of each step's 64 samples are fresh.
  # Buffer size: 64 prompt ids x per_prompt_cap = 640, 6400 or 64000 attacks (nothing evicted in 600 steps).
  [searchers1_beta0.1]="n_searchers=1 max_reuse=4 beta_start=0.1 beta_end=0.1"
  [searchers4_beta0.1]="n_searchers=4 max_reuse=1 beta_start=0.1 beta_end=0.1"
  [buffer640_beta0.1]="per_prompt_cap=10 beta_start=0.1 beta_end=0.1"
  [buffer64k_beta0.1]="per_prompt_cap=1000 beta_start=0.1 beta_end=0.1"
  # The same at beta = 1 (the middle arm is tb), the pilot that could not tell them apart (docs/tasks.md):
  #   ARMS="searchers1 searchers4 buffer640 buffer64k" SEEDS=0 bash scripts/redteam_grid.sh
  [searchers1]="n_searchers=1 max_reuse=4"
  [searchers4]="n_searchers=4 max_reuse=1"
  [buffer640]="per_prompt_cap=10"
  [buffer64k]="per_prompt_cap=1000"
)
ORDER="tb dr_grpo tb_beta0.1 grpo rloo online_dpo tb_sync rloo_beta1 searchers1_beta0.1 searchers4_beta0.1
       buffer640_beta0.1 buffer64k_beta0.1"
source scripts/grid.sh
run_grid configs/redteam_modes.yaml
