#!/usr/bin/env bash
# The pre-registered pass@k question (docs/diversity.md, "Does TB keep pass@k where the maximisers lose it?"): the
# tiny default (TB, asynchronous, 1000 steps, 32 fresh of 64 trained samples a step, lr 3e-5, no time cap) and the
# same run with grpo, rloo, and grpo without a KL term (the positive control); beta 0.05 in every arm that has one;
# each evaluation also samples 16 completions per problem (eval_samples=16) on the 500 held-out problems, every 100
# steps. One seed at a time over every arm; resumable across sessions and machines (runs packed into docs/grids/).
#   bash scripts/passk_grid.sh pilot     # seeds 0-1, every arm: the level check and the spread (the doc's rule)
#   bash scripts/passk_grid.sh test      # seeds 0-5 (SEEDS=... if the pilot's power rule asks for more)
#   bash scripts/passk_grid.sh control   # the control's fallback setting: grpo_nokl, seed 0, STEPS (default 2000)
#   STEPS=2000 bash scripts/passk_grid.sh test    # the test at the fallback's steps (docs/diversity.md, the pilot)
#   DRY_RUN=1 ... only lists the runs
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
[ "${1:-}" = control ] && STEPS=${STEPS:-2000}
STEPS=${STEPS:-1000}  # the registered 1000; 2000 is the control's fallback (docs/diversity.md)
E="steps=$STEPS time_budget_min=0 eval_every=100 eval_samples=16"  # every arm; the objectives add their KL weight
M="$E beta_start=0.05 beta_end=0.05"
declare -A ARM=([tb]="$M loss=tb" [grpo]="$M loss=grpo" [rloo]="$M loss=rloo"
                [grpo_nokl]="$E loss=grpo beta_start=0 beta_end=0")
ORDER="tb grpo rloo grpo_nokl"
case "${1:-}" in
  pilot) SEEDS=${SEEDS:-"0 1"}; OUT=${OUT:-out/passk/pilot}; PACKED=${PACKED:-docs/grids/passk_pilot} ;;
  test) SEEDS=${SEEDS:-"0 1 2 3 4 5"}; OUT=${OUT:-out/passk/test}; PACKED=${PACKED:-docs/grids/passk_test}
        [ "$STEPS" = 1000 ] || { OUT=${OUT}_$STEPS; PACKED=${PACKED}_$STEPS; } ;;
  control) ORDER="grpo_nokl"; SEEDS=${SEEDS:-"0"}
           OUT=${OUT:-out/passk/control$STEPS}; PACKED=${PACKED:-docs/grids/passk_control$STEPS} ;;
  *) echo "usage: bash scripts/passk_grid.sh pilot|test|control (the pilot first)" >&2; exit 2 ;;
esac
source scripts/grid.sh
run_grid configs/tiny.yaml
