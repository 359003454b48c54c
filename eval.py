"""Test-set evaluation with either engine: greedy accuracy, or the task's own metrics when it defines
make_evaluator (rewards/__init__.py). Used by the searchers during training, and on its own:

    python eval.py MODEL_DIR [--task gsm8k] [--data PATH] [--n 0] [--engine auto|vllm|hf] [--max-new-tokens 512]
    -> accuracy <percent>% (<correct>/<problems>)
    python eval.py MODEL_DIR --task tldr judge_model=PATH            # config keys the task's evaluator reads
    -> win_rate <mean> (n=<count>) ...
"""
import argparse
import math
import sys

from config import quiet_known_warnings

quiet_known_warnings()  # before torch loads (policy imports it)
from policy import encode_prompt  # noqa: E402
from rewards import Timeout, time_limit, warn_task_error  # noqa: E402


def greedy_eval(engine, tok, task, records, max_new_tokens, batch=64, timeout_s=0.0):
    """[(completion, correct)] for each record, generated greedily; a correct() that raises or runs past timeout_s
    (0: no limit) counts as wrong."""
    correct_fn = getattr(task, "correct", lambda c, a: task.reward(c, a) >= 1.0)
    out = []
    for start in range(0, len(records), batch):
        chunk = records[start : start + batch]
        gens = engine.generate([encode_prompt(tok, r["prompt"]) for r in chunk], 1, 0.0, max_new_tokens)
        for r, gen in zip(chunk, gens):  # gen: this record's one (response_ids, logprobs) pair, in a list
            text = tok.decode(gen[0][0], skip_special_tokens=True)
            try:
                with time_limit(timeout_s):
                    ok = bool(correct_fn(text, r["answer"]))
            except (Exception, Timeout):  # a reward function must never end (nor hang) a run
                ok = False
            out.append((text, ok))
    return out


def evaluate(engine, tok, task, records, max_new_tokens, evaluator=None, timeout_s=0.0):
    """(rows, totals) for this share of the test set. rows: one dict per record, in order, for eval_stepN.jsonl;
    totals: {metric: [sum, count]}, added up over the searchers by the trainer, which logs eval/<metric> = sum / count.
    Without an evaluator: greedy accuracy. An evaluator that raises (or returns the wrong number of rows) gives no
    metrics this time and a warning, never a crash."""
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

    from config import ConfigError, load_config
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
                    help="config keys for the task's evaluator, e.g. judge_model=PATH")
    args = ap.parse_intermixed_args()  # KEY=VALUE may follow the options
    try:
        task = get_task(args.task)
        records = task.load(args.data or task.DEFAULT_TEST, "test")
        records = records[: args.n] if args.n else records
        tok = load_tokenizer(args.model)
        cfg = load_config(None, [f"model={args.model}", f"engine={args.engine}", f"dtype={args.dtype}", *args.keys])
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
    rows, totals = evaluate(engine, tok, task, records, max_new_tokens, evaluator)
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
