#!/usr/bin/env bash
# The pre-registered search-scaling question (docs/diversity.md, "Does more search find more?"): at fixed trainer
# steps, 1, 2 and 4 searchers' worth of fresh data, F = 16, 32 and 64 fresh samples per 64-sample step, for TB and
# GRPO beside it. The pace (searcher.run, trainer.wait_for_fresh): a round every k = 2 steps brings at most
# n_searchers x max_prompts_per_round x S = 2 x P x 8 fresh samples, and the trainer waits for fresh ones rather than
# train on more than max_reuse x those generated; with P = F / 8 and max_reuse = 64 / F both bounds give F a step:
#   F = 16: max_prompts_per_round 2, max_reuse 4 | F = 32: 4, 2 (the configs' own) | F = 64: 8, 1
# Tasks: redteam = configs/redteam_modes.yaml at 1200 steps (its grid's setting, evaluation every 25 steps); math =
# the tiny arith default (configs/tiny.yaml) at 300 steps with 16 samples a problem at each evaluation (pass@16),
# every 100 steps, on the 500 held-out problems. One seed at a time over every arm; resumable across sessions and
# machines (each run packed into docs/grids/scaling_<task>_<phase> as it finishes; commit it).
#   bash scripts/search_scaling_grid.sh redteam pilot   # seeds 0-1, the 6 arms: the doc's pilot rules
#   bash scripts/search_scaling_grid.sh redteam test    # seeds 0-3 (SEEDS="0 ... 7" if the pilot's rule asks for more)
#   bash scripts/search_scaling_grid.sh redteam ranks   # real searcher ranks, TB: n_searchers 1 and 4 at
#                                                       # max_prompts_per_round 4 (tb_f32 of the test is n = 2)
#   (math likewise)    DRY_RUN=1 ... only lists the runs;  ARMS="tb_f16" SEEDS="0" ... for a part
# The reading: python scripts/scaling_verdict.py docs/grids/scaling_<task>_test
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
case "${1:-}" in
  redteam) CONFIG=configs/redteam_modes.yaml; M="steps=1200" ;;  # the config: beta 0.2, lr 1e-4, eval every 25
  math) CONFIG=configs/tiny.yaml
        M="steps=300 time_budget_min=0 eval_every=100 eval_samples=16 beta_start=0.05 beta_end=0.05" ;;
  *) echo "usage: bash scripts/search_scaling_grid.sh redteam|math pilot|test|ranks (the pilot first)" >&2; exit 2 ;;
esac
TASK=$1
declare -A ARM=()
# F fresh samples per step: P = F / 8 prompt visits per searcher and round (2 searchers, S = 8, k = 2), max_reuse 64 / F
for loss in tb grpo; do
  ARM[${loss}_f16]="$M loss=$loss max_prompts_per_round=2 max_reuse=4"
  ARM[${loss}_f32]="$M loss=$loss max_prompts_per_round=4 max_reuse=2"
  ARM[${loss}_f64]="$M loss=$loss max_prompts_per_round=8 max_reuse=1"
done
# real searcher ranks: one searcher's worth is P = 4 (16 a step), so n searchers make 16 n a step
ARM[tb_n1]="$M loss=tb n_searchers=1 max_prompts_per_round=4 max_reuse=4"
ARM[tb_n4]="$M loss=tb n_searchers=4 max_prompts_per_round=4 max_reuse=1"
case "${2:-}" in
  pilot) ORDER="tb_f16 grpo_f16 tb_f32 grpo_f32 tb_f64 grpo_f64"; SEEDS=${SEEDS:-"0 1"} ;;
  test) ORDER="tb_f16 grpo_f16 tb_f32 grpo_f32 tb_f64 grpo_f64"; SEEDS=${SEEDS:-"0 1 2 3"} ;;
  ranks) ORDER="tb_n1 tb_n4"; SEEDS=${SEEDS:-"0 1 2 3"} ;;
  *) echo "usage: bash scripts/search_scaling_grid.sh redteam|math pilot|test|ranks (the pilot first)" >&2; exit 2 ;;
esac
PHASE=$2
[ "$PHASE" = ranks ] && PHASE=test  # the ranks' runs sit beside the test's (its tb_f32 is their n = 2)
OUT=${OUT:-out/scaling/$TASK/$PHASE}
PACKED=${PACKED:-docs/grids/scaling_${TASK}_$PHASE}
source scripts/grid.sh
run_grid "$CONFIG"
