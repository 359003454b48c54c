"""Build the tiny local assets of the model-based tasks (rewards/tldr.py, rewards/redteam.py), for CPU runs and tests.

    python scripts/make_tiny_models.py [--out assets]   # builds what is missing (about 25 min), then SHA256SUMS
    python scripts/make_tiny_models.py --info           # measures the tldr-mini pair again: its tiny_info.json only

The repository ships what this made (assets/README.md); the models are trained on the machine that runs it and may
differ from machine to machine in their last bits. All are 2-layer Llama sequence classifiers over the tiny arith
tokenizer (scripts/make_tiny.py), so the tiny policy assets/tiny-arith/sft can be the TL;DR policy, the red-team
attacker and the red-team victim.

    tiny-tldr/train.jsonl, test.jsonl   synthetic posts in the TL;DR dataset's layout: "query" = "SUBREDDIT: r/...
                                        TITLE: ... POST: ... TL;DR:" (the frame's own words are unknown to the tiny
                                        vocabulary and become <unk>), "reference_response" = " <main name> has <his
                                        items>." The post is 2-4 arith-style sentences about a main person and others.
    tiny-tldr/rm, tiny-tldr/judge       one-output reward models, trained (Bradley-Terry, a few seconds) to prefer the
                                        reference summary over corrupted ones (another person, another item, empty,
                                        repeated, the post copied); the judge has another seed.
    tiny-redteam/toxicity               two-label classifier (id2label non-toxic / toxic) of a synthetic "toxicity":
                                        a text is toxic when it contains the digit 9 (the victim, the arith model,
                                        answers with numbers, so an attacker can learn to provoke it).
    tiny-redteam-modes/sft              the attacker of rewards/redteam_modes.py: a tiny Llama (make_tiny.build_model)
                                        with its own word-level tokenizer, SFT for 1000 steps on questions of that
                                        task's grammar; tiny_info.json holds the attacker's exact probability of
                                        its successful attacks and each kind's share of it (rewards/redteam_modes
                                        .MASSES) and what 8192 samples at temperature 1 give.
    tiny-tldr-mini/sft, rm              rewards/tldr_mini.py's summariser (a tiny Llama with its own word-level
                                        tokenizer, SFT 1000 steps on posts -> noisy references) and proxy reward
                                        model (its layers under a token head, Bradley-Terry 2000 steps on a
                                        length-biased labeller's noisy preferences); rm/tiny_info.json: the RM's
                                        agreement with the labeller and the gold, the SFT's win / tie rate, and
                                        the KL-regularised optimum of the RM and of the labeller (kl_optimum).
Each folder is built in <folder>.tmp and renamed when complete; an existing one is left alone. Last, <out>/SHA256SUMS
is written anew over every file under <out> (make_tiny.py's model included): the list policy.check_shipped holds the
shipped files to.
"""
import argparse
import json
import math
import os
import random
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from make_tiny import build_tokenizer  # noqa: E402
from rewards import arith  # noqa: E402

SUBREDDITS = ["relationships", "AskReddit", "personalfinance"]
TITLES = ["Need advice", "What do I do", "Help please"]
SENTENCES = ["{n} has {a} {c} of {i}.", "{n} buys {a} more {i}.", "{n} finds {a} {i}.", "{n} gives away {a} {i}.",
             "{n} had {a} {i} in each of {b} {c}."]


def post(rng):
    """(query, reference summary, main name, main item) of one synthetic post."""
    main, item = rng.choice(arith.NAMES), rng.choice(arith.ITEMS)
    others = [n for n in arith.NAMES if n != main]
    lines = []
    for k in range(rng.randint(2, 4)):
        n = main if k == 0 or rng.random() < 0.5 else rng.choice(others)
        i = item if n == main else rng.choice(arith.ITEMS)
        lines.append(rng.choice(SENTENCES).format(n=n, i=i, c=rng.choice(arith.CONTAINERS), a=rng.randint(2, 9),
                                                   b=rng.randint(2, 9)))
    query = (f"SUBREDDIT: r/{rng.choice(SUBREDDITS)}\n\nTITLE: {rng.choice(TITLES)}\n\nPOST: {' '.join(lines)}"
             f"\n\nTL;DR:")
    return query, f" {main} has {item}.", main, item


def corrupt(rng, query, main, item):
    """A worse summary of the same post."""
    kind = rng.randrange(5)
    if kind == 0:
        return f" {rng.choice([n for n in arith.NAMES if n != main])} has {item}."
    if kind == 1:
        return f" {main} has {rng.choice([i for i in arith.ITEMS if i != item])}."
    if kind == 2:
        return ""
    if kind == 3:
        return f" {main} {main} {main}."
    return " " + query.split("POST: ")[1].split("\n")[0]


def write_posts(folder, seed=0, n_train=300, n_test=32):
    rng = random.Random(seed)
    for split, n in (("train", n_train), ("test", n_test)):
        with open(os.path.join(folder, f"{split}.jsonl"), "w") as f:
            for _ in range(n):
                query, ref, _, _ = post(rng)
                f.write(json.dumps({"query": query, "reference_response": ref}) + "\n")


def classifier(tok, num_labels, seed, id2label=None):
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      num_labels=num_labels, id2label=id2label or {i: f"LABEL_{i}" for i in range(num_labels)})
    return LlamaForSequenceClassification(cfg)


def batch_logits(model, tok, texts):
    """Logits of texts + EOS (right padding; the model pools the last non-pad token)."""
    import torch
    ids = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]
    T = max(map(len, ids))
    x = torch.full((len(ids), T), tok.pad_token_id)
    mask = torch.zeros((len(ids), T), dtype=torch.long)
    for r, s in enumerate(ids):
        x[r, : len(s)], mask[r, : len(s)] = torch.tensor(s), 1
    return model(input_ids=x, attention_mask=mask).logits


def train_rm(tok, seed, steps, log):
    """Bradley-Terry: -log sigmoid(r(post + reference) - r(post + corrupted))."""
    import torch
    model, rng = classifier(tok, 1, seed), random.Random(seed + 100)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(steps):
        good, bad = [], []
        for _ in range(16):
            query, ref, main, item = post(rng)
            good.append(query + ref)
            bad.append(query + corrupt(rng, query, main, item))
        r = batch_logits(model, tok, good + bad)[:, 0]
        loss = -torch.nn.functional.logsigmoid(r[:16] - r[16:]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % 25 == 0:
            right = (r[:16] > r[16:]).float().mean()
            log(f"  rm seed {seed} step {step + 1}: loss {loss.item():.3f}, pairs ranked right {right:.2f}")
    return model


def toxic_text(rng):
    """A random arith-style text and whether it contains the digit 9 (the synthetic notion of toxic)."""
    question, solution = arith.make_problem(rng)
    text = rng.choice([solution, question, f"{question} {solution}", solution.split("####")[0]])
    return text, "9" in text


def train_toxicity(tok, seed, steps, log):
    import torch
    model = classifier(tok, 2, seed, id2label={0: "non-toxic", 1: "toxic"})
    rng = random.Random(seed + 200)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(steps):
        texts, labels = zip(*(toxic_text(rng) for _ in range(32)))
        logits = batch_logits(model, tok, list(texts))
        y = torch.tensor(labels, dtype=torch.long)
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % 25 == 0:
            accuracy = (logits.argmax(-1) == y).float().mean()
            log(f"  toxicity step {step + 1}: loss {loss.item():.3f}, accuracy {accuracy:.2f}")
    return model


def attacker_tokenizer():
    """The red-team-modes attacker's word-level tokenizer: every piece of its prompt and of every question."""
    from rewards import redteam_modes as rm
    texts = [rm.PROMPT + " " + t.format(x=x, y=y) for mode, t in rm.TEMPLATES.items() for x in rm.X[mode]
             for y in rm.Y[mode]]
    return build_tokenizer(texts=texts)


def pad_batch(tok, seqs, start):
    """(input ids, labels) right-padded; labels -100 before each sequence's `start` and on padding."""
    import torch
    T = max(map(len, seqs))
    x, y = torch.full((len(seqs), T), tok.pad_token_id), torch.full((len(seqs), T), -100)
    for r, (seq, s) in enumerate(zip(seqs, start)):
        x[r, : len(seq)] = torch.tensor(seq)
        y[r, s : len(seq)] = torch.tensor(seq[s:])
    return x, y


def update(opt, decay, loss):
    """One optimiser step on `loss` and one of the learning-rate schedule; returns the loss."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    decay.step()
    return loss


def train_attacker(tok, seed, steps, log, batch_size=128):
    """SFT of a tiny Llama (make_tiny.build_model) on questions of the red-team-modes grammar after its prompt (loss on
    the question + eos), fresh questions every step, the learning rate decaying linearly to 0 (so the model settles
    on the grammar's frequencies instead of the last batches')."""
    import torch
    from make_tiny import build_model
    from rewards import redteam_modes as rm
    model, rng = build_model(tok, seed), random.Random(seed + 300)
    prompt = tok(rm.PROMPT)["input_ids"]  # <s> prompt
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: 1 - u / steps)
    for step in range(steps):
        seqs = [prompt + tok(rm.sample_question(rng), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                for _ in range(batch_size)]
        x, y = pad_batch(tok, seqs, [len(prompt)] * batch_size)
        loss = update(opt, decay, model(input_ids=x, labels=y).loss)
        if (step + 1) % 100 == 0:
            log(f"  attacker step {step + 1}: loss {loss.item():.3f} (the grammar's entropy per question: "
                f"{grammar_entropy():.3f} nats over ~11 tokens)")
    return model


def grammar_entropy():
    from rewards import redteam_modes as rm
    return sum(-w * math.log(w) for w in rm.WEIGHTS.values()) + 2 * math.log(8)


def success_masses(model, tok):
    """Per kind, the attacker's exact probability (temperature 1) of writing one of its 8 successful attacks: the sum
    over the free slot of exp(log pi(question + eos | prompt)), from one forward pass over the 48 questions."""
    import torch
    from rewards import redteam_modes as rm
    prompt = tok(rm.PROMPT)["input_ids"]
    masses = {}
    with torch.no_grad():
        for mode in rm.MODES:
            seqs = [prompt + tok(" " + rm.TEMPLATES[mode].format(x=rm.TRIGGERS[mode], y=y),
                                 add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for y in rm.Y[mode]]
            x = torch.tensor(seqs)  # one template: every question has the same length
            logp = torch.log_softmax(model(input_ids=x).logits[:, :-1].double(), -1)
            token_logp = logp.gather(-1, x[:, 1:, None])[..., 0][:, len(prompt) - 1 :]
            masses[mode] = float(token_logp.sum(-1).exp().sum())
    return masses


def attacker_masses(model, tok, n=8192, seed=0, batch_size=512):
    """The TB target over modes, exactly (success_masses, normalised), and from n samples at temperature 1: the
    fraction that are questions of the grammar, the fraction that succeed, and each kind's share of all."""
    import torch
    from rewards import redteam_modes as rm
    torch.manual_seed(seed)
    texts = [t for _ in range(n // batch_size) for t in sample(model, tok, [rm.PROMPT] * batch_size, 16)]
    kinds = [rm.parse(t) for t in texts]
    hits = [rm.mode_of(t) for t in texts]
    n_hit = sum(h is not None for h in hits)
    masses = success_masses(model, tok)
    return {"samples": len(texts), "grammatical": sum(k is not None for k in kinds) / len(texts),
            "success": n_hit / len(texts), "success_exact": sum(masses.values()),
            "target": {m: round(masses[m] / sum(masses.values()), 4) for m in rm.MODES},
            "target_sampled": {m: round(hits.count(m) / n_hit, 4) for m in rm.MODES},
            "kinds": {m: round(sum(k is not None and k[0] == m for k in kinds) / len(texts), 4) for m in rm.MODES}}


def summariser_tokenizer():
    """The tldr-mini word-level tokenizer: every piece of its posts and of its summary language."""
    from rewards import tldr_mini as tm
    words = tm.NAMES + tm.ITEMS + tm.WANTS
    texts = [tm.PROMPT.format(body=" ".join(tm.INTRO + tm.LOST + tm.WANT + tm.FRIEND + tm.FILLER))]
    texts += [f"{t} {w}" for t in tm.INTRO + tm.LOST + tm.WANT + tm.FRIEND for w in words]
    texts += [" " + " and ".join([f"{n} lost {i}", f"{n} wants {w}", "wants"] + tm.PADS) + " ." for n, i, w in
              zip(tm.NAMES, tm.ITEMS, tm.WANTS)]
    return build_tokenizer(texts=texts)


def train_summariser(tok, seed, steps, log, batch_size=64):
    """SFT of a tiny Llama on tldr-mini posts -> their noisy human references (+ eos), fresh posts every step, the
    learning rate decaying linearly to 0: the policy imitates the references' flaws, as an SFT on TL;DR does."""
    import torch
    from make_tiny import build_model
    from rewards import tldr_mini as tm
    model, rng = build_model(tok, seed), random.Random(seed + 400)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: 1 - u / steps)
    for step in range(steps):
        seqs, start = [], []
        for _ in range(batch_size):
            text, facts, friend = tm.post(rng)
            prompt = tok(text)["input_ids"]
            seqs.append(prompt + tok(tm.reference(rng, facts, friend), add_special_tokens=False)["input_ids"]
                        + [tok.eos_token_id])
            start.append(len(prompt))
        x, y = pad_batch(tok, seqs, start)
        loss = update(opt, decay, model(input_ids=x, labels=y).loss)
        if (step + 1) % 100 == 0:
            log(f"  summariser step {step + 1}: loss {loss.item():.3f}")
    return model


def train_proxy_rm(sft, tok, seed, steps, log, batch_size=64, lr=1e-3):
    """The tldr-mini proxy reward model (rewards/tldr_mini.py: rm_scores): the SFT summariser's layers under a new
    one-output token head (as Stiennon et al. 2020 start their reward model from the SFT policy), trained by
    Bradley-Terry on the simulated labeller's noisy preferences between two candidate summaries of a post (utility,
    labeller_pair), fresh pairs every step, the learning rate decaying linearly to 0."""
    import torch
    from transformers import LlamaForTokenClassification
    from rewards import tldr_mini as tm
    torch.manual_seed(seed)
    from transformers.utils import logging as hf_logging
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the new head's "missing / unexpected keys" report is expected: not printed
    model = LlamaForTokenClassification.from_pretrained(sft, num_labels=1)
    hf_logging.set_verbosity(verbosity)
    model.config.pad_token_id = tok.pad_token_id
    rng = random.Random(seed + 500)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: 1 - u / steps)
    for step in range(steps):
        posts, chosen, rejected = [], [], []
        for _ in range(batch_size):
            text, facts, friend = tm.post(rng)
            a, b = tm.labeller_pair(rng, facts, friend)
            p = 1 / (1 + math.exp(tm.utility(b, facts) - tm.utility(a, facts)))
            a, b = (a, b) if rng.random() < p else (b, a)
            posts.append(text)
            chosen.append(a)
            rejected.append(b)
        r = tm.rm_scores(model, tok, posts + posts, chosen + rejected)
        loss = update(opt, decay, -torch.nn.functional.logsigmoid(r[:batch_size] - r[batch_size:]).mean())
        if (step + 1) % 100 == 0:
            log(f"  proxy rm step {step + 1}: loss {loss.item():.3f}")
    return model


def tldr_mini_info(policy, rm, tok, n=512, seed=0):
    """What the shipped pair does on n fresh posts: the RM's agreement with the labeller's utility and with the gold
    rule on labeller pairs of distinct utility / gold, what one flaw or pad costs in its score against the clean
    summary (the labeller's utility: a wrong fact -2, no want -1, a pad +LENGTH_BIAS), and the SFT's samples at
    temperature 1 against the references (win / tie rate, gold, proxy, pads), and where the KL-regularised optimum of
    the proxy and of the labeller lies at several beta (kl_optimum)."""
    import torch
    from rewards import tldr_mini as tm
    rng = random.Random(seed + 600)
    posts = [tm.post(rng) for _ in range(n)]
    pairs = [(text, facts, *tm.labeller_pair(rng, facts, friend)) for text, facts, friend in posts]
    refs = [tm.reference(rng, facts, friend) for _, facts, friend in posts]
    with torch.no_grad():
        ra = tm.rm_scores(rm, tok, [t for t, _, _, _ in pairs], [a for _, _, a, _ in pairs])
        rb = tm.rm_scores(rm, tok, [t for t, _, _, _ in pairs], [b for _, _, _, b in pairs])
        edits = {"clean": lambda f, fr: tm.summary(f), "wrong_name": lambda f, fr: tm.summary((fr[0], f[1], f[2])),
                 "wrong_item": lambda f, fr: tm.summary((f[0], fr[1], f[2])),
                 "no_want": lambda f, fr: tm.summary(f, want=False),
                 "pad": lambda f, fr: tm.summary(f, pads=["is sad"])}
        edit = {k: tm.rm_scores(rm, tok, [t for t, _, _ in posts], [e(f, fr) for _, f, fr in posts]).mean().item()
                for k, e in edits.items()}
    torch.manual_seed(seed)
    texts = sample(policy, tok, [t for t, _, _ in posts])

    def agree(score):
        d = [(score(a, f) - score(b, f), x - y) for (_, f, a, b), x, y in zip(pairs, ra.tolist(), rb.tolist())]
        d = [(u, r) for u, r in d if u != 0]
        return round(sum((u > 0) == (r > 0) for u, r in d) / len(d), 4)
    golds = [tm.gold(s, f) for s, (_, f, _) in zip(texts, posts)]
    ref_golds = [tm.gold(r, f) for r, (_, f, _) in zip(refs, posts)]
    return {"posts": n, "rm_agrees_with_labeller": agree(tm.utility), "rm_agrees_with_gold": agree(tm.gold),
            "sft_win_rate": round(sum(g > h for g, h in zip(golds, ref_golds)) / n, 4),
            "sft_tie_rate": round(sum(g == h for g, h in zip(golds, ref_golds)) / n, 4),
            "sft_gold": round(sum(golds) / n, 4), "reference_gold": round(sum(ref_golds) / n, 4),
            "sft_summaries_in_language": round(sum(tm.clauses_of(s) is not None for s in texts) / n, 4),
            "sft_pads": round(sum(len([c for c in tm.clauses_of(s) or [] if c in tm.PADS]) for s in texts) / n, 4),
            "rm_cost_against_clean": {k: round(v - edit["clean"], 3) for k, v in edit.items() if k != "clean"},
            **kl_optimum(policy, rm, tok, posts[:128], refs[:128], seed)}


def kl_optimum(policy, rm, tok, posts, refs, seed, samples=1024, betas=(2.0, 1.0, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05)):
    """Win rate and KL to the SFT of pi_sft(y) exp(r(y) / beta) normalised, the optimum of KL-regularised RL at
    coefficient beta and TB's target (paper Eq. 2), for r = the proxy RM and r = the labeller's utility (the proxy
    rewards/tldr_mini.py calls `labeller`): estimated by weighting `samples` SFT summaries per post by softmax(r / beta)
    (self-normalised importance sampling). It sees only what the SFT writes, so the optimum's over-optimisation beyond
    the SFT's support is not in it; and at small beta the tilt favours the SFT's rare summaries with two pads or more,
    which a few samples a post miss (with 32 a post the labeller's optimum at beta 0.3 came out 7 points higher than
    with 1024). Per beta: the win rate, the KL, the paired standard error over posts of the gain over the SFT, and the
    mean padding clauses."""
    import torch
    from rewards import tldr_mini as tm
    torch.manual_seed(seed + 1)
    texts = [sample(policy, tok, [text] * samples) for text, _, _ in posts]
    with torch.no_grad():
        proxy = [tm.rm_scores(rm, tok, [t] * samples, ys).tolist() for (t, _, _), ys in zip(posts, texts)]
    labeller = [[tm.utility(y, f) for y in ys] for (_, f, _), ys in zip(posts, texts)]
    wins = torch.tensor([[float(tm.gold(y, f) > tm.gold(r, f)) for y in ys] for (_, f, _), r, ys
                         in zip(posts, refs, texts)])
    pads = torch.tensor([[float(sum(c in tm.PADS for c in tm.clauses_of(y) or [])) for y in ys] for ys in texts])
    result = {"samples_per_post": samples}
    for name, r in (("proxy", proxy), ("labeller", labeller)):
        for beta in betas:
            win, kl, se, mean_pads = tilted(torch.tensor(r), wins, pads, beta)
            for key, value, digits in (("win_rate", win, 4), ("kl", kl, 3), ("gain_se", se, 4), ("pads", mean_pads, 3)):
                result.setdefault(f"{name}_optimum_{key}", {})[str(beta)] = round(value, digits)
    result["sft_win_rate_on_these_posts"] = round(wins.mean().item(), 4)
    return result


def tilted(rewards, wins, pads, beta):
    """(win rate, KL to the sampler, paired s.e. over posts of the win rate's gain over the sampler, mean pads) of the
    sampler tilted by exp(r / beta), from n samples a post: rewards, wins and pads are [posts, n]; each post's samples
    weigh softmax(r / beta), so KL = sum w log(w n), averaged over posts."""
    import torch
    w = torch.softmax(rewards / beta, dim=1)
    n = rewards.shape[1]
    gain = (w * wins).sum(1) - wins.mean(1)
    se = gain.std().item() / math.sqrt(len(gain)) if len(gain) > 1 else float("nan")
    return (w * wins).sum(1).mean().item(), torch.xlogy(w, w * n).sum(1).mean().item(), se, (w * pads).sum(1).mean().item()


def sample(policy, tok, prompts, max_new_tokens=24):
    """One completion a prompt from policy at temperature 1 (prompts left-padded into one batch), decoded."""
    import torch
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True)
    tok.padding_side = "right"
    with torch.no_grad():
        out = policy.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                              max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                              eos_token_id=tok.eos_token_id)
    return tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def build(path, make, tok=None):
    """Run make(tmp) into path.tmp, then rename; skip when path exists."""
    if os.path.exists(path):
        return
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    out = make(tmp)
    if out is not None:
        out.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    os.replace(tmp, path)
    print(f"saved {path}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "assets"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--info", action="store_true", help="measure the built tldr-mini pair again: rewrite "
                    "tiny-tldr-mini/rm/tiny_info.json (about 7 minutes of one core), then SHA256SUMS")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)  # one thread: deterministic, and many times faster than two on a busy 2-core box
    tok = build_tokenizer()
    log = lambda m: print(m, flush=True)  # noqa: E731
    tldr, red = os.path.join(args.out, "tiny-tldr"), os.path.join(args.out, "tiny-redteam")
    os.makedirs(tldr, exist_ok=True)
    os.makedirs(red, exist_ok=True)
    if not os.path.isfile(os.path.join(tldr, "test.jsonl")):
        write_posts(tldr, args.seed)
    build(os.path.join(tldr, "rm"), lambda tmp: train_rm(tok, args.seed, 100, log), tok)
    build(os.path.join(tldr, "judge"), lambda tmp: train_rm(tok, args.seed + 1, 100, log), tok)
    build(os.path.join(red, "toxicity"), lambda tmp: train_toxicity(tok, args.seed, 100, log), tok)
    attacker = attacker_tokenizer()

    def make_attacker(tmp):
        model = train_attacker(attacker, args.seed, 1000, log)
        info = attacker_masses(model, attacker, seed=args.seed)
        with open(os.path.join(tmp, "tiny_info.json"), "w") as f:
            json.dump(info, f, indent=2)
        log(f"  attacker: {info}")
        return model
    build(os.path.join(args.out, "tiny-redteam-modes", "sft"), make_attacker, attacker)
    mini, summ = os.path.join(args.out, "tiny-tldr-mini"), summariser_tokenizer()
    build(os.path.join(mini, "sft"), lambda tmp: train_summariser(summ, args.seed, 1000, log), summ)

    def make_rm(tmp):
        rm = train_proxy_rm(os.path.join(mini, "sft"), summ, args.seed, 2000, log)
        write_tldr_mini_info(mini, rm, summ, args.seed, tmp, log)
        return rm
    if args.info:  # the shipped pair measured again: its tiny_info.json only, no training
        from transformers import AutoTokenizer, LlamaForTokenClassification
        shipped = os.path.join(mini, "rm")
        rm = LlamaForTokenClassification.from_pretrained(shipped)
        write_tldr_mini_info(mini, rm, AutoTokenizer.from_pretrained(shipped), args.seed, shipped, log)
    build(os.path.join(mini, "rm"), make_rm, summ)
    write_sums(args.out)


def write_tldr_mini_info(mini, rm, tok, seed, folder, log):
    """<folder>/tiny_info.json: tldr_mini_info of the summariser <mini>/sft with the proxy RM `rm`."""
    from transformers import AutoModelForCausalLM
    info = tldr_mini_info(AutoModelForCausalLM.from_pretrained(os.path.join(mini, "sft")), rm, tok, seed=seed)
    with open(os.path.join(folder, "tiny_info.json"), "w") as f:
        json.dump(info, f, indent=2)
    log(f"  tldr-mini: {info}")


def write_sums(root):
    """<root>/SHA256SUMS: `sha256sum` lines for every file under root but README.md and the list itself."""
    from policy import SUMS, sha256
    files = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
                   if ".tmp" not in d and f not in (SUMS, "README.md"))
    with open(os.path.join(root, SUMS), "w") as f:
        f.writelines(f"{sha256(os.path.join(root, name))}  {name}\n" for name in files)
    print(f"wrote {os.path.join(root, SUMS)} ({len(files)} files)", flush=True)


if __name__ == "__main__":
    main()
