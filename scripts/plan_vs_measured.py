"""The memory plan (plan.py) against a measurement on this machine's CPU: a train step's activation memory and a
searcher's no-grad log-prob pass, for a mid-size random Llama, each case in a fresh process.

    python scripts/plan_vs_measured.py [--json out/plan_vs_measured.json]

Model: 12 layers, hidden 512, MLP 1376, 8 heads, vocab 32000, float32 (71M parameters), built here with random weights.
Train step: token_logprobs + the TB loss + backward on n samples of 1024 tokens (a 32-token prompt + 992 response
tokens), as Learner.update runs a micro-batch. Measured: the process's peak RSS during the step minus its RSS just
before it (after a warm-up step on 2 short samples has allocated the gradients and AdamW states), against the plan's
activations + LM-head chunk for the same shape, n and sequence. Searcher: policy.sequence_logprobs over 16 sequences
of 1024 tokens at logprob_tokens 16384 (one pass) and 4096 (four passes), against the plan's no-grad forward.
On a CPU the glibc allocator and PyTorch's CPU kernels decide what the RSS shows; a GPU's peak allocated memory
(torch.cuda.max_memory_allocated, scripts/gpu_check.sh) is the figure the plan is meant for.
"""
import argparse
import json
import os
import resource
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = dict(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=12, num_attention_heads=8,
             num_key_value_heads=8, tie_word_embeddings=False)
PROMPT, RESPONSE = 32, 992
CASES = [  # (name, kind, n sequences, grad_checkpointing, logprob_tokens)
    ("train, 4 x 1024, whole", "train", 4, False, 0),
    ("train, 4 x 1024, checkpointed", "train", 4, True, 0),
    ("train, 2 x 1024 (micro-batch below K = 4)", "train", 2, False, 0),
    ("train, 1 x 1024 (micro-batch below K = 4)", "train", 1, False, 0),
    ("searcher log-probs, 16 x 1024, one pass", "ref", 16, False, 16384),
    ("searcher log-probs, 16 x 1024, 4096 at a time", "ref", 16, False, 4096),
]


def rss_gb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def measure(kind, n, checkpointed, budget):
    """In this (fresh) process: GB the case adds above the RSS before it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from losses import tb_loss
    from policy import sequence_logprobs, token_logprobs
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    if checkpointed:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, 32000, (PROMPT,), generator=g).tolist() for _ in range(n)]
    responses = [torch.randint(4, 32000, (RESPONSE,), generator=g).tolist() for _ in range(n)]
    if kind == "ref":
        model.eval()
        sequence_logprobs(model, prompts[:1], [responses[0][:8]], 1.0, budget)  # warm-up
        before = rss_gb()
        sequence_logprobs(model, prompts, responses, 1.0, budget)
    else:
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

        def step(p, r):
            logp, mask = token_logprobs(model, p, r, 1.0)
            seq = (logp * mask).sum(1)
            tb_loss(seq, seq.detach() * 0.9, torch.ones(len(p)), 0.1, torch.zeros(len(p))).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)  # gradients stay allocated, as the plan counts them
        step([p[:4] for p in prompts[:2]], [r[:4] for r in responses[:2]])  # allocates gradients and AdamW states
        before = rss_gb()
        step(prompts, responses)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return peak - before


def planned(kind, n, checkpointed):
    """The plan's GB for the same case (float32: 4 bytes)."""
    import plan
    shape = dict(params=0, layers=SHAPE["num_hidden_layers"], hidden=SHAPE["hidden_size"],
                 intermediate=SHAPE["intermediate_size"], heads=SHAPE["num_attention_heads"],
                 kv_dim=SHAPE["hidden_size"], vocab=SHAPE["vocab_size"], gated=True)
    seq = PROMPT + RESPONSE
    if kind == "ref":
        return plan.nograd_forward(shape, 4, n, seq) / 2**30
    return (plan.trainer_activations(shape, 4, n, seq, checkpointed) + plan.lm_head_chunk(shape, n * RESPONSE)) / 2**30


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="")
    ap.add_argument("--case", type=int, default=-1, help=argparse.SUPPRESS)  # one case, in a fresh process
    a = ap.parse_args()
    sys.path.insert(0, ROOT)
    if a.case >= 0:
        name, kind, n, ckpt, budget = CASES[a.case]
        print(json.dumps(measure(kind, n, ckpt, budget)))
        return 0
    rows = []
    for i, (name, kind, n, ckpt, budget) in enumerate(CASES):
        p = subprocess.run([sys.executable, __file__, "--case", str(i)], capture_output=True, text=True, cwd=ROOT,
                           env=dict(os.environ, OMP_NUM_THREADS="2", PYTHONPATH=ROOT))
        if p.returncode:
            print(p.stderr[-2000:], file=sys.stderr)
            return 1
        got = float(p.stdout.strip().splitlines()[-1])
        # the searcher's budgeted passes: the plan counts one pass of budget // seq sequences
        n_plan = n if kind == "train" else min(n, budget // (PROMPT + RESPONSE))
        want = planned(kind, n_plan, ckpt)
        rows.append(dict(case=name, measured_gb=round(got, 3), planned_gb=round(want, 3),
                         plan_over_measured=round(want / got, 2)))
        print(f"{name:<50} measured {got:6.2f} GB   plan {want:6.2f} GB   plan / measured {want / got:5.2f}",
              flush=True)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
