"""Greedy test accuracy with either engine. Used by the searchers during training, and on its own:

    python eval.py MODEL_DIR [--task gsm8k] [--data PATH] [--n 0] [--engine auto|vllm|hf] [--max-new-tokens 512]
    -> accuracy 54.6% (720/1319)
"""
import argparse
import sys

from policy import encode_prompt


def greedy_eval(engine, tok, task, records, max_new_tokens, batch=64):
    """[(completion, correct)] for each record, generated greedily."""
    correct_fn = getattr(task, "correct", lambda c, a: task.reward(c, a) >= 1.0)
    out = []
    for s in range(0, len(records), batch):
        chunk = records[s : s + batch]
        gens = engine.generate([encode_prompt(tok, r["prompt"]) for r in chunk], 1, 0.0, max_new_tokens)
        for r, g in zip(chunk, gens):
            text = tok.decode(g[0][0], skip_special_tokens=True)
            try:
                ok = bool(correct_fn(text, r["answer"]))
            except Exception:  # a reward function must never end a run
                ok = False
            out.append((text, ok))
    return out


def main():
    import torch

    from config import Config, ConfigError
    from engine import make_engine
    from policy import ModelError, load_tokenizer
    from rewards import DataError, get_task

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--data", default="", help="test data (default: the task's)")
    ap.add_argument("--n", type=int, default=0, help="first n problems (0 = all)")
    ap.add_argument("--engine", default="auto", choices=["auto", "vllm", "hf"])
    ap.add_argument("--dtype", default="bfloat16" if torch.cuda.is_available() else "float32")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    args = ap.parse_args()
    try:
        task = get_task(args.task)
        records = task.load(args.data or task.DEFAULT_TEST, "test")
        records = records[: args.n] if args.n else records
        tok = load_tokenizer(args.model)
        cfg = Config(model=args.model, engine=args.engine, dtype=args.dtype)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        longest = max(len(encode_prompt(tok, r["prompt"])) for r in records)
        engine = make_engine(cfg, device, 0, tok.pad_token_id, tok.eos_token_id, longest + args.max_new_tokens)
    except (ConfigError, DataError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    results = greedy_eval(engine, tok, task, records, args.max_new_tokens)
    c = sum(ok for _, ok in results)
    print(f"accuracy {100 * c / len(results):.1f}% ({c}/{len(results)})")


if __name__ == "__main__":
    main()
