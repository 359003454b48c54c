"""A searcher's pieces without processes: its prompt shard (and the place a checkpoint keeps), its random streams
(one per run and rank), and rewards that raise."""
import os
import time

import torch
from conftest import ROOT

from config import load_config
from engine import make_engine
from policy import load_tokenizer
from rewards import redteam_modes as rm
from rewards import score, score_batch
from rewards.redteam import sample_attacks
from searcher import Shard, stream_seed


class NoRngEngine:
    def __init__(self):
        self.state = None

    def get_rng_state(self):
        return self.state

    def set_rng_state(self, state):
        self.state = state


def test_shards_are_disjoint_and_each_pass_visits_every_prompt_once():
    shards = [Shard(rank, 3, 20, seed=rank) for rank in (1, 2, 3)]
    assert sorted(i for s in shards for i in s.ids) == list(range(20))
    first = shards[0]
    two_passes = first.take(2 * len(first.ids))
    assert sorted(two_passes[: len(first.ids)]) == sorted(two_passes[len(first.ids):]) == first.ids


def test_a_restored_place_continues_the_same_prompt_order():
    engine = NoRngEngine()
    a = Shard(2, 2, 30, seed=5)
    a.take(19)  # part way into the second pass (15 prompts per shard)
    place = a.place(engine)
    assert place.n_searchers == 2 and place.pos == 19 - len(a.ids)
    after = a.take(20)
    b = Shard(2, 2, 30, seed=99)  # another seed: only the restored place can make it agree
    torch.manual_seed(123)
    b.restore(place, engine)
    assert b.take(20) == after
    assert torch.equal(torch.get_rng_state(), place.torch_rng)


def test_runs_of_different_seeds_never_draw_the_same_attacks(tiny_task_models):
    """A searcher's draws are a function of its stream's seed (vLLM on CPU samples from the torch generator that seed
    starts; the HF engine from its own), so each (seed, rank) needs its own: with seed + rank, run s's searcher 2 and
    run s + 1's searcher 1 would write the same attacks, and three seeds would not be three independent repeats."""
    assert len({stream_seed(seed, rank) for seed in range(16) for rank in range(1, 9)}) == 16 * 8
    attacker = os.path.join(ROOT, "assets", "tiny-redteam-modes", "sft")
    cfg, tok = load_config(None, [f"model={attacker}", "engine=hf"]), load_tokenizer(attacker)

    def attacks(seed, rank):
        engine = make_engine(cfg, "cpu", stream_seed(seed, rank), tok.pad_token_id, tok.eos_token_id, 64)
        return sample_attacks(engine, tok, [{"prompt": rm.PROMPT}] * 32, 1.0, 16)
    assert attacks(0, 2) == attacks(0, 2)
    assert attacks(0, 2) != attacks(1, 1)


def test_a_raising_reward_counts_zero_with_a_warning(capsys):
    class Task:
        @staticmethod
        def reward(text, answer):
            raise ZeroDivisionError("boom")
    stats = dict(reward_errors=0, reward_timeouts=0)
    assert [score(Task, "weird text", "#### 1", stats, 60.0) for _ in range(5)] == [0.0] * 5
    assert stats["reward_errors"] == 5 and stats["reward_timeouts"] == 0
    err = capsys.readouterr().err
    assert err.count("warning: the reward raised ZeroDivisionError: boom") == 3 and "only counted" in err


def test_a_reward_or_scorer_that_hangs_is_cut_off_and_counted(capsys):
    """A reward past reward_timeout_s counts as 0 (search/reward_timeouts) even when the task catches every
    Exception itself; a scorer batch the same for each of its completions; a fast call after it is untouched."""
    class Hangs:
        @staticmethod
        def reward(text, answer):
            try:
                while True:  # pure Python: a runaway parser
                    pass
            except Exception:  # a task's own catch-all must not swallow the time limit
                return 1.0

    class Sleeps:
        def score(self, prompts, completions, records, finished):
            time.sleep(30)

    class Task:
        reward = staticmethod(lambda text, answer: 0.5)

    stats = dict(reward_errors=0, reward_timeouts=0)
    t0 = time.perf_counter()
    assert score(Hangs, "x", "1", stats, 0.3) == 0.0
    assert score_batch(Sleeps(), ["p"] * 3, ["a"] * 3, [{}] * 3, [True] * 3, stats, 0.3) == [0.0] * 3
    assert time.perf_counter() - t0 < 3
    assert stats == dict(reward_errors=4, reward_timeouts=4)
    assert score(Task, "x", "1", stats, 0.3) == 0.5
    time.sleep(0.5)  # the limit is disarmed: no stray alarm after a call that finished in time
    assert "took longer than 0.3 s" in capsys.readouterr().err


def test_a_reward_that_is_not_finite_counts_zero_as_a_failed_reward(capsys):
    """A NaN or inf reward would make the whole update's loss non-finite: from reward() or from a scorer's batch it
    counts as 0 and search/reward_errors (as a raising reward), with a warning that says so; the batch's finite
    rewards stay."""
    class Task:
        @staticmethod
        def reward(text, answer):
            return float(text)

    class Scorer:
        def score(self, prompts, completions, records, finished):
            return [float(c) for c in completions]

    stats = dict(reward_errors=0, reward_timeouts=0)
    assert [score(Task, t, "1", stats, 60.0) for t in ("nan", "inf", "-inf", "0.5")] == [0.0, 0.0, 0.0, 0.5]
    assert stats == dict(reward_errors=3, reward_timeouts=0)
    texts = ["1", "nan", "0.25", "inf"]
    assert score_batch(Scorer(), ["p"] * 4, texts, [{}] * 4, [True] * 4, stats, 60.0) == [1.0, 0.0, 0.25, 0.0]
    assert stats == dict(reward_errors=5, reward_timeouts=0)
    err = capsys.readouterr().err
    assert "warning: the reward returned nan, which is not finite, on completion 'nan'" in err
    assert "warning: the task's scorer returned 2 rewards that are not finite (nan, inf) on a batch of 4" in err


def test_log_probs_in_token_budgeted_passes_equal_one_pass(tiny_model):
    """policy.sequence_logprobs cuts a round's sequences into passes of at most logprob_tokens padded tokens (size x
    longest, one sequence at least, order kept); the log-probs are those of one pass over all of them."""
    import numpy as np

    from policy import load_model, sequence_logprobs, token_batches
    assert token_batches([5, 5, 9, 3, 20, 2], 18) == [[0, 1], [2, 3], [4], [5]]
    assert token_batches([4, 4], 1) == [[0], [1]] and token_batches([], 8) == []
    model = load_model(tiny_model, "float32", "cpu").eval()
    rng = np.random.default_rng(0)
    prompts = [[1] + rng.integers(4, 100, int(rng.integers(3, 9))).tolist() for _ in range(12)]
    responses = [rng.integers(4, 100, int(rng.integers(1, 12))).tolist() for _ in range(12)]
    whole = sequence_logprobs(model, prompts, responses, 0.7, 10**6)
    parts = sequence_logprobs(model, prompts, responses, 0.7, 40)
    assert [len(a) for a in whole] == [len(r) for r in responses]
    for a, b in zip(whole, parts):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_synchronous_vllm_search_makes_its_whole_share_in_one_call_and_hf_keeps_its_chunks():
    """ChunkedSearch.work: in synchronous mode on vLLM one generation call for the share (4 prompts, chunk_prompts 2);
    on the HF engine, and in asynchronous mode, chunks of chunk_prompts (a round can be joined between them)."""
    import types
    from config import Config
    from searcher import ChunkedSearch

    def calls(asynchronous, engine):
        made = []
        searcher = types.SimpleNamespace(cfg=Config(asynchronous=asynchronous, chunk_prompts=2),
                                         engine=types.SimpleNamespace(name=engine), shard=Shard(1, 1, 10, 0),
                                         search=lambda pids, version: made.append(len(pids)) or [])
        strategy, budget = ChunkedSearch(searcher), 4
        while budget:
            budget -= strategy.work(budget)
        return made
    assert calls(False, "vllm") == [4]
    assert calls(False, "hf") == [2, 2] and calls(True, "vllm") == [2, 2]
