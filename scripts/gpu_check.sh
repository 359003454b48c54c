#!/usr/bin/env bash
# GPU check on ONE GPU (about 5 minutes): the single-GPU workstation layout, trainer + 1 searcher sharing the GPU.
#  1. weight transport alone: a TinyLlama-1.1B-shaped model, CUDA IPC, verified bit for bit, timed
#  2. the real loop: train.py with that model (random weights, bf16), HF engine, GSM8K batch shape (7 prompts x K=20,
#     S=20, 512 new tokens); logs sync seconds, trainer tokens/s, MFU and peak memory per step
#  3. bare forward+backward of one micro-batch of the same shape, for the MFU the loop is compared with
# Needs .cache/tiny-arith/sft (its tokenizer is reused). Results: $OUT (default out/gpu_check), table at the end.
#   SHAPE=tiny bash scripts/gpu_check.sh     # dry run of the same script on a CPU box
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_check}; SHAPE=${SHAPE:-tinyllama}; mkdir -p "$OUT"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
PY=${PY:-python3}
nvidia-smi -L 2>/dev/null; $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

echo "== 1. weight transport"
$PY -m torch.distributed.run --nproc_per_node=2 --master_port=29511 scripts/check_transport.py --shape "$SHAPE" \
  --pushes 5 --json "$OUT/transport.json" 2>&1 | grep -v "^W1" | tail -2

echo "== 2. the real loop"
$PY - "$SHAPE" <<'PYEOF'
import sys, torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
shapes = {"tiny": dict(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, head_dim=32),
          "tinyllama": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                            num_attention_heads=32, num_key_value_heads=4)}
tok = AutoTokenizer.from_pretrained(".cache/tiny-arith/sft")
cfg = LlamaConfig(**shapes[sys.argv[1]], tie_word_embeddings=False, max_position_embeddings=2048,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
with torch.device(dev):
    m = LlamaForCausalLM(cfg).to(torch.bfloat16 if dev == "cuda" else torch.float32)
m.save_pretrained("/tmp/gpu_check_model"); tok.save_pretrained("/tmp/gpu_check_model")
print("model", sum(p.numel() for p in m.parameters()), "params")
PYEOF
DT=bfloat16; [ "$SHAPE" = tiny ] && DT=float32
timeout 420 $PY -m torch.distributed.run --nproc_per_node=2 --master_port=29512 train.py configs/tiny.yaml \
  out_dir="$OUT/run" model=/tmp/gpu_check_model dtype=$DT engine=hf n_searchers=1 B=7 K=20 S=20 chunk_prompts=7 \
  max_new_tokens=512 micro_batch=20 steps=6 k=2 initial_buffer=140 n_test=32 eval_max_new_tokens=32 eval_every=0 \
  max_prompts_per_round=0 lr=1e-5 peak_tflops=790 check_sync=true time_budget_min=5 progress=false overwrite=true 2>&1 \
  | grep -v "^W1" | tail -5

echo "== 3. bare forward+backward, one micro-batch of 20 x 552 tokens"
$PY - <<'PYEOF' | tee "$OUT/bare.txt"
import time, torch
from transformers import AutoModelForCausalLM
dev = "cuda" if torch.cuda.is_available() else "cpu"
m = AutoModelForCausalLM.from_pretrained("/tmp/gpu_check_model").to(dev)
opt = torch.optim.AdamW(m.parameters(), lr=1e-5)
x = torch.randint(0, 100, (20, 552), device=dev)
def step():
    loss = m(input_ids=x, labels=x).loss; loss.backward(); opt.step(); opt.zero_grad()
for _ in range(2): step()
if dev == "cuda": torch.cuda.synchronize()
t = time.perf_counter(); n = 5
for _ in range(n): step()
if dev == "cuda": torch.cuda.synchronize()
dt = (time.perf_counter() - t) / n
N = sum(p.numel() for p in m.parameters())
print(f"bare fwd+bwd+AdamW: {dt:.3f} s per micro-batch, {20*552/dt:.0f} tok/s, MFU {6*N*20*552/dt/790e12:.1%}")
PYEOF

echo "== summary"
$PY - "$OUT" <<'PYEOF'
import json, sys, statistics as st
out = sys.argv[1]
t = json.load(open(f"{out}/transport.json"))
rows = [json.loads(l) for l in open(f"{out}/run/metrics.jsonl")]
s = json.load(open(f"{out}/run/summary.json"))
tr = [r for r in rows if "train/loss" in r]
push = [r["sync/push_seconds"] for r in rows if r.get("sync/push_seconds")]
def med(k): v = [r[k] for r in tr if k in r]; return st.median(v) if v else float("nan")
print(f"| transport ({t['transport']}, {t['bytes']/1e9:.2f} GB, {t['buckets']} buckets, verified) | median push {t['push_seconds_median']*1e3:.1f} ms |")
print(f"| loop: push seconds in sync rounds | mean {st.mean(push):.3f} s, max {max(push):.3f} s |")
print(f"| loop: sync round seconds | mean {st.mean([r['sync/seconds'] for r in rows if 'sync/seconds' in r]):.2f} s |")
print(f"| loop: trainer tokens/s (median step) | {med('perf/train_tokens_per_s'):.0f} |")
print(f"| loop: MFU (median step) | {med('perf/mfu'):.1%} |")
print(f"| loop: train seconds / step seconds (median) | {med('time/train_seconds'):.2f} / {med('time/step_seconds'):.2f} |")
print(f"| loop: peak memory (trainer) | {max(r.get('perf/peak_memory_gb', 0) for r in tr):.1f} GB |")
print(f"| loop: searcher tokens/s (HF engine) | {st.median([r['search/tokens_per_s'] for r in rows if r.get('search/tokens_per_s')]):.0f} |")
print(f"| loop: probe match after pushes | {[r['sync/probe_match'] for r in rows if 'sync/probe_match' in r]} |")
print(f"| loop: steps, wall, trainer busy | {s['steps']}, {s['wall_seconds']:.0f} s, {s['trainer_busy_fraction']:.0%} |")
PYEOF
