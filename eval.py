"""Test-set evaluation with either engine: greedy accuracy, or the task's own metrics when it defines
make_evaluator (rewards/__init__.py); with eval_samples = N also pass@k and distinct solutions from N samples per
problem. Used by the searchers during training, and on its own:

    python eval.py MODEL_DIR [--task gsm8k] [--data PATH] [--n 0] [--engine auto|vllm|hf] [--max-new-tokens 512]
    -> accuracy <percent>% (<correct>/<problems>)
    python eval.py MODEL_DIR --task tldr judge_model=PATH            # config keys the task's evaluator reads
    -> win_rate <mean> (n=<count>) ...
    python eval.py MODEL_DIR --task arith eval_samples=64 temperature=0.7     # N samples per problem, as a run's keys
    -> ... pass@1 <mean> (n=<problems>) ... pass@64 <mean> ... distinct_correct <mean> ... distinct_answers <mean> ...
"""
import argparse
import math
import sys

import numpy as np

from config import ConfigError, quiet_known_warnings

quiet_known_warnings()  # before torch loads (policy imports it)
from policy import encode_prompt  # noqa: E402
from rewards import Timeout, time_limit, warn_task_error  # noqa: E402


def grade(task, text, answer, timeout_s):
    """The task's correct() (default: reward >= 1) of one completion; one that raises or runs past timeout_s (0: no
    limit) counts as wrong: a reward function must never end (nor hang) a run."""
    try:
        with time_limit(timeout_s):
            return bool(task.correct(text, answer) if hasattr(task, "correct") else task.reward(text, answer) >= 1.0)
    except (Exception, Timeout):
        return False


def generations(engine, tok, records, n, temperature, max_new_tokens, batch):
    """Per record, its n (response ids, behaviour log-probs) at `temperature` (0: greedy), `batch` records per call."""
    out = []
    for start in range(0, len(records), batch):
        chunk = records[start : start + batch]
        out += engine.generate([encode_prompt(tok, r["prompt"]) for r in chunk], n, temperature, max_new_tokens)
    return out


def completions(engine, tok, records, n, temperature, max_new_tokens, batch):
    """Per record, its n completions' texts at `temperature` (0: greedy), generated `batch` records per call."""
    return [[tok.decode(ids, skip_special_tokens=True) for ids, _ in gen]
            for gen in generations(engine, tok, records, n, temperature, max_new_tokens, batch)]


def greedy_eval(engine, tok, task, records, max_new_tokens, batch=64, timeout_s=0.0):
    """[(completion, correct)] for each record, generated greedily."""
    texts = completions(engine, tok, records, 1, 0.0, max_new_tokens, batch)
    return [(t[0], grade(task, t[0], r["answer"], timeout_s)) for r, t in zip(records, texts)]


def pass_at_k(n, c, k):
    """The unbiased pass@k of a problem with c correct among n samples (k <= n): 1 - C(n - c, k) / C(n, k), the
    chance that k of the n drawn without replacement hold a correct one (Chen et al. 2021, arXiv 2107.03374, eq. 1)."""
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_ks(n):
    """The k of eval/pass@k for n samples: 1, 2, 4, ... up to n, and n itself."""
    return sorted({2 ** i for i in range(n.bit_length()) if 2 ** i <= n} | {n})


def sampled_eval(engine, tok, task, records, n, temperature, max_new_tokens, timeout_s=0.0, sft=None):
    """Per record, n completions sampled at `temperature`, counted: samples, samples_correct, distinct_correct (correct
    completions distinct after stripping whitespace) and, when the task can say what an answer is (extract_answer),
    distinct_answers (distinct answers over all n, None not counted). vLLM takes every record in one call (it batches
    by itself); the HF engine greedy evaluation's 64 sequences per call, which bound its memory. With `sft`
    (eval_kl_sft: sft(prompts, responses) -> the start model's per-token log-probs at `temperature`) also kl_sft: the
    mean over the n samples of sum_t log pi(y_t) - log pi_sft(y_t), pi the engine's log-probs of its own samples, a
    Monte-Carlo estimate of KL(pi || pi_sft) per response."""
    batch = max(1, len(records)) if getattr(engine, "name", "") == "vllm" else max(1, 64 // n)
    gens = generations(engine, tok, records, n, temperature, max_new_tokens, batch)
    kl = kl_sft(tok, records, gens, sft) if sft is not None else None
    rows = []
    for i, (r, gen) in enumerate(zip(records, gens)):
        texts = [tok.decode(ids, skip_special_tokens=True) for ids, _ in gen]
        right = [t for t in texts if grade(task, t, r["answer"], timeout_s)]
        row = {"samples": n, "samples_correct": len(right), "distinct_correct": len({t.strip() for t in right})}
        if hasattr(task, "extract_answer"):
            row["distinct_answers"] = len({answer_of(task, t) for t in texts} - {None})
        if kl is not None:
            row["kl_sft"] = kl[i]
        rows.append(row)
    return rows


def kl_sft(tok, records, gens, sft):
    """Per record, the mean over its samples (`gens`: its (response ids, behaviour log-probs)) of
    sum_t log pi(y_t) - log pi_sft(y_t): the samples come from pi, so this estimates KL(pi || pi_sft) per response
    without bias (up to the engine's log-probs against a forward pass's: at step 0, where pi = pi_sft, it reads
    about 0)."""
    prompts = [encode_prompt(tok, r["prompt"]) for r in records]
    flat = [(p, ids, lp) for p, gen in zip(prompts, gens) for ids, lp in gen]
    ref = sft([p for p, _, _ in flat], [list(ids) for _, ids, _ in flat])
    per = [float(np.sum(lp, dtype=np.float64) - np.sum(r, dtype=np.float64)) for (_, _, lp), r in zip(flat, ref)]
    out, at = [], 0
    for gen in gens:
        out.append(sum(per[at : at + len(gen)]) / len(gen))
        at += len(gen)
    return out


def answer_of(task, text):
    """The task's extract_answer(text), or None (no answer) when it raises."""
    try:
        return task.extract_answer(text)
    except Exception:
        return None


def sampled_totals(rows, n):
    """{metric: [sum, count]} of sampled_eval's rows of n samples each: pass@k for every k of pass_ks(n), and the
    distinct counts (a searcher without test problems adds zero counts)."""
    totals = {f"pass@{k}": [sum(pass_at_k(n, r["samples_correct"], k) for r in rows), len(rows)] for k in pass_ks(n)}
    for name in ("distinct_correct", "distinct_answers", "kl_sft"):
        if rows and name in rows[0]:
            totals[name] = [sum(r[name] for r in rows), len(rows)]
    return totals


def check_samples(samples, task, name):
    """eval_samples grades each sample with the task's correct() or reward(): refused, as one line, for a task
    graded only by models in a batch (make_scorer)."""
    if samples and not (hasattr(task, "correct") or hasattr(task, "reward")):
        raise ConfigError(f"eval_samples={samples}: task '{name}' has no correct() or reward() to grade one sample "
                          "with; use eval_samples=0")


def evaluate(engine, tok, task, records, max_new_tokens, evaluator=None, timeout_s=0.0, samples=0,
             temperature=1.0, sft=None):
    """(rows, totals) for this share of the test set. rows: one dict per record, in order, for eval_stepN.jsonl;
    totals: {metric: [sum, count]}, added up over the searchers by the trainer, which logs eval/<metric> = sum / count.
    Without an evaluator: greedy accuracy. With `samples` = N > 0 also N samples per record at `temperature`: their
    counts join each row and pass@k and the distinct counts the totals (sampled_eval); with `sft` (eval_kl_sft) also
    kl_sft, the KL to the start model estimated on those samples."""
    rows, totals = judged(engine, tok, task, records, max_new_tokens, evaluator, timeout_s)
    if samples:
        counts = sampled_eval(engine, tok, task, records, samples, temperature, max_new_tokens, timeout_s, sft)
        rows = [dict(row, **c) for row, c in zip(rows, counts)]
        totals.update(sampled_totals(counts, samples))
    return rows, totals


def judged(engine, tok, task, records, max_new_tokens, evaluator, timeout_s):
    """evaluate's greedy accuracy, or the evaluator's metrics. An evaluator that raises (or returns the wrong number
    of rows) gives no metrics this time and a warning, never a crash."""
    if evaluator is None:
        results = greedy_eval(engine, tok, task, records, max_new_tokens, timeout_s=timeout_s)
        rows = [{"correct": ok, "completion": text} for text, ok in results]
        return rows, {"accuracy": [sum(ok for _, ok in results), len(results)]}
    try:
        rows, totals = evaluator.evaluate(engine, tok, records, max_new_tokens)
        if len(rows) != len(records):
            raise ValueError(f"{len(rows)} rows for {len(records)} records")
        return rows, {name: [float(s), int(n)] for name, (s, n) in totals.items()}
    except Exception as e:
        warn_task_error("task's evaluator", e, f"{len(records)} records", "no eval metrics this time")
        return [{"error": f"{type(e).__name__}: {e}"} for _ in records], {}


def merge_evals(evals, task=None, cfg=None):
    """Each searcher's (rows, {metric: [sum, count]}) for its share of the test set -> ({metric: sum / count over
    all searchers}, all rows sorted by test id). A metric no searcher counted is NaN. A task with
    `summarize(rows, cfg)` adds the metrics it computes over all the rows (e.g. how many modes they cover)."""
    results = sorted((r for rows, _ in evals for r in rows), key=lambda r: r["id"])
    sums = {}
    for _, part in evals:
        for name, (s, n) in part.items():
            total = sums.setdefault(name, [0.0, 0])
            total[0], total[1] = total[0] + s, total[1] + n
    metrics = {name: s / n if n else float("nan") for name, (s, n) in sums.items()}
    if hasattr(task, "summarize"):
        metrics.update(task.summarize(results, cfg))
    return metrics, results


def main():
    import torch

    from config import load_config
    from engine import make_engine, position_limit
    from policy import ModelError, fit_new_tokens, load_tokenizer, longest_prompt
    from rewards import DataError, get_task

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--data", default="", help="test data (default: the task's)")
    ap.add_argument("--n", type=int, default=0, help="first n problems (0 = all)")
    ap.add_argument("--engine", default="auto", choices=["auto", "vllm", "hf"])
    ap.add_argument("--dtype", default="bfloat16" if torch.cuda.is_available() else "float32")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("keys", nargs="*", metavar="KEY=VALUE",
                    help="config keys: the task's evaluator's (judge_model=PATH), or eval_samples=N temperature=T")
    args = ap.parse_intermixed_args()  # KEY=VALUE may follow the options
    try:
        task = get_task(args.task)
        records = task.load(args.data or task.DEFAULT_TEST, "test")
        records = records[: args.n] if args.n else records
        tok = load_tokenizer(args.model)
        cfg = load_config(None, [f"model={args.model}", f"engine={args.engine}", f"dtype={args.dtype}", *args.keys])
        check_samples(cfg.eval_samples, task, args.task)
        if cfg.eval_kl_sft:  # the start model is a training run's (its `model`); here MODEL_DIR is the policy
            raise ConfigError("eval_kl_sft is measured during training (against the run's start model), not by eval.py")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        longest = longest_prompt(tok, [r["prompt"] for r in records])
        max_new_tokens, max_len, warning = fit_new_tokens(position_limit(args.model, args.engine), longest,
                                                          args.max_new_tokens)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        engine = make_engine(cfg, device, 0, tok.pad_token_id, tok.eos_token_id, max_len)
        evaluator = task.make_evaluator(cfg, device) if hasattr(task, "make_evaluator") else None
    except (ConfigError, DataError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    rows, totals = evaluate(engine, tok, task, records, max_new_tokens, evaluator, samples=cfg.eval_samples,
                            temperature=cfg.temperature)
    for name, (s, n) in totals.items():
        if name == "accuracy":
            print(f"accuracy {100 * s / n:.1f}% ({int(s)}/{n})")
        else:
            print(f"{name} {s / n if n else math.nan:.4f} (n={n})")
    for name, value in (task.summarize(rows, cfg) if hasattr(task, "summarize") else {}).items():
        print(f"{name} {value:.4f}")
    if evaluator is not None and not totals:
        sys.exit(1)


if __name__ == "__main__":
    main()
