#!/usr/bin/env bash
# The TL;DR miniature's pre-registered grid (docs/tasks.md, "TL;DR in miniature"): configs/tldr_mini.yaml, 300 steps
# of 64 summaries, evaluated on 1,024 test posts every 20 steps, seeds 0-3, one seed at a time over every arm so a
# partial grid is balanced; rerunning skips finished runs and resumes unfinished ones. Two phases, in this order:
#   bash scripts/tldr_grid.sh control   # the positive control: every baseline at D = 0 and D = 14, then its table
#   bash scripts/tldr_grid.sh compare   # TB and the m ablation (the control gates only question 2)
#   DRY_RUN=1 bash scripts/tldr_grid.sh control   # only list the runs;  ARMS="rloo_d0" SEEDS="0" for a part
# Held equal in every arm: the SFT and the proxy (the labeller's utility), the KL coefficient 0.4 (TB's beta, RLOO's
# and GRPO's KL weight, online DPO's DPO beta), 64 fresh summaries a step (every arm generates what it trains on: the
# synchronous arms one batch a step, TB's searchers at replay ratio 1), lr 1e-4, the evaluation.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/tldr_mini}
SEEDS=${SEEDS:-"0 1 2 3"}
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
# TB as the paper runs TL;DR (section 5.1): k = 10 trainer steps between weight syncs, m = 0.5, beta from 1 towards the
# final 0.4 over half the steps, cut to 0.4 at one eighth (step 38 of 300); its searchers capped at 640 summaries a
# round (2 x 40 prompts x S = 8) and the trainer at replay ratio 1 (max_reuse=1): 64 fresh summaries a step.
TB="k=10 max_reuse=1 max_prompts_per_round=40 beta_start=1 beta_end=0.4 beta_decay_steps=150 beta_cut_step=38"
# The m ablation at m = 0.1 and 0.9, not the paper's 0.4 and 0.6: the mean staleness of a trained summary is linear in
# m, and between 0.4 and 0.6 it moved only from 52 to 40 updates; 0.1 and 0.9 should span about 69 to 23.
declare -A ARM=(
  [tb]="$TB"
  [tb_m0.1]="$TB m=0.1"
  [tb_m0.9]="$TB m=0.9"
)
# The baselines as Noukhovitch et al. run them (the paper's Table 1 rows): synchronous, one batch of the weights of D
# updates ago a step (weight_delay=D): 1 and about 15 steps off-policy are D = 0 and 14.
for d in 0 14; do
  ARM[rloo_d$d]="async=false weight_delay=$d loss=rloo"
  ARM[grpo_d$d]="async=false weight_delay=$d loss=grpo"
  ARM[online_dpo_d$d]="async=false weight_delay=$d loss=online_dpo dpo_beta=0.4"
done
CONTROL="rloo_d0 rloo_d14 grpo_d0 grpo_d14 online_dpo_d0 online_dpo_d14"
case "${1:-}" in
  control) ORDER=$CONTROL ;;
  compare) ORDER="tb tb_m0.1 tb_m0.9" ;;
  *) echo "usage: bash scripts/tldr_grid.sh control|compare (the positive control first)" >&2; exit 2 ;;
esac
source scripts/grid.sh
run_grid configs/tldr_mini.yaml
if [ "$1" = control ] && [ "${DRY_RUN:-0}" = 0 ] && [ -z "${ARMS:-}" ]; then  # the rule: docs/tasks.md, "Positive control"
  "$PY" tables.py "$OUT"/{rloo,grpo,online_dpo}_d{0,14}/seed* --group-by loss,weight_delay --metric win_rate \
    --paired weight_delay=0,14 --front kl --matched 0.25
fi
