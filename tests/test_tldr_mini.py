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
    for key, p in (("no_want", 0.2), ("wrong", 0.15), ("pad", 0.2)):
        assert flaws[key] / 4000 == pytest.approx(p, abs=0.025)
    assert flaws["clean"] / 4000 == pytest.approx(0.8 * 0.85 * 0.8, abs=0.03)


def test_gold_rewards_the_facts_and_brevity_and_the_labeller_likes_length():
    clean = " anna lost job and wants advice ."
    cases = {  # summary: (gold, labeller's utility)
        clean: (3.0, 3.0),
        " anna lost job .": (2.0, 2.0),
        " ben lost job and wants advice .": (1.0, 1.0),  # a wrong name: -1, and the right one missing
        " anna lost job and ben wants money .": (0.0, 0.0),  # two wrong facts stated, the want missed
        " anna lost job and wants advice and is sad .": (2.0, 3.6),  # 10 words: -1; the labeller: +0.6
        " anna lost job and wants advice and is sad and is tired .": (0.5, 4.2),
        " anna lost job and wants advice and had a long week .": (1.0, 3.6),
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


def test_the_shipped_pair_behaves_as_recorded():
    """The proxy RM agrees with its labeller more than with the gold, prefers padding (the gold does not) and the
    right facts; the SFT writes the summary language and wins sometimes (rm/tiny_info.json, made by the builder)."""
    info = json.load(open(os.path.join(MINI, "rm", "tiny_info.json")))
    assert info["rm_agrees_with_labeller"] > 0.75 and info["rm_agrees_with_gold"] < info["rm_agrees_with_labeller"]
    assert info["sft_summaries_in_language"] > 0.9 and 0.0 < info["sft_win_rate"] < 0.46
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


def test_config_end_to_end(tiny_task_models, tmp_path):
    """configs/tldr_mini.yaml through torchrun (HF engine): every metric at the start and the end."""
    rows, summary = task_run("tldr_mini.yaml", tmp_path / "run", "engine=hf", "n_test=32", reward=(-20.0, 20.0))
    for r in (rows[0], rows[-1]):
        assert 0.0 <= r["eval/win_rate"] + r["eval/tie_rate"] <= 1.0 and r["eval/perplexity"] >= 1.0
        assert math.isfinite(r["eval/kl"]) and math.isfinite(r["eval/gold"]) and r["eval/words"] > 0
    assert abs(rows[0]["eval/kl"]) < 2.0  # the policy is the SFT at step 0: KL 0 up to sampling noise
    evals = [json.loads(line) for line in open(tmp_path / "run" / "eval_step0.jsonl")]
    assert [e["id"] for e in evals] == list(range(32)) and {"summary", "gold", "win", "tie", "kl"} <= set(evals[0])
