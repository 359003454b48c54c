#!/usr/bin/env bash
# The pre-registered staleness test (docs/staleness.md, "The test"): does stale data cost TB less held-out accuracy
# than it costs Dr. GRPO, GRPO and RLOO? Every arm: the tiny task with the shipped model, 300 steps at a pinned replay
# ratio of 2 (32 fresh of 64 trained samples per step), beta 0.05 for every objective, PPO clip 0.2 where an objective
# has one, no gradient clipping, evaluation on 1,000 held-out problems every 50 steps (of the trainer's weights).
#   bash scripts/staleness_test.sh pilot      # tb and grpo at D = 0, 64, 128, seeds 0-1: decides D (the doc's rule)
#   bash scripts/staleness_test.sh test       # tb, dr_grpo, grpo, rloo, tba_prime at D = 0 and D, seeds 0-7
#   bash scripts/staleness_test.sh lr3e-5     # secondary: the same arms at lr 3e-5, seeds 0-3, after the test
#   DRY_RUN=1 ... only lists the runs;  SEEDS="0" ARMS="tb_d0" ... for a part
# One seed at a time over every arm, so a partial grid stays balanced. Resumable across sessions and machines: a run
# finished here (out/stale2/...) or packed (docs/grids/staleness_*) is skipped, an unfinished one resumed, and each run
# is packed into docs/grids/ as it finishes (commit it). The reading, from the packed runs of a fresh clone:
#   python scripts/staleness_verdict.py docs/grids/staleness_test --plot docs/staleness_test.png
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
M="steps=300 time_budget_min=0 max_reuse=2 max_prompts_per_round=4 eval_every=50 test_data=procedural:test:1000"
M+=" n_test=1000 beta_start=0.05 beta_end=0.05 grad_clip=0"
D=${D:-64}     # the test's delay: 64, or 128 if the pilot's GRPO drop at 64 is under 2 points in both seeds
declare -A ARM=()
arms() {  # arms LR D... : every objective of the test at each delay
  local lr=$1 d loss; shift
  for d in "$@"; do
    for loss in tb dr_grpo grpo rloo; do ARM[${loss}_d$d]="$M lr=$lr weight_delay=$d loss=$loss"; done
    ARM[tba_prime_d$d]="$M lr=$lr weight_delay=$d loss=tba_prime ref_reset_every=50"  # TBA' (section 6): resets
  done
}
case "${1:-}" in
  pilot) arms 1e-5 0 64 128; ORDER="tb_d0 grpo_d0 tb_d64 grpo_d64 tb_d128 grpo_d128"; SEEDS=${SEEDS:-"0 1"}
         OUT=${OUT:-out/stale2/pilot}; PACKED=${PACKED:-docs/grids/staleness_pilot} ;;
  test) arms 1e-5 0 "$D"; ORDER="tb_d0 tb_d$D dr_grpo_d0 dr_grpo_d$D grpo_d0 grpo_d$D rloo_d0 rloo_d$D tba_prime_d0 tba_prime_d$D"
        SEEDS=${SEEDS:-"0 1 2 3 4 5 6 7"}; OUT=${OUT:-out/stale2/test}; PACKED=${PACKED:-docs/grids/staleness_test} ;;
  lr3e-5) arms 3e-5 0 "$D"; ORDER="tb_d0 tb_d$D dr_grpo_d0 dr_grpo_d$D grpo_d0 grpo_d$D rloo_d0 rloo_d$D tba_prime_d0 tba_prime_d$D"
          SEEDS=${SEEDS:-"0 1 2 3"}; OUT=${OUT:-out/stale2/lr3e-5}; PACKED=${PACKED:-docs/grids/staleness_lr3e-5} ;;
  *) echo "usage: bash scripts/staleness_test.sh pilot|test|lr3e-5 (the pilot first: it decides D)" >&2; exit 2 ;;
esac
source scripts/grid.sh
run_grid configs/tiny.yaml
if [ "$1" != pilot ] && [ "${DRY_RUN:-0}" = 0 ] && [ -z "${ARMS:-}" ]; then
  "$PY" scripts/staleness_verdict.py "$PACKED"
fi
