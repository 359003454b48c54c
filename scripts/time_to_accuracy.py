"""Time to accuracy on this box and the tiny task, side by side with the trainer a user would pick instead (TRL's
GRPOTrainer): seconds per step at equal work, fresh samples per second, held-out accuracy at fixed steps, and the
training seconds each arm needs to reach an accuracy fixed before the runs (the paper's Fig. 1 framing).

    pip install trl==1.16.0                       # the peer: an optional install, not a dependency of this code
    python scripts/time_to_accuracy.py run [--seeds 0,1,2] [--arms trl,sync,async] [key=value ...]
    python scripts/time_to_accuracy.py report [--target 0.53] [--plot docs/time_to_accuracy.png]

run: the arms alternate within each seed, so that a slow spell of the box hits every arm; a finished run is skipped
when rerun. out/time_to_accuracy/<arm>_s<seed>/. Needs an otherwise idle machine: the figures are seconds.
  trl       TRL's GRPOTrainer in one process with a torch thread per core, as a user runs it: Hugging Face generate,
            the shipped tiny model, B x K = 8 prompts x 8 samples generated for each step (64 fresh), the settings
            of configs/tiny.yaml with loss=grpo (temperature 0.7, 24 new tokens, lr 3e-5 constant, AdamW, KL
            coefficient beta 0.05, clip 0.2, no gradient clipping), loss_type "grpo", 500 steps
  sync      ours, loss=grpo async=false: the same work per step (each step's 64 samples generated for it and
            trained once), 500 steps
  async     ours, the tiny default: TB, asynchronous, 32 fresh samples per 64-sample step, 1000 steps
  inflight  ours, the tiny default with inflight=true, 1000 steps
Every arm is evaluated greedily on the same 1,000 held-out problems every 50 steps, with vLLM, outside its clock:
ours inside the run (n_test=1000), TRL's checkpoints afterwards (eval.py's greedy_eval). The clock is training
seconds from the first step, evaluations and checkpoint saves left out: ours time/loop_seconds -
time/eval_seconds_total (it starts before the initial buffer fill), TRL's from on_train_begin to each step's end
less its saves.

report: per arm, seconds per step and fresh samples per second over the first 300 steps, accuracy at steps 100,
200 and 300, and the time to --target: the clock at the first evaluation where the mean of it and the two before
it reaches the target, so that one lucky evaluation does not decide (an arm that evaluates more often per second
still gets more chances; the smoothing narrows that). The target is fixed in advance: 53.0%, TRL's 300-step
accuracy in the first try of this comparison. Every ratio is per seed (paired), with its 95% t-interval over the
seeds on the log scale; "faster" or "slower" is said only when the interval excludes 1.
"""
import argparse
import glob
import json
import os
import statistics as st
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tables import ratio_interval  # noqa: E402

TINY = os.path.join(ROOT, "configs", "tiny.yaml")
COMMON = ["eval_every=50", "n_test=1000", "test_data=procedural:test:1000", "time_budget_min=0", "progress=false"]
ARMS = {"trl": None, "sync": ["loss=grpo", "async=false", "steps=500"],
        "async": ["async=true", "inflight=false", "steps=1000"], "inflight": ["async=true", "inflight=true",
                                                                              "steps=1000"]}
NAMES = {"trl": "TRL GRPOTrainer", "sync": "ours sync (grpo)", "async": "ours async (tb, default)",
         "inflight": "ours async in-flight (tb)"}
TRL_STEPS, EVERY = 500, 50


# ---------------------------------------------------------------- the peer: TRL's GRPOTrainer, in its own process


def train_trl(seed, out_dir, overrides, steps=TRL_STEPS, every=EVERY):
    """TRL's GRPO on the tiny task at configs/tiny.yaml's settings; checkpoints every EVERY steps, then each one
    evaluated; metrics.jsonl in our format (step, time/loop_seconds, time/eval_seconds_total, eval/accuracy)."""
    import torch
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # one process: every core, as a TRL user runs it
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from config import load_config
    from rewards import get_task
    cfg = load_config(TINY, ["loss=grpo", *overrides])
    task = get_task(cfg.task)
    records = task.load(cfg.train_data or task.DEFAULT_TRAIN, "train")
    data = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in records])

    def reward(prompts, completions, answer, **_):
        return [float(task.reward(c, a)) for c, a in zip(completions, answer)]

    class Clock(TrainerCallback):
        """Training seconds at each step's end, the checkpoint saves left out."""
        def __init__(self):
            self.t0, self.saves, self.at = None, 0.0, {}

        def on_train_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.end = time.perf_counter()
            self.at[state.global_step] = self.end - self.t0 - self.saves

        def on_save(self, args, state, control, **kw):
            self.saves += time.perf_counter() - self.end

    args = GRPOConfig(
        output_dir=out_dir, max_steps=steps, seed=seed, data_seed=seed, use_cpu=True,
        per_device_train_batch_size=cfg.B * cfg.K, num_generations=cfg.K, steps_per_generation=1, num_iterations=1,
        max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature, top_p=1.0, top_k=0,
        learning_rate=cfg.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=cfg.weight_decay,
        adam_beta1=0.9, adam_beta2=cfg.adam_beta2, max_grad_norm=cfg.grad_clip, beta=cfg.beta_start,
        epsilon=cfg.clip_eps, loss_type="grpo", gradient_checkpointing=False, save_strategy="steps",
        save_steps=every, save_only_model=True, logging_steps=every, report_to="none", disable_tqdm=True)
    clock = Clock()
    trainer = GRPOTrainer(model=cfg.model, reward_funcs=reward, args=args, train_dataset=data, callbacks=[clock])
    trainer.train()
    evaluate_trl(cfg, out_dir, clock.at)


def evaluate_trl(cfg, out_dir, clock):
    """The start model and each checkpoint greedily on the test set, with one engine that loads each checkpoint's
    weights as a sync round loads the trainer's; metrics.jsonl and summary.json in our format."""
    import dataclasses

    from safetensors.torch import load_file

    from engine import make_engine
    from eval import greedy_eval
    from policy import encode_prompt, load_tokenizer
    from rewards import get_task
    task, tok = get_task(cfg.task), load_tokenizer(cfg.model)
    test = task.load(cfg.test_data, "test")[: cfg.n_test]
    longest = max(len(encode_prompt(tok, r["prompt"])) for r in test)
    new_tokens = cfg.eval_max_new_tokens or cfg.max_new_tokens
    engine = make_engine(dataclasses.replace(cfg, engine="auto"), "cpu", cfg.seed, tok.pad_token_id,
                         tok.eos_token_id, longest + new_tokens + 8)
    steps = sorted(int(p.rsplit("-", 1)[1]) for p in glob.glob(os.path.join(out_dir, "checkpoint-*")))
    rows = []
    for step in [0, *steps]:
        if step:
            engine.load_weights(load_file(os.path.join(out_dir, f"checkpoint-{step}", "model.safetensors")).items())
        results = greedy_eval(engine, tok, task, test, new_tokens)
        rows.append({"step": step, "time/loop_seconds": clock.get(step, 0.0), "time/eval_seconds_total": 0.0,
                     "eval/accuracy": sum(ok for _, ok in results) / len(results)})
    if hasattr(engine, "shutdown"):
        engine.shutdown()
    with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump({"steps": steps[-1], "fresh_samples_per_step": cfg.B * cfg.K}, f)


# ---------------------------------------------------------------- run


def run(args, overrides):
    for seed in args.seeds.split(","):
        for arm in args.arms.split(","):
            out_dir = os.path.join(args.out, f"{arm}_s{seed}")
            if os.path.isfile(os.path.join(out_dir, "summary.json")):
                print(f"{out_dir}: done, skipped")
                continue
            if arm == "trl":
                cmd = [sys.executable, __file__, "trl", "--seed", seed, "--out", out_dir]
            else:
                cmd = ["bash", os.path.join(ROOT, "launch.sh"), TINY, *ARMS[arm], *COMMON, f"seed={seed}",
                       "overwrite=true", f"out_dir={out_dir}"]
            print(" ".join(cmd[1:] + overrides), flush=True)
            subprocess.run(cmd + overrides, check=True, stdout=subprocess.DEVNULL)


# ---------------------------------------------------------------- report


def evals(out_dir):
    """[(clock seconds, step, accuracy)] of one run's evaluations; clock 0 is the start-of-run evaluation."""
    points = []
    for line in open(os.path.join(out_dir, "metrics.jsonl")):
        r = json.loads(line)
        if "eval/accuracy" in r:
            clock = r["time/loop_seconds"] - r["time/eval_seconds_total"] if r["step"] else 0.0
            points.append((clock, r["step"], r["eval/accuracy"]))
    return points


def time_to(points, target, window=3):
    """(clock, step) at the first evaluation where the mean of it and the window - 1 before it reaches the target;
    None if none does."""
    for i in range(window - 1, len(points)):
        if st.mean(a for _, _, a in points[i - window + 1 : i + 1]) >= target:
            return points[i][0], points[i][1]
    return None


def at_step(points, step):
    return next((a for _, s, a in points if s == step), None)


def seconds_per_step(points, upto=300):
    """Training seconds per step over the first `upto` steps (the clock at that evaluation over its step)."""
    hit = next(((c, s) for c, s, _ in points if s == upto), None) or points[-1][:2]
    return hit[0] / hit[1] if hit[1] else float("nan")


def verdict(name, r, lo, hi, n, what):
    """'a / b: 0.62 (95% 0.55-0.70, n = 3): a is faster' with the interval deciding."""
    if lo is None:
        return f"{name}: {r:.2f} (n = {n}: no interval)"
    said = f"below 1: {what[0]}" if hi < 1 else f"above 1: {what[1]}" if lo > 1 else "not told apart from 1"
    return f"{name}: {r:.2f} (95% {lo:.2f}-{hi:.2f}, n = {n}): {said}"


def report(args):
    runs = {arm: {} for arm in ARMS}
    for path in sorted(glob.glob(os.path.join(args.out, "*_s*"))):
        arm, seed = os.path.basename(path).rsplit("_s", 1)
        if arm in runs and os.path.isfile(os.path.join(path, "summary.json")):
            runs[arm][int(seed)] = (evals(path), json.load(open(os.path.join(path, "summary.json"))))
    runs = {arm: seeds for arm, seeds in runs.items() if seeds}
    if not runs:
        sys.exit(f"error: no finished run under {args.out} (python scripts/time_to_accuracy.py run)")
    print(f"target: {args.target:.1%} held-out accuracy (fixed in advance), reached when the mean of three "
          "consecutive evaluations is at or above it\n")
    print("| arm | seeds | s / step, first 300 steps | fresh samples / s | accuracy at 100 / 200 / 300 | time to "
          "target, s (each seed) | steps at target |")
    print("|---|---|---|---|---|---|---|")
    for arm, seeds in runs.items():
        sps = [seconds_per_step(p) for p, _ in seeds.values()]
        fresh = [s.get("fresh_samples_per_step", float("nan")) / x for (_, s), x in zip(seeds.values(), sps)]
        accs = []
        for step in (100, 200, 300):
            got = [a for a in (at_step(p, step) for p, _ in seeds.values()) if a is not None]
            accs.append(f"{st.mean(got):.1%}" if got else "-")
        hits = [time_to(p, args.target) for p, _ in seeds.values()]
        print(f"| {NAMES[arm]} | {len(seeds)} | {st.mean(sps):.3f} | {st.mean(fresh):.0f} | {' / '.join(accs)} | "
              + " / ".join("not reached" if h is None else f"{h[0]:.0f}" for h in hits) + " | "
              + " / ".join("-" if h is None else str(h[1]) for h in hits) + " |")
    print()
    base = "trl" if "trl" in runs else "sync"
    for arm in runs:
        if arm == base:
            continue
        seeds = sorted(set(runs[arm]) & set(runs[base]))
        pairs = [(seconds_per_step(runs[arm][s][0]), seconds_per_step(runs[base][s][0])) for s in seeds]
        fresh = [st.mean(runs[a][s][1].get("fresh_samples_per_step", float("nan")) for s in seeds) for a in (arm, base)]
        if pairs and not max(fresh) <= 1.1 * min(fresh):  # a step is not the same work: no per-step verdict
            print(f"s / step, {NAMES[arm]} / {NAMES[base]}: at unequal work ({fresh[0]:.0f} vs {fresh[1]:.0f} fresh "
                  "samples per step): not compared")
        elif pairs:
            print(verdict(f"s / step, {NAMES[arm]} / {NAMES[base]}", *ratio_interval(pairs), len(pairs),
                          (f"{NAMES[arm]} is faster per step", f"{NAMES[arm]} is slower per step")))
        hit = [(time_to(runs[arm][s][0], args.target), time_to(runs[base][s][0], args.target)) for s in seeds]
        pairs = [(a[0], b[0]) for a, b in hit if a and b]
        if len(pairs) < len(hit):
            print(f"time to target, {NAMES[arm]} / {NAMES[base]}: {len(hit) - len(pairs)} of {len(hit)} seeds "
                  "did not reach it in one arm or both: no ratio")
        elif pairs:
            print(verdict(f"time to target, {NAMES[arm]} / {NAMES[base]}", *ratio_interval(pairs), len(pairs),
                          (f"{NAMES[arm]} gets there sooner", f"{NAMES[base]} gets there sooner")))
    breakdown(args.out, [arm for arm in runs if arm != "trl"])
    if args.plot:
        plot(runs, args.target, args.plot)


PARTS = [("time/step_seconds", "step"), ("time/train_seconds", "train"), ("sync/seconds", "gather wait"),
         ("sync/push_seconds", "push"), ("search/load_seconds", "load"), ("search/generate_seconds", "generate"),
         ("search/ref_seconds", "ref"), ("search/reward_seconds", "reward"),
         ("time/trainer_idle_ratio", "trainer idle"), ("search/idle_ratio", "searcher idle")]


def breakdown(out, arms, first=10, last=300):
    """Where our arms' steps go: each per-role metric's median over the steps first..last of each run (the start-up
    rounds left out), then the mean over the seeds; '-' for a metric the runs did not log."""
    if not arms:
        return
    print(f"\nour steps, per role (median over steps {first}-{last} of each run, mean over seeds; seconds; idle: "
          "share of the step):")
    print("| arm | " + " | ".join(name for _, name in PARTS) + " |")
    print("|---|" + "---|" * len(PARTS))
    for arm in arms:
        medians = {key: [] for key, _ in PARTS}
        for path in sorted(glob.glob(os.path.join(out, f"{arm}_s*"))):
            rows = [json.loads(line) for line in open(os.path.join(path, "metrics.jsonl"))]
            rows = [r for r in rows if first <= r.get("step", 0) <= last]
            for key, _ in PARTS:
                values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
                if values:
                    medians[key].append(st.median(values))
        print(f"| {NAMES[arm]} | " + " | ".join(f"{st.mean(v):.3f}" if v else "-" for v in medians.values()) + " |")


def plot(runs, target, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (arm, seeds) in enumerate(runs.items()):
        for j, (points, _) in enumerate(seeds.values()):
            ax.plot([c for c, _, _ in points], [100 * a for _, _, a in points], color=f"C{i}", lw=1, alpha=0.8,
                    marker=".", label=NAMES[arm] if j == 0 else None)
    ax.axhline(100 * target, color="k", ls="--", lw=0.8, label=f"target {target:.1%}")
    ax.set_xlabel("training seconds (evaluations and saves left out), this box")
    ax.set_ylabel("held-out accuracy (%), 1,000 problems")
    ax.set_title("tiny task: accuracy against training seconds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("run", "report", "trl"))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--seed", default="0", help="trl: the one run's seed")
    ap.add_argument("--steps", type=int, default=TRL_STEPS, help="trl: its steps")
    ap.add_argument("--every", type=int, default=EVERY, help="trl: steps between checkpoints (evaluations)")
    ap.add_argument("--arms", default="trl,sync,async", help="run: of " + ", ".join(ARMS))
    ap.add_argument("--target", type=float, default=0.53, help="report: the accuracy fixed in advance")
    ap.add_argument("--plot", default=None, help="report: write the accuracy-against-seconds plot here")
    ap.add_argument("--out", default="out/time_to_accuracy")
    args, overrides = ap.parse_known_args()
    if args.what == "trl":
        from config import quiet_known_warnings
        quiet_known_warnings()
        try:
            import trl  # noqa: F401
        except ImportError:
            sys.exit("error: the trl arm needs TRL: pip install trl==1.16.0")
        return train_trl(int(args.seed), args.out, [*COMMON, *overrides], args.steps, args.every)
    run(args, overrides) if args.what == "run" else report(args)


if __name__ == "__main__":
    main()
