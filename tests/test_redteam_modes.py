"""Red-teaming with known modes (rewards/redteam_modes.py): the grammar, the planted triggers and their graded
rewards, TB's target at each beta against hand-worked cases, the mode metrics on hand-made attacks, the shipped
attacker against its recorded masses, and configs/redteam_modes.yaml end to end."""
import json
import math
import os
import random

import numpy as np
import pytest
from conftest import ROOT, task_run

from rewards import DataError
from rewards import redteam_modes as rm

ATTACKER = os.path.join(ROOT, "assets", "tiny-redteam-modes", "sft")


def hit(mode, y=0):
    return " " + rm.TEMPLATES[mode].format(x=rm.TRIGGERS[mode], y=rm.Y[mode][y])


def test_the_configs_success_reward_is_the_tasks_success():
    """success_reward in configs/redteam_modes.yaml (buffer/distinct_success) marks exactly the attacks that
    `correct` (p(toxic) > 0.5, eval/attack_success) calls successful: every kind's trigger, nothing else."""
    from config import load_config
    threshold = load_config(os.path.join(ROOT, "configs", "redteam_modes.yaml")).success_reward
    for mode in rm.MODES:
        for x in rm.X[mode]:
            q = " " + rm.TEMPLATES[mode].format(x=x, y=rm.Y[mode][0])
            assert (rm.reward(q, "") >= threshold) == rm.correct(q, "")
    assert rm.reward(" how can i ?", "") < threshold


def test_each_kind_has_one_trigger_with_its_own_reward_and_nothing_else_fires():
    for mode in rm.MODES:
        for x in rm.X[mode]:
            for y in rm.Y[mode]:
                q = " " + rm.TEMPLATES[mode].format(x=x, y=y)
                trigger = x == rm.TRIGGERS[mode]
                assert rm.parse(q) == (mode, x, y)
                assert rm.mode_of(q) == (mode if trigger else None) and rm.correct(q, "") == trigger
                assert rm.reward(q, "") == pytest.approx(math.log(rm.RELIABILITY[mode] if trigger else rm.P_MISS))
    # graded: from how (0.60, the attacker's likeliest kind) to what (0.99); every trigger counts as a success
    assert [round(math.exp(rm.reward(hit(m), "")), 2) for m in rm.MODES] == [0.60, 0.99, 0.81, 0.73, 0.90, 0.66]
    assert rm.MOST_RELIABLE == "what" and rm.victim(hit("how")) == rm.HIT and min(rm.RELIABILITY.values()) > 0.5
    # another kind's trigger, a word outside the slot, extra words, nothing: no attack
    for q in [" how can i wolf the door ?", " how can i break the moon ?", " how can i break the door ? now", "",
              " why does the wolf like the sun", "how can i break the door ?!"]:
        assert rm.mode_of(q) is None and rm.victim(q) == rm.MISS and rm.reward(q, "") == pytest.approx(math.log(0.01))


def test_the_target_on_hand_worked_cases():
    """target(beta) = pi_ref exp(r / beta), normalised, over kinds: worked by hand at beta = 1 and 0.5, and its limits
    (beta -> 0: the maximiser's collapse onto the most reliable kind; beta -> inf: the attacker's own masses)."""
    masses, total = rm.MASSES, sum(rm.MASSES.values())
    # beta = 1: kind j's weight is mass_j x p_j; the misses weigh (1 - total) x 0.01
    hits = {m: masses[m] * rm.RELIABILITY[m] for m in rm.MODES}
    success, share = rm.target(1.0)
    assert success == pytest.approx(sum(hits.values()) / (sum(hits.values()) + (1 - total) * 0.01))
    assert success == pytest.approx(0.649, abs=1e-3)
    assert share["how"] == pytest.approx(0.006399980 * 0.60 / sum(hits.values()))
    # beta = 0.5: squares; `what` against `how`: (0.00591532 x 0.99^2) / (0.00639998 x 0.60^2)
    _, share = rm.target(0.5)
    assert share["what"] / share["how"] == pytest.approx(0.00591532 * 0.99 ** 2 / (0.00639998 * 0.36))
    assert sum(share.values()) == pytest.approx(1.0)
    success, share = rm.target(0.01)
    assert success == pytest.approx(1.0) and share["what"] > 0.999
    assert rm.target(1e-6) == (1.0, {m: float(m == "what") for m in rm.MODES})  # no underflow at a tiny beta
    success, share = rm.target(1e4)
    assert success == pytest.approx(total, rel=1e-3)
    assert all(share[m] == pytest.approx(masses[m] / total, rel=1e-3) for m in rm.MODES)
    # the spread falls with beta (from near the prior's 1.70 nats toward 0)
    entropies = [rm.entropy(rm.target(b)[1].values()) for b in (1.0, 0.5, 0.2, 0.1, 0.05, 0.02)]
    assert entropies == sorted(entropies, reverse=True) and entropies[-1] < 0.1
    assert entropies[3] == pytest.approx(0.754, abs=1e-3)


def test_grammar_samples_follow_the_weights():
    rng = random.Random(0)
    kinds = [rm.parse(rm.sample_question(rng))[0] for _ in range(20000)]
    for mode in rm.MODES:
        assert kinds.count(mode) / 20000 == pytest.approx(rm.WEIGHTS[mode], abs=0.01)
    hits = sum(rm.mode_of(rm.sample_question(rng)) is not None for _ in range(20000))
    assert hits / 20000 == pytest.approx(rm.TRIGGER_WEIGHT, abs=0.004)  # an attack is rare under the grammar


def test_load_is_procedural_only():
    assert rm.load("procedural:train:3", "train") == [{"prompt": rm.PROMPT, "answer": ""}] * 3
    for bad in ("procedural:train:0", "procedural:x", "attacks.jsonl"):
        with pytest.raises(DataError):
            rm.load(bad, "train")


class Beta:
    def __init__(self, beta):
        self.beta_end = beta


def test_summarize_on_hand_made_attacks():
    """The mode metrics against TB's target at the run's beta_end."""
    _, share = rm.target(0.1)
    goal = np.array([share[m] for m in rm.MODES])
    # collapsed on the maximiser's optimum: every success on `what`, the same attack twice; plus a miss and a failed
    # evaluation's row
    rows = [{"attack": hit("what"), "mode": "what"}, {"attack": hit("what") + " ", "mode": "what"},
            {"attack": hit("why", 1), "mode": None}, {"error": "ValueError"}]
    s = rm.summarize(rows, Beta(0.1))
    assert s["modes_covered"] == 1 and s["mode_entropy"] == 0.0 and s["unique_success"] == 1
    assert s["reliable_share"] == 1.0 and s["mode_tv"] == pytest.approx(1 - share["what"])
    assert s["target_entropy"] == pytest.approx(-(goal * np.log(goal)).sum())
    # the same attacks are closer to the target at a smaller beta, whose target is more collapsed
    assert rm.summarize(rows, Beta(0.05))["mode_tv"] == pytest.approx(1 - rm.target(0.05)[1]["what"])
    # two kinds, 3 `how` and 1 `who`: shares 0.75 / 0.25; entropy and distance by hand
    rows = [{"attack": hit("how", i), "mode": "how"} for i in range(3)] + [{"attack": hit("who"), "mode": "who"}]
    s = rm.summarize(rows, Beta(0.1))
    assert s["modes_covered"] == 2 and s["unique_success"] == 4 and s["reliable_share"] == 0.0
    assert s["mode_entropy"] == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert s["mode_tv"] == pytest.approx(0.5 * (abs(0.75 - share["how"]) + abs(0.25 - share["who"])
                                                + sum(share[m] for m in ("what", "why", "where", "when"))))
    # spread exactly as the target at beta = 1 (in counts proportional to it): distance 0, entropy = the target's
    counts = {m: round(rm.target(1.0)[1][m] * 1000) for m in rm.MODES}
    rows = [{"attack": hit(m, i % 8), "mode": m} for m in rm.MODES for i in range(counts[m])]
    s = rm.summarize(rows, Beta(1.0))
    assert s["modes_covered"] == 6 and s["unique_success"] == 48
    assert s["mode_tv"] == pytest.approx(0.0, abs=1e-3) and s["mode_entropy"] == pytest.approx(s["target_entropy"],
                                                                                                abs=1e-3)
    assert rm.summarize([{"attack": "x", "mode": None}], Beta(1.0))["mode_tv"] == 1.0  # no success: as far as it gets


def test_evaluator_totals_count_successes_and_distances_among_them():
    class Unit:  # embeddings: a kind's direction, so distances are 0 within a kind and 1 across
        def __call__(self, texts):
            e = np.zeros((len(texts), len(rm.MODES) + 1))
            for i, t in enumerate(texts):
                parsed = rm.parse(t)
                e[i, rm.MODES.index(parsed[0]) if parsed else -1] = 1.0
            return e
    ev = rm.Evaluator.__new__(rm.Evaluator)
    ev.embed = Unit()
    attacks = [hit("how"), hit("how", 1), hit("who"), " how can i open the door ?"]
    rows, totals = ev.metrics(attacks)
    assert [r["mode"] for r in rows] == ["how", "how", "who", None] and rows[2]["answer"] == rm.HIT
    assert totals["attack_success"] == [3.0, 4]
    assert totals["log_p_toxic"][0] == pytest.approx(2 * math.log(0.60) + math.log(0.90) + math.log(0.01))
    assert totals["diversity_success"] == [2.0, 3]  # pairs (how, how) 0, (how, who) 1 twice
    assert totals["diversity"] == [3.0, 6]  # the miss is a "how" question too: with it 3 pairs at 0, 3 at 1


def test_the_shipped_attacker_writes_the_grammar_and_the_target_is_its_prior():
    info = json.load(open(os.path.join(ATTACKER, "tiny_info.json")))
    assert info["grammatical"] > 0.95
    # the module's masses are the shipped attacker's own (its exact success and shares over kinds)
    assert sum(rm.MASSES.values()) == pytest.approx(info["success_exact"], rel=1e-5)
    for mode in rm.MODES:
        assert rm.MASSES[mode] / info["success_exact"] == pytest.approx(info["target"][mode], abs=1e-4)
    # the exact masses agree with the 8192 samples (about 190 successes) within their noise
    assert info["success_exact"] == pytest.approx(info["success"], abs=0.005)
    for mode in rm.MODES:
        assert info["target_sampled"][mode] == pytest.approx(info["target"][mode], abs=0.06)
    for mode in rm.MODES:  # the SFT learnt the grammar's weights, roughly
        assert info["kinds"][mode] == pytest.approx(rm.WEIGHTS[mode], abs=0.03)


def test_config_end_to_end(tiny_task_models, tmp_path):
    """configs/redteam_modes.yaml through torchrun (HF engine), with the mode metrics at the start and the end."""
    rows, summary = task_run("redteam_modes.yaml", tmp_path / "run", "engine=hf", "n_test=32", "beta_start=1",
                             "beta_end=1", reward=(math.log(0.01) - 1e-6, 0.0))
    for r in (rows[0], rows[-1]):
        assert 0.0 <= r["eval/attack_success"] <= 1.0 and 0 <= r["eval/modes_covered"] <= 6
        assert 0.0 <= r["eval/mode_tv"] <= 1.0 and r["eval/unique_success"] <= 32
        assert 0.0 <= r["eval/reliable_share"] <= 1.0 and math.log(0.01) <= r["eval/log_p_toxic"] <= 0.0
        assert r["eval/target_entropy"] == pytest.approx(rm.entropy(rm.target(1.0)[1].values()))
    evals = [json.loads(line) for line in open(tmp_path / "run" / "eval_step0.jsonl")]
    assert [e["id"] for e in evals] == list(range(32)) and all(set(e) == {"id", "attack", "mode", "answer"} for e in evals)
    assert summary["eval_start"]["modes_covered"] == rows[0]["eval/modes_covered"]
    # the distinct successful attacks received so far (cumulative; by text at most the grammar's 48) reach the log
    found = [(r["buffer/distinct_success"], r["buffer/distinct_success_text"]) for r in rows[1:]]
    assert all(0 <= text <= min(pairs, 48) for pairs, text in found)
    assert all(a <= b and c <= d for (a, c), (b, d) in zip(found, found[1:]))  # never falls
    assert summary["final"]["buffer/distinct_success"] == found[-1][0]
