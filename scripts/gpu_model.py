"""A model of seconds per trainer step on one 16-GPU node for configs/gsm8k.yaml, with vLLM on both sides. Every input
is marked measured (where, when) or assumed; every output is a prediction: no GPU with vLLM has run this code.

    python scripts/gpu_model.py                  # the table in docs/performance.md
    python scripts/gpu_model.py --decode-ms 8    # the same with another assumed input (--help: all of them)

Work is held equal across the arms: each step trains on B x K = 140 samples that were generated for it (replay ratio
1: the synchronous arms generate exactly that; the asynchronous arms are counted at the fresh samples they must supply,
and the table says how many more they could). Each arm:

  our sync, 1 + 15     async=false: the 15 searchers generate the batch (B = 7 prompts: one prompt's S samples each on
                       7 of them, 8 idle), the trainer waits, trains, pushes; the searchers wait meanwhile
                       step = L_tail x d + t_score + T_train(1) + T_push
  strong sync, 16      what this code does not do (verl's colocated "hybrid engine"): all 16 GPUs generate the batch,
                       then all 16 train it (data parallel), then the engines take the new weights in place
                       step = L_tail x d + t_score + T_train(16) + T_switch
  async chunks, T + n  T trainers (DDP) + n searchers generating chunks; a round every k steps waits for every
                       searcher's current chunk, which lasts C = L_tail x d (latency bound, whatever its size)
                       step = max(T_train(T) + T_push / k, C / k)   when the trainer outruns the chunks
  async in-flight, T+n the searchers join a round within one engine step (sync.py, comm.ready)
                       step = T_train(T) + (T_push + d_full + t_1) / k
  with T_train(T) = T_train(1) / T + t_allreduce (DDP; B prompts split evenly: for B = 7, T is 1 or 7).
Supply: an asynchronous searcher keeps max_inflight sequences running, max_inflight / (ell x d_full) samples per
second, and a step takes at least B x K / (n x that) (generation bound). The table prints supply / demand per step:
above 1 the trainer is the limit (the searchers could search more per step than replay ratio 1 needs), 1 when
generation is.
"""
import argparse

# (value, where it comes from); "measured" figures are from docs/performance.md's H200 sections
INPUTS = {
    "train_1": (1.8, "measured: H200, 2026-11-30, trainer step of 140 samples x ~552 tokens, 1.1B bf16, HF model "
                     "(MFU 33-41%), synchronous mode so the GPU was not shared"),
    "push": (0.010, "measured as CUDA IPC (8.5 ms, 2.2 GB, H200 2026-11-30); NCCL broadcast to 15 GPUs assumed the "
                    "same (2.2 GB at ~300 GB/s NVLink bus bandwidth is 7 ms)"),
    "allreduce": (0.013, "assumed: 2.2 GB bf16 gradients, ring all-reduce 2 (T-1)/T x 2.2 GB at 300 GB/s, not "
                         "overlapped with the backward pass (an upper bound)"),
    "decode_ms": (3.5, "assumed: a vLLM decode step (CUDA graphs) of a 1.1B model at up to ~100 sequences (a "
                       "synchronous round, a chunk); the HF engine with a static cache measured 8.7 ms at 140 "
                       "(H200, 2026-11-29), the weights' memory floor is 0.5 ms"),
    "decode_full_ms": (6.0, "assumed: the same at max_inflight sequences (in-flight search)"),
    "L_tail": (400, "assumed: tokens of the longest of a round's sequences (max_new_tokens = 512 caps it)"),
    "ell": (200, "assumed: mean response tokens of the Rho-1B SFT model on GSM8K"),
    "score": (0.05, "assumed: reference log-probs of a round's samples and the rewards after the last sequence ends"),
    "t_1": (0.02, "assumed: scoring the sequences that finish in the last engine step before a gather"),
    "switch": (0.2, "assumed: a colocated engine's switch from training to generation and back (weights in place, "
                    "KV cache released and rebuilt)"),
    "max_inflight": (256, "assumed: sequences a searcher keeps running (max_inflight)"),
}
K, k, GPUS = 20, 2, 16  # configs/gsm8k.yaml, one 16-GPU node


def model(x):
    """[(arm, trainers + searchers, seconds per step, supply / demand)] for the inputs x ({name: value}) and B
    prompts per step (the trainer's step scales with B: train_1 is for 7)."""
    d, d_full, B = x["decode_ms"] / 1000, x["decode_full_ms"] / 1000, int(x["B"])
    gen = x["L_tail"] * d + x["score"]  # a synchronous round's generation: latency bound
    per_searcher = x["max_inflight"] / (x["ell"] * d_full)  # samples per second, continuous batching

    def train(t):
        return x["train_1"] * B / 7 / t + (x["allreduce"] if t > 1 else 0.0)

    rows = [("our sync (async=false)", "1 + 15", gen + train(1) + x["push"], None),
            ("strong sync, colocated (not in this code)", "16 (all)", gen + train(GPUS) + x["switch"], None)]
    for t in (t for t in range(1, GPUS) if B % t == 0):  # trainer ranks take B / T prompts each
        n = GPUS - t
        chunks = max(train(t) + x["push"] / k, x["L_tail"] * d / k)
        inflight = train(t) + (x["push"] + d_full + x["t_1"]) / k
        bound = B * K / (n * per_searcher)  # generation: the n searchers supply a step's samples
        for name, step in (("async chunks", chunks), ("async in-flight", inflight)):
            rows.append((name, f"{t} + {n}", max(step, bound), n * per_searcher * max(step, bound) / (B * K)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, (value, why) in INPUTS.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=float, default=value, help=why)
    ap.add_argument("--B", type=int, default=7, help="prompts per step (configs/gsm8k.yaml: 7)")
    x = vars(ap.parse_args())
    rows = model(x)
    base = rows[1][2]  # the strong synchronous baseline
    print("| arm | trainers + searchers | s / step (predicted) | vs strong sync | vs our sync | "
          "fresh-sample supply / demand |")
    print("|---|---|---|---|---|---|")
    for name, split, step, supply in rows:
        print(f"| {name} | {split} | {step:.2f} | {base / step:.2f}x | {rows[0][2] / step:.2f}x | "
              f"{'-' if supply is None else f'{supply:.1f}'} |")
    print("\ninputs:")
    print(f"- B = {x['B']}, K = {K}, k = {k}, {GPUS} GPUs (configs/gsm8k.yaml, one node)")
    for name, (value, why) in INPUTS.items():
        print(f"- {name} = {x[name]:g}{' (changed)' if x[name] != value else ''}: {why}")


if __name__ == "__main__":
    main()
