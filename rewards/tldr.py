"""TL;DR preference fine-tuning (paper section 5, Table 3): summarise a Reddit post.

Data: vwxyzjn/summarize_from_feedback_tldr_3_filtered_oai_preprocessing_1706381144 (the default; needs `datasets` and
the hub). The prompt is the row's "query" as it is (it already ends in "TL;DR:" and is at most 512 tokens: the set is
pre-filtered); the record's "answer" is the human "reference_response". Evaluation uses the "validation" split (the
config's test data). A local .jsonl / .json / .parquet file with the same two fields works too, e.g. the synthetic
posts that scripts/make_tiny_models.py wrote for the tiny CPU run (shipped in assets/tiny-tldr).

Reward (searchers, `make_scorer`): the score of a Hugging Face sequence-classification reward model (config key
`reward_model`; the paper's is the Pythia RM trained on the 6.9B judge's preferences) on prompt + completion + EOS,
read at the EOS position as trl's `get_reward` does on the EOS-truncated response. A completion that did not end with
EOS gets -1 instead of its score (trl's `non_eos_penalty` with penalty_reward_value -1, as in the TBA reference code).

Evaluation (`make_evaluator`, after eval_tldr/ in bbartoldson/TBA, from mnoukhov/async_rlhf): one summary per
validation prompt, sampled at the config's `eval_temperature` (the paper's 0.01 in configs/tldr.yaml; 0 = greedy),
then
    win_rate    fraction of prompts where the judge (config key `judge_model`; the paper's gold judge is the 6.9B RM)
                scores the policy's summary strictly above the human reference summary;
    perplexity  exp(mean token NLL) of the policy's summary (its generated tokens, EOS included when generated) under
                the SFT reference (the config's `model`, the policy's starting point), averaged over prompts.
"""
import math

import numpy as np
import torch

from policy import encode_prompt, token_logprobs
from rewards import DataError, read_records, require
from rewards import hf

DATASET = "vwxyzjn/summarize_from_feedback_tldr_3_filtered_oai_preprocessing_1706381144"
DEFAULT_TRAIN = DATASET
DEFAULT_TEST = DATASET
DEFAULT_REWARD_MODEL = "mnoukhov/pythia410m-rm-tldr6.9b"  # the reference code's mnoukhov/pythia{size}-rm-tldr6.9b
DEFAULT_JUDGE = "cleanrl/EleutherAI_pythia-6.9b-deduped__reward__tldr"  # the gold judge
NON_EOS_PENALTY = -1.0  # reward of a completion cut at max_new_tokens (trl penalty_reward_value)
EVAL_BATCH = 64


def load(source, split):
    try:
        rows = read_records(source, "validation" if split == "test" else split)
    except DataError as e:
        if "assets/tiny-tldr/" in source:  # the tiny run's synthetic posts, shipped
            raise DataError(f"{e} (restore it: git checkout -- assets)") from None
        raise
    require(source, rows, ["query", "reference_response"])
    return [{"prompt": row["query"], "answer": row["reference_response"]} for _, row in rows]


# --- reward ---------------------------------------------------------------------------------------------------------

class Scorer:
    """The training reward: the reward model's score of each finished completion, NON_EOS_PENALTY for the rest."""

    def __init__(self, cfg, device):
        path = hf.resolve(cfg.reward_model, DEFAULT_REWARD_MODEL, "reward_model")
        self.rm = hf.classifier(path, str(device), cfg.dtype)
        if self.rm.num_labels != 1:
            raise ValueError(f"reward_model must have one output (a scalar score), it has {self.rm.num_labels}")

    def score(self, prompts, completions, records, finished):
        rewards = [NON_EOS_PENALTY] * len(completions)
        todo = [i for i, f in enumerate(finished) if f]
        if todo:
            values = self.rm.logits([prompts[i] + completions[i] for i in todo])[:, 0].tolist()
            for i, v in zip(todo, values):
                rewards[i] = v
        return rewards


def make_scorer(cfg, device):
    return Scorer(cfg, device)


# --- evaluation -----------------------------------------------------------------------------------------------------

@torch.no_grad()
def perplexities(model, prompts, responses, batch=EVAL_BATCH):
    """exp(mean NLL) of each response (token ids) given its prompt (token ids) under `model` at temperature 1."""
    out = []
    for s in range(0, len(prompts), batch):
        lp, mask = token_logprobs(model, prompts[s : s + batch], responses[s : s + batch], 1.0)
        nll = -(lp * mask).sum(1) / mask.sum(1).clamp(min=1)
        out += torch.exp(nll).float().cpu().tolist()
    return out


class Evaluator:
    def __init__(self, cfg, device):
        self.judge = hf.classifier(hf.resolve(cfg.judge_model, DEFAULT_JUDGE, "judge_model"), str(device), cfg.dtype)
        if self.judge.num_labels != 1:
            raise ValueError(f"judge_model must have one output (a scalar score), it has {self.judge.num_labels}")
        self.sft, _ = hf.causal_lm(cfg.model, str(device), cfg.dtype)  # the SFT reference: the policy's start
        self.temperature = cfg.eval_temperature

    def evaluate(self, engine, tok, records, max_new_tokens):
        """(rows, totals): one row per record; totals {name: [sum, count]} (see rewards/__init__.py)."""
        prompts = [encode_prompt(tok, r["prompt"]) for r in records]
        responses = []
        for s in range(0, len(prompts), EVAL_BATCH):
            gens = engine.generate(prompts[s : s + EVAL_BATCH], 1, self.temperature, max_new_tokens)
            responses += [gen[0][0] for gen in gens]
        return self.metrics(records, prompts, responses, [tok.decode(r, skip_special_tokens=True) for r in responses])

    def metrics(self, records, prompts, responses, summaries):
        policy = self.judge.logits([r["prompt"] + s for r, s in zip(records, summaries)])[:, 0].tolist()
        reference = self.judge.logits([r["prompt"] + r["answer"] for r in records])[:, 0].tolist()
        ppl = perplexities(self.sft, prompts, responses)
        rows = [{"summary": s, "win": p > q, "judge_policy": p, "judge_reference": q, "perplexity": x}
                for s, p, q, x in zip(summaries, policy, reference, ppl)]
        finite = [x for x in ppl if math.isfinite(x)]
        return rows, {"win_rate": [float(np.sum([r["win"] for r in rows])), len(rows)],
                      "perplexity": [float(np.sum(finite)), len(finite)]}


def make_evaluator(cfg, device):
    return Evaluator(cfg, device)
