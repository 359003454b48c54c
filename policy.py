"""The model side shared by trainer and searchers: loading, prompt encoding, sequence log-probabilities, and a LoRA
policy (peft) seen as the plain Hugging Face model it stands for (merged_weights)."""
import functools
import hashlib
import os
from collections.abc import Mapping

import torch
from torch.utils.checkpoint import checkpoint

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ModelError(Exception):
    """A model path that cannot be loaded: printed as one line, exit code 2."""


ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")  # the tiny models this repository ships
SUMS = "SHA256SUMS"  # in ASSETS: `sha256sum` lines, one per shipped file (assets/README.md says how they were made)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_shipped(path):
    """A path inside assets/ must hold exactly the bytes assets/SHA256SUMS lists for it (so every machine runs the
    same tiny models); ModelError names the first file that is missing or differs. Other paths: nothing to check."""
    real = os.path.realpath(path)
    root = os.path.realpath(ASSETS)
    if real == root or not real.startswith(root + os.sep):
        return
    listed = {os.path.join(root, name): digest for name, digest in _shipped(root).items()}
    mine = {file: digest for file, digest in listed.items() if file == real or file.startswith(real + os.sep)}
    if not mine:
        raise ModelError(f"{path} is not among the shipped files (assets/{SUMS})")
    for file, digest in mine.items():
        if not os.path.isfile(file):
            raise ModelError(f"{file} is missing (restore it: git checkout -- assets)")
        if _file_sum(file, os.path.getmtime(file), os.path.getsize(file)) != digest:
            raise ModelError(f"{file} is not the shipped file: its checksum differs from assets/{SUMS} "
                             "(restore it: git checkout -- assets)")


@functools.cache
def _shipped(root):
    """assets/SHA256SUMS as {relative path: sha256}."""
    with open(os.path.join(root, SUMS)) as f:
        pairs = [line.split(None, 1) for line in f.read().splitlines() if line.strip()]
    return {name.lstrip("*"): digest for digest, name in pairs}  # "*": sha256sum's binary-mode mark


@functools.cache
def _file_sum(file, mtime, size):  # once per file version and process: loaders call check_shipped often
    return sha256(file)


def load_tokenizer(path):
    from transformers import AutoTokenizer
    check_shipped(path)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load tokenizer from '{path}': {str(e).splitlines()[0]}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # Llama-style tokenizers ship without a pad token
    return tok


def load_model(path, dtype, device):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging
    logging.disable_progress_bar()  # no "Loading weights" bar per rank in the run's log
    if not os.path.isdir(path) and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ModelError(f"model path not found: {path} (and HF_HUB_OFFLINE=1)")
    check_shipped(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load model from '{path}': {str(e).splitlines()[0]}") from None
    return model.to(device)


def encode_prompt(tok, text):
    """Prompt token ids, with the tokenizer's default special tokens (BOS), as the reference code does."""
    return tok(text)["input_ids"]


def longest_prompt(tok, texts):
    """The longest of these prompts in tokens, encoded as encode_prompt does (one batched tokenizer call)."""
    return max(len(ids) for ids in tok(list(texts))["input_ids"])


def model_positions(path):
    """The model's own position limit, max_position_embeddings of its config.json (None when it declares none)."""
    from transformers import AutoConfig
    try:
        return getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load model config from '{path}': {str(e).splitlines()[0]}") from None


def fit_new_tokens(positions, longest, new_tokens):
    """How many tokens an engine may generate after prompts of up to `longest` tokens in a model of `positions`
    positions (None = no limit): (new tokens, max_model_len for vLLM, a one-line warning or None). Asking for more
    than the model's positions makes vLLM refuse to start (and HF generate run past its trained positions), so the
    new tokens are capped to what fits; a prompt that leaves no room at all raises ModelError."""
    if positions is None or longest + new_tokens <= positions:
        return new_tokens, longest + new_tokens, None
    if longest >= positions:
        raise ModelError(f"the longest prompt has {longest} tokens: the model has {positions} positions, no room to "
                         "generate (shorten the prompts or drop the longest with n_train / n_test)")
    room = positions - longest
    return room, positions, (f"warning: {new_tokens} new tokens after the longest prompt ({longest} tokens) exceed "
                             f"the model's {positions} positions; generating at most {room}")


def trim_at_eos(ids, eos_id):
    """Generated token ids up to and including the first EOS (all of them when there is none)."""
    return ids[: ids.index(eos_id) + 1] if eos_id in ids else ids


def token_batches(lengths, budget):
    """Sequence indices in order, cut into batches whose size x longest length stays within `budget` padded tokens
    (one sequence at least)."""
    batches, current, longest = [], [], 0
    for i, n in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, n) > budget:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    return batches + [current] if current else batches


@torch.no_grad()
def sequence_logprobs(model, prompts, responses, temperature, budget):
    """token_logprobs without gradients, as one float32 numpy array per response, in forward passes of at most
    `budget` padded tokens (logprob_tokens): the searchers' reference and HF behaviour log-probs never hold the
    activations of a whole round's sequences at once."""
    out = [None] * len(responses)
    for batch in token_batches([len(p) + len(r) for p, r in zip(prompts, responses)], budget):
        lp, mask = token_logprobs(model, [prompts[i] for i in batch], [responses[i] for i in batch], temperature)
        for j, i in enumerate(batch):
            out[i] = lp[j][mask[j]].float().cpu().numpy()
    return out


def token_logprobs(model, prompts, responses, temperature, chunk_tokens=2048):
    """Per-token log pi(y_t | x, y_<t) of each response, with logits / temperature.

    prompts, responses: lists of token-id lists. Returns (logp [N, L], mask [N, L]) padded to the longest response.
    Sequences are right-padded to the longest one in this call, not to a configured maximum. Only response positions
    go through the LM head, in chunks of `chunk_tokens` under activation checkpointing, so full-vocabulary fp32 logits
    never exist for the whole batch at once (forward or backward).
    """
    device = next(model.parameters()).device
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    T = max(lengths)
    pad = 0
    ids = torch.full((len(prompts), T), pad, dtype=torch.long)
    attn = torch.zeros((len(prompts), T), dtype=torch.long)
    rows, cols, targets = [], [], []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, : lengths[i]] = torch.tensor(list(p) + list(r))
        attn[i, : lengths[i]] = 1
        rows += [i] * len(r)
        cols += range(len(p) - 1, len(p) + len(r) - 1)  # position t predicts token t + 1
        targets += list(r)
    ids, attn = ids.to(device), attn.to(device)
    model = hf_model(model)  # lora: its adapter layers are in place in the Hugging Face model
    hidden = model.base_model(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
    h = hidden[torch.tensor(rows, device=device), torch.tensor(cols, device=device)]
    y = torch.tensor(targets, device=device)
    head = model.get_output_embeddings()

    def chunk_logp(h_c, y_c):
        logits = head(h_c).float() / temperature
        return logits.gather(1, y_c[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)

    parts = []
    for s in range(0, len(y), chunk_tokens):
        h_c, y_c = h[s : s + chunk_tokens], y[s : s + chunk_tokens]
        grad = torch.is_grad_enabled()
        parts.append(checkpoint(chunk_logp, h_c, y_c, use_reentrant=False) if grad else chunk_logp(h_c, y_c))
    flat = torch.cat(parts) if parts else torch.zeros(0, device=device)
    L = max(len(r) for r in responses)
    logp = torch.zeros((len(responses), L), device=device)
    mask = torch.zeros((len(responses), L), dtype=torch.bool, device=device)
    pos = torch.cat([torch.arange(len(r)) for r in responses]).to(device)
    logp = logp.index_put((torch.tensor(rows, device=device), pos), flat)
    mask[torch.tensor(rows, device=device), pos] = True
    return logp, mask


# ---------------------------------------------------------------- a LoRA policy as a plain model (lora_rank > 0)

ADAPTER = "default"  # peft's name for a model's one adapter


def is_lora(model):
    """Whether `model` is a peft model (learner.lora_model): a Hugging Face model whose decoder linear layers carry
    LoRA adapters."""
    return hasattr(model, "get_base_model")


def hf_model(model):
    """The Hugging Face model: `model` itself, or a peft model's base model with its adapter layers in place (so
    they take part in its forward)."""
    return model.get_base_model() if is_lora(model) else model


def base_weights(model, buffers=False):
    """{Hugging Face name: tensor} of the model's parameters (with `buffers`: its state dict), a peft model's under
    its base model's own names (<layer>.base_layer.weight -> <layer>.weight), the adapters left out."""
    model = hf_model(model)
    tensors = model.state_dict() if buffers else dict(model.named_parameters())
    return {n.replace(".base_layer.", "."): t for n, t in tensors.items() if ".lora_" not in n}


def merged_weights(model, buffers=False):
    """The policy as a plain Hugging Face model: base_weights, with each LoRA layer's weight merged (MergedWeights);
    a model without adapters: its own."""
    return MergedWeights(model, buffers) if is_lora(model) else base_weights(model, buffers)


class MergedWeights(Mapping):
    """{Hugging Face name: tensor} of a peft LoRA model as a plain model: each adapted weight is W + (alpha / r) B A
    when it is read, from peft's delta weight, computed in float32 (the adapters are float32) and rounded once to
    W's dtype; one layer's merged copy at a time (the weight push reads them bucket by bucket). The base is never
    merged in place: in bfloat16 a merge / unmerge round trip would drift its weights."""

    def __init__(self, model, buffers=False):
        from peft.tuners.lora import LoraLayer
        self.tensors = base_weights(model, buffers)
        self.adapted = {f"{name}.weight": m for name, m in hf_model(model).named_modules() if isinstance(m, LoraLayer)}

    def __getitem__(self, name):
        layer = self.adapted.get(name)
        if layer is None:
            return self.tensors[name]
        w = self.tensors[name]
        with torch.no_grad():
            return (w + layer.get_delta_weight(ADAPTER)).to(w.dtype)  # w + a float32 delta: computed in float32

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self):
        return len(self.tensors)


def decoder_layers(model):
    """A Hugging Face model's decoder blocks (FSDP2 shards them one by one, LoRA adapts their linear layers): the
    modules whose class the model's _no_split_modules names (transformers' list of the blocks that must stay whole,
    e.g. LlamaDecoderLayer)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]
