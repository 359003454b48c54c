"""rewards/arith: deterministic disjoint splits, reward on gold / altered answers, tokenizer round trip (no training)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rewards import DataError, arith, gsm8k  # noqa: E402


def test_generation_is_deterministic():
    a, b = arith.load("procedural:test:200", "test"), arith.load("procedural:test:200", "test")
    assert a == b
    assert arith.load("procedural:test:50", "test") == a[:50]  # a longer split extends a shorter one
    assert all(r["prompt"].startswith("[MATH TASK] Problem:\n") and r["prompt"].endswith("\n\nSolution:\n") for r in a)


def test_splits_are_disjoint():
    train = {r["prompt"] for r in arith.load(arith.DEFAULT_TRAIN, "train")}
    test = {r["prompt"] for r in arith.load(arith.DEFAULT_TEST, "test")}
    dev = {r["prompt"] for r in arith.load("procedural:dev:300", "dev")}
    assert len(train) == 20000 and len(test) == 500 and len(dev) == 300
    assert not train & test and not train & dev and not dev & test


def test_all_kinds_appear():
    answers = [r["answer"] for r in arith.load("procedural:test:500", "test")]
    assert {"+", "-", "*"} <= {tok for a in answers for tok in a.split()}
    assert any(a.count("=") == 2 for a in answers) and any(a.count("=") == 1 for a in answers)


def test_reward_gold_and_altered():
    for r in arith.load("procedural:test:200", "test"):
        n = int(gsm8k.gold(r["answer"]))
        assert arith.reward(r["answer"], r["answer"]) == 1.0
        assert arith.reward(r["answer"].rsplit("####", 1)[0] + f"#### {n + 1}", r["answer"]) == 0.0
        assert arith.reward("I don't know", r["answer"]) == 0.0


def test_bad_source():
    with pytest.raises(DataError):
        arith.load("procedural:valid:10", "test")
    with pytest.raises(DataError):
        arith.load("procedural:test:x", "test")


def test_tokenizer_round_trip(tmp_path):
    pytest.importorskip("transformers")
    from make_tiny import build_tokenizer
    from transformers import AutoTokenizer

    build_tokenizer(str(tmp_path))
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id}) == 4
    assert len(tok) <= 200
    for d in range(10):
        assert len(tok(f"{d}", add_special_tokens=False)["input_ids"]) == 1  # digits are single tokens
    records = arith.load("procedural:train:100", "train") + arith.load("procedural:test:100", "test")
    for r in records:
        for text in (r["prompt"], r["answer"], r["prompt"] + r["answer"]):
            ids = tok(text)["input_ids"]
            assert ids[0] == tok.bos_token_id and tok.unk_token_id not in ids
            assert tok.decode(ids, skip_special_tokens=True) == text
        # prompt + solution tokenizes as the concatenation of the two (training and sampling agree)
        assert tok(r["prompt"] + r["answer"])["input_ids"] == \
            tok(r["prompt"])["input_ids"] + tok(r["answer"], add_special_tokens=False)["input_ids"]


def test_file_source_reads_like_gsm8k(tmp_path):
    path = tmp_path / "mini.jsonl"
    path.write_text('{"question": "Tom has 2 apples and buys 3 more. How many apples does Tom have now?", "answer": "2 + 3 = 5. #### 5"}\n')
    [r] = arith.load(str(path), "test")
    assert r["prompt"] == arith.PROMPT.format(question="Tom has 2 apples and buys 3 more. How many apples does Tom have now?")
    assert arith.reward("2 + 3 = 5. #### 5", r["answer"]) == 1.0
