#!/usr/bin/env bash
# The first thing to run on a new GPU node: bash scripts/gpu_check.sh (under 10 minutes on one node).
# It checks every layout the node allows: with 2+ GPUs "own" (a GPU per rank, weights by NCCL) and "shared" (every rank
# on one GPU, CUDA IPC); with 1 GPU shared only; without a GPU a CPU dry run (gloo, tiny model only). Per layout:
#  1. weight transport alone (scripts/check_transport.py): 5 pushes of the 1.1B shape (CPU: tiny), bit-exact, timed
#  2. train.py, trainer + 1 searcher, 4 steps, check_sync=true, for the tiny model (assets/tiny-arith/sft) and a
#     TinyLlama-1.1B-shaped model (random bf16 weights built here, no download); engine vllm if it imports, else hf.
#     With a GPU per rank for 3+ ranks also own-<model>-overlap-2trainers: the same with n_trainers=2 and
#     push_overlap=true, rank 0's NCCL weight broadcast in flight beside the trainer group's NCCL collectives (a
#     deadlock NCCL warns of, so train.py refuses it unless TBA_CHECK_NCCL_OVERLAP=1); a hang ends at the timeout: FAIL
#  3. faults (scripts/kill_check.py): the searcher SIGKILLed at step 3 of a run with max_restarts=1 must heal (one
#     restart, every step logged once); with a GPU per rank for 3+ ranks (and on CPU) a trainer rank of n_trainers=2
#     SIGKILLed must end the job within 150 s naming it, though rank 0 waits in a collective (NCCL: the watchdog)
# and once: 4. a bare forward+backward+AdamW of one micro-batch, the MFU the loop is compared with.
# SHAPE=7b instead runs the 7B-shaped memory checks alone (scripts/plan_vs_measured.py --shape 7b, ~4 minutes on one
# GPU of 80+ GB): Qwen2.5-7B-shaped random bf16 weights, a train step of the MATH recipe's micro-batch (8 x 2304,
# checkpointed), of its LoRA variant (4 x 2304, rank 64) and the searcher's reference pass, each one's peak GPU memory
# against the plan (PASS: within 25%).
# Prints one PASS/FAIL table (probe match, sync and push seconds, MFU, trainer and searcher tokens/s, peak memory; by
# scripts/gpu_check_table.py) and exits 1 when a check failed. Every step has a timeout, all share BUDGET_S seconds.
# Env: OUT (results, logs: out/gpu_check), PY (python3), SHAPE (all | tiny | 1b | 7b; CPU: tiny), ENGINE (vllm | hf),
#      PEAK_TFLOPS (790, the H200's measured bf16 peak: set yours for the MFU), BUDGET_S (540).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_check}; PY=${PY:-python3}; BUDGET_S=${BUDGET_S:-540}; PEAK_TFLOPS=${PEAK_TFLOPS:-790}
mkdir -p "$OUT"; : > "$OUT/checks.tsv"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$SECONDS; PORT=$((29500 + RANDOM % 400))

# check CASE KIND RESULT CAP CMD...: CMD under a timeout (CAP seconds or what is left of BUDGET_S), its output in
# $OUT/CASE.log, one line in $OUT/checks.tsv for the table
check() {
  local case=$1 kind=$2 result=$3 cap=$4 rc=124; shift 4
  local t=$((BUDGET_S - (SECONDS - START))); [ "$cap" -lt "$t" ] && t=$cap
  echo "== $case (timeout ${t}s)"
  if [ "$t" -ge 10 ]; then
    timeout -k 10 "$t" "$@" > "$OUT/$case.log" 2>&1; rc=$?
  else
    echo "not run: no time left of BUDGET_S=$BUDGET_S" > "$OUT/$case.log"
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$case" "$kind" "$rc" "$result" "$OUT/$case.log" >> "$OUT/checks.tsv"
  PORT=$((PORT + 1))
}

timeout 30 nvidia-smi -L 2>/dev/null
timeout 120 $PY -c "import torch, transformers as t; print('torch', torch.__version__, 'transformers', t.__version__)"
# the node's GPUs as train.py sees them (train.GPUS: CUDA_VISIBLE_DEVICES, else nvidia-smi), none without CUDA in torch
GPUS=$(timeout 120 $PY -c "import train, torch; print(','.join(train.GPUS) if torch.cuda.is_available() else '')" \
  2>/dev/null | tail -1)
ENGINE=${ENGINE:-$(timeout 120 $PY -c "import vllm" >/dev/null 2>&1 && echo vllm || echo hf)}
IFS=, read -ra G <<< "$GPUS"
if [ ${#G[@]} -ge 2 ]; then LAYOUTS="own shared"; elif [ ${#G[@]} -eq 1 ]; then LAYOUTS=shared; else LAYOUTS=cpu; fi
SHAPE=${SHAPE:-all}; DTYPE=bfloat16; PEAK=$PEAK_TFLOPS
[ ${#G[@]} -eq 0 ] && SHAPE=${SHAPE/all/tiny} && DTYPE=float32 && PEAK=0  # CPU dry run
MODELS=$SHAPE; [ "$SHAPE" = all ] && MODELS="tiny 1b"
TSHAPE=tiny; [ "$SHAPE" != tiny ] && TSHAPE=tinyllama
echo "GPUs: ${GPUS:-none}; layouts: $LAYOUTS; models: $MODELS; engine: $ENGINE; results: $OUT"

if [ "$SHAPE" = 7b ]; then
  [ ${#G[@]} -eq 0 ] && echo "SHAPE=7b needs a GPU" && exit 2
  check "plan-7b" plan "$OUT/plan_7b.json" 500 env CUDA_VISIBLE_DEVICES=${G[0]} $PY scripts/plan_vs_measured.py \
    --shape 7b --json "$OUT/plan_7b.json"
  LAYOUTS=; MODELS=
fi

if [[ " $MODELS " == *" 1b "* ]] && [ ! -d "$OUT/model_1b" ]; then
  echo "== building the 1.1B-shaped random model in $OUT/model_1b"
  CUDA_VISIBLE_DEVICES=${G[0]:-} timeout 300 $PY - "$OUT/model_1b" <<'PYEOF'
import os, sys, torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
tok = AutoTokenizer.from_pretrained("assets/tiny-arith/sft")  # its tokenizer: the arith task's prompts
cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                  num_attention_heads=32, num_key_value_heads=4, tie_word_embeddings=False,
                  max_position_embeddings=2048,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(sys.argv[1] + ".tmp"); tok.save_pretrained(sys.argv[1] + ".tmp")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print("model", sum(p.numel() for p in model.parameters()), "parameters")
PYEOF
fi

STEPS="n_searchers=1 steps=4 k=2 B=4 K=8 S=8 chunk_prompts=2 max_prompts_per_round=0 initial_buffer=32 micro_batch=32
  n_test=8 eval_every=0 eval_max_new_tokens=16 time_budget_min=0 check_sync=true progress=false overwrite=true"
for LAYOUT in $LAYOUTS; do
  case $LAYOUT in
    own) CVD=${G[0]},${G[1]}; WT=nccl ;;
    shared) CVD=${G[0]}; WT=ipc ;;
    cpu) CVD=; WT=gloo ;;
  esac
  check "$LAYOUT-transport" transport "$OUT/$LAYOUT-transport.json" 120 env CUDA_VISIBLE_DEVICES=$CVD \
    $PY -m torch.distributed.run --nproc_per_node=2 --master_port=$PORT scripts/check_transport.py --shape $TSHAPE \
    --transport $WT --pushes 5 --json "$OUT/$LAYOUT-transport.json"
  for M in $MODELS; do
    if [ "$M" = tiny ]; then MODEL=assets/tiny-arith/sft; EXTRA=; CAP=150
    else MODEL=$OUT/model_1b; CAP=200
      EXTRA="B=8 K=16 S=16 chunk_prompts=4 initial_buffer=128 max_new_tokens=128"  # GSM8K-like lengths, 4 steps
    fi
    check "$LAYOUT-$M-$ENGINE" train "$OUT/$LAYOUT-$M" $CAP env CUDA_VISIBLE_DEVICES=$CVD \
      $PY -m torch.distributed.run --nproc_per_node=2 --master_port=$PORT train.py configs/tiny.yaml \
      out_dir="$OUT/$LAYOUT-$M" model="$MODEL" dtype=$DTYPE engine=$ENGINE weight_transport=$WT peak_tflops=$PEAK \
      $STEPS $EXTRA
    if [ "$LAYOUT" = own ] && [ ${#G[@]} -ge 3 ]; then  # the combination train.py refuses until this passes
      check "own-$M-overlap-2trainers" train "$OUT/own-$M-overlap-2trainers" $CAP env TBA_CHECK_NCCL_OVERLAP=1 \
        CUDA_VISIBLE_DEVICES=${G[0]},${G[1]},${G[2]} $PY -m torch.distributed.run --nproc_per_node=3 \
        --master_port=$PORT train.py configs/tiny.yaml out_dir="$OUT/own-$M-overlap-2trainers" model="$MODEL" \
        dtype=$DTYPE engine=$ENGINE weight_transport=nccl peak_tflops=$PEAK $STEPS $EXTRA n_trainers=2 push_overlap=true
    fi
  done
  KILL="model=assets/tiny-arith/sft dtype=$DTYPE engine=$ENGINE weight_transport=$WT n_test=8 eval_every=0
    time_budget_min=0 timeout_s=120"
  check "$LAYOUT-kill-searcher" kill "$OUT/$LAYOUT-kill-searcher.json" 240 env CUDA_VISIBLE_DEVICES=$CVD \
    $PY scripts/kill_check.py --out "$OUT/$LAYOUT-kill-searcher" --rank 1 --at-step 3 --expect heal \
    --json "$OUT/$LAYOUT-kill-searcher.json" -- $KILL n_searchers=1 steps=10
  if [ "$LAYOUT" = cpu ] || { [ "$LAYOUT" = own ] && [ ${#G[@]} -ge 3 ]; }; then
    [ "$LAYOUT" = own ] && CVD=${G[0]},${G[1]},${G[2]}
    check "$LAYOUT-kill-trainer" kill "$OUT/$LAYOUT-kill-trainer.json" 240 env CUDA_VISIBLE_DEVICES=$CVD \
      $PY scripts/kill_check.py --out "$OUT/$LAYOUT-kill-trainer" --rank 1 --at-step 3 --expect stop --deadline 150 \
      --json "$OUT/$LAYOUT-kill-trainer.json" -- $KILL n_trainers=2 n_searchers=1 steps=100000
  fi
done

BARE=tiny; BARE_MODEL=assets/tiny-arith/sft; [ "$TSHAPE" = tinyllama ] && BARE=1b && BARE_MODEL=$OUT/model_1b
[ "$SHAPE" != 7b ] && check "bare-$BARE" bare "$OUT/bare.json" 90 env CUDA_VISIBLE_DEVICES=${G[0]:-} $PY - "$BARE_MODEL" "$OUT/bare.json" \
  "$PEAK" <<'PYEOF'
# bare forward + backward + AdamW of one micro-batch: 20 x 552 tokens on a GPU (GSM8K's shape), 8 x 128 on a CPU
import json, sys, time, torch
from transformers import AutoModelForCausalLM
dev = "cuda" if torch.cuda.is_available() else "cpu"
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16 if dev == "cuda" else torch.float32).to(dev)
opt = torch.optim.AdamW(m.parameters(), lr=1e-5)
n, L = (20, 552) if dev == "cuda" else (8, 128)
L = min(L, m.config.max_position_embeddings)
x = torch.randint(0, 100, (n, L), device=dev)
def step():
    loss = m(input_ids=x, labels=x).loss; loss.backward(); opt.step(); opt.zero_grad()
for _ in range(2): step()
if dev == "cuda": torch.cuda.synchronize()
t = time.perf_counter(); reps = 5
for _ in range(reps): step()
if dev == "cuda": torch.cuda.synchronize()
dt = (time.perf_counter() - t) / reps
N, peak = sum(p.numel() for p in m.parameters()), float(sys.argv[3])
res = {"what": f"bare fwd+bwd+AdamW, {n} x {L} tokens", "seconds": dt, "tokens_per_s": n * L / dt,
       "mfu": 6 * N * n * L / dt / (peak * 1e12) if peak else 0.0,
       "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else 0.0}
print(json.dumps(res)); json.dump(res, open(sys.argv[2], "w"))
PYEOF

echo "== results ($((SECONDS - START)) s; logs and runs in $OUT)"
timeout 60 $PY scripts/gpu_check_table.py "$OUT/checks.tsv" | tee "$OUT/table.txt"
exit "${PIPESTATUS[0]}"
