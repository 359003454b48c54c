"""LoRA (Hu et al. 2021, arXiv 2106.09685): the policy is the frozen base model plus a low-rank update of each linear
layer of the decoder blocks, W x + (alpha / r) B A x, with A (r x in) and B (out x r) the only trained weights (B
starts at zero, so step 0's policy is the base model). lora_rank = r > 0 turns it on (learner.build).

What changes elsewhere is small and named here:
  - the optimizer holds the adapters only (Learner: the parameters that require grad), so the trainer's gradients
    and AdamW states are those of r x (in + out) numbers per layer, not of the whole model;
  - the searchers never see an adapter: the weight push and the checkpoint's Hugging Face files carry merged weights
    W + (alpha / r) B A under the base model's own names (merged_weights), so vLLM and eval.py load them as any
    checkpoint and generate at full speed; a checkpoint also keeps the adapters themselves (adapters.pth), which
    resume loads on top of the base model;
  - the reference model is the base model itself: the searchers load `model`, as without LoRA (a reference reset,
    ref_reset_every, makes it the merged policy of that step, as for any run).
The adapters are plain parameters of each nn.Linear (`<linear>.lora_A`, `<linear>.lora_B`) added to its output by a
forward hook, so the model stays a Hugging Face model: generate, gradient checkpointing, DDP and save_pretrained work
unchanged.
"""
import math
import os
from collections.abc import Mapping

import torch

ADAPTERS = "adapters.pth"  # in a checkpoint: {name: tensor} of every lora_A / lora_B


def _delta(module, args, output):
    """Forward hook: the linear layer's output plus its low-rank update."""
    x = args[0].to(module.lora_A.dtype)
    return output + torch.nn.functional.linear(torch.nn.functional.linear(x, module.lora_A), module.lora_B).to(
        output.dtype) * module.lora_scale


def targets(model):
    """The linear layers that get an adapter: every nn.Linear inside the decoder blocks (attention and MLP, the
    'all-linear' choice of QLoRA, Dettmers et al. 2023); not the embeddings or the LM head."""
    from trainer_group import decoder_layers
    return [m for block in decoder_layers(model) for m in block.modules() if isinstance(m, torch.nn.Linear)]


def add(model, rank, alpha, seed=0):
    """Freeze `model` and give each target linear layer an adapter of rank `rank`, scale alpha / rank. A is drawn as
    nn.Linear draws its weights (Kaiming uniform, a = sqrt(5)) from its own generator seeded by `seed`, B is zero."""
    layers = targets(model)
    if not layers:
        raise ValueError(f"lora_rank: {type(model).__name__} has no linear layers in decoder blocks")
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    for m in layers:
        w = m.weight
        a = torch.empty(rank, m.in_features)
        bound = 1 / math.sqrt(m.in_features)  # kaiming_uniform_(a=sqrt(5)) on an (r, in) weight
        a.uniform_(-bound, bound, generator=gen)
        m.lora_A = torch.nn.Parameter(a.to(w.device, w.dtype))
        m.lora_B = torch.nn.Parameter(torch.zeros(m.out_features, rank, device=w.device, dtype=w.dtype))
        m.lora_scale = alpha / rank
        m.register_forward_hook(_delta)
    return model


def enabled(model):
    return any(name.endswith(".lora_A") for name, _ in model.named_parameters())


def is_adapter(name):
    return name.endswith((".lora_A", ".lora_B"))


def merged(module):
    """A linear layer's weight with its adapter merged in: W + scale B A (in W's dtype)."""
    with torch.no_grad():
        delta = module.lora_B.float() @ module.lora_A.float() * module.lora_scale
        return (module.weight.float() + delta).to(module.weight.dtype)


class MergedWeights(Mapping):
    """{Hugging Face name: tensor} of the policy as a plain model: the base weights, each adapted linear layer's
    merged when it is read (one layer's merged copy at a time: the weight push reads them bucket by bucket)."""

    def __init__(self, model, buffers=False):
        tensors = model.state_dict() if buffers else dict(model.named_parameters())
        self.tensors = {n: t for n, t in tensors.items() if not is_adapter(n)}
        self.adapted = {f"{name}.weight": m for name, m in model.named_modules() if hasattr(m, "lora_A")}

    def __getitem__(self, name):
        m = self.adapted.get(name)
        return merged(m) if m is not None else self.tensors[name]

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self):
        return len(self.tensors)


def merged_weights(model, buffers=False):
    """The model's parameters (with `buffers`: its state dict) under Hugging Face names: merged when it has adapters,
    else its own."""
    if not enabled(model):
        return model.state_dict() if buffers else dict(model.named_parameters())
    return MergedWeights(model, buffers)


def adapters(model):
    """{name: CPU copy} of the adapters, for a checkpoint."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if is_adapter(n)}


def load_adapters(model, path):
    """Resume: the adapters a checkpoint kept (adapters.pth) into `model`, which add() prepared the same way."""
    state = torch.load(os.path.join(path, ADAPTERS), map_location="cpu", weights_only=True)
    params = dict(model.named_parameters())
    missing = sorted(set(n for n in params if is_adapter(n)) ^ set(state))
    if missing:
        raise ValueError(f"resume: {path}/{ADAPTERS} does not match lora_rank's adapters ({missing[0]} ...)")
    with torch.no_grad():
        for n, t in state.items():
            if params[n].shape != t.shape:
                raise ValueError(f"resume: {path}/{ADAPTERS} has {n} of shape {tuple(t.shape)}, lora_rank gives "
                                 f"{tuple(params[n].shape)}")
            params[n].copy_(t)
