"""TL;DR in miniature: a summariser that can beat noisy human references by a gold rule, trained on a proxy reward
model that can be gamed, so pushing the proxy too far lowers the gold win rate (the paper's section 5, Table 1 and
Fig. 4 in miniature; the over-optimisation of Gao et al. 2023).

A post (procedural: `post`) is about its writer: a name, an item they lost and what they want, among sentences about
a friend (other names, items, wants: distractors) and filler. The summary language is clauses joined by " and ", then
" .": "<name> lost <item>", "wants <want>", "<name> wants <want>" or a padding clause (PADS). The human reference is
"<name> lost <item> and wants <want> ." written noisily (`reference`): it drops the want, takes a distractor's name or
item, or adds a padding clause.

Gold judge (`gold`, a rule over the post's facts): +1 for each of the writer's name, item and want the summary states,
-1 for each other fact word it states, -0.5 per word past MAX_WORDS (a clean summary has 7); a text outside the summary
language scores NOT_A_SUMMARY. A clean summary (3) beats a flawed reference: a policy can win.

Proxy reward model (assets/tiny-tldr-mini/rm, scripts/make_tiny_models.py): the SFT summariser's layers under a
one-output token head (Hugging Face LlamaForTokenClassification), whose score of a summary is the sum of the head over
the summary's tokens and EOS (`rm_scores`: a sum over tokens lets a 2-layer model check each fact where it is written;
read at EOS alone, the tiny model never learnt to). Trained by Bradley-Terry on preferences between two candidate
summaries of a post from a simulated labeller who judges the facts like the gold rule but prefers longer summaries
(utility +LENGTH_BIAS per padding clause instead of the gold's length penalty: the length bias of human TL;DR labels,
Singhal et al. 2023), and whose choices are noisy (each pair labelled with probability sigmoid(u_a - u_b)). The
training reward is its score, -1 without EOS (trl's non_eos_penalty, as rewards/tldr.py). `reward_model: labeller`
(configs/tldr_mini.yaml) takes the labeller's utility itself as the proxy: the RM a 2-layer model learns reads the facts
too weakly for the KL-regularised optimum of its score to beat the SFT by more than a few points at any beta, while the
utility's optimum beats it by more than 10 (assets/tiny-tldr-mini/rm/tiny_info.json; docs/tasks.md); padding, which it
rewards and the gold punishes, is what over-optimisation exploits.

Evaluation (`make_evaluator`): one summary per test post sampled at the config's temperature (the distribution the
objective trains; the paper's win rate is at 0.01), then totals
    win_rate, tie_rate    fraction of posts where gold(summary) > / = gold(reference); loss_rate = 1 - both
    gold, proxy           mean gold score and mean training reward of the summaries
    kl                    KL(policy || SFT) per summary, estimated on the samples: sum_t log pi(y_t) - log pi_sft(y_t)
                          (pi: the engine's log-probs at the sampling temperature; pi_sft at 1: the SFT reference)
    perplexity            exp(mean token NLL) of the summary under the SFT reference (the paper's Table 1 column)
    words, pads           mean words per summary and padding clauses per summary
"""
import math
import os
import random
import re

import numpy as np
import torch

from policy import DTYPES, ModelError, check_shipped, encode_prompt, token_logprobs
from rewards import DataError, hf

NAMES = ["anna", "ben", "cara", "dan", "emma", "finn", "gina", "hugo"]
ITEMS = ["job", "car", "dog", "phone", "wallet", "keys", "bike", "house"]
WANTS = ["advice", "money", "sleep", "rest", "support", "answers", "peace", "friends"]
FACTS = set(NAMES) | set(ITEMS) | set(WANTS)
INTRO = ["i am {n} .", "my name is {n} ."]
LOST = ["i lost my {i} .", "my {i} is gone .", "someone took my {i} ."]
WANT = ["i want {w} .", "i need {w} .", "all i ask is {w} ."]
FRIEND = ["my friend {n} lost a {i} .", "{n} wants {w} .", "{n} found a {i} ."]
FILLER = ["it was a long week .", "please read this .", "i feel bad .", "thanks for reading .", "this is hard ."]
PADS = ["is sad", "feels bad", "had a long week", "is tired"]
PROMPT = "post : {body} tl;dr :"
MAX_WORDS = 8         # gold: -0.5 per word past this (a clean summary has 7, "." included)
NOT_A_SUMMARY = -3.0  # gold of a text outside the summary language (below every summary of it but the worst)
LENGTH_BIAS = 0.5     # the labeller's utility per padding clause (the gold's is -1 to -2: 3-4 words past MAX_WORDS)
REFERENCE_NOISE = {"drop_want": 0.3, "wrong_fact": 0.3, "pad": 0.2}  # the human references' flaws, independent
NON_EOS_PENALTY = -1.0
DEFAULT_TRAIN = "procedural:train:512"
DEFAULT_TEST = "procedural:test:256"
SEEDS = {"train": 1, "test": 2}  # the RM's and the SFT's posts come from other streams (make_tiny_models.py)
EVAL_BATCH = 64
LABELLER = "labeller"  # reward_model: the labeller's utility as the proxy instead of a model (Scorer)
DEFAULT_REWARD_MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets",
                                    "tiny-tldr-mini", "rm")
NAME, ITEM, WANT_WORD = (f"(?:{'|'.join(ws)})" for ws in (NAMES, ITEMS, WANTS))
CLAUSE = re.compile(rf"{NAME} lost {ITEM}|(?:{NAME} )?wants {WANT_WORD}|" + "|".join(PADS))
POST_FACTS = (re.compile(rf"(?:i am|my name is) ({NAME}) \."), re.compile(rf"(?:i lost my|my|someone took my) ({ITEM})"
              rf" (?:\.|is gone)"), re.compile(rf"(?:i want|i need|all i ask is) ({WANT_WORD}) \."))


def post(rng):
    """(post text, facts (name, item, want), distractor facts) of one procedural post."""
    n, i, w = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(WANTS)
    friend = (rng.choice([x for x in NAMES if x != n]), rng.choice([x for x in ITEMS if x != i]),
              rng.choice([x for x in WANTS if x != w]))
    body = [rng.choice(LOST).format(i=i), rng.choice(WANT).format(w=w)]
    body += [t.format(n=friend[0], i=friend[1], w=friend[2]) for t in rng.sample(FRIEND, rng.randint(0, 2))]
    body += rng.sample(FILLER, rng.randint(0, 2))
    rng.shuffle(body)
    text = PROMPT.format(body=" ".join([rng.choice(INTRO).format(n=n)] + body))
    return text, (n, i, w), friend


def facts_of(text):
    """The writer's (name, item, want) read back from a post, or None."""
    found = [p.search(text) for p in POST_FACTS]
    return tuple(m.group(1) for m in found) if all(found) else None


def summary(facts, want=True, pads=0, rng=None):
    """ " <name> lost <item> [and wants <want>] [and <pad>]... .": pads is a count (drawn from PADS with rng) or the
    padding clauses themselves."""
    n, i, w = facts
    clauses = [f"{n} lost {i}"] + ([f"wants {w}"] if want else [])
    clauses += [rng.choice(PADS) for _ in range(pads)] if isinstance(pads, int) else list(pads)
    return " " + " and ".join(clauses) + " ."


def reference(rng, facts, friend):
    """The noisy human reference of a post (REFERENCE_NOISE)."""
    n, i, w = facts
    if rng.random() < REFERENCE_NOISE["wrong_fact"]:
        n, i = (friend[0], i) if rng.random() < 0.5 else (n, friend[1])
    return summary((n, i, w), want=rng.random() >= REFERENCE_NOISE["drop_want"],
                   pads=int(rng.random() < REFERENCE_NOISE["pad"]), rng=rng)


def clauses_of(text):
    """The clauses of a text of the summary language, or None."""
    t = text.strip()
    if not t.endswith(" .") and t != ".":
        return None
    parts = t[:-1].strip().split(" and ")
    return parts if all(CLAUSE.fullmatch(p) for p in parts) else None


def fact_score(text, facts):
    """+1 for each of the writer's facts the text states, -1 for each other fact word it states."""
    stated = {x for x in text.split() if x in FACTS}
    return len(stated & set(facts)) - len(stated - set(facts))


def gold(text, facts):
    """The gold judge: see the module's doc."""
    if clauses_of(text) is None:
        return NOT_A_SUMMARY
    return fact_score(text, facts) - 0.5 * max(0, len(text.split()) - MAX_WORDS)


def utility(text, facts):
    """The simulated labeller's utility: the gold's facts, LENGTH_BIAS per padding clause instead of its length rule."""
    parts = clauses_of(text)
    if parts is None:
        return NOT_A_SUMMARY
    return fact_score(text, facts) + LENGTH_BIAS * sum(p in PADS for p in parts)


def labeller_pair(rng, facts, friend):
    """Two candidate summaries of a post for the labeller (the RM's preference data): one with each flaw and 0-3 pads
    at random, and the same summary with one thing changed (a fact swapped with the distractor's or back, the want
    dropped or restored, a pad added or removed). A pair that differs in one feature is what lets the tiny RM learn
    that a wrong name costs 2: from pairs of unrelated summaries it learnt about 0.5 in 2000 steps."""
    a = [friend[k] if rng.random() < p else facts[k] for k, p in enumerate((0.15, 0.15, 0.1))]
    a += [rng.random() >= 0.3, [rng.choice(PADS) for _ in range(rng.choices([0, 1, 2, 3], [0.5, 0.25, 0.15, 0.1])[0])]]
    b, k = a[:4] + [list(a[4])], rng.choice([0, 1, 2, 3, 4] if a[3] else [0, 1, 3, 4])  # no want: none to swap
    if k < 3:
        b[k] = friend[k] if b[k] == facts[k] else facts[k]
    elif k == 3:
        b[3] = not b[3]
    elif b[4] and rng.random() < 0.5:
        b[4].pop(rng.randrange(len(b[4])))
    else:
        b[4].insert(rng.randrange(len(b[4]) + 1), rng.choice(PADS))
    return tuple(summary(x[:3], want=x[3], pads=x[4]) for x in (a, b))


def load(source, split):
    parts = source.split(":")
    if len(parts) != 3 or parts[0] != "procedural" or parts[1] not in SEEDS or not parts[2].isdigit() \
            or int(parts[2]) < 1:
        raise DataError(f"tldr_mini data '{source}': expected procedural:<train|test>:<n> (posts are made, not read)")
    rng = random.Random(SEEDS[parts[1]])
    records = []
    for _ in range(int(parts[2])):
        text, facts, friend = post(rng)
        records.append({"prompt": text, "answer": reference(rng, facts, friend)})
    return records


def rm_scores(model, tok, posts, summaries):
    """The proxy RM's score of each (post, summary): its token head summed over the summary's tokens and EOS (a
    differentiable tensor: scripts/make_tiny_models.py trains through it)."""
    ids, starts = [], []
    for text, summ in zip(posts, summaries):
        prompt = tok(text)["input_ids"]
        ids.append(prompt + tok(summ, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
        starts.append(len(prompt))
    T = max(map(len, ids))
    x = torch.full((len(ids), T), tok.pad_token_id)
    attend, summary_mask = torch.zeros((len(ids), T), dtype=torch.long), torch.zeros((len(ids), T))
    for r, (seq, start) in enumerate(zip(ids, starts)):
        x[r, : len(seq)], attend[r, : len(seq)], summary_mask[r, start : len(seq)] = torch.tensor(seq), 1, 1
    device = next(model.parameters()).device
    head = model(input_ids=x.to(device), attention_mask=attend.to(device)).logits[..., 0].float()
    return (head * summary_mask.to(device)).sum(1)


class Scorer:
    """The training reward: the proxy RM's score (rm_scores) or, with `reward_model: labeller`, the labeller's utility
    itself (what a proxy RM of it converges to: the facts right, the length bias whole); NON_EOS_PENALTY without
    EOS."""

    def __init__(self, cfg, device):
        self.rm = None
        if cfg.reward_model == LABELLER:
            return
        from transformers import AutoTokenizer, LlamaForTokenClassification
        path = hf.resolve(cfg.reward_model, DEFAULT_REWARD_MODEL, "reward_model")
        check_shipped(path)
        try:
            self.tok = AutoTokenizer.from_pretrained(path)
            self.rm = LlamaForTokenClassification.from_pretrained(path, dtype=DTYPES[cfg.dtype])
        except (OSError, ValueError) as e:
            raise ModelError(f"cannot load the tldr_mini reward model from '{path}': {str(e).splitlines()[0]}") \
                from None
        self.rm.to(str(device)).eval()

    @torch.no_grad()
    def score(self, prompts, completions, records, finished):
        rewards = [NON_EOS_PENALTY] * len(completions)
        todo = [i for i, f in enumerate(finished) if f]
        if self.rm is None:
            for i in todo:
                rewards[i] = utility(completions[i], facts_of(prompts[i]))
            return rewards
        for s in range(0, len(todo), EVAL_BATCH):
            part = todo[s : s + EVAL_BATCH]
            values = rm_scores(self.rm, self.tok, [prompts[i] for i in part], [completions[i] for i in part])
            for i, v in zip(part, values.cpu().tolist()):
                rewards[i] = v
        return rewards


def make_scorer(cfg, device):
    return Scorer(cfg, device)


class Evaluator:
    def __init__(self, cfg, device):
        self.scorer = Scorer(cfg, device)
        self.sft, _ = hf.causal_lm(cfg.model, str(device), cfg.dtype)  # the SFT reference: the policy's start
        self.temperature = cfg.temperature

    def evaluate(self, engine, tok, records, max_new_tokens):
        prompts = [encode_prompt(tok, r["prompt"]) for r in records]
        responses, logps = [], []
        for s in range(0, len(prompts), EVAL_BATCH):
            for gen in engine.generate(prompts[s : s + EVAL_BATCH], 1, self.temperature, max_new_tokens):
                responses.append(list(gen[0][0]))
                logps.append(np.asarray(gen[0][1], dtype=np.float64))
        texts = [tok.decode(r, skip_special_tokens=True) for r in responses]
        finished = [bool(r) and r[-1] == tok.eos_token_id for r in responses]
        return self.metrics(records, prompts, responses, texts, finished, logps)

    @torch.no_grad()
    def sft_logprobs(self, prompts, responses):
        out = []
        for s in range(0, len(prompts), EVAL_BATCH):
            lp, mask = token_logprobs(self.sft, prompts[s : s + EVAL_BATCH], responses[s : s + EVAL_BATCH], 1.0)
            out += [row[: int(m.sum())].double().cpu().numpy() for row, m in zip(lp, mask)]
        return out

    def metrics(self, records, prompts, responses, texts, finished, logps):
        """(rows, totals) of one summary per record: see the module's doc."""
        sft = self.sft_logprobs(prompts, responses)
        proxy = self.scorer.score([r["prompt"] for r in records], texts, records, finished)
        rows = []
        for r, text, lp, ref_lp, p in zip(records, texts, logps, sft, proxy):
            facts = facts_of(r["prompt"])
            g, g_ref = gold(text, facts), gold(r["answer"], facts)
            parts = clauses_of(text) or []
            rows.append({"summary": text, "gold": g, "gold_reference": g_ref, "win": g > g_ref, "tie": g == g_ref,
                         "proxy": p, "kl": float(lp.sum() - ref_lp.sum()),
                         "perplexity": math.exp(-ref_lp.mean()) if len(ref_lp) else float("nan"),
                         "words": len(text.split()), "pads": sum(c in PADS for c in parts)})
        n = len(rows)
        finite = [x["perplexity"] for x in rows if math.isfinite(x["perplexity"])]
        total = lambda key: [float(sum(x[key] for x in rows)), n]  # noqa: E731
        return rows, {"win_rate": total("win"), "tie_rate": total("tie"), "gold": total("gold"),
                      "proxy": total("proxy"), "kl": total("kl"), "perplexity": [float(sum(finite)), len(finite)],
                      "words": total("words"), "pads": total("pads")}


def make_evaluator(cfg, device):
    return Evaluator(cfg, device)
