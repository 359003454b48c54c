"""Ranks 1..N-1: search. Walk this rank's shard of the training prompts; per prompt visit generate S samples, score
them with the task's reward, and compute their behaviour and reference log-probs; hand them to the trainer at the
next sync round. Between generation chunks, join a sync round if one was announced (comm.py).
"""
import os
import signal
import sys
import time

import numpy as np
import torch

import comm as C
import checkpoint
from buffer import Sample
from engine import make_engine
from eval import evaluate
from policy import encode_prompt, load_model, token_logprobs


def score(task, text, answer, stats):
    """The task's reward; a reward function that raises counts as 0 with a warning (the first few times) and a
    counter (search/reward_errors), never a crash."""
    try:
        return float(task.reward(text, answer))
    except Exception as e:
        stats["reward_errors"] += 1  # cumulative over the run
        if stats["reward_errors"] <= 3:
            print(f"warning: the reward raised {type(e).__name__}: {e} on completion {text[:80]!r}; counted as 0"
                  + (" (further ones are only counted: search/reward_errors)" if stats["reward_errors"] == 3 else ""),
                  file=sys.stderr, flush=True)
        return 0.0


def score_batch(scorer, prompts, texts, records, finished, stats):
    """The task's batched scorer (make_scorer); a batch that raises (or returns the wrong number of rewards) counts
    as 0 for every sample in it, with a warning (the first few times) and the search/reward_errors counter."""
    try:
        rewards = [float(r) for r in scorer.score(prompts, texts, records, finished)]
        if len(rewards) != len(texts):
            raise ValueError(f"{len(rewards)} rewards for {len(texts)} completions")
        return rewards
    except Exception as e:
        stats["reward_errors"] += len(texts)  # cumulative over the run
        stats["scorer_failures"] = stats.get("scorer_failures", 0) + 1
        if stats["scorer_failures"] <= 3:
            print(f"warning: the task's scorer raised {type(e).__name__}: {e} on a batch of {len(texts)}; counted as 0"
                  + (" (further ones are only counted: search/reward_errors)" if stats["scorer_failures"] == 3 else ""),
                  file=sys.stderr, flush=True)
        return [0.0] * len(texts)


_built = {}  # (task, hook) -> the object the task's make_scorer / make_evaluator built in this process


def task_hook(task, hook, cfg, device):
    """What the task's optional hook (make_scorer, make_evaluator) builds, once per searcher process, so its models
    load once; None when the task has no such hook (then its per-sample reward / greedy accuracy apply)."""
    if not hasattr(task, hook):
        return None
    key = (task.__name__, hook)
    if key not in _built:
        _built[key] = getattr(task, hook)(cfg, str(device))
    return _built[key]


def search_chunk(cfg, engine, ref, tok, task, records, prompts, pids, version, stats):
    """One generation call: S samples for each prompt id, scored (the task's per-sample reward, or its batched
    scorer), with behaviour and reference log-probs."""
    t0 = time.perf_counter()
    outs = engine.generate([prompts[p] for p in pids], cfg.S, cfg.temperature, cfg.max_new_tokens)
    flat = [(pid, resp, lp) for pid, group in zip(pids, outs) for resp, lp in group]
    ref_lp = []
    with torch.no_grad():
        for s in range(0, len(flat), 64):
            part = flat[s : s + 64]
            lp, mask = token_logprobs(ref, [prompts[p] for p, _, _ in part], [r for _, r, _ in part], cfg.temperature)
            ref_lp += [lp[i][mask[i]].float().cpu().numpy() for i in range(len(part))]
    texts = [tok.decode(resp, skip_special_tokens=True) for _, resp, _ in flat]
    finished = [bool(resp and resp[-1] == tok.eos_token_id) for _, resp, _ in flat]
    scorer = task_hook(task, "make_scorer", cfg, next(ref.parameters()).device)
    if scorer is None:
        rewards = [score(task, text, records[pid]["answer"], stats) for (pid, _, _), text in zip(flat, texts)]
    else:
        rewards = score_batch(scorer, [records[pid]["prompt"] for pid, _, _ in flat], texts,
                              [records[pid] for pid, _, _ in flat], finished, stats)
    samples = []
    for (pid, resp, lp), rlp, reward, fin in zip(flat, ref_lp, rewards, finished):
        samples.append(Sample(pid, tuple(resp), reward, lp, rlp, version, fin))
        stats["tokens"] += len(resp)
    stats["gen_s"] += time.perf_counter() - t0
    stats["samples"] += len(flat)
    return samples


def run(cfg, comm, ctx):
    rank, n_searchers = comm.rank, comm.world - 1
    task, train, test, tok, device = ctx.task, ctx.train, ctx.test, ctx.tok, ctx.device
    prompts = [encode_prompt(tok, r["prompt"]) for r in train]
    shard = list(range(rank - 1, len(train), n_searchers))  # round-robin shard, as in the reference code
    my_test = list(range(rank - 1, len(test), n_searchers))
    eval_tokens = cfg.eval_max_new_tokens or cfg.max_new_tokens
    max_len = max(len(p) for p in prompts) + max(cfg.max_new_tokens, eval_tokens) + 8
    rng = np.random.default_rng(cfg.seed + rank)

    def leave(signum, frame):  # SIGTERM / SIGINT: the trainer saves a checkpoint; a searcher just leaves, quietly
        comm.leaving(signum)
        os._exit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, leave)
    ref = load_model(cfg.model, cfg.dtype, device).eval()  # reference pi_ref (frozen unless TBA' resets it)
    engine = make_engine(cfg, device, cfg.seed + rank, tok.pad_token_id, tok.eos_token_id, max_len)
    weights = ctx.make_transport(comm, None)

    order, pos, version = rng.permutation(shard).tolist(), 0, 0
    if ctx.resume:  # continue this shard where the checkpoint's sync round left it, with the same random streams
        saved = (checkpoint.load(ctx.resume, "searchers.pth") or {}).get(rank)
        if saved and saved["n_searchers"] == n_searchers:
            order, pos = saved["order"], saved["pos"]
            rng.bit_generator.state = saved["rng"]
            torch.set_rng_state(saved["torch_rng"])
            engine.set_rng_state(saved["engine_rng"])
        else:
            print(f"warning: rank {rank}: the checkpoint has no shard position for {n_searchers} searchers; "
                  "starting the shard afresh", file=sys.stderr, flush=True)
        ref_state = checkpoint.load(ctx.resume, "ref.pth")
        if ref_state is not None:
            ref.load_state_dict(ref_state)
    pending = []  # trajectories generated since the last sync round
    stats = dict(tokens=0, gen_s=0.0, samples=0, reward_errors=0, engine=engine.name)
    # prompt visits per round before this searcher waits for the next round: in synchronous mode exactly its share of
    # the batch; in async mode max_prompts_per_round (0 = no cap). It waits for the first round before generating in
    # synchronous mode and after a resume (that round brings the checkpoint's weights).
    limit = cfg.B // n_searchers if not cfg.asynchronous else (cfg.max_prompts_per_round or float("inf"))
    done_prompts = limit if not cfg.asynchronous or ctx.resume else 0

    def next_prompts(n):
        nonlocal pos, order
        pids = []
        for _ in range(n):
            if pos == len(order):
                order, pos = rng.permutation(shard).tolist(), 0
            pids.append(order[pos])
            pos += 1
        return pids

    while True:
        # synchronous mode joins a round only with its whole share generated; async mode polls between chunks
        ann = None if not cfg.asynchronous and done_prompts < limit else comm.poll(block=done_prompts >= limit)
        if ann is None:
            pids = next_prompts(int(min(cfg.chunk_prompts, limit - done_prompts)))
            pending.extend(search_chunk(cfg, engine, ref, tok, task, train, prompts, pids, version, stats))
            done_prompts += len(pids)
            continue
        step, flags = ann
        place = dict(n_searchers=n_searchers, order=order, pos=pos, rng=rng.bit_generator.state,
                     torch_rng=torch.get_rng_state(), engine_rng=engine.get_rng_state())  # for checkpoints
        comm.gather_object((pending, dict(stats), place))  # 1. trajectories to rank 0
        pending, done_prompts = [], 0
        stats.update(tokens=0, gen_s=0.0, samples=0)
        if flags & C.WEIGHTS:  # 2. weights from rank 0
            named, done = weights.pull()
            engine.load_weights(named)
            if flags & C.REF:  # TBA': pi_ref <- pi every rho steps (the trainer decides when)
                ref.load_state_dict(dict(named), strict=False)
            done()
            version = step
            if cfg.check_sync:  # the trainer compares this with its own greedy completion
                comm.gather_object(engine.generate([prompts[0]], 1, 0.0, C.PROBE_TOKENS)[0][0][0])
        if flags & C.EVAL:  # 3. evaluation of this rank's share of the test set (greedy accuracy, or the task's)
            rows, totals = evaluate(engine, tok, task, [test[i] for i in my_test], eval_tokens,
                                    task_hook(task, "make_evaluator", cfg, device))
            comm.gather_object(([{"id": i, **r} for i, r in zip(my_test, rows)], totals))
        if flags & C.STOP:
            break
    if hasattr(engine, "shutdown"):
        engine.shutdown()
