"""A model of the time one 16-GPU node takes to reach the accuracy of the paper's GSM8K recipe (configs/gsm8k.yaml),
with vLLM on both sides: a synchronous baseline at its best batch and layout against the asynchronous splits of this
code. Every input is marked measured or assumed and carries a plausible (low, high) range with its reason; every output
is a prediction: no GPU with vLLM has run this code.

    python scripts/gpu_model.py                  # time to equal accuracy at B = 7, 14, 28, 56; per-step table at --B
    python scripts/gpu_model.py --ranges         # the headline ratio's range over the inputs' ranges, and what moves it
    python scripts/gpu_model.py --decode-ms 8    # another value for an input (--help: all of them, with their ranges)

Time to equal accuracy. The recipe trains 700 steps of B = 7 prompts x K = 20 samples (98,000 samples). At B prompts
per step an arm takes 700 x (7 / B)^batch_exp steps to the same accuracy (batch_exp = 1: equal total samples, the
most a larger batch can buy), and an asynchronous arm (1 + c) times that, c being staleness's cost in steps. Each arm
is read at each B of 7, 14, 28, 56 (an asynchronous arm at its best split); the headline is the strong synchronous
arm's time at its best B over the best asynchronous arm's at its best B. `--ranges` varies every input over its
range (every corner of the box, and seeded uniform draws in it) and one at a time.

Work per step is held equal: each step trains on B x K samples that were generated for it (replay ratio 1: the
synchronous arms generate exactly that; the asynchronous arms are counted at the fresh samples they must supply, and
the per-step table says how many more they could). Each arm at B prompts per step:

  our sync, 1 + 15     async=false: the 15 searchers generate the batch (a prompt's samples on one searcher: for B = 7,
                       7 of them busy, 8 idle), the trainer waits, trains, pushes; the searchers wait meanwhile
                       step = gen + t_score + T_train(1) + T_push
  strong sync, 16      what this code does not do (verl's colocated "hybrid engine"): all 16 GPUs generate the batch,
                       then all 16 train it (data parallel), then the engines take the new weights in place
                       step = gen + t_score + T_train(16) + T_switch
  async chunks, T + n  T trainers (DDP) + n searchers generating chunks; a round every k steps waits for every
                       searcher's current chunk, which lasts C = L_tail x d (latency bound, whatever its size)
                       step = max(T_train(T) + T_push / k, C / k)   when the trainer outruns the chunks
  async in-flight, T+n the searchers join a round within one engine step (sync.py, comm.ready)
                       step = T_train(T) + (T_push + d_full + t_1) / k
  with T_train(T) = T_train(1) x B / 7 / T + t_allreduce (DDP; B prompts split evenly over T ranks) and gen, a
  synchronous round's generation, L_tail x d (latency bound) or, when larger, its sequences at a searcher's full rate.
Supply: an asynchronous searcher keeps max_inflight sequences running, max_inflight / (ell x d_full) samples per
second, and a step takes at least B x K / (n x that) (generation bound). The per-step table prints supply / demand:
above 1 the trainer is the limit (the searchers could search more per step than replay ratio 1 needs), 1 when
generation is.
"""
import argparse
import itertools
import math
import random

# name: (value, low, high, why). "measured" figures are from docs/performance.md's H200 sections; an assumed input's
# range is where its reason puts it, and --ranges varies each over its range.
INPUTS = {
    "train_1": (1.8, 1.6, 2.0, "measured: H200, 2026-11-30, trainer step of 140 samples x ~552 tokens, 1.1B bf16, "
                               "HF model, synchronous mode so the GPU was not shared; range: the steps' MFU spread, "
                               "33-41%"),
    "push": (0.010, 0.007, 0.03, "measured as CUDA IPC (8.5-10 ms, 2.2 GB, H200 2026-11-30); an NCCL broadcast to 15 "
                                 "GPUs assumed the same; range: 2.2 GB at 300 (7 ms) to 75 GB/s of bus bandwidth"),
    "allreduce": (0.013, 0.0, 0.03, "assumed: 2.2 GB bf16 gradients, ring all-reduce 2 (T-1)/T x 2.2 GB at 300 GB/s "
                                    "after the backward; range: fully overlapped with it (0) to 130 GB/s"),
    "decode_ms": (3.5, 2.0, 8.7, "assumed: a vLLM decode step (CUDA graphs) of a 1.1B model at up to ~100 sequences "
                                 "(a synchronous round, a chunk); range: 4x the weights' memory floor (0.5 ms) to the "
                                 "HF engine's measured 8.7 ms at 140 (static cache, H200 2026-11-29)"),
    "decode_full_ms": (6.0, 3.5, 12.0, "assumed: the same at max_inflight sequences (in-flight search; never below "
                                       "decode_ms); range: as decode_ms at ~100, to 2x it at 256"),
    "L_tail": (400, 250, 512, "assumed: tokens of the longest of a round's sequences; range: 1.25x the mean response "
                              "to max_new_tokens = 512, which caps it"),
    "ell": (200, 120, 300, "assumed: mean response tokens of the Rho-1B SFT model on GSM8K; range: a terse to a "
                           "verbose chain of thought"),
    "score": (0.05, 0.02, 0.2, "assumed: reference log-probs of a round's samples and the rewards after its last "
                               "sequence ends; range: one batched forward to a few"),
    "t_1": (0.02, 0.005, 0.05, "assumed: scoring the sequences that finish in the last engine step before a gather; "
                               "range: a few sequences to a batch"),
    "switch": (0.2, 0.05, 1.0, "assumed: a colocated engine's switch from training to generation and back (weights in "
                               "place, KV cache released and rebuilt); range: a weight copy to a full engine wake-up"),
    "max_inflight": (256, 128, 512, "assumed: sequences a searcher keeps running, a setting (max_inflight=256; 0, "
                                    "the default, gives 2 x chunk_prompts x S = 144 here); range: 128 to 512"),
    "c": (0.1, 0.0, 0.4, "assumed: staleness's cost, the asynchronous arms need (1 + c) x the steps; range: 0, the "
                         "paper's off-policy TBA matching on-policy baselines at ~15 updates of lag (Table 1, TL;DR) "
                         "and its asynchronous GSM8K result, to 0.4, above the upper end of TB's cost measured at 64 "
                         "updates of lag on the tiny task, -0.13 [-0.51, +0.25] (n = 8; docs/staleness.md, the "
                         "registered test), a lag far beyond this node's few updates"),
    "batch_exp": (1.0, 0.5, 1.0, "assumed: steps to accuracy scale as (7 / B)^batch_exp; 1 is equal total samples, "
                                 "the best case for a larger batch (below the critical batch size, McCandlish et al. "
                                 "2018, arXiv 1812.06162); range: 0.5, returns diminishing past it (the paper's GSM8K "
                                 "ablation, Fig. 7, plots 140 samples about level with larger batches), to 1"),
}
MEASURED = ("train_1", "push")
K, k, GPUS = 20, 2, 16  # configs/gsm8k.yaml, one 16-GPU node
BATCHES = (7, 14, 28, 56)  # prompts per step each arm is read at
REF_STEPS = 700  # the recipe's steps at B = 7
OURS, STRONG = "our sync (async=false)", "strong sync, colocated (not in this code)"
CHUNKS, INFLIGHT = "async chunks", "async in-flight"


def model(x):
    """[(arm, trainers + searchers, seconds per step, supply / demand)] for the inputs x ({name: value}) and B
    prompts per step (the trainer's step scales with B: train_1 is for 7)."""
    d, B = x["decode_ms"] / 1000, int(x["B"])
    d_full = max(x["decode_full_ms"] / 1000, d)
    per_searcher = x["max_inflight"] / (x["ell"] * d_full)  # samples per second, continuous batching

    def gen(samples_per_gpu):  # a synchronous round: latency bound unless a GPU's share takes longer at full rate
        return max(x["L_tail"] * d, samples_per_gpu / per_searcher) + x["score"]

    def train(t):
        return x["train_1"] * B / 7 / t + (x["allreduce"] if t > 1 else 0.0)

    rows = [(OURS, "1 + 15", gen(math.ceil(B / (GPUS - 1)) * K) + train(1) + x["push"], None),
            (STRONG, "16 (all)", gen(B * K / GPUS) + train(GPUS) + x["switch"], None)]
    for t in (t for t in range(1, GPUS) if B % t == 0):  # trainer ranks take B / T prompts each
        n = GPUS - t
        chunks = max(train(t) + x["push"] / k, x["L_tail"] * d / k)
        inflight = train(t) + (x["push"] + d_full + x["t_1"]) / k
        bound = B * K / (n * per_searcher)  # generation: the n searchers supply a step's samples
        for name, step in ((CHUNKS, chunks), (INFLIGHT, inflight)):
            rows.append((name, f"{t} + {n}", max(step, bound), n * per_searcher * max(step, bound) / (B * K)))
    return rows


def steps_to_accuracy(x, B, asynchronous):
    return REF_STEPS * (7 / B) ** x["batch_exp"] * ((1 + x["c"]) if asynchronous else 1.0)


def to_accuracy(x):
    """{B: {arm: (split, seconds per step, minutes to the recipe's accuracy)}} for B in BATCHES, each asynchronous
    arm at its fastest split."""
    out = {}
    for B in BATCHES:
        best = {}
        for name, split, step, _ in model(x | {"B": B}):
            minutes = steps_to_accuracy(x, B, name.startswith("async")) * step / 60
            if name not in best or minutes < best[name][2]:
                best[name] = (split, step, minutes)
        out[B] = best
    return out


def headline(x):
    """(strong sync's minutes at its best B / the best asynchronous arm's at its best B, strong sync's B,
    (the asynchronous arm, its split, its B))."""
    t = to_accuracy(x)
    b_sync = min(BATCHES, key=lambda B: t[B][STRONG][2])
    arm, B = min(((a, B) for B in BATCHES for a in (CHUNKS, INFLIGHT)), key=lambda p: t[p[1]][p[0]][2])
    return t[b_sync][STRONG][2] / t[B][arm][2], b_sync, (arm, t[B][arm][0], B)


def ranges(x, varied, draws=4000, seed=0):
    """The headline ratio over the box of the varied inputs' (low, high) ranges, the others held at x: (point,
    (min, max) over every corner of the box and every draw, (5th, 50th, 95th percentile) of `draws` uniform draws in
    the box (random.Random(seed)), [(input, ratio at its low, ratio at its high)] with the others at x, largest swing
    first)."""
    ratio = lambda y: headline(y)[0]
    box = [INPUTS[n][1:3] for n in varied]
    corners = [ratio(x | dict(zip(varied, c))) for c in itertools.product(*box)]
    rng = random.Random(seed)
    mc = sorted(ratio(x | {n: rng.uniform(lo, hi) for n, (lo, hi) in zip(varied, box)}) for _ in range(draws))
    pct = tuple(mc[round(p * (draws - 1))] for p in (0.05, 0.5, 0.95)) if mc else ()
    one = [(n, ratio(x | {n: lo}), ratio(x | {n: hi})) for n, (lo, hi) in zip(varied, box)]
    one.sort(key=lambda r: -abs(r[2] - r[1]))
    return ratio(x), (min(corners + mc), max(corners + mc)), pct, one


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, (value, lo, hi, why) in INPUTS.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=float, default=value, help=f"[{lo:g}, {hi:g}] {why}")
    ap.add_argument("--B", type=int, default=7, help="prompts per step of the per-step table (configs/gsm8k.yaml: 7)")
    ap.add_argument("--ranges", action="store_true", help="the headline ratio over the inputs' ranges (an input given "
                                                          "another value on the command line is held at it)")
    ap.add_argument("--draws", type=int, default=4000, help="uniform draws for --ranges (seed 0)")
    x = vars(ap.parse_args())
    changed = [n for n, v in INPUTS.items() if x[n] != v[0]]
    ratio, b_sync, (arm, split, b_async) = headline(x)
    if x["ranges"]:
        varied = [n for n in INPUTS if n not in changed and INPUTS[n][1] != INPUTS[n][2]]
        point, (lo, hi), (p5, p50, p95), one = ranges(x, varied, x["draws"])
        print(f"Headline: strong sync's time to the recipe's accuracy at its best B over the best asynchronous arm's "
              f"at its best B (B in {', '.join(map(str, BATCHES))}); predicted, not measured.")
        print(f"- at the inputs' values: {point:.2f}x")
        print(f"- range over every corner of the {len(varied)} inputs' box ({2 ** len(varied)} corners) and "
              f"{x['draws']} uniform draws in it: {lo:.2f}x to {hi:.2f}x")
        print(f"- the uniform draws (seed 0): median {p50:.2f}x, 5th-95th percentile {p5:.2f}x to {p95:.2f}x")
        if changed:
            print(f"- held at their command-line values: {', '.join(f'{n} = {x[n]:g}' for n in changed)}")
        print("\nOne at a time (the others at their values), largest swing first:\n")
        print("| input | measured / assumed | value | range | headline at low | headline at high |")
        print("|---|---|---|---|---|---|")
        for n, r_lo, r_hi in one:
            print(f"| {n} | {'measured' if n in MEASURED else 'assumed'} | {x[n]:g} | {INPUTS[n][1]:g}-"
                  f"{INPUTS[n][2]:g} | {r_lo:.2f}x | {r_hi:.2f}x |")
        return
    t = to_accuracy(x)
    print(f"Predicted minutes to the recipe's accuracy ({REF_STEPS} steps at B = 7; batch_exp = {x['batch_exp']:g}, "
          f"c = {x['c']:g}); asynchronous arms at their fastest split:\n")
    print("| B (samples per step) | our sync | strong sync | async chunks | async in-flight | "
          "strong sync / best async, this B |")
    print("|---|---|---|---|---|---|")
    for B in BATCHES:
        cells = [f"{t[B][a][2]:.1f}" + (f" ({t[B][a][0]})" if a.startswith("async") else "")
                 for a in (OURS, STRONG, CHUNKS, INFLIGHT)]
        print(f"| {B} ({B * K}) | {' | '.join(cells)} | "
              f"{t[B][STRONG][2] / min(t[B][CHUNKS][2], t[B][INFLIGHT][2]):.2f}x |")
    print(f"\nHeadline: {arm} ({split}) at B = {b_async} reaches it {ratio:.2f}x sooner than strong sync at its best "
          f"B = {b_sync} (python scripts/gpu_model.py --ranges: the range over every input's range)\n")
    rows = model(x)
    base = rows[1][2]  # the strong synchronous baseline at this B
    print(f"Per step at B = {x['B']} (the asynchronous arms' minutes include 1 + c):\n")
    print("| arm | trainers + searchers | s / step | vs strong sync per step | minutes to accuracy | "
          "fresh-sample supply / demand |")
    print("|---|---|---|---|---|---|")
    for name, split, step, supply in rows:
        minutes = steps_to_accuracy(x, x["B"], name.startswith("async")) * step / 60
        print(f"| {name} | {split} | {step:.2f} | {base / step:.2f}x | {minutes:.1f} | "
              f"{'-' if supply is None else f'{supply:.1f}'} |")
    print(f"\ninputs (K = {K}, k = {k}, {GPUS} GPUs: configs/gsm8k.yaml, one node):")
    for name, (value, lo, hi, why) in INPUTS.items():
        print(f"- {name} = {x[name]:g}{' (changed)' if name in changed else ''}, range {lo:g}-{hi:g}: {why}")


if __name__ == "__main__":
    main()
