"""The memory plan (plan.py) against a measurement: a train step's activation memory and a searcher's no-grad log-prob
pass, for a random model of a given shape, each case in a fresh process.

    python scripts/plan_vs_measured.py [--json out/plan_vs_measured.json]            this machine's CPU, a mid-size Llama
    python scripts/plan_vs_measured.py --shape 7b [--json ...]                       one GPU, the Qwen2.5-7B shape
                                                                                     (scripts/gpu_check.sh runs it)
    python scripts/plan_vs_measured.py --shape 1b [--json ...]                       one GPU, the GSM8K recipe's
                                                                                     1.1B shape (gpu_check.sh too)

CPU: 12 layers, hidden 512, MLP 1376, 8 heads, vocab 32000, float32 (71M parameters), built here with random weights.
Train step: token_logprobs + the TB loss + backward on n samples of 1024 tokens (a 32-token prompt + 992 response
tokens), as Learner.optimizer_step runs a micro-batch. Measured: the process's peak RSS during the step minus its RSS just
before it (after a warm-up step on 2 short samples has allocated the gradients and AdamW states), against the plan's
activations + LM-head chunk for the same shape, n and sequence. Searcher: policy.sequence_logprobs over 48 sequences
of 1024 tokens at logprob_tokens 49152 (one pass) and 4096 (twelve passes), against the plan's no-grad forward.
On a CPU the glibc allocator and PyTorch's CPU kernels decide what the RSS shows: each case runs with
MALLOC_MMAP_THRESHOLD_=65536, so that every large tensor is its own mapping, returned when freed (glibc's default
raises that threshold as blocks are freed, after which freed tensors stay in the heap and the RSS counts them: a LoRA
step then showed 1.5 GB more than full fine-tuning, with fewer live tensors).
--shape 7b: Qwen2.5-7B's shape in bfloat16 on the GPU, sequences of 2304 tokens (256 prompt + 2048 new: the MATH
recipe's), the micro-batches of configs/math_tba_prime.yaml (8, checkpointed) and of its LoRA variant (4, rank 64),
and the searcher's pass at logprob_tokens 16384 and 8192. Measured: torch.cuda.max_memory_allocated during the case
minus memory_allocated before it; the whole peak (weights, gradients, AdamW states too) is reported beside the plan's
sum of the same rows.
--shape 1b: the same on the GPU for configs/gsm8k.yaml: Rho-1B's (TinyLlama-1.1B's) shape in bfloat16, 256 prompt +
512 new tokens, a micro-batch of K = 20 samples (micro_batch=0) and the searcher's pass over a generation call's 72
sequences (chunk_prompts 3 x S 24) at logprob_tokens 16384.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = dict(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=12, num_attention_heads=8,
             num_key_value_heads=8, tie_word_embeddings=False)
QWEN_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)  # plan.KNOWN_SHAPES's
TINYLLAMA_1B = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                    num_attention_heads=32, num_key_value_heads=4, tie_word_embeddings=False)  # plan.KNOWN_SHAPES's
LENGTHS = {"cpu": (32, 992), "7b": (256, 2048), "1b": (256, 512)}  # (prompt, response) tokens
PARAMS = {"7b": 7_615_616_512, "1b": 1_100_048_384}  # the published counts (plan.KNOWN_SHAPES)
CASES_7B = [  # (name, kind, n sequences, grad_checkpointing, logprob_tokens); kind lora: rank-64 adapters
    ("7B train, 8 x 2304, checkpointed (math_tba_prime)", "train", 8, True, 0),
    ("7B LoRA train, 4 x 2304, checkpointed (..._lora)", "lora", 4, True, 0),
    ("7B searcher log-probs, 7 x 2304, logprob_tokens 16384", "ref", 7, False, 16384),
    ("7B searcher log-probs, 3 x 2304, logprob_tokens 8192", "ref", 3, False, 8192),
]
CASES_1B = [
    ("1.1B train, 20 x 768 (gsm8k)", "train", 20, False, 0),
    ("1.1B searcher log-probs, 72 x 768, logprob_tokens 16384", "ref", 72, False, 16384),
]
CASES = [  # (name, kind, n sequences, grad_checkpointing, logprob_tokens)
    ("train, 4 x 1024, whole", "train", 4, False, 0),
    ("train, 4 x 1024, checkpointed", "train", 4, True, 0),
    ("train, 2 x 1024 (micro-batch below K = 4)", "train", 2, False, 0),
    ("train, 1 x 1024 (micro-batch below K = 4)", "train", 1, False, 0),
    ("train, 4 x 1024, LoRA rank 64", "lora", 4, False, 0),
    ("searcher log-probs, 48 x 1024, one pass", "ref", 48, False, 49152),
    ("searcher log-probs, 48 x 1024, 4096 at a time", "ref", 48, False, 4096),
]


def rss_gb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def build(shape):
    """A random model of `shape` ("cpu": the mid-size Llama in float32 on the CPU; "7b": Qwen2.5-7B, "1b":
    TinyLlama-1.1B, in bfloat16 on the GPU) and its vocabulary size."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    if shape == "cpu":
        return LlamaForCausalLM(LlamaConfig(**SHAPE)), SHAPE["vocab_size"]
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        if shape == "1b":
            model = LlamaForCausalLM(LlamaConfig(**TINYLLAMA_1B))
        else:
            model = Qwen2ForCausalLM(Qwen2Config(**QWEN_7B))
    torch.set_default_dtype(torch.float32)
    return model, model.config.vocab_size


def measure(shape, kind, n, checkpointed, budget):
    """In this (fresh) process: (GB the case adds above what was allocated before it, the whole peak in GB)."""
    import torch

    from learner import lora_model
    from losses import tb_loss
    from policy import sequence_logprobs, token_logprobs
    model, vocab = build(shape)
    gpu = shape != "cpu"
    if kind == "lora":
        model = lora_model(model, types.SimpleNamespace(lora_rank=64, lora_alpha=64.0, seed=0))
    if checkpointed:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    prompt, response = LENGTHS[shape]
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, vocab, (prompt,), generator=g).tolist() for _ in range(n)]
    responses = [torch.randint(4, vocab, (response,), generator=g).tolist() for _ in range(n)]

    def now():
        return torch.cuda.memory_allocated() / 2**30 if gpu else rss_gb()
    if kind == "ref":
        model.eval()
        sequence_logprobs(model, prompts[:1], [responses[0][:8]], 1.0, budget)  # warm-up
        before = now()
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        sequence_logprobs(model, prompts, responses, 1.0, budget)
    else:
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)

        def step(p, r):
            logp, mask = token_logprobs(model, p, r, 1.0)
            seq = (logp.float() * mask).sum(1)
            tb_loss(seq, seq.detach() * 0.9, torch.ones(len(p), device=seq.device), 0.1,
                    torch.zeros(len(p), device=seq.device)).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)  # gradients stay allocated, as the plan counts them
        step([p[:4] for p in prompts[:2]], [r[:4] for r in responses[:2]])  # allocates gradients and AdamW states
        before = now()
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        step(prompts, responses)
    if gpu:
        peak = torch.cuda.max_memory_allocated() / 2**30
        return peak - before, peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20 - before, 0.0


def plan_shape(shape):
    cfg = {"cpu": SHAPE, "7b": QWEN_7B, "1b": TINYLLAMA_1B}[shape]
    params = PARAMS.get(shape, 0)
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    return dict(params=params, layers=cfg["num_hidden_layers"], hidden=h, intermediate=cfg["intermediate_size"],
                heads=heads, kv_dim=cfg["num_key_value_heads"] * h // heads, vocab=cfg["vocab_size"], gated=True)


def planned(shape, kind, n, checkpointed):
    """The plan's GB for the same case: (what the case adds, the whole peak: with the weights, and for a train step
    the gradients and AdamW states, as the plan's trainer rows count them)."""
    import plan
    s, e = plan_shape(shape), 4 if shape == "cpu" else 2
    prompt, response = LENGTHS[shape]
    seq = prompt + response
    if kind == "ref":
        added = plan.nograd_forward(s, e, n, seq)
        return added / 2**30, (added + plan.weights(s, e)) / 2**30
    rank = 64 if kind == "lora" else 0
    added = plan.trainer_activations(s, e, n, seq, checkpointed, rank) + plan.lm_head_chunk(s, n * response)
    if kind == "lora":  # the adapters, their gradients and AdamW states in float32
        states = s["params"] * e + 4 * plan.lora_params(s, rank) * 4
    else:
        states = plan.weights(s, e) * 2 + plan.adamw_states(s, e)
    return added / 2**30, (added + states) / 2**30


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="")
    ap.add_argument("--shape", choices=("cpu", "7b", "1b"), default="cpu")
    ap.add_argument("--case", type=int, default=-1, help=argparse.SUPPRESS)  # one case, in a fresh process
    a = ap.parse_args()
    sys.path.insert(0, ROOT)
    cases = {"cpu": CASES, "7b": CASES_7B, "1b": CASES_1B}[a.shape]
    if a.case >= 0:
        name, kind, n, ckpt, budget = cases[a.case]
        print(json.dumps(measure(a.shape, kind, n, ckpt, budget)))
        return 0
    rows = []
    seq = sum(LENGTHS[a.shape])
    for i, (name, kind, n, ckpt, budget) in enumerate(cases):
        p = subprocess.run([sys.executable, __file__, "--shape", a.shape, "--case", str(i)], capture_output=True,
                           text=True, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="2", PYTHONPATH=ROOT,
                                                         MALLOC_MMAP_THRESHOLD_="65536"))
        if p.returncode:
            print(p.stderr[-2000:], file=sys.stderr)
            return 1
        got, got_peak = json.loads(p.stdout.strip().splitlines()[-1])
        # the searcher's budgeted passes: the plan counts one pass of budget // seq sequences
        n_plan = min(n, max(1, budget // seq)) if kind == "ref" else n
        want, want_peak = planned(a.shape, kind, n_plan, ckpt)
        row = dict(case=name, measured_gb=round(got, 3), planned_gb=round(want, 3),
                   plan_over_measured=round(want / got, 2))
        line = f"{name:<54} measured {got:6.2f} GB   plan {want:6.2f} GB   plan / measured {want / got:5.2f}"
        if got_peak:
            row.update(peak_gb=round(got_peak, 2), planned_peak_gb=round(want_peak, 2))
            line += f"   whole peak {got_peak:6.1f} GB, plan {want_peak:6.1f} GB"
        rows.append(row)
        print(line, flush=True)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
