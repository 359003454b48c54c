"""Benchmark: the same trainer steps asynchronous vs synchronous, and the searchers' throughput inside the pipeline
vs the same engine alone on the same prompts. A benchmark, not a test: it reports figures, it asserts nothing.

    python bench.py [CONFIG] [--steps 40] [--repeats 1] [key=value ...]   -> table on stdout, out/bench/bench.json

Runs `launch.sh CONFIG` with async=true and async=false, alternately, `repeats` times each, with identical settings
(evaluation only at the start and the end, on 64 problems: it is outside the timed loop anyway), then times one
searcher's work (generation + reference log-probs + rewards, searcher.search_chunk) in this process with nothing else
running. The timed loop starts after the initial buffer and leaves out the final evaluation; the speedup is the ratio
of the mean loop times, the other figures come from the run closest to its mode's mean. On a CPU it also prints the
most a searcher inside the pipeline can get of its standalone rate when every rank shares the same cores.
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
    cmd = ["bash", os.path.join(ROOT, "launch.sh"), cfg_path, *overrides, f"out_dir={out_dir}", "progress=false",
           "overwrite=true"]  # a benchmark reruns into the same out_dirs
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    return rows, json.load(open(os.path.join(out_dir, "summary.json")))


def standalone_tokens_per_s(cfg, n_chunks, warmup=3):
    """One searcher's work, alone on the machine: tokens / seconds of search_chunk over n_chunks chunks (after
    `warmup` chunks that are not timed)."""
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
    for c in range(warmup):
        search_chunk(cfg, engine, ref, tok, task, records, prompts, [c], 0, dict(stats))
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
    ap.add_argument("--repeats", type=int, default=1, help="runs of each mode, alternating (figures: medians)")
    ap.add_argument("--chunks", type=int, default=30, help="generation chunks timed for the standalone rate")
    ap.add_argument("--out", default="out/bench")
    args, overrides = ap.parse_known_args()
    if "=" in args.config:  # no config file given, only overrides
        overrides, args.config = [args.config, *overrides], os.path.join(ROOT, "configs", "tiny.yaml")
    overrides = [f"steps={args.steps}", "eval_every=0", "n_test=64", "time_budget_min=0", *overrides]
    runs = {"async": [], "sync": []}
    for i in range(args.repeats):
        for mode in runs:
            t0 = time.perf_counter()
            out_dir = os.path.join(args.out, mode if args.repeats == 1 else f"{mode}{i}")
            rows, summary = run(args.config, overrides + [f"async={'true' if mode == 'async' else 'false'}"], out_dir)
            syncs = [r["sync/seconds"] for r in rows[1:] if "sync/seconds" in r]
            tps = [r["search/tokens_per_s"] for r in rows[1:] if r.get("search/tokens_per_s")]
            hist = {}
            for r in rows[1:]:
                for j, c in enumerate(r.get("staleness/hist", [])):
                    hist[j] = hist.get(j, 0) + c
            loop = summary["loop_seconds"] - summary["eval_seconds_total"]  # the final evaluation is not training
            runs[mode].append({
                "launch_seconds": time.perf_counter() - t0, "wall_seconds": summary["wall_seconds"],
                "loop_seconds": loop, "eval_seconds": summary["eval_seconds_total"], "steps": summary["steps"],
                "trainer_busy_fraction": summary["train_seconds_total"] / loop,
                "trainer_cores": summary["loop_cpu_seconds"] / summary["loop_seconds"],  # CPU seconds per second
                "train_seconds_per_step": st.mean(r["time/train_seconds"] for r in rows[1:]),
                "wait_seconds_per_step": st.mean(r["time/wait_seconds"] for r in rows[1:]),
                "sync_seconds_mean": st.mean(syncs), "sync_seconds_max": max(syncs),
                "push_seconds_mean": st.mean([r["sync/push_seconds"] for r in rows[1:] if "sync/push_seconds" in r]),
                "searcher_tokens_per_s_median": st.median(tps) if tps else 0.0, "staleness_hist": hist,
                "fresh_samples_per_step": sum(r.get("sync/samples", 0) for r in rows[1:]) / summary["steps"]})
    res = {}
    for mode, rs in runs.items():  # the run closest to the mean loop time stands for the mode; every run is kept
        mean = st.mean(r["loop_seconds"] for r in rs)
        res[mode] = dict(min(rs, key=lambda r: abs(r["loop_seconds"] - mean)), loop_seconds_mean=mean,
                         loop_seconds_all=[r["loop_seconds"] for r in rs])
    from config import load_config
    cfg = load_config(args.config, [o for o in overrides if not o.startswith("async=")])
    res["standalone_tokens_per_s"], res["engine"] = standalone_tokens_per_s(cfg, n_chunks=args.chunks)
    res["speedup_sync_over_async"] = res["sync"]["loop_seconds_mean"] / res["async"]["loop_seconds_mean"]
    res["pipeline_vs_standalone"] = res["async"]["searcher_tokens_per_s_median"] / res["standalone_tokens_per_s"]
    import torch
    if not torch.cuda.is_available():  # every rank shares these cores: the trainer's share is gone for searching
        cores = len(os.sched_getaffinity(0))
        res["cpu_cores"] = cores
        res["cpu_bound_pipeline_vs_standalone"] = min(1.0, (cores - res["async"]["trainer_cores"]) / cfg.n_searchers)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(res, f, indent=2)
    a, s = res["async"], res["sync"]
    print(f"| {args.steps} trainer steps, engine {res['engine']} | async | sync |\n|---|---|---|")
    print(f"| training loop seconds (after the initial buffer, without the final evaluation) | "
          f"{a['loop_seconds_mean']:.1f} | {s['loop_seconds_mean']:.1f} |")
    if args.repeats > 1:
        print(f"| ... each run | {' / '.join(f'{x:.1f}' for x in a['loop_seconds_all'])} | "
              f"{' / '.join(f'{x:.1f}' for x in s['loop_seconds_all'])} |")
    print(f"| train / wait seconds per step | {a['train_seconds_per_step']:.3f} / {a['wait_seconds_per_step']:.3f} | "
          f"{s['train_seconds_per_step']:.3f} / {s['wait_seconds_per_step']:.3f} |")
    print(f"| whole run seconds (incl. start eval, buffer fill, end eval) | {a['wall_seconds']:.1f} | {s['wall_seconds']:.1f} |")
    print(f"| trainer busy (fwd+bwd+opt / loop time) | {a['trainer_busy_fraction']:.0%} | {s['trainer_busy_fraction']:.0%} |")
    print(f"| trainer CPU use (cores, CPU seconds / loop seconds) | {a['trainer_cores']:.2f} | {s['trainer_cores']:.2f} |")
    print(f"| sync round seconds, mean / max | {a['sync_seconds_mean']:.2f} / {a['sync_seconds_max']:.2f} | {s['sync_seconds_mean']:.2f} / {s['sync_seconds_max']:.2f} |")
    print(f"| weight push seconds, mean | {a['push_seconds_mean']:.3f} | {s['push_seconds_mean']:.3f} |")
    print(f"| searcher tokens/s in the pipeline (median, per searcher) | {a['searcher_tokens_per_s_median']:.0f} | {s['searcher_tokens_per_s_median']:.0f} |")
    print(f"| fresh samples per step (generated; the step consumes {cfg.B * cfg.K}) | {a['fresh_samples_per_step']:.1f} | "
          f"{s['fresh_samples_per_step']:.1f} |")
    print(f"| staleness histogram (updates: samples) | {a['staleness_hist']} | {s['staleness_hist']} |")
    print(f"\nasync is {res['speedup_sync_over_async']:.2f}x faster than sync for the same steps; "
          f"searcher in pipeline / standalone ({res['standalone_tokens_per_s']:.0f} tok/s): {res['pipeline_vs_standalone']:.0%}")
    if "cpu_cores" in res:
        print(f"CPU bound for that ratio: (cores - cores the trainer uses) / searchers = ({res['cpu_cores']} - "
              f"{a['trainer_cores']:.2f}) / {cfg.n_searchers} = {res['cpu_bound_pipeline_vs_standalone']:.0%} "
              f"of a searcher that has a core to itself")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as launch.sh gives each rank: the standalone searcher is one rank
    sys.path.insert(0, ROOT)
    main()
