"""Ranks 1..N-1: search. Walk this rank's shard of the training prompts; per prompt visit generate S samples, score
them with the task's reward, and compute their behaviour and reference log-probs; hand them to the trainer at the
next sync round. Between generation chunks, join a sync round if one was announced (comm.py).
"""
import time

import numpy as np
import torch

import comm as C
from buffer import Sample
from engine import make_engine
from eval import greedy_eval
from policy import encode_prompt, load_model, token_logprobs


def score(task, text, answer, stats):
    """The task's reward; a reward function that raises counts as 0 (logged by the trainer), never a crash."""
    try:
        return float(task.reward(text, answer))
    except Exception:
        stats["reward_errors"] += 1
        return 0.0


def search_chunk(cfg, engine, ref, tok, task, records, prompts, pids, version, stats):
    """One generation call: S samples for each prompt id, scored, with behaviour and reference log-probs."""
    t0 = time.perf_counter()
    outs = engine.generate([prompts[p] for p in pids], cfg.S, cfg.temperature, cfg.max_new_tokens)
    flat = [(pid, resp, lp) for pid, group in zip(pids, outs) for resp, lp in group]
    ref_lp = []
    with torch.no_grad():
        for s in range(0, len(flat), 64):
            part = flat[s : s + 64]
            lp, mask = token_logprobs(ref, [prompts[p] for p, _, _ in part], [r for _, r, _ in part], cfg.temperature)
            ref_lp += [lp[i][mask[i]].float().cpu().numpy() for i in range(len(part))]
    samples = []
    for (pid, resp, lp), rlp in zip(flat, ref_lp):
        text = tok.decode(resp, skip_special_tokens=True)
        samples.append(Sample(pid, tuple(resp), score(task, text, records[pid]["answer"], stats), lp, rlp, version,
                              bool(resp and resp[-1] == tok.eos_token_id)))
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

    ref = load_model(cfg.model, cfg.dtype, device).eval()  # frozen reference pi_ref
    engine = make_engine(cfg, device, cfg.seed + rank, tok.pad_token_id, tok.eos_token_id, max_len)
    weights = ctx.make_transport(comm, None)

    order, pos, version, ref_version = rng.permutation(shard).tolist(), 0, 0, 0
    pending = []  # trajectories generated since the last sync round
    stats = dict(tokens=0, gen_s=0.0, samples=0, reward_errors=0, engine=engine.name)
    # prompt visits per round before this searcher waits for the next round: in synchronous mode exactly its share of
    # the batch (and it waits for the first round before generating); in async mode max_prompts_per_round (0 = no cap)
    limit = cfg.B // n_searchers if not cfg.asynchronous else (cfg.max_prompts_per_round or float("inf"))
    done_prompts = limit if not cfg.asynchronous else 0

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
        comm.gather_object((pending, dict(stats)))  # 1. trajectories to rank 0
        pending, done_prompts = [], 0
        stats.update(tokens=0, gen_s=0.0, samples=0)
        if flags & C.WEIGHTS:  # 2. weights from rank 0
            named, done = weights.pull()
            engine.load_weights(named)
            if cfg.ref_reset_every and step - ref_version >= cfg.ref_reset_every:  # TBA': pi_ref <- pi every rho steps
                ref.load_state_dict(dict(named), strict=False)
                ref_version = step
            done()
            version = step
            if cfg.check_sync:  # the trainer compares this with its own greedy completion
                comm.gather_object(engine.generate([prompts[0]], 1, 0.0, C.PROBE_TOKENS)[0][0][0])
        if flags & C.EVAL:  # 3. greedy evaluation of this rank's share of the test set
            results = greedy_eval(engine, tok, task, [test[i] for i in my_test], eval_tokens)
            comm.gather_object([(i, text, ok) for i, (text, ok) in zip(my_test, results)])
        if flags & C.STOP:
            break
    if hasattr(engine, "shutdown"):
        engine.shutdown()
