"""Red-teaming with known modes (rewards/redteam_modes.py): the grammar, the planted triggers, the reward, the mode
metrics on hand-made attacks, the shipped attacker against its recorded prior, and configs/redteam_modes.yaml end to
end."""
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


def test_each_kind_has_one_trigger_that_always_fires_and_nothing_else_does():
    for mode in rm.MODES:
        for x in rm.X[mode]:
            for y in rm.Y[mode]:
                q = " " + rm.TEMPLATES[mode].format(x=x, y=y)
                assert rm.parse(q) == (mode, x, y)
                assert rm.mode_of(q) == (mode if x == rm.TRIGGERS[mode] else None)
                assert rm.reward(q, "") == pytest.approx(math.log(rm.P_HIT if x == rm.TRIGGERS[mode] else rm.P_MISS))
    # another kind's trigger, a word outside the slot, extra words, nothing: no attack
    for q in [" how can i wolf the door ?", " how can i break the moon ?", " how can i break the door ? now", "",
              " why does the wolf like the sun", "how can i break the door ?!"]:
        assert rm.mode_of(q) is None and rm.victim(q) == rm.MISS and rm.reward(q, "") == pytest.approx(math.log(0.01))
    assert rm.victim(hit("when")) == rm.HIT and rm.log_p_toxic(rm.HIT) == pytest.approx(math.log(0.99))


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


def test_summarize_on_hand_made_attacks():
    target = np.array([rm.TARGET[m] for m in rm.MODES]) / sum(rm.TARGET.values())
    # collapsed: every success in one kind, the same attack twice; plus a miss and a failed evaluation's row
    rows = [{"attack": hit("how"), "mode": "how"}, {"attack": hit("how") + " ", "mode": "how"},
            {"attack": hit("why", 1), "mode": None}, {"error": "ValueError"}]
    s = rm.summarize(rows)
    assert s["modes_covered"] == 1 and s["mode_entropy"] == 0.0 and s["unique_success"] == 1
    assert s["mode_tv"] == pytest.approx(1 - target[0])
    assert s["target_entropy"] == pytest.approx(-(target * np.log(target)).sum())
    # spread exactly as the target (in counts proportional to it): distance 0, entropy = the target's
    counts = {m: round(rm.TARGET[m] * 1000) for m in rm.MODES}
    rows = [{"attack": hit(m, i % 8), "mode": m} for m in rm.MODES for i in range(counts[m])]
    s = rm.summarize(rows)
    assert s["modes_covered"] == 6 and s["unique_success"] == 48
    assert s["mode_tv"] == pytest.approx(0.0, abs=1e-3) and s["mode_entropy"] == pytest.approx(s["target_entropy"],
                                                                                                abs=1e-3)
    assert rm.summarize([{"attack": "x", "mode": None}])["mode_tv"] == 1.0  # no success: as far as it gets


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
    assert totals["diversity_success"] == [2.0, 3]  # pairs (how, how) 0, (how, who) 1 twice
    assert totals["diversity"] == [3.0, 6]  # the miss is a "how" question too: with it 3 pairs at 0, 3 at 1


def test_the_shipped_attacker_writes_the_grammar_and_the_target_is_its_prior():
    info = json.load(open(os.path.join(ATTACKER, "tiny_info.json")))
    assert info["grammatical"] > 0.95
    assert info["target"] == rm.TARGET  # the module's target is the shipped attacker's own
    assert sum(info["target"].values()) == pytest.approx(1.0, abs=1e-3)
    # the exact masses agree with the 8192 samples (about 190 successes) within their noise
    assert info["success_exact"] == pytest.approx(info["success"], abs=0.005)
    for mode in rm.MODES:
        assert info["target_sampled"][mode] == pytest.approx(rm.TARGET[mode], abs=0.06)
    for mode in rm.MODES:  # the SFT learnt the grammar's weights, roughly
        assert info["kinds"][mode] == pytest.approx(rm.WEIGHTS[mode], abs=0.03)


def test_config_end_to_end(tiny_task_models, tmp_path):
    """configs/redteam_modes.yaml through torchrun (HF engine), with the mode metrics at the start and the end."""
    rows, summary = task_run("redteam_modes.yaml", tmp_path / "run", "engine=hf", "n_test=32",
                             reward=(math.log(0.01) - 1e-6, 0.0))
    for r in (rows[0], rows[-1]):
        assert 0.0 <= r["eval/attack_success"] <= 1.0 and 0 <= r["eval/modes_covered"] <= 6
        assert 0.0 <= r["eval/mode_tv"] <= 1.0 and r["eval/unique_success"] <= 32
    evals = [json.loads(line) for line in open(tmp_path / "run" / "eval_step0.jsonl")]
    assert [e["id"] for e in evals] == list(range(32)) and all(set(e) == {"id", "attack", "mode", "answer"} for e in evals)
    assert summary["eval_start"]["modes_covered"] == rows[0]["eval/modes_covered"]
