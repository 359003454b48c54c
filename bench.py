"""Benchmark: the same trainer steps asynchronous (searchers generating in chunks) vs synchronous vs asynchronous with
in-flight search (inflight=true, vLLM only), and the searchers' throughput inside the pipeline vs the same engine
alone on the same prompts. A benchmark, not a test: it reports figures, it asserts nothing.

    python bench.py [CONFIG] [--steps 40] [--repeats 1] [--modes async,sync,inflight] [--work equal] [key=value ...]
    -> table on stdout, out/bench/bench.json

--work equal (the default) holds the work per step equal across arms: the asynchronous arms make B prompt visits
per trainer step, as the synchronous arm does (max_prompts_per_round = B x k / n_searchers), and run with
max_reuse=1, so they train on at most as many samples as they generate; the table reports each arm's fresh samples
per step, and a speedup is printed only when they agree within 10%. --work native runs the config's own settings (e.g. the tiny
default's max_reuse=2: half the fresh samples per step in the asynchronous arms), for time per step at unequal work.
Each arm's trainer floor is its own train seconds summed over the steps plus its weight pushes: no arm's loop can
be shorter (the trainer is one process); loop / floor says how close an arm gets. The cores are the other floor: no
job can be shorter than the CPU seconds of all its processes (ranks and engines, counted when they end) over the cores
it may use (affinity, capped by a cgroup quota); the table gives each arm's whole job against it.

Runs `launch.sh CONFIG` in each mode (async: async=true inflight=false; sync: async=false; inflight: async=true
inflight=true; the HF engine has no in-flight mode, so that arm is left out with it), alternately, `repeats` times
each, with identical settings (evaluation only at the start and the end, on 64 problems, both outside the timed
loop), then times one searcher's work (generation + reference log-probs + rewards: Searcher.search, and
InFlightSearch for the in-flight arm, searcher.py) in this process with nothing else running. The timed loop starts
before the initial buffer fill and leaves out the final evaluation. A speedup is the geometric mean of the loop-time
ratios of the runs paired by repeat, with its 95% t-interval on the log scale; it is called faster or slower only
when the interval excludes 1 (one run per arm: no claim). The other figures come from the run closest to its mode's
mean. The trainer's wait per sync round is time/wait_seconds of
the steps with a round (the gather, the push, and waiting for the searchers to join).
"""
import argparse
import json
import os
import resource
import statistics as st
import subprocess
import sys
import time

from config import quiet_known_warnings
from tables import ratio_interval

quiet_known_warnings()  # before torch loads (the standalone timing imports it)
ROOT = os.path.dirname(os.path.abspath(__file__))


def run(cfg_path, overrides, out_dir):
    """(metrics rows, summary.json, CPU seconds of the whole job: every rank and engine process, startup included)."""
    cmd = ["bash", os.path.join(ROOT, "launch.sh"), cfg_path, *overrides, f"out_dir={out_dir}", "progress=false",
           "overwrite=true"]  # a benchmark reruns into the same out_dirs
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the processes torchrun and the ranks waited for
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return rows, json.load(open(os.path.join(out_dir, "summary.json"))), cpu


def cores():
    """CPU cores this process may use: its affinity, capped by a cgroup v2 quota (cpu.max) when there is one."""
    n = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
        return min(n, int(quota) / int(period)) if quota != "max" else n
    except (OSError, ValueError):
        return n


def standalone_tokens_per_s(cfg, n_chunks, warmup=3):
    """One searcher's work, alone on the machine: tokens / seconds of Searcher.search over n_chunks chunks (after
    `warmup` chunks that are not timed), or of in-flight search over the same prompt visits."""
    import dataclasses

    import torch
    from engine import make_engine
    from policy import encode_prompt, load_model, load_tokenizer
    from rewards import get_task
    from searcher import InFlightSearch, Searcher, Shard
    task = get_task(cfg.task)
    records = task.load(cfg.train_data or task.DEFAULT_TRAIN, "train")
    tok = load_tokenizer(cfg.model)
    prompts = [encode_prompt(tok, r["prompt"]) for r in records[: n_chunks * cfg.chunk_prompts]]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref = load_model(cfg.model, cfg.dtype, device).eval()
    max_len = max(map(len, prompts)) + cfg.max_new_tokens + 8
    engine = make_engine(cfg, device, cfg.seed, tok.pad_token_id, tok.eos_token_id, max_len)
    searcher = Searcher(cfg, engine, ref, tok, task, records, prompts, Shard(1, 1, len(prompts), cfg.seed))
    for c in range(warmup):  # counted apart
        dataclasses.replace(searcher, stats=dict(searcher.stats)).search([c], 0)
    if cfg.inflight and engine.name == "vllm":  # the same prompt visits, kept at max_inflight running sequences
        flight, started = InFlightSearch(searcher), 0
        while started < len(prompts) or engine.flight:
            started += flight.work(len(prompts) - started)
        flight.hand_over()
    else:
        for c in range(n_chunks):
            searcher.search(list(range(c * cfg.chunk_prompts, (c + 1) * cfg.chunk_prompts)), 0)
    if hasattr(engine, "shutdown"):
        engine.shutdown()
    return searcher.stats["tokens"] / searcher.stats["gen_s"], engine.name


MODES = {"async": ["async=true", "inflight=false"], "sync": ["async=false", "inflight=false"],
         "inflight": ["async=true", "inflight=true"]}


def equal_work(cfg):
    """--work equal, the asynchronous arms: B prompt visits per trainer step, as the synchronous arm makes (each
    searcher B x k / n_searchers per round of k steps, rounded up) and max_reuse=1 (the trainer waits rather than
    train on more than was generated). Without the cap the searchers generate whatever the trainer's time allows
    (74 and 111 fresh samples per 64-sample step in a run of 2026-12-01), which is more work, not less."""
    visits = -(-cfg.B * cfg.k // cfg.n_searchers)
    return ["max_reuse=1", f"max_prompts_per_round={visits}"]


def measure(rows, summary, launch_seconds, job_cpu_seconds):
    """One run's figures from its metrics.jsonl rows (step 0 is the start-of-run evaluation), summary.json and the
    job's CPU seconds over its launch."""
    n_cores = cores()
    syncs = [r["sync/seconds"] for r in rows[1:] if "sync/seconds" in r]
    waits = [r["time/wait_seconds"] for r in rows[1:] if "sync/seconds" in r]  # the steps with a sync round
    tps = [r["search/tokens_per_s"] for r in rows[1:] if r.get("search/tokens_per_s")]
    hist = {}
    for r in rows[1:]:
        for j, c in enumerate(r.get("staleness/hist", [])):
            hist[j] = hist.get(j, 0) + c
    loop = summary["loop_seconds"] - summary["eval_seconds_total"]  # the final evaluation is not training
    return {
        "launch_seconds": launch_seconds, "wall_seconds": summary["wall_seconds"],
        "loop_seconds": loop, "eval_seconds": summary["eval_seconds_total"], "steps": summary["steps"],
        "trainer_busy_fraction": summary["train_seconds_total"] / loop,
        "trainer_cores": summary["loop_cpu_seconds"] / summary["loop_seconds"],  # CPU seconds per second
        "train_seconds_per_step": st.mean(r["time/train_seconds"] for r in rows[1:]),
        "wait_seconds_per_step": st.mean(r["time/wait_seconds"] for r in rows[1:]),
        "round_wait_seconds_median": st.median(waits), "round_wait_seconds_max": max(waits),
        "sync_seconds_mean": st.mean(syncs), "sync_seconds_median": st.median(syncs), "sync_seconds_max": max(syncs),
        "push_seconds_mean": st.mean([r["sync/push_seconds"] for r in rows[1:] if "sync/push_seconds" in r]),
        "searcher_tokens_per_s_median": st.median(tps) if tps else 0.0, "staleness_hist": hist,
        "mixed_fraction_mean": st.mean(r.get("staleness/mixed_fraction", 0.0) for r in rows[1:]),
        # every sample generated (reuse-wait rounds too, which log no row; the initial buffer included) per step
        "fresh_samples_per_step": summary["samples_generated"] / summary["steps"],
        # no loop can be shorter than the trainer's own work: its steps and its weight pushes
        "trainer_floor_seconds": summary["train_seconds_total"]
        + sum(r.get("sync/push_seconds", 0.0) for r in rows[1:]),
        # nor can the whole job be shorter than its CPU seconds spread over every core it may use
        "job_cpu_seconds": job_cpu_seconds, "cores": n_cores,
        "cores_busy_fraction": job_cpu_seconds / (n_cores * launch_seconds)}


def parse_args():
    """(options, overrides): bench.py's own options, and the config keys every run gets (the arms add their own)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", default=os.path.join(ROOT, "configs", "tiny.yaml"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each mode, alternating (figures: medians)")
    ap.add_argument("--modes", default="async,sync,inflight", help="the arms, of " + ", ".join(MODES))
    ap.add_argument("--chunks", type=int, default=30, help="generation chunks timed for the standalone rate")
    ap.add_argument("--work", choices=("equal", "native"), default="equal",
                    help="equal: the async arms at max_reuse=1 (B x K fresh samples per step, as sync); native: the "
                         "config's own settings")
    ap.add_argument("--out", default="out/bench")
    args, overrides = ap.parse_known_args()
    if "=" in args.config:  # no config file given, only overrides
        overrides, args.config = [args.config, *overrides], os.path.join(ROOT, "configs", "tiny.yaml")
    return args, [f"steps={args.steps}", "eval_every=0", "n_test=64", "time_budget_min=0", *overrides]


def run_arms(args, overrides, modes, cfg):
    """{mode: [the figures of each run]}: every arm `repeats` times, the arms alternating."""
    runs = {mode: [] for mode in modes}
    for i in range(args.repeats):
        for mode in runs:
            t0 = time.perf_counter()
            out_dir = os.path.join(args.out, mode if args.repeats == 1 else f"{mode}{i}")
            extra = equal_work(cfg) if args.work == "equal" and mode != "sync" else []
            rows, summary, cpu = run(args.config, overrides + MODES[mode] + extra, out_dir)
            runs[mode].append(measure(rows, summary, time.perf_counter() - t0, cpu))
    return runs


def results(runs, cfg, n_chunks):
    """bench.json: per mode the run closest to its mean loop time (every run's loop time kept), the standalone
    searcher rates, the ratios between arms and, on a CPU, the bound on a searcher's share inside the pipeline."""
    import dataclasses
    res = {}
    for mode, mode_runs in runs.items():  # the run closest to the mean loop time stands for the mode
        mean = st.mean(r["loop_seconds"] for r in mode_runs)
        res[mode] = dict(min(mode_runs, key=lambda r: abs(r["loop_seconds"] - mean)), loop_seconds_mean=mean,
                         loop_seconds_all=[r["loop_seconds"] for r in mode_runs])
    chunked = dataclasses.replace(cfg, inflight=False)
    res["standalone_tokens_per_s"], res["engine"] = standalone_tokens_per_s(chunked, n_chunks=n_chunks)
    for fast, slow in (("async", "sync"), ("inflight", "sync"), ("inflight", "async")):  # the arms that ran
        if fast in res and slow in res:  # paired by repeat (the arms alternate): geometric mean, 95% interval
            pairs = list(zip(res[slow]["loop_seconds_all"], res[fast]["loop_seconds_all"]))
            ratio, low, high = ratio_interval(pairs)
            res[f"speedup_{slow}_over_{fast}"], res[f"speedup_{slow}_over_{fast}_interval"] = ratio, [low, high]
            fresh = (res[fast]["fresh_samples_per_step"], res[slow]["fresh_samples_per_step"])
            res[f"equal_work_{slow}_{fast}"] = max(fresh) <= 1.1 * min(fresh)  # within 10%
    for mode in runs:
        res[mode]["loop_over_trainer_floor"] = res[mode]["loop_seconds"] / res[mode]["trainer_floor_seconds"]
    if "async" in res:
        res["pipeline_vs_standalone"] = res["async"]["searcher_tokens_per_s_median"] / res["standalone_tokens_per_s"]
    if "inflight" in res:
        res["standalone_inflight_tokens_per_s"], _ = standalone_tokens_per_s(
            dataclasses.replace(chunked, inflight=True), n_chunks=n_chunks)
        res["inflight_pipeline_vs_standalone"] = (res["inflight"]["searcher_tokens_per_s_median"]
                                                  / res["standalone_inflight_tokens_per_s"])
    return res


NAMES = {"async": "async (chunks)", "sync": "sync", "inflight": "async in-flight"}  # the arms' column headings


def print_table(res, cols, args, cfg):
    """The markdown table: a row per figure, a column per arm that ran (cols)."""
    def row(label, fmt):  # `fmt(figures of a mode)` per column
        print(f"| {label} | " + " | ".join(fmt(res[m]) for m in cols) + " |")
    print(f"| {args.steps} trainer steps, engine {res['engine']} | " + " | ".join(NAMES[m] for m in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    row("training loop seconds (the initial buffer fill included, without the final evaluation)",
        lambda r: f"{r['loop_seconds_mean']:.1f}")
    if args.repeats > 1:
        row("... each run", lambda r: " / ".join(f"{x:.1f}" for x in r["loop_seconds_all"]))
    row("train / wait seconds per step",
        lambda r: f"{r['train_seconds_per_step']:.3f} / {r['wait_seconds_per_step']:.3f}")
    row("trainer wait per sync round, median / max (time/wait_seconds)",
        lambda r: f"{r['round_wait_seconds_median']:.3f} / {r['round_wait_seconds_max']:.2f}")
    row("sync round seconds, median / max (sync/seconds)",
        lambda r: f"{r['sync_seconds_median']:.3f} / {r['sync_seconds_max']:.2f}")
    row("whole run seconds (incl. start eval, buffer fill, end eval)", lambda r: f"{r['wall_seconds']:.1f}")
    row("trainer busy (fwd+bwd+opt / loop time)", lambda r: f"{r['trainer_busy_fraction']:.0%}")
    row("trainer CPU use (cores, CPU seconds / loop seconds)", lambda r: f"{r['trainer_cores']:.2f}")
    row("weight push seconds, mean", lambda r: f"{r['push_seconds_mean']:.3f}")
    row("searcher tokens/s in the pipeline (median, per searcher)",
        lambda r: f"{r['searcher_tokens_per_s_median']:.0f}")
    row(f"fresh samples per step (all generated, initial buffer included; a step consumes {cfg.B * cfg.K})",
        lambda r: f"{r['fresh_samples_per_step']:.1f}")
    row("trainer floor seconds (its train steps + pushes), loop / floor",
        lambda r: f"{r['trainer_floor_seconds']:.1f}, {r['loop_over_trainer_floor']:.2f}")
    row("whole job: CPU seconds of every process / (cores x launch seconds)",
        lambda r: f"{r['job_cpu_seconds']:.0f} / ({r['cores']:g} x {r['launch_seconds']:.0f}) = "
                  f"{r['cores_busy_fraction']:.0%}")
    row("staleness histogram (updates: samples)", lambda r: str(r["staleness_hist"]))
    row("mixed-version samples in a batch, mean", lambda r: f"{r['mixed_fraction_mean']:.1%}")


def print_ratios(res, cfg):
    """The ratios under the table: loop time between arms (a speedup only at equal work), and a searcher's rate in
    the pipeline against standalone."""
    for fast, slow, name in (("async", "sync", "async"), ("inflight", "sync", "in-flight"),
                             ("inflight", "async", "in-flight")):
        if f"speedup_{slow}_over_{fast}" not in res:
            continue
        fresh = f"{res[fast]['fresh_samples_per_step']:.1f} vs {res[slow]['fresh_samples_per_step']:.1f}"
        ratio, (low, high) = res[f"speedup_{slow}_over_{fast}"], res[f"speedup_{slow}_over_{fast}_interval"]
        if res[f"equal_work_{slow}_{fast}"]:
            if low is None:
                said = "one run per arm: no interval, no claim (--repeats 3 or more)"
            else:
                said = (f"95% {low:.2f}-{high:.2f}, n = {len(res[fast]['loop_seconds_all'])}: " +
                        (f"{name} is faster" if low > 1 else f"{name} is slower" if high < 1 else "not told apart"))
            print(f"{NAMES[slow]} / {name} loop time at equal work (the same steps, {fresh} fresh samples per "
                  f"step): {ratio:.2f} ({said})")
        else:
            print(f"{name} takes {1 / res[f'speedup_{slow}_over_{fast}']:.2f}x the time of {NAMES[slow]} for the same "
                  f"steps, at UNEQUAL work ({fresh} fresh samples per step): not a speedup")
    for mode, key, standalone in (("async", "pipeline_vs_standalone", "standalone_tokens_per_s"),
                                  ("inflight", "inflight_pipeline_vs_standalone", "standalone_inflight_tokens_per_s")):
        if key in res:
            print(f"{NAMES[mode]}: searcher in the pipeline / standalone ({res[standalone]:.0f} tok/s): {res[key]:.0%}")


def main():
    args, overrides = parse_args()
    from config import load_config
    from engine import engine_name
    cfg = load_config(args.config, overrides)
    modes = args.modes.split(",")
    if "inflight" in modes and engine_name(cfg.engine) != "vllm":
        print("note: no in-flight arm: the HF engine generates in chunks", file=sys.stderr)
        modes.remove("inflight")
    runs = run_arms(args, overrides, modes, cfg)
    res = results(runs, cfg, args.chunks)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(res, f, indent=2)
    print_table(res, [m for m in MODES if m in runs], args, cfg)
    print()
    print_ratios(res, cfg)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as launch.sh gives each rank: the standalone searcher is one rank
    sys.path.insert(0, ROOT)
    main()
