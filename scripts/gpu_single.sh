#!/usr/bin/env bash
# One GPU without vLLM (e.g. one H100 or H200 with torch and transformers only): what such a machine can show, in
# under 10 minutes. bash scripts/gpu_single.sh runs scripts/gpu_check.sh's checks that fit it, every rank on the one
# GPU, the HF engine (static KV cache), weights by CUDA IPC:
#   plan-1b               the GSM8K recipe's trainer micro-batch and searcher log-prob pass: peak memory against the
#                         plan
#   shared-transport      CUDA IPC, 5 pushes of the 1.1B shape (2.2 GB in bf16), bit-exact
#   shared-tiny-hf        the HF-engine loop, synchronous: the searcher's log-probs against the trainer's
#   shared-1b-hf          the same at the 1.1B shape (random weights) and GSM8K's 512 new tokens
#   shared-launch         launch.sh (--prepare and its memory plan), the tiny model's greedy probe against the trainer's
#   shared-delay-eval     weight_delay=2: an evaluation (a CURRENT round, over IPC) equal to checkpoints/final's greedy
#                         completions, not the delayed weights'
#   shared-tiny-lora      LoRA: float32 adapters on a bf16 base, the merged weights pushed on CUDA
#   shared-sync-vs-async  bench.py: synchronous against asynchronous at equal work, two runs each, alternated, the
#                         1.1B shape at GSM8K's batch (7 prompts x 20 samples), 128 new tokens, 12 steps, k=1
# It cannot show: vLLM (its kernels, in-flight search and its version labels), NCCL (a GPU per rank), n_trainers > 1
# (NCCL refuses two trainer ranks on one GPU), nor the fault checks: scripts/gpu_check.sh on a node with vLLM and
# 2+ GPUs does. Without a GPU: a dry run on the CPU (tiny model, gloo, float32; no plan-1b).
# Env as scripts/gpu_check.sh's: OUT (logs and table.txt: out/gpu_single), WORK (runs and the 1.1B model, 2.2 GB:
# OUT), PY, DEADLINE_S (570: checks that would pass it are listed as not run, the timing last).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-out/gpu_single} ENGINE=hf DEADLINE_S=${DEADLINE_S:-570}
export CHECKS="plan transport train launch current lora timing"
bash scripts/gpu_check.sh
rc=$?
[ "${DRY_RUN:-0}" != 0 ] && exit $rc
echo "not checked on this machine: vLLM, NCCL, n_trainers > 1, faults (scripts/gpu_check.sh on a vLLM node)" \
  | tee -a "$OUT/table.txt"
exit $rc
