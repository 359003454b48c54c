#!/usr/bin/env bash
# The paper's ablations in miniature (docs/ablations.md), one pre-registered question each, on the tiny default
# (configs/tiny.yaml: TB, asynchronous, 1000 steps, lr 3e-5, beta 0.05, 32 fresh of 64 trained samples a step) with no
# time cap, evaluated every 100 steps on 1,000 held-out problems, greedy and 16 samples a problem (pass@k).
#   q1: recency m in {0.5, 0.95} x reward priority inv_temp in {0, 1}          (Table 2, Fig. 7)
#   q2: K = 8 against K = 16 at B x K = 64, fresh samples per step equal        (Table 5)
#   q3: S in {8, 10, 16} at K = 8, fresh samples per step equal, TB and GRPO    (S > K)
#   q4: beta constant, annealed as configs/gsm8k.yaml, constant with reference resets every 50 steps   (TBA', section 6)
#   bash scripts/ablation_grid.sh q1 pilot     # seeds 0-1, every arm: the controls' feasibility and the spread
#   bash scripts/ablation_grid.sh q1 test      # seeds 0-7 (SEEDS=... as the pilot's rule decides)
#   DRY_RUN=1 ... only lists the runs;  SEEDS="0" ARMS="m0.5_it0" ... for a part
# Fresh samples per step: 2 searchers x max_prompts_per_round x S per sync round of k = 2 steps; with max_reuse = 2 the
# trainer trains on at most twice what was generated (64 of 32 fresh a step) and waits for more rather than reuse
# more, so a cap of exactly 64 a round (S x max_prompts_per_round = 32) holds 32 a step, and a cap under it (S = 10:
# 3 visits, 60 a round) is topped up to 32 a step by sync rounds without weights.
# Pilot fallbacks the doc registers (set only after a pilot's rule says so): M_LOW (q1's low m, 0.5), IT (q1's inv_temp,
# 1), BETA_END (q4's annealed end, 0.0143).
# One seed at a time over every arm; resumable across sessions and machines (runs packed into
# docs/grids/ablation_qN_pilot|test as they finish; a packed run is skipped).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
M="time_budget_min=0 eval_every=100 eval_samples=16 test_data=procedural:test:1000 n_test=1000"
M+=" max_reuse=2 beta_start=0.05"
V8="S=8 K=8 B=8 max_prompts_per_round=4"      # the default: 2 x 4 x 8 = 64 fresh a round, 32 a step
C="beta_end=0.05"                             # constant beta (q4's anneal arm ends lower)
M_LOW=${M_LOW:-0.5}; IT=${IT:-1}; BETA_END=${BETA_END:-0.0143}
declare -A ARM=()
case "${1:-}" in
  q1) for m in 0.95 "$M_LOW"; do for it in 0 "$IT"; do
        ARM[m${m}_it$it]="$M $C $V8 loss=tb m=$m inv_temp=$it"; done; done
      ORDER="m0.95_it0 m${M_LOW}_it0 m${M_LOW}_it$IT m0.95_it$IT" ;;
  q2) ARM[k8]="$M $C $V8 loss=tb"
      ARM[k16]="$M $C S=16 K=16 B=4 max_prompts_per_round=2 loss=tb"    # 2 x 2 x 16 = 64 a round: the same 32 a step
      ORDER="k8 k16" ;;
  q3) for loss in tb grpo; do
        ARM[${loss}_s8]="$M $C $V8 loss=$loss"
        ARM[${loss}_s10]="$M $C S=10 K=8 B=8 max_prompts_per_round=3 loss=$loss"  # 60 a round: max_reuse tops it up
        ARM[${loss}_s16]="$M $C S=16 K=8 B=8 max_prompts_per_round=2 loss=$loss"  # 64 a round
      done
      ORDER="tb_s8 tb_s10 tb_s16 grpo_s8 grpo_s10 grpo_s16" ;;
  q4) E="$M $V8 loss=tb eval_kl_sft=true"  # every arm: the KL to the start model at each evaluation
      ARM[const]="$E $C"
      ARM[anneal]="$E beta_end=$BETA_END beta_decay_steps=500"   # 0.05 -> 0.05 x 0.004 / 0.014 over 500 of 1000 steps
      ARM[reset]="$E $C ref_reset_every=50"                      # TBA' (section 6): rho = 50
      ORDER="const anneal reset" ;;
  *) echo "usage: bash scripts/ablation_grid.sh q1|q2|q3|q4 pilot|test (the pilot first)" >&2; exit 2 ;;
esac
case "${2:-}" in
  pilot) SEEDS=${SEEDS:-"0 1"} ;;
  test) SEEDS=${SEEDS:-"0 1 2 3 4 5 6 7"} ;;
  *) echo "usage: bash scripts/ablation_grid.sh q1|q2|q3|q4 pilot|test (the pilot first)" >&2; exit 2 ;;
esac
OUT=${OUT:-out/ablation/$1_$2}; PACKED=${PACKED:-docs/grids/ablation_$1_$2}
source scripts/grid.sh
run_grid configs/tiny.yaml
