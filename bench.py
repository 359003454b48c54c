"""Benchmark: the same trainer steps asynchronous vs synchronous, and the searchers' throughput inside the pipeline
vs the same engine alone on the same prompts. A benchmark, not a test: it reports figures, it asserts nothing.

    python bench.py [CONFIG] [--steps 40] [key=value ...]        -> table on stdout, out/bench/bench.json

Runs `launch.sh CONFIG` twice (async=true, async=false) with identical settings, then times one searcher's work
(generation + reference log-probs + rewards, searcher.search_chunk) in this process with nothing else running.
"""
import argparse
import json
import os
import statistics as st
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.abspath(__file__))


def run(cfg_path, overrides, out_dir):
    cmd = ["bash", os.path.join(ROOT, "launch.sh"), cfg_path, *overrides, f"out_dir={out_dir}", "progress=false"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    return rows, json.load(open(os.path.join(out_dir, "summary.json")))


def standalone_tokens_per_s(cfg, n_chunks):
    """One searcher's work, alone on the machine: tokens / seconds of search_chunk over n_chunks chunks."""
    import torch
    from engine import make_engine
    from policy import encode_prompt, load_model, load_tokenizer
    from rewards import get_task
    from searcher import search_chunk
    task = get_task(cfg.task)
    records = task.load(cfg.train_data or task.DEFAULT_TRAIN, "train")
    tok = load_tokenizer(cfg.model)
    prompts = [encode_prompt(tok, r["prompt"]) for r in records[: n_chunks * cfg.chunk_prompts]]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref = load_model(cfg.model, cfg.dtype, device).eval()
    engine = make_engine(cfg, device, cfg.seed, tok.pad_token_id, tok.eos_token_id, max(map(len, prompts)) + cfg.max_new_tokens + 8)
    stats = dict(tokens=0, gen_s=0.0, samples=0, reward_errors=0)
    search_chunk(cfg, engine, ref, tok, task, records, prompts, [0], 0, dict(stats))  # warm-up
    for c in range(n_chunks):
        pids = list(range(c * cfg.chunk_prompts, (c + 1) * cfg.chunk_prompts))
        search_chunk(cfg, engine, ref, tok, task, records, prompts, pids, 0, stats)
    if hasattr(engine, "shutdown"):
        engine.shutdown()
    return stats["tokens"] / stats["gen_s"], engine.name


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", default=os.path.join(ROOT, "configs", "tiny.yaml"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default="out/bench")
    args, overrides = ap.parse_known_args()
    overrides = [f"steps={args.steps}", "eval_every=0", "time_budget_min=0", *overrides]
    res = {}
    for mode in ("async", "sync"):
        t0 = time.perf_counter()
        rows, summary = run(args.config, overrides + [f"async={'true' if mode == 'async' else 'false'}"],
                            os.path.join(args.out, mode))
        syncs = [r["sync/seconds"] for r in rows[1:] if "sync/seconds" in r]
        tps = [r["search/tokens_per_s"] for r in rows[1:] if r.get("search/tokens_per_s")]
        hist = {}
        for r in rows[1:]:
            for i, c in enumerate(r.get("staleness/hist", [])):
                hist[i] = hist.get(i, 0) + c
        res[mode] = {"launch_seconds": time.perf_counter() - t0, "wall_seconds": summary["wall_seconds"],
                     "loop_seconds": summary["loop_seconds"], "steps": summary["steps"],
                     "trainer_busy_fraction": summary["trainer_busy_fraction"],
                     "sync_seconds_mean": st.mean(syncs), "sync_seconds_max": max(syncs),
                     "push_seconds_mean": st.mean([r["sync/push_seconds"] for r in rows[1:] if "sync/push_seconds" in r]),
                     "searcher_tokens_per_s_median": st.median(tps) if tps else 0.0, "staleness_hist": hist}
    from config import load_config
    cfg = load_config(args.config, [o for o in overrides if not o.startswith("async=")])
    res["standalone_tokens_per_s"], res["engine"] = standalone_tokens_per_s(cfg, n_chunks=10)
    res["speedup_sync_over_async"] = res["sync"]["loop_seconds"] / res["async"]["loop_seconds"]
    res["pipeline_vs_standalone"] = res["async"]["searcher_tokens_per_s_median"] / res["standalone_tokens_per_s"]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(res, f, indent=2)
    a, s = res["async"], res["sync"]
    print(f"| {args.steps} trainer steps, engine {res['engine']} | async | sync |\n|---|---|---|")
    print(f"| training loop seconds (after the initial buffer) | {a['loop_seconds']:.1f} | {s['loop_seconds']:.1f} |")
    print(f"| whole run seconds (incl. start eval, buffer fill, end eval) | {a['wall_seconds']:.1f} | {s['wall_seconds']:.1f} |")
    print(f"| trainer busy (fwd+bwd+opt / loop time) | {a['trainer_busy_fraction']:.0%} | {s['trainer_busy_fraction']:.0%} |")
    print(f"| sync round seconds, mean / max | {a['sync_seconds_mean']:.2f} / {a['sync_seconds_max']:.2f} | {s['sync_seconds_mean']:.2f} / {s['sync_seconds_max']:.2f} |")
    print(f"| weight push seconds, mean | {a['push_seconds_mean']:.3f} | {s['push_seconds_mean']:.3f} |")
    print(f"| searcher tokens/s in the pipeline (median, per searcher) | {a['searcher_tokens_per_s_median']:.0f} | {s['searcher_tokens_per_s_median']:.0f} |")
    print(f"| staleness histogram (updates: samples) | {a['staleness_hist']} | {s['staleness_hist']} |")
    print(f"\nasync is {res['speedup_sync_over_async']:.2f}x faster than sync for the same steps; "
          f"searcher in pipeline / standalone ({res['standalone_tokens_per_s']:.0f} tok/s): {res['pipeline_vs_standalone']:.0%}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as launch.sh gives each rank: the standalone searcher is one rank
    sys.path.insert(0, ROOT)
    main()
