"""Hugging Face models behind the model-based rewards (tldr.py, redteam.py). A helper, not a task.

Every model is loaded once per process (`functools.lru_cache` on path, device, dtype), so a searcher's scorer and
evaluator share them, and is run without gradients in batches.
"""
import functools
import os

import torch

from policy import DTYPES, ModelError, check_shipped


def resolve(path, default, key):
    """The model path from config key `key`, else the task's default; one clear line when a local path is missing."""
    path = path or default
    if not path:
        raise ModelError(f"'{key}' is empty and the task has no default")
    local = path.startswith((".", "/")) or os.environ.get("HF_HUB_OFFLINE") == "1"
    if local and not os.path.isdir(path):
        offline = " (HF_HUB_OFFLINE=1)" if not path.startswith((".", "/")) else ""  # a hub id, looked for locally
        raise ModelError(f"{key} not found: {path}{offline}")
    return path


class Classifier:
    """An HF sequence classifier (a reward model, a toxicity classifier) applied to whole texts.

    Each text is tokenised with the classifier's own tokenizer and given its EOS token at the end when the tokenizer
    has one and did not add it: trl's reward models (TL;DR) are trained and read at the EOS position. Batches are
    right-padded with a pad id different from EOS, so the models' own pooling (the last non-pad token for decoders,
    the first token for encoders) reads the right position even when the tokenizer pads with EOS. Texts longer than
    the model's context keep their last tokens.
    """

    def __init__(self, path, device, dtype="float32", batch_size=32):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging
        logging.disable_progress_bar()
        check_shipped(path)
        try:
            self.tok = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=DTYPES[dtype])
        except (OSError, ValueError) as e:
            raise ModelError(f"cannot load sequence classifier from '{path}': {str(e).splitlines()[0]}") from None
        self.model.to(device).eval()
        self.device, self.batch_size = device, batch_size
        self.eos = self.tok.eos_token_id
        pad = self.tok.pad_token_id
        self.pad = pad if pad is not None and pad != self.eos else (0 if self.eos != 0 else 1)
        self.model.config.pad_token_id = self.pad
        limits = [n for n in (self.tok.model_max_length, getattr(self.model.config, "max_position_embeddings", None))
                  if isinstance(n, int) and 0 < n < 10**6]
        self.max_len = min(limits) if limits else 2048
        self.num_labels = self.model.config.num_labels
        self.id2label = {int(i): str(name) for i, name in (self.model.config.id2label or {}).items()}

    def encode(self, text):
        ids = self.tok(text)["input_ids"]
        if self.eos is not None and (not ids or ids[-1] != self.eos):
            ids = ids + [self.eos]
        return ids[-self.max_len:] or [self.pad]

    @torch.no_grad()
    def logits(self, texts):
        """float32 logits, shape (len(texts), num_labels), on the CPU."""
        out = []
        for s in range(0, len(texts), self.batch_size):
            ids = [self.encode(t) for t in texts[s : s + self.batch_size]]
            T = max(len(x) for x in ids)
            input_ids = torch.full((len(ids), T), self.pad, dtype=torch.long)
            mask = torch.zeros((len(ids), T), dtype=torch.long)
            for i, x in enumerate(ids):
                input_ids[i, : len(x)] = torch.tensor(x)
                mask[i, : len(x)] = 1
            logits = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device)).logits
            out.append(logits.float().cpu())
        return torch.cat(out) if out else torch.zeros((0, self.num_labels))


@functools.lru_cache(maxsize=None)
def classifier(path, device, dtype="float32"):
    return Classifier(path, device, dtype)


@functools.lru_cache(maxsize=None)
def causal_lm(path, device, dtype="float32"):
    """(model, tokenizer) of a causal LM, in eval mode, with a pad token."""
    from policy import load_model, load_tokenizer
    return load_model(path, dtype, device).eval(), load_tokenizer(path)
