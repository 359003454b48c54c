"""Check that a weight_delay run evaluated the trainer's weights (sync.Flag.CURRENT), not the searchers' older ones:
its last evaluation's completions must be what checkpoints/final writes greedily, and not what the delayed weights
(checkpoints/step_<steps - D>) write.

    python scripts/check_current.py RUN_DIR [--json F]      (scripts/gpu_check.sh runs it after a run with
                                                             weight_delay = D, save_every=1 and a high lr)

Each searcher's share of the test set is written again as that searcher wrote it (the same engine, dtype, device and
batches; eval.greedy_eval), first with the final weights, then with the delayed ones loaded into the same engine.
PASS: every completion equals the final weights' and at least one differs from the delayed weights' (else the
run's lr moved the weights too little to tell them apart).
"""
import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from config import load_config, quiet_known_warnings  # noqa: E402

quiet_known_warnings()
import torch  # noqa: E402

from engine import make_engine  # noqa: E402
from eval import greedy_eval  # noqa: E402
from policy import encode_prompt, load_model, load_tokenizer  # noqa: E402
from rewards import get_task  # noqa: E402
from searcher import fit_lengths  # noqa: E402


def written(engine, tok, task, test, n_searchers, max_new_tokens):
    """{test id: completion} as the run's searchers write them: searcher r evaluates ids r - 1, r - 1 + n, ..."""
    out = {}
    for rank in range(1, n_searchers + 1):
        ids = list(range(rank - 1, len(test), n_searchers))
        texts = greedy_eval(engine, tok, task, [test[i] for i in ids], max_new_tokens)
        out.update((i, text) for i, (text, _) in zip(ids, texts))
    return out


def check(run):
    cfg = load_config(os.path.join(run, "config.yaml"))
    steps = json.load(open(os.path.join(run, "summary.json")))["steps"]
    final, delayed = (os.path.join(run, "checkpoints", name) for name in ("final", f"step_{steps - cfg.weight_delay}"))
    evaluated = {r["id"]: r["completion"] for r in map(json.loads, open(os.path.join(run, f"eval_step{steps}.jsonl")))}
    task, tok = get_task(cfg.task), load_tokenizer(final)
    train = task.load(cfg.train_data or task.DEFAULT_TRAIN, "train")[: cfg.n_train or None]
    test = task.load(cfg.test_data or task.DEFAULT_TEST, "test")[: cfg.n_test or None]
    cfg, max_len, _ = fit_lengths(dataclasses.replace(cfg, model=final), tok,
                                  [encode_prompt(tok, r["prompt"]) for r in train], test)
    device = "cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu"
    engine = make_engine(cfg, device, cfg.seed, tok.pad_token_id, tok.eos_token_id, max_len)
    new_tokens = cfg.eval_max_new_tokens or cfg.max_new_tokens
    by_final = written(engine, tok, task, test, cfg.n_searchers, new_tokens)
    engine.load_weights(load_model(delayed, cfg.dtype, device).named_parameters())
    by_delayed = written(engine, tok, task, test, cfg.n_searchers, new_tokens)
    same_final = sum(evaluated[i] == by_final[i] for i in evaluated)
    same_delayed = sum(evaluated[i] == by_delayed[i] for i in evaluated)
    n = len(evaluated)
    passed = same_final == n and same_delayed < n
    note = (f"step {steps}, D = {cfg.weight_delay}: {same_final} of {n} completions are the final weights', "
            f"{same_delayed} the delayed weights'")
    if same_final == n and same_delayed == n:
        note += ": the delayed weights write the same, raise lr to tell them apart"
    return dict(passed=passed, note=note, n=n, same_as_final=same_final, same_as_delayed=same_delayed)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    res = check(a.run)
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    sys.stdout.flush()
    os._exit(0 if res["passed"] else 1)  # skip an in-process vLLM engine's teardown


if __name__ == "__main__":
    main()
