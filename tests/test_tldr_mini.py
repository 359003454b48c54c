"""TL;DR in miniature (rewards/tldr_mini.py): posts and their facts, the gold rule and the labeller on hand-made
summaries, the evaluator's win / tie / KL arithmetic, the shipped summariser and proxy RM against their recorded
behaviour, and configs/tldr_mini.yaml end to end."""
import json
import math
import os
import random

import numpy as np
import pytest
from conftest import ROOT, task_run

from rewards import DataError
from rewards import tldr_mini as tm

MINI = os.path.join(ROOT, "assets", "tiny-tldr-mini")
FACTS = ("anna", "job", "advice")


def test_posts_carry_their_facts_and_references_their_noise():
    rng = random.Random(0)
    flaws = {"clean": 0, "no_want": 0, "wrong": 0, "pad": 0}
    for _ in range(4000):
        text, facts, friend = tm.post(rng)
        assert tm.facts_of(text) == facts and text.startswith("post :") and text.endswith(" tl;dr :")
        assert not set(friend) & set(facts)  # a distractor never repeats a writer's fact
        ref = tm.reference(rng, facts, friend)
        parts = tm.clauses_of(ref)
        assert parts is not None  # every reference is in the summary language
        flaws["no_want"] += not any(p.startswith("wants") for p in parts)
        flaws["wrong"] += parts[0] != f"{facts[0]} lost {facts[1]}"
        flaws["pad"] += any(p in tm.PADS for p in parts)
        flaws["clean"] += ref == tm.summary(facts)
    noise = tm.REFERENCE_NOISE
    for key, p in (("no_want", noise["drop_want"]), ("wrong", noise["wrong_fact"]), ("pad", noise["pad"])):
        assert flaws[key] / 4000 == pytest.approx(p, abs=0.025)
    clean = (1 - noise["drop_want"]) * (1 - noise["wrong_fact"]) * (1 - noise["pad"])
    assert flaws["clean"] / 4000 == pytest.approx(clean, abs=0.03)


def test_labeller_pairs_differ_in_one_feature():
    rng = random.Random(1)
    changed = {"name": 0, "item": 0, "want": 0, "no_want": 0, "pads": 0}
    for _ in range(2000):
        _, facts, friend = tm.post(rng)
        a, b = tm.labeller_pair(rng, facts, friend)
        pa, pb = tm.clauses_of(a), tm.clauses_of(b)
        assert pa is not None and pb is not None and a != b
        (na, _, ia), (nb, _, ib) = pa[0].split(), pb[0].split()
        wa, wb = [p for p in pa if p.startswith("wants")], [p for p in pb if p.startswith("wants")]
        diff = {"name": na != nb, "item": ia != ib, "want": wa != wb and bool(wa) and bool(wb),
                "no_want": bool(wa) != bool(wb),
                "pads": [p for p in pa if p in tm.PADS] != [p for p in pb if p in tm.PADS]}
        assert sum(diff.values()) == 1, (a, b)
        for k, d in diff.items():
            changed[k] += d
        assert {na, nb} <= {facts[0], friend[0]} and {ia, ib} <= {facts[1], friend[1]}
        gap = abs(tm.utility(a, facts) - tm.utility(b, facts))
        assert gap == pytest.approx({"name": 2, "item": 2, "want": 2, "no_want": 1, "pads": tm.LENGTH_BIAS}[
            next(k for k, d in diff.items() if d)])
    assert all(n > 250 for n in changed.values()), changed  # each feature about a fifth of the pairs


def test_gold_rewards_the_facts_and_brevity_and_the_labeller_likes_length():
    clean = " anna lost job and wants advice ."
    cases = {  # summary: (gold, labeller's utility)
        clean: (3.0, 3.0),
        " anna lost job .": (2.0, 2.0),
        " ben lost job and wants advice .": (1.0, 1.0),  # a wrong name: -1, and the right one missing
        " anna lost job and ben wants money .": (0.0, 0.0),  # two wrong facts stated, the want missed
        " anna lost job and wants advice and is sad .": (2.0, 3.0 + tm.LENGTH_BIAS),  # 10 words: -1
        " anna lost job and wants advice and is sad and is tired .": (0.5, 3.0 + 2 * tm.LENGTH_BIAS),
        " anna lost job and wants advice and had a long week .": (1.0, 3.0 + tm.LENGTH_BIAS),
        "anna job advice .": (tm.NOT_A_SUMMARY, tm.NOT_A_SUMMARY),  # outside the language
        " anna lost job and wants advice": (tm.NOT_A_SUMMARY, tm.NOT_A_SUMMARY),  # cut before the "."
        "": (tm.NOT_A_SUMMARY, tm.NOT_A_SUMMARY),
    }
    for text, (g, u) in cases.items():
        assert tm.gold(text, FACTS) == pytest.approx(g), text
        assert tm.utility(text, FACTS) == pytest.approx(u), text
    # a clean summary beats every flawed reference, and ties a clean one
    for ref in list(cases)[1:7]:
        assert tm.gold(clean, FACTS) > tm.gold(ref, FACTS)


def test_load_is_procedural_and_fixed():
    a, b = tm.load("procedural:test:5", "test"), tm.load("procedural:test:5", "test")
    assert a == b and len(a) == 5 and a != tm.load("procedural:train:5", "train")
    assert all(tm.facts_of(r["prompt"]) and tm.clauses_of(r["answer"]) for r in a)
    for bad in ("procedural:test:0", "procedural:dev:4", "posts.jsonl"):
        with pytest.raises(DataError):
            tm.load(bad, "train")


def test_evaluator_counts_wins_ties_apart_and_estimates_kl():
    records = [{"prompt": tm.PROMPT.format(body="i am anna . i lost my job . i want advice ."), "answer": a}
               for a in (" anna lost job .", " anna lost job and wants advice .", " anna lost job and wants advice .")]
    texts = [" anna lost job and wants advice .", " anna lost job and wants advice .", " anna lost job ."]

    class Fixed:  # the proxy RM and the SFT log-probs, stubbed
        def score(self, prompts, completions, recs, finished):
            return [tm.utility(c, FACTS) if f else tm.NON_EOS_PENALTY for c, f in zip(completions, finished)]
    ev = tm.Evaluator.__new__(tm.Evaluator)
    ev.scorer = Fixed()
    ev.sft_logprobs = lambda prompts, responses: [np.log(np.full(len(r), 0.5)) for r in responses]
    responses = [[1, 2, 3], [1, 2], [1]]
    logps = [np.log(np.full(len(r), 0.8)) for r in responses]
    rows, totals = ev.metrics(records, [[0]] * 3, responses, texts, [True, True, False], logps)
    assert [(r["win"], r["tie"]) for r in rows] == [(True, False), (False, True), (False, False)]
    assert totals["win_rate"] == [1.0, 3] and totals["tie_rate"] == [1.0, 3]
    assert totals["gold"] == [8.0, 3] and totals["proxy"] == [6.0 + tm.NON_EOS_PENALTY, 3]
    assert totals["kl"][0] == pytest.approx(6 * math.log(0.8 / 0.5))  # sum over all 6 tokens of log pi - log sft
    assert totals["perplexity"] == [pytest.approx(6.0), 3]  # exp(-log 0.5) = 2 per summary
    assert totals["words"] == [18.0, 3] and totals["pads"] == [0.0, 3]


def test_the_labeller_as_proxy_scores_hand_made_summaries():
    """reward_model: labeller: the training reward is the labeller's utility of the summary against the post's own
    facts (a pad +LENGTH_BIAS where the gold takes 1 off), NOT_A_SUMMARY outside the language, NON_EOS_PENALTY when
    the summary did not end; no model is loaded."""
    from config import Config
    scorer = tm.Scorer(Config(reward_model=tm.LABELLER), "cpu")
    assert scorer.rm is None
    post = tm.PROMPT.format(body="i am anna . my friend ben lost a car . i lost my job . i want advice .")
    cases = [(" anna lost job and wants advice .", True, 3.0),
             (" anna lost job and wants advice and is sad .", True, 3.0 + tm.LENGTH_BIAS),  # gold 2: the bias
             (" anna lost job and wants advice and is sad and is tired .", True, 3.0 + 2 * tm.LENGTH_BIAS),
             (" ben lost job and wants advice .", True, 1.0),  # the friend's name: -1, and the writer's missing
             (" anna lost car .", True, 0.0),
             (" anna job advice", True, tm.NOT_A_SUMMARY),
             (" anna lost job and wants advice .", False, tm.NON_EOS_PENALTY)]
    rewards = scorer.score([post] * len(cases), [c for c, _, _ in cases], [{}] * len(cases), [f for _, f, _ in cases])
    assert rewards == pytest.approx([r for _, _, r in cases])
    assert tm.gold(cases[1][0], FACTS) == 2.0 < tm.gold(cases[0][0], FACTS)  # what the proxy's favourite costs


def test_the_shipped_pair_behaves_as_recorded():
    """The proxy RM agrees with its labeller more than with the gold, prefers padding (the gold does not) and the
    right facts; the SFT writes the summary language and wins sometimes; the KL-regularised optimum of the proxy wins
    more than the SFT at beta 1 and less at 0.05, a front that rises then falls; the config's proxy (the labeller)
    has its optimum at the config's beta at least 10 points above the SFT, where the RM's never is (rm/tiny_info.json,
    made by the builder)."""
    info = json.load(open(os.path.join(MINI, "rm", "tiny_info.json")))
    assert info["rm_agrees_with_labeller"] > 0.75 and info["rm_agrees_with_gold"] < info["rm_agrees_with_labeller"]
    noise = tm.REFERENCE_NOISE
    best = 1 - (1 - noise["drop_want"]) * (1 - noise["wrong_fact"]) * (1 - noise["pad"])  # a clean summary's wins
    assert info["sft_summaries_in_language"] > 0.9 and 0.0 < info["sft_win_rate"] < best
    proxy, sft = info["proxy_optimum_win_rate"], info["sft_win_rate_on_these_posts"]
    assert proxy["1.0"] > sft > proxy["0.05"] and info["labeller_optimum_win_rate"]["0.5"] > proxy["1.0"]
    import yaml
    cfg = yaml.safe_load(open(os.path.join(ROOT, "configs", "tldr_mini.yaml")))
    labeller, beta = info["labeller_optimum_win_rate"], str(float(cfg["beta_end"]))
    assert cfg["reward_model"] == tm.LABELLER and labeller[beta] >= sft + 0.10 > max(proxy.values())
    assert max(labeller.values()) > labeller[beta] and labeller["0.05"] < sft  # past the peak; falls below the SFT
    from config import Config
    scorer = tm.Scorer(Config(reward_model=os.path.join(MINI, "rm")), "cpu")
    rng = random.Random(5)
    posts = [tm.post(rng) for _ in range(64)]
    kinds = {"clean": lambda f, fr: tm.summary(f), "pad": lambda f, fr: tm.summary(f, pads=1, rng=rng),
             "short": lambda f, fr: tm.summary(f, want=False), "wrong": lambda f, fr: tm.summary((fr[0], f[1], f[2]))}
    mean = {k: np.mean(scorer.score([t for t, _, _ in posts], [make(f, fr) for _, f, fr in posts], [{}] * 64,
                                    [True] * 64)) for k, make in kinds.items()}
    # on average: the length bias (the gold says clean > pad), the want, the facts (a weak proxy: about 70% per pair)
    assert mean["pad"] > mean["clean"] > mean["short"] and mean["clean"] > mean["wrong"]
    assert scorer.score([posts[0][0]], [" anna lost job ."], [{}], [False]) == [tm.NON_EOS_PENALTY]


def test_the_builders_optimum_estimate_on_a_hand_made_case():
    """kl_optimum's tilt: two samples of rewards 0 and log 3 at beta 1 weigh 1/4 and 3/4, so the tilted policy wins
    3/4 when only the second wins, at KL 1/4 log(1/2) + 3/4 log(3/2) to the sampler; beta -> 0 takes the argmax (KL
    log 2), a huge beta the sampler (KL 0); posts average."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import torch
    from make_tiny_models import tilted
    r, wins = torch.tensor([[0.0, math.log(3)]]), torch.tensor([[0.0, 1.0]])
    pads = torch.tensor([[0.0, 2.0]])
    win, kl, se, mean_pads = tilted(r, wins, pads, 1.0)
    assert win == pytest.approx(0.75) and kl == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5))
    assert mean_pads == pytest.approx(1.5) and math.isnan(se)  # one post: no standard error
    assert tilted(r, wins, pads, 1e-3) == pytest.approx((1.0, math.log(2), math.nan, 2.0), nan_ok=True)
    assert tilted(r, wins, pads, 1e6) == pytest.approx((0.5, 0, math.nan, 1.0), abs=1e-6, nan_ok=True)
    # two posts: the second's samples tie (weights 1/2 each, KL 0) and both win; gains over the sampler 0.25 and 0:
    # mean 0.125, s.e. = stdev(0.25, 0) / sqrt(2) = 0.125
    two = tilted(torch.tensor([[0.0, math.log(3)], [0.0, 0.0]]), torch.tensor([[0.0, 1.0], [1.0, 1.0]]),
                 torch.tensor([[0.0, 2.0], [0.0, 0.0]]), 1.0)
    assert two == pytest.approx(((0.75 + 1.0) / 2, kl / 2, 0.125, 1.5 / 2))


def test_config_end_to_end(tiny_task_models, tmp_path):
    """configs/tldr_mini.yaml through torchrun (HF engine): every metric at the start and the end."""
    rows, summary = task_run("tldr_mini.yaml", tmp_path / "run", "engine=hf", "n_test=32", reward=(-20.0, 20.0))
    for r in (rows[0], rows[-1]):
        assert 0.0 <= r["eval/win_rate"] + r["eval/tie_rate"] <= 1.0 and r["eval/perplexity"] >= 1.0
        assert math.isfinite(r["eval/kl"]) and math.isfinite(r["eval/gold"]) and r["eval/words"] > 0
    assert abs(rows[0]["eval/kl"]) < 2.0  # the policy is the SFT at step 0: KL 0 up to sampling noise
    evals = [json.loads(line) for line in open(tmp_path / "run" / "eval_step0.jsonl")]
    assert [e["id"] for e in evals] == list(range(32)) and {"summary", "gold", "win", "tie", "kl"} <= set(evals[0])
