"""The floors under one step: each part of a step timed alone in this process, on the config's model and task, with
nothing else running. No job step can beat the sum of the parts on its critical path; the job's own breakdown (the
same parts inside a run: search/generate_seconds, search/ref_seconds, search/reward_seconds, sync/seconds,
sync/push_seconds, time/train_seconds, and the idle ratios) says how far above them it runs. A benchmark: it reports
figures, it asserts nothing.

    python scripts/step_floors.py [CONFIG] [--repeats 10] [--threads 1,2] [--engines hf,vllm] [key=value ...]
    -> a table on stdout, out/step_floors.json

The parts, at the config's B prompts x S samples (a synchronous step's round; K = S on the tiny default):
  generate   engine.generate of the B prompts, S samples each, max_new_tokens, the config's temperature: per engine
             (hf, vllm) and per torch thread count (vLLM on CPU runs one thread whatever is asked: it is timed once)
  load       the engine's load of one round's weights (engine.load_weights, each tensor a fresh copy as the
             transport yields them; vLLM re-runs its post-load processing), per engine
  ref        the reference log-probs of those B x S samples (policy.sequence_logprobs, as a searcher computes them)
  reward     decoding and the task's reward of each sample
  train      one optimizer step of the learner on those B x S samples (learner.Learner.train), per thread count
Each figure is the median of `repeats` timed calls after two untimed ones, with the fastest and slowest beside it.
vLLM's engine goes last: in-process it pins torch to one thread for the rest of the process.
"""
import argparse
import dataclasses
import json
import os
import statistics as st
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from config import load_config, quiet_known_warnings  # noqa: E402

quiet_known_warnings()
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as train.py sets it for every rank, before torch loads


def timed(fn, repeats):
    """(median, fastest, slowest) seconds of fn() over `repeats` calls after two untimed ones."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return st.median(times), min(times), max(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", default=os.path.join(ROOT, "configs", "tiny.yaml"))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", default=f"1,{len(os.sched_getaffinity(0))}", help="torch thread counts to time")
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "step_floors.json"))
    args, overrides = ap.parse_known_args()
    if "=" in args.config:
        overrides, args.config = [args.config, *overrides], os.path.join(ROOT, "configs", "tiny.yaml")
    cfg = load_config(args.config, overrides)
    threads = sorted({int(t) for t in args.threads.split(",")})

    import numpy as np
    import torch
    from buffer import ReplayBuffer, Sample
    from engine import make_engine
    from learner import Learner, checkpointing, policy_model
    from policy import encode_prompt, load_model, load_tokenizer, sequence_logprobs
    from rewards import get_task
    from trainer_group import Group
    torch.manual_seed(cfg.seed)
    task, tok = get_task(cfg.task), load_tokenizer(cfg.model)
    records = task.load(cfg.train_data or task.DEFAULT_TRAIN, "train")[: cfg.B]
    prompts = [encode_prompt(tok, r["prompt"]) for r in records]
    max_len = max(map(len, prompts)) + cfg.max_new_tokens + 8
    rows = []  # (part, engine or "", threads, (median, fastest, slowest))

    def generate(engine):
        return engine.generate(prompts, cfg.S, cfg.temperature, cfg.max_new_tokens)

    engines = args.engines.split(",")
    hf = make_engine(dataclasses.replace(cfg, engine="hf"), "cpu", cfg.seed, tok.pad_token_id, tok.eos_token_id,
                     max_len)
    for n in threads:
        torch.set_num_threads(n)
        if "hf" in engines:
            rows.append(("generate", "hf", n, timed(lambda: generate(hf), args.repeats)))
    source = load_model(cfg.model, cfg.dtype, "cpu")  # the weights a round pushes, loaded as a searcher loads them

    def load(engine):
        engine.load_weights((name, t.detach().clone()) for name, t in source.named_parameters())
    if "hf" in engines:
        rows.append(("load", "hf", torch.get_num_threads(), timed(lambda: load(hf), args.repeats)))
    torch.set_num_threads(1)  # the samples every other part works on: one round's worth from the HF engine
    flat = [(i, resp, lp) for i, outs in enumerate(generate(hf)) for resp, lp in outs]
    ref = load_model(cfg.model, cfg.dtype, "cpu").eval()
    texts = lambda: [tok.decode(r, skip_special_tokens=True) for _, r, _ in flat]  # noqa: E731
    for n in threads:
        torch.set_num_threads(n)
        rows.append(("ref", "", n, timed(lambda: sequence_logprobs(ref, [prompts[i] for i, _, _ in flat],
                                                                   [r for _, r, _ in flat], cfg.temperature,
                                                                   cfg.logprob_tokens), args.repeats)))
    rows.append(("reward", "", 1, timed(lambda: [task.reward(t, records[i]["answer"])
                                                 for (i, _, _), t in zip(flat, texts())], args.repeats)))
    logp_ref = sequence_logprobs(ref, [prompts[i] for i, _, _ in flat], [r for _, r, _ in flat], cfg.temperature,
                                 cfg.logprob_tokens)
    samples = [Sample(i, tuple(r), task.reward(t, records[i]["answer"]), np.asarray(lp, dtype=np.float32), lr, 0,
                      True, ()) for (i, r, lp), t, lr in zip(flat, texts(), logp_ref)]
    sync_cfg = dataclasses.replace(cfg, asynchronous=False, n_trainers=1)
    for n in threads:
        torch.set_num_threads(n)
        model = checkpointing(policy_model(sync_cfg, None, "cpu").train(), sync_cfg)
        learner = Learner(sync_cfg, tok, prompts, model, Group(sync_cfg, model, "cpu", None))
        buffer = ReplayBuffer(sync_cfg)
        buffer.add(samples)
        rows.append(("train", "", n, timed(lambda: learner.train(buffer.sample(cfg.B, cfg.K), 1), args.repeats)))
    if "vllm" in engines:
        vllm = make_engine(dataclasses.replace(cfg, engine="vllm"), "cpu", cfg.seed, tok.pad_token_id,
                           tok.eos_token_id, max_len)
        rows.append(("generate", "vllm", torch.get_num_threads(), timed(lambda: generate(vllm), args.repeats)))
        rows.append(("load", "vllm", torch.get_num_threads(), timed(lambda: load(vllm), args.repeats)))
        vllm.shutdown()

    print(f"| part, alone ({cfg.B} prompts x {cfg.S} samples, {cfg.max_new_tokens} new tokens, {args.repeats} "
          f"repeats) | engine | torch threads | median s | fastest - slowest s |")
    print("|---|---|---|---|---|")
    for part, engine, n, (med, lo, hi) in rows:
        print(f"| {part} | {engine or '-'} | {n} | {med:.3f} | {lo:.3f} - {hi:.3f} |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump([{"part": p, "engine": e, "threads": n, "median_s": m, "fastest_s": lo, "slowest_s": hi}
                   for p, e, n, (m, lo, hi) in rows], f, indent=2)


if __name__ == "__main__":
    main()
