"""Memory plan: what each GPU will hold for a config, and whether it fits, before a run spends a node-day.

    python train.py --plan CONFIG [key=value ...] --gpus N --gpu-memory-gb M [--prompt-tokens P]
    python train.py --plan CONFIG ... --params N --layers L --hidden H --vocab V     (a model with no config at hand)
    python train.py --prepare CONFIG ...   (launch.sh, on a GPU node) the same plan for the GPUs present: refused in
                                           one line (exit 2) when it cannot fit

Per GPU: the trainer's weights, gradients, AdamW states, weight-transport buffers and the activations of one
micro-batch (n_trainers > 1: on each trainer rank, weights, gradients and AdamW states split n_trainers ways with
fsdp, whole with ddp; the transport buffers on rank 0 only); each searcher's reference model, engine budget, receive
buffers and log-prob forward; a CUDA context allowance per process. GB here is 2^30 bytes, as torch.cuda and
nvidia-smi count (an "80 GB" GPU has 79-80 of them). The estimates come from the model's shape (each function says
what it counts); not counted: a task's own models (tldr / redteam reward, judge and victim models), which the searchers
also load.
"""
import dataclasses
import os

import torch

from config import ConfigError
from losses import SPLITS

GB = 2**30
BYTES = {"float32": 4, "bfloat16": 2}
PROMPT_TOKENS = 256  # the prompt length assumed when the model's tokenizer and the task's data are not at hand
HEAD_CHUNK = 2048  # policy.token_logprobs' chunk_tokens: LM-head tokens per checkpointed chunk
CONTEXT_GB = 1.0  # per process: CUDA context, cuBLAS / NCCL workspaces, allocator slack (an allowance)

# Shapes of the hub models the configs in configs/ name, for machines without the hub. Source of every number: the
# model's config.json on the hub, as of 2026; parameters are counted from them (meta device) and match the published
# counts (TinyLlama-1.1B 1,100,048,384; Qwen2.5-7B 7,615,616,512; GPT-2 124,439,808). Left out, so the plan asks for
# --params ... : mnoukhov/pythia410m-sft-tldr (configs/tldr.yaml), whose vocabulary size is not known here.
KNOWN_SHAPES = {
    "realtreetune/rho-1b-sft-GSM8K": dict(  # the TinyLlama-1.1B shape (Rho-1B continues TinyLlama)
        model_type="llama", hidden_size=2048, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
        intermediate_size=5632, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=2048),
    "Qwen/Qwen2.5-7B": dict(
        model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
        intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
    "gpt2": dict(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024),
}


# ---------------------------------------------------------------- the model's shape


def shape_from_config(hf_cfg, source):
    """The numbers the estimates need, from a transformers config; parameters counted on the meta device (no memory,
    no download). gated: a Llama-style MLP (gate_proj, up_proj, down_proj) and RMSNorm."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_cfg)
    h, heads = hf_cfg.hidden_size, hf_cfg.num_attention_heads
    head_dim = getattr(hf_cfg, "head_dim", None) or h // heads
    inter = getattr(hf_cfg, "intermediate_size", None) or getattr(hf_cfg, "n_inner", None) or 4 * h
    return dict(params=sum(p.numel() for p in model.parameters()), layers=hf_cfg.num_hidden_layers, hidden=h,
                intermediate=inter, heads=heads, kv_dim=getattr(hf_cfg, "num_key_value_heads", heads) * head_dim,
                vocab=hf_cfg.vocab_size, positions=getattr(hf_cfg, "max_position_embeddings", None),
                gated=any("gate_proj" in n for n, _ in model.named_parameters()),
                tied=bool(getattr(hf_cfg, "tie_word_embeddings", False)), source=source)


def model_shape(model, given=None):
    """The shape of `model`: given by the user (--params --layers --hidden --vocab), else its config.json (a local
    folder), else KNOWN_SHAPES, else config.json from the hub (or its local cache). Raises ConfigError, one line,
    when none works."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    if given:
        missing = [f"--{k}" for k in ("params", "layers", "hidden", "vocab") if k not in given]
        if missing:
            raise ConfigError(f"--plan: a shape given by hand needs {' '.join(missing)} too")
        h = given["hidden"]  # a Llama-style block assumed: gated MLP of 8/3 h, no grouped KV heads
        return dict(params=given["params"], layers=given["layers"], hidden=h, intermediate=8 * h // 3, heads=1,
                    kv_dim=h, vocab=given["vocab"], positions=None, gated=True,
                    source="--params/--layers/--hidden/--vocab (a Llama-style block assumed)")
    from transformers import AutoConfig
    if model in KNOWN_SHAPES and not os.path.isdir(model):
        return shape_from_config(AutoConfig.for_model(**KNOWN_SHAPES[model]),
                                 "its config.json on the hub, as of 2026 (plan.py's table)")
    try:  # a local folder, else the hub (or its local cache)
        where = f"{model}/config.json" if os.path.isdir(model) else f"{model} config.json (hub)"
        return shape_from_config(AutoConfig.from_pretrained(model), where)
    except (OSError, ValueError):
        raise ConfigError(f"memory plan: no shape for model '{model}' (no config.json in a local folder or from the "
                          "hub, not in plan.py's table): give --params N --layers L --hidden H --vocab V, or a local "
                          "path")


def measured_prompt_tokens(cfg):
    """The longest training or test prompt in tokens when the model's tokenizer is a local folder and the task's data
    loads; None otherwise (the plan then assumes PROMPT_TOKENS)."""
    if not os.path.isdir(cfg.model):
        return None
    from policy import ModelError, load_tokenizer, longest_prompt
    from rewards import DataError, get_task
    try:
        task = get_task(cfg.task)
        rows = task.load(cfg.train_data or task.DEFAULT_TRAIN, "train")[: cfg.n_train or None]
        rows += task.load(cfg.test_data or task.DEFAULT_TEST, "test")[: cfg.n_test or None]
        return longest_prompt(load_tokenizer(cfg.model), [r["prompt"] for r in rows])
    except (DataError, ModelError, OSError, ValueError):
        return None


# ---------------------------------------------------------------- the estimates, in bytes (e: bytes per element)


def weights(shape, e):
    # parameters x bytes of `dtype`; the gradients are the same size (trainer.py: pure `dtype`, no fp32 master copy)
    return shape["params"] * e


def lora_params(shape, rank):
    """The LoRA adapters (learner.lora_model): r x (in + out) numbers per linear layer of each decoder block.
    Llama / Qwen2 blocks: q, o (h -> h), k, v (h -> kv_dim), gate, up (h -> i), down (i -> h): 9h + 2 kv_dim + 3i;
    other blocks (GPT-NeoX: fused qkv h -> 3h, dense, fc_in, fc_out): 8h + 2i."""
    h, i = shape["hidden"], shape["intermediate"]
    per_rank = 9 * h + 2 * shape["kv_dim"] + 3 * i if shape["gated"] else 8 * h + 2 * i
    return shape["layers"] * rank * per_rank


def lora_activations(shape, e, rank):
    """Bytes per token that one decoder layer saves for backward with LoRA beyond layer_activations' count (full
    fine-tuning): each adapted linear layer's A x (r float32 numbers) and, when the base is not float32, its input
    cast to float32 (peft casts it to the adapters' dtype, once per layer), in place of the inputs the frozen base no
    longer keeps for weight gradients (e bytes each, shared where layers share an input). Llama / Qwen2 blocks: q, k,
    v, gate and up each cast the normed hidden state, o and down their own inputs: 4 (6h + i) - e (3h + i) + 28 r;
    other blocks (qkv, dense, fc_in, fc_out): (4 - e)(3h + i) + 16 r. Checked against the saved tensors of a tiny
    Llama layer (scripts/plan_vs_measured.py measures whole steps)."""
    h, i = shape["hidden"], shape["intermediate"]
    copies, layers = (6 * h + i, 7) if shape["gated"] else (3 * h + i, 4)
    cast = 4 * copies - e * (3 * h + i) if e != 4 else 0
    return cast + 4 * rank * layers


def adamw_states(shape, e):
    # torch.optim.AdamW keeps exp_avg and exp_avg_sq like each parameter (in `dtype`): 2 x params x bytes
    return 2 * shape["params"] * e


def layer_activations(shape, e, seq):
    """Bytes per token that one decoder layer saves for backward (no recomputation).
    Korthikanti et al. 2022 ("Reducing Activation Recomputation", eq. 1) count (34 h + 5 a s) bytes for a GPT block
    in 16-bit; with SDPA (flash / memory-efficient kernels keep a log-sum-exp, not the s x s scores) the 5 a s term
    goes. A HF Llama / Qwen2 block differs from theirs: RMSNorm upcasts to fp32 (2 x 4h: the fp32 input of each norm),
    a SwiGLU MLP of width i saves gate, act(gate), up and their product (4i elements), GQA keys and values are repeated
    to all heads once a padding mask is present (the trainer's case), no dropout. Counted: e (8h + 4i) + 8h bytes, in
    bf16 24h + 8i (46h for TinyLlama). Other blocks (GPT-2, GPT-NeoX): Korthikanti's eq. 1 scaled to e bytes (GPT-2
    with dropout saves more, and so does SDPA's math path, which keeps the scores)."""
    h, i = shape["hidden"], shape["intermediate"]
    if shape["gated"]:
        return e * (8 * h + 4 * i) + 8 * h
    return (34 * h + 5 * shape["heads"] * seq) * e // 2


def trainer_activations(shape, e, n, seq, recompute=False, lora_rank=0):
    """Activations of a micro-batch of n samples padded to seq tokens (token_logprobs pads to the longest):
    every layer's saved tensors (layer_activations), the final norm and the gathered response hidden states
    (4h + 2eh), and half a layer's more while backward runs (the gradients of one layer's intermediates). With
    `recompute` (grad_checkpointing) a layer keeps only its input (e h bytes per token) until the backward reaches
    it, and then one layer's saved tensors exist at a time. lora_rank: a layer saves its adapters' too
    (lora_activations). An estimate, not calibrated; the trainer peak memory of the GPU check (docs/performance.md) is
    the figure to compare it with."""
    layer, h = layer_activations(shape, e, seq), shape["hidden"]
    layer += lora_activations(shape, e, lora_rank) if lora_rank else 0
    kept = shape["layers"] * e * h + layer if recompute else shape["layers"] * layer
    return n * seq * (kept + 4 * h + 2 * e * h + layer // 2)


def fsdp_gathered(shape, e):
    """fsdp: the whole parameters a trainer rank holds beyond its shard during a train step. trainer_group.py shards
    each decoder layer and the root (embeddings, final norm, LM head); FSDP2 keeps the root's gathered from forward
    to the end of backward (fully_shard's reshard_after_forward is False for the root) and a layer's while it runs,
    with the next one's all-gather in flight: the root's and 2 layers' parameters."""
    root = shape["vocab"] * shape["hidden"] * (1 if shape.get("tied") else 2) + shape["hidden"]
    return (root + 2 * (shape["params"] - root) / shape["layers"]) * e


def lm_head_chunk(shape, tokens):
    """One checkpointed chunk of min(tokens, 2048) tokens x vocab (policy.token_logprobs), at backward's peak: the
    recomputed forward's fp32 logits / temperature, and in the backward the gradient through logsumexp (a softmax),
    the gather's scattered gradient and their sum: ~16 bytes per logit (checked on a CPU:
    scripts/plan_vs_measured.py)."""
    return min(tokens, HEAD_CHUNK) * shape["vocab"] * 16


def nograd_forward(shape, e, n_seq, seq):
    """Peak of a forward without gradients over n_seq x seq tokens (one pass of policy.sequence_logprobs: reference
    log-probs, HF behaviour log-probs): nothing is saved and no KV cache kept (use_cache=False), so the peak is the
    larger of two phases, not their sum. The body: one MLP's live tensors (act(gate), up, their product: 3i; 2i
    without a gate) beside the residual stream, the layer's input and its normed copy (3h), and the boolean padding
    mask (n_seq x seq^2). The LM head, after the body has returned: the last hidden states and the gathered response
    ones (2 e h per token) and one chunk's logits at 8 bytes each (token_logprobs: fp32 logits / temperature, then
    logsumexp's one fp32 temporary, (x - max).exp_(); a bf16 head output is freed once .float() has copied it).
    Checked on a CPU (scripts/plan_vs_measured.py, docs/performance.md)."""
    tokens = n_seq * seq
    h, i = shape["hidden"], shape["intermediate"]
    body = tokens * e * ((3 if shape["gated"] else 2) * i + 3 * h) + n_seq * seq * seq
    head = tokens * 2 * e * h + min(tokens, HEAD_CHUNK) * shape["vocab"] * 8
    return max(body, head)


def hf_kv_cache(cfg, shape, e, seq):
    # HFEngine: a static KV cache for chunk_prompts x S sequences of `seq` tokens: layers x 2 (K, V) x kv_dim x bytes
    return cfg.chunk_prompts * cfg.S * seq * shape["layers"] * 2 * shape["kv_dim"] * e


def vllm_budget(cfg, shape, e, gpu_bytes, engines):
    # vLLM takes vllm_gpu_memory_utilization of the GPU (weights, activations and KV cache), split evenly among the
    # engines sharing it (engine.vllm_memory_args); with vllm_kv_cache_memory_bytes: that KV cache plus the weights
    if cfg.vllm_kv_cache_memory_bytes:
        return cfg.vllm_kv_cache_memory_bytes + weights(shape, e)
    return cfg.vllm_gpu_memory_utilization * gpu_bytes / engines


# ---------------------------------------------------------------- the plan


def sequence(cfg, shape, prompt_tokens):
    """The longest sequence a micro-batch pads to: prompt + max_new_tokens, capped at the model's positions."""
    seq = prompt_tokens + cfg.max_new_tokens
    return min(seq, shape["positions"]) if shape["positions"] else seq


def micro_batch(cfg):
    # samples per forward / backward, as Learner.update splits a batch (micro_batch, 0 = K), at most the B x K batch
    return min(cfg.micro_batch or cfg.K, cfg.B * cfg.K)


def transport_buffers(cfg, shape, e, kind):
    """A side's weight-transport buffers (transport.py): two bucket buffers, each as large as the largest bucket
    (bucket_mb, or the largest tensor, the embeddings, when it is larger); ipc: the trainer's, which the searchers
    see through CUDA IPC handles."""
    return min(2 * largest_bucket(cfg, shape, e), weights(shape, e))


def largest_bucket(cfg, shape, e):
    return max(cfg.bucket_mb * 2**20, shape["vocab"] * shape["hidden"] * e)


def trainer_rows(cfg, shape, seq, rank0=True, kind="nccl"):
    """[(part, bytes, how)] of rank 0 (rank0=False: another trainer rank, n_trainers > 1: no transport buffers);
    `kind`: the weight transport."""
    e, p, n, t = BYTES[cfg.dtype], shape["params"], micro_batch(cfg), cfg.n_trainers
    if cfg.micro_tokens:  # packed to the budget: at worst every sample as long as the longest (one at least)
        n = max(1, min(cfg.micro_tokens // seq, cfg.B * cfg.K))
    per_token = trainer_activations(shape, e, 1, seq, cfg.grad_checkpointing, cfg.lora_rank) / seq
    split = t if t > 1 and cfg.trainer_parallel == "fsdp" else 1  # fsdp: each rank keeps 1 / n_trainers of them
    of = f", 1/{split} (fsdp shard)" if split > 1 else ""
    if cfg.lora_rank:  # frozen base; gradients and AdamW states of the adapters only, float32 like the adapters
        a = lora_params(shape, cfg.lora_rank)
        rows = [("weights", p * e + a * 4, f"{p:,} frozen x {e} B + {a:,} adapter params (lora_rank "
                                           f"{cfg.lora_rank}) x 4 B"),
                ("gradients", a * 4, "of the adapters, float32"),
                ("AdamW states", 2 * a * 4, "exp_avg + exp_avg_sq of the adapters, float32")]
    else:
        rows = [("weights", weights(shape, e) / split, f"{p:,} params x {e} B{of}"),
                ("gradients", weights(shape, e) / split, "as the weights"),
                ("AdamW states", adamw_states(shape, e) / split, f"exp_avg + exp_avg_sq, 2 x the weights{of}")]
    if split > 1:
        rows.append(("FSDP gathered weights", fsdp_gathered(shape, e), "embeddings, LM head, final norm and 2 "
                                                                       "decoder layers, whole during a step"))
    if t > 1 and split == 1:  # DistributedDataParallel's all-reduce buckets (gradient_as_bucket_view off)
        rows.append(("DDP gradient buckets", rows[1][1], "a flat copy of the gradients"))
    if rank0:
        rows.append(("weight transport buffers", transport_buffers(cfg, shape, e, kind), f"2 buckets ({kind})"))
        if cfg.push_overlap:  # the push's own copy of the model, broadcast while the next step trains
            rows.append(("push snapshot", weights(shape, e), "push_overlap: the weights once more"))
    if cfg.lora_rank:
        # policy.MergedWeights: the float32 delta, W + delta in float32, the result rounded to W's dtype
        rows.append(("merged weight", shape["hidden"] * shape["intermediate"] * (8 + (e if e != 4 else 0)),
                     "the largest linear layer merged in fp32 for the push"))
    return rows + [
            ("activations", trainer_activations(shape, e, n, seq, cfg.grad_checkpointing, cfg.lora_rank),
             f"{n} x {seq} tokens x {per_token / 1e6:.2f} MB" + (", recomputed per layer" if cfg.grad_checkpointing
                                                                 else "")),
            ("LM-head chunk", lm_head_chunk(shape, n * seq), f"{min(n * seq, HEAD_CHUNK)} tokens x {shape['vocab']} "
                                                             "vocab x 16 B"),
            ("CUDA context", CONTEXT_GB * GB, "allowance per process")]


def searcher_rows(cfg, shape, seq, machine, count=1):
    """[(part, bytes, how)] of `count` searchers on one GPU (count > 1: all ranks share it)."""
    e, x = BYTES[cfg.dtype], f"{count} x " if count > 1 else ""
    engines = count if machine["mode"] == "shared" else 1
    if machine["engine"] == "hf":
        c = cfg.chunk_prompts * cfg.S
        engine = ("HF engine", count * (weights(shape, e) + hf_kv_cache(cfg, shape, e, seq)),
                  f"{x}weights + static KV cache of {c} x {seq} tokens")
        n_seq = c  # the HF engine's behaviour log-probs: the chunk's sequences, logprob_tokens at a time
    else:
        budget = vllm_budget(cfg, shape, e, machine["gpu_bytes"], engines)
        how = (f"{x}KV cache bytes + weights" if cfg.vllm_kv_cache_memory_bytes else
               f"vllm_gpu_memory_utilization {cfg.vllm_gpu_memory_utilization:g} of the GPU"
               + (f", {count} engines" if count > 1 else ""))
        engine = ("vLLM engine" + ("s" if count > 1 else ""), count * budget, how)
        n_seq = cfg.chunk_prompts * cfg.S
    n_seq = min(n_seq, max(1, cfg.logprob_tokens // seq))  # policy.sequence_logprobs: one pass at a time
    # gloo / nccl: two buckets; ipc: one bucket's copies out of the trainer's; and the copies the engine holds
    # until a layer (or the embeddings) is loaded
    layer = (shape["params"] - shape["vocab"] * shape["hidden"]) / shape["layers"] * e
    buffers = (min(largest_bucket(cfg, shape, e), weights(shape, e)) if machine["kind"] == "ipc"
               else transport_buffers(cfg, shape, e, machine["kind"]))
    receive = buffers + max(layer, shape["vocab"] * shape["hidden"] * e)
    # eval_kl_sft with reference resets: the start model once more (searcher.sft_model); a frozen reference is it
    sft = ([("start model (eval_kl_sft)", count * weights(shape, e), f"{x}a frozen copy: the reference resets")]
           if cfg.eval_kl_sft and cfg.ref_reset_every else [])
    return [("reference model" + ("s" if count > 1 else ""), count * weights(shape, e), f"{x}a frozen copy"), *sft,
            engine,
            ("weight receive buffers", count * receive, f"{x}a bucket's copies + a layer's (ipc)"
             if machine["kind"] == "ipc" else f"{x}2 buckets + a layer's copies ({machine['kind']})"),
            ("log-probs, no grad", count * nograd_forward(shape, e, n_seq, seq), f"{x}{n_seq} x {seq} tokens"),
            ("CUDA context", count * CONTEXT_GB * GB, f"{x}allowance per process")]


def gpu_tables(cfg, shape, prompt_tokens, machine):
    """[(GPU title, [(part, bytes, how)])]: the trainer's GPU and one searcher's, or the one shared GPU."""
    seq = sequence(cfg, shape, prompt_tokens)
    n, t = cfg.n_searchers, cfg.n_trainers
    if machine["mode"] == "shared":
        return [(f"shared GPU (all {n + 1} ranks)", trainer_rows(cfg, shape, seq, kind=machine["kind"])
                 + [(f"searchers: {part}", b, how) for part, b, how in searcher_rows(cfg, shape, seq, machine, n)])]
    others = [] if t == 1 else [(f"other trainer GPU (rank{f's 1..{t - 1}, each' if t > 2 else ' 1'})",
                                 trainer_rows(cfg, shape, seq, rank0=False))]
    return [("trainer GPU (rank 0)", trainer_rows(cfg, shape, seq, kind=machine["kind"]))] + others + [
            (f"searcher GPU (rank{f's {t}..' if n > 1 else ' '}{t + n - 1}{', each' if n > 1 else ''})",
             searcher_rows(cfg, shape, seq, machine))]


def worst(cfg, shape, prompt_tokens, machine):
    """(GPU title, its total bytes) of the fullest GPU."""
    return max(((title, sum(b for _, b, _ in rows)) for title, rows in gpu_tables(cfg, shape, prompt_tokens, machine)),
               key=lambda t: t[1])


def advice(cfg, shape, prompt_tokens, machine):
    """What to change so that the plan fits: the single changes that do, else what the least setting still needs."""
    def fits(c, m=machine):
        return worst(c, shape, prompt_tokens, m)[1] <= machine["gpu_bytes"]
    ranks, found = cfg.n_trainers + cfg.n_searchers, []
    own = dict(machine, mode="own", kind="nccl")
    if machine["mode"] == "shared" and fits(cfg, own):
        found.append(f"{ranks} GPUs (one per rank)")
    if not cfg.grad_checkpointing and fits(dataclasses.replace(cfg, grad_checkpointing=True)):
        found.append("grad_checkpointing=true")
    least = 1 if cfg.loss in SPLITS else cfg.K  # below K: the losses that split a prompt over micro-batches
    sizes = [m for m in range(micro_batch(cfg) - 1, least - 1, -1) if m % cfg.K == 0 or cfg.loss in SPLITS]
    sizes = [m for m in sizes if fits(dataclasses.replace(cfg, micro_batch=m))]
    found += [f"micro_batch={sizes[0]}"] if sizes else []
    if machine["engine"] == "vllm" and not cfg.vllm_kv_cache_memory_bytes:
        fractions = [u / 100 for u in range(int(round(cfg.vllm_gpu_memory_utilization * 100)) - 5, 4, -5)
                     if fits(dataclasses.replace(cfg, vllm_gpu_memory_utilization=u / 100))]
        found += [f"vllm_gpu_memory_utilization={fractions[0]:g}"] if fractions else []
    if cfg.dtype == "float32" and fits(dataclasses.replace(cfg, dtype="bfloat16")):
        found.append("dtype=bfloat16")
    caps = [t for t in range(cfg.max_new_tokens - 16, 15, -16) if fits(dataclasses.replace(cfg, max_new_tokens=t))]
    found += [f"max_new_tokens={caps[0]}"] if caps else []
    trainers = [t for t in (2, 4, 8) if t > cfg.n_trainers and cfg.B % t == 0  # the trainer's states split t ways
                and not cfg.lora_rank and fits(dataclasses.replace(cfg, n_trainers=t, trainer_parallel="fsdp"), own)]
    if trainers:
        found.append(f"n_trainers={trainers[0]} trainer_parallel=fsdp ({trainers[0] + cfg.n_searchers} GPUs)")
    if not cfg.lora_rank and not cfg.weight_delay and fits(dataclasses.replace(cfg, lora_rank=64)):
        found.append("lora_rank=64 (adapters train, not the whole model)")
    if found:
        return "it fits with " + " or ".join(found)
    both = [m for m in range(micro_batch(cfg), least - 1, -1) if (m % cfg.K == 0 or cfg.loss in SPLITS)
            and fits(dataclasses.replace(cfg, micro_batch=m, grad_checkpointing=True), own)]
    if both:
        where = " with a GPU per rank" if machine["mode"] == "shared" else ""
        return f"no single change fits; grad_checkpointing=true and micro_batch={both[0]} together do{where}"
    title, need = worst(dataclasses.replace(cfg, micro_batch=least, grad_checkpointing=True), shape, prompt_tokens,
                        own)
    return (f"no single change fits: even with a GPU per rank, grad_checkpointing=true and micro_batch={least} (the "
            f"least for loss={cfg.loss}) the "
            f"{title.split(' (')[0]} needs {need / GB:.1f} GB: use GPUs that size, or lower K or max_new_tokens (a "
            "trainer rank keeps weights, gradients and AdamW states, 1/n_trainers of them with fsdp, and the "
            "activations of a micro-batch on its GPU)")


def host_rows(cfg, shape):
    """[(part, bytes, how)] of rank 0's host (CPU) memory beyond the processes themselves: the weight copies it keeps
    on the CPU (trainer.TrainerState), which no GPU table holds."""
    e, rows = BYTES[cfg.dtype], []
    if cfg.weight_delay:
        rows.append(("weight_delay versions", (cfg.weight_delay + 1) * weights(shape, e),
                     f"D + 1 = {cfg.weight_delay + 1} copies of the weights"))
    if cfg.ref_reset_every:
        rows.append(("reference weights", weights(shape, e), "TBA's reset reference, kept for checkpoints"))
    if cfg.n_trainers > 1 and cfg.trainer_parallel == "fsdp":
        rows.append(("assembled state dict", weights(shape, e), "while saving (and at a reference reset)"))
    return rows


def verdict(cfg, shape, prompt_tokens, machine):
    """(fits, verdict): 'fits: ...' or 'does not fit: <GPU> needs X of M GB; <what to change>', a single line."""
    m = machine["gpu_bytes"]
    totals = [(title.split(" (")[0], sum(b for _, b, _ in rows))
              for title, rows in gpu_tables(cfg, shape, prompt_tokens, machine)]
    if all(t <= m for _, t in totals):
        return True, "fits: " + ", ".join(f"{title} {t / GB:.1f} of {m / GB:.0f} GB" for title, t in totals)
    over = " and ".join(f"{title} {t / GB:.1f}" for title, t in totals if t > m)
    return False, f"does not fit: {over} of {m / GB:.0f} GB; " + advice(cfg, shape, prompt_tokens, machine)


def report(cfg, shape, prompt_tokens, prompt_source, machine, name="config"):
    """The whole plan as text (header, a table per GPU, the verdict line last) and whether it fits."""
    seq, t = sequence(cfg, shape, prompt_tokens), cfg.n_trainers
    m = machine["gpu_bytes"]
    layout = {"own": "a GPU per rank", "shared": "every rank on one GPU"}[machine["mode"]]
    gpus = f"{machine['n_gpus']} x {m / GB:.0f} GB GPU{'s' if machine['n_gpus'] > 1 else ''}"
    trainers = "1 trainer" if t == 1 else f"{t} trainers, {cfg.trainer_parallel}"
    lines = [f"memory plan: {name}, {t + cfg.n_searchers} ranks ({trainers} + {cfg.n_searchers} searchers) on {gpus}: "
             f"{layout}, weights by {machine['kind']}",
             f"model {cfg.model}: {shape['params']:,} parameters, {shape['layers']} layers, hidden "
             f"{shape['hidden']}, vocab {shape['vocab']}, {cfg.dtype}",
             f"shape from {shape['source']}",
             f"sequence {seq} tokens = {prompt_tokens} prompt ({prompt_source}) + {cfg.max_new_tokens} new; "
             f"engine {machine['engine']}" + (" (engine=auto: vLLM assumed)" if cfg.engine == "auto" else "")]
    extra = [k for k in ("reward_model", "judge_model", "victim_model", "embed_model") if getattr(cfg, k)]
    if extra or cfg.task in ("tldr", "redteam"):
        models = ", ".join(extra) or f"the {cfg.task} defaults"
        lines.append(f"not counted: the task's own models on each searcher ({models})")
    for title, rows in gpu_tables(cfg, shape, prompt_tokens, machine):
        total = sum(b for _, b, _ in rows)
        lines += ["", f"{title:<44}{'GB':>8}"]
        lines += [f"  {part:<42}{b / GB:>8.1f}   {how}" for part, b, how in rows]
        lines.append(f"  {'total':<42}{total / GB:>8.1f}   of {m / GB:.0f} GB ({total / m:.0%})")
    host = host_rows(cfg, shape)
    if host:
        lines += ["", f"{'rank 0 host (CPU) memory':<44}{'GB':>8}"]
        lines += [f"  {part:<42}{b / GB:>8.1f}   {how}" for part, b, how in host]
    ok, line = verdict(cfg, shape, prompt_tokens, machine)
    return "\n".join(lines + ["", line]), ok


# ---------------------------------------------------------------- entry points (train.py --plan, --prepare)

FLAGS = {"--gpus": "gpus", "--gpu-memory-gb": "gpu_gb", "--prompt-tokens": "prompt_tokens", "--params": "params",
         "--layers": "layers", "--hidden": "hidden", "--vocab": "vocab"}


def pop_flags(args):
    """--plan's own options (`--gpus 4` or `--gpus=4`) out of train.py's arguments -> (the rest, {key: number})."""
    rest, opts, it = [], {}, iter(args)
    for a in it:
        flag, eq, value = a.partition("=")
        if flag not in FLAGS:
            rest.append(a)
            continue
        value = value if eq else next(it, "")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{flag} needs a number, got {value!r}") from None
        counts = flag != "--gpu-memory-gb"  # every flag but --gpu-memory-gb takes a whole number
        if number <= 0 or (counts and not number.is_integer()):
            raise ConfigError(f"{flag} needs a {'whole number >= 1' if counts else 'positive number'}, got {value}")
        opts[FLAGS[flag]] = number if flag == "--gpu-memory-gb" else int(number)
    if "gpus" not in opts or "gpu_gb" not in opts:
        raise ConfigError("--plan needs --gpus N and --gpu-memory-gb M, e.g. --gpus 4 --gpu-memory-gb 80")
    return rest, opts


def machine(cfg, mode, n_gpus, gpu_bytes, engine):
    """The GPUs a plan is for: layout (train.gpu_layout), count, bytes each, engine (vllm | hf), weight transport."""
    from transport import pick_transport  # raises the run's own one-line error for a transport the layout refuses
    return dict(mode=mode, n_gpus=n_gpus, gpu_bytes=gpu_bytes, engine=engine,
                kind=pick_transport(cfg.weight_transport, "cuda", mode, overlap=cfg.push_overlap,
                                    n_trainers=cfg.n_trainers))


def plan_cli(cfg, name, opts, mode):
    """python train.py --plan: (the plan's text, fits) for --gpus x --gpu-memory-gb GPUs in layout `mode`.
    engine=auto counts as vLLM (requirements.txt installs it on a GPU node)."""
    shape = model_shape(cfg.model, {k: opts.get(k) for k in ("params", "layers", "hidden", "vocab")})
    prompt, source = opts.get("prompt_tokens"), "--prompt-tokens"
    if prompt is None:
        prompt, source = measured_prompt_tokens(cfg), "the longest in the data"
    if prompt is None:
        prompt, source = PROMPT_TOKENS, "assumed; set --prompt-tokens"
    gpus = machine(cfg, mode, opts["gpus"], opts["gpu_gb"] * GB, "hf" if cfg.engine == "hf" else "vllm")
    return report(cfg, shape, prompt, source, gpus, name)


def prepare_check(cfg, mode, n_gpus, gpu_bytes, prompt_tokens, engine):
    """--prepare on a GPU node: the plan for the GPUs present. Returns the 'fits: ...' line; raises ConfigError (one
    line: the figures and what to change) when it cannot fit."""
    shape = model_shape(cfg.model)
    gpus = machine(cfg, mode, n_gpus, gpu_bytes, engine)
    ok, line = verdict(cfg, shape, prompt_tokens, gpus)
    if not ok:
        raise ConfigError(f"memory plan: {line} (python train.py --plan CONFIG ... --gpus {n_gpus} --gpu-memory-gb "
                          f"{gpu_bytes / GB:.0f} prints the table)")
    return f"memory plan: {line}"
