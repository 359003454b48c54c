#!/usr/bin/env bash
# The TL;DR miniature's grid (docs/tasks.md, "TL;DR in miniature"): the paper's Table 1 in miniature, the win-rate /
# KL front through each run's evaluations, and the m ablation. configs/tldr_mini.yaml, 300 steps of 64 summaries,
# evaluated every 20 steps, seeds 0-2, one seed at a time over every arm so a partial grid is balanced; rerunning
# skips finished runs (summary.json) and resumes unfinished ones.
#   bash scripts/tldr_grid.sh                   # every arm;  ARMS="tb rloo_d0" SEEDS="0" for a part
#   G="--group-by loss,weight_delay,m --metric win_rate --no-plot"   # each arm's peak, its end, the front at equal KL
#   python tables.py out/tldr_mini/*/seed* $G --finals win_rate,kl,perplexity,pads,staleness/mean --at best
#   python tables.py out/tldr_mini/*/seed* $G --finals win_rate,tie_rate,gold,proxy,kl,perplexity,pads
#   python tables.py out/tldr_mini/*/seed* $G --front kl --band 0.5,1.5
# Held equal in every arm: the SFT and proxy RM, 300 steps x 64 summaries, 64 fresh summaries a step (every arm
# generates what it trains on: the synchronous arms one batch a step, TB's searchers at replay ratio 1), lr 2e-5, the
# evaluation (256 test posts at temperature 1).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/tldr_mini}
SEEDS=${SEEDS:-"0 1 2"}
# TB as the paper runs TL;DR (section 5.1): k = 10 trainer steps between weight syncs, m = 0.5, beta 1 -> 0.05 over
# half the steps, cut to 0.05 at one eighth (step 38 of 300); its searchers capped at 640 summaries a round (2 x 40
# prompts x S = 8) and the trainer at replay ratio 1 (max_reuse=1): 64 fresh summaries a step, as the synchronous arms.
TB="k=10 max_reuse=1 max_prompts_per_round=40 beta_start=1 beta_end=0.05 beta_decay_steps=150 beta_cut_step=38"
# The baselines as Noukhovitch et al. run them (the paper's Table 1 rows): synchronous, one batch of the weights of D
# updates ago a step (weight_delay=D): 1, 2 and about 15 steps off-policy are D = 0, 1 and 14. KL coefficients of their
# sources: RLOO 0.05 (Noukhovitch et al.), GRPO 0.04 (TRL), online DPO its DPO beta 0.1.
declare -A ARM=(
  [tb]="$TB"
  [tb_m0.4]="$TB m=0.4"
  [tb_m0.6]="$TB m=0.6"
)
for d in 0 1 14; do
  ARM[online_dpo_d$d]="async=false weight_delay=$d loss=online_dpo"
  ARM[rloo_d$d]="async=false weight_delay=$d loss=rloo beta_start=0.05 beta_end=0.05"
  ARM[grpo_d$d]="async=false weight_delay=$d loss=grpo beta_start=0.04 beta_end=0.04"
done
ORDER="tb rloo_d0 online_dpo_d0 grpo_d0 rloo_d14 online_dpo_d14 grpo_d14 rloo_d1 online_dpo_d1 grpo_d1 tb_m0.4 tb_m0.6"
source scripts/grid.sh
run_grid configs/tldr_mini.yaml
