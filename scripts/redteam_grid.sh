#!/usr/bin/env bash
# The red-teaming grid (docs/tasks.md, "Red-teaming with known modes"): configs/redteam_modes.yaml, 600 steps, seeds
# 0-2, one seed at a time over every arm so a partial grid is balanced; rerunning skips finished runs (summary.json).
# Every asynchronous arm trains on 64 samples per step at a pinned replay ratio (max_reuse: the trainer waits for fresh
# samples), so every arm does the same work whatever the machine's speed; the draws still depend on timing (which
# weights each searcher held when), so a seed does not reproduce a run exactly.
#   bash scripts/redteam_grid.sh                  # every arm (63 runs);  ARMS="tb_b0.1 dr_grpo" SEEDS="0" for a part
#   DRY_RUN=1 bash scripts/redteam_grid.sh        # only print the runs
# The tables and plots: docs/tasks.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/redteam_modes}
SEEDS=${SEEDS:-"0 1 2"}
BETAS="0.05 0.1 0.2 1.0"
# Reward maximisers without a KL term, whose optimum is every attack on the most reliable kind: GRPO at a negligible KL
# weight (the positive control: it collapses in the pilot) and Dr. GRPO (no KL term; it did not in the pilot).
declare -A ARM=([grpo_nokl]="loss=grpo beta_start=0.0001 beta_end=0.0001" [dr_grpo]="loss=dr_grpo")
ORDER="grpo_nokl dr_grpo"
# The objectives at the same KL coefficient (TB's beta = GRPO's and RLOO's KL weight = online DPO's DPO beta), swept:
# the same target, pi_ref exp(r / beta) normalised, for each objective at a beta.
for b in $BETAS; do
  for loss in tb grpo rloo online_dpo; do
    ARM[${loss}_b$b]="loss=$loss beta_start=$b beta_end=$b"
    [ $loss = online_dpo ] && ARM[${loss}_b$b]+=" dpo_beta=$b"
    ORDER+=" ${loss}_b$b"
  done
done
# Buffer size at beta = 0.2 (the middle arm is tb_b0.2, 6400): 64 prompt ids x per_prompt_cap = 640, 6400 or 64000
# attacks (the largest evicts nothing in 600 steps).
ARM[buffer640_b0.2]="per_prompt_cap=10 beta_start=0.2 beta_end=0.2"
ARM[buffer64k_b0.2]="per_prompt_cap=1000 beta_start=0.2 beta_end=0.2"
ORDER+=" buffer640_b0.2 buffer64k_b0.2"
# The amended positive control (docs/tasks.md, amendment of 2026-12-05): GRPO without a KL term over 1200 steps, read
# at step 1200. Every other arm keeps a constant lr and beta, so its first 600 steps are those of a 1200-step run.
ARM[grpo_nokl_1200]="loss=grpo beta_start=0.0001 beta_end=0.0001 steps=1200"
ORDER+=" grpo_nokl_1200"
source scripts/grid.sh
run_grid configs/redteam_modes.yaml
