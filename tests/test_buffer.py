"""Replay buffer: dedup, per-prompt cap with oldest-first eviction, the rate of recent draws, reward priority."""
import numpy as np
import pytest

from buffer import Draw, ReplayBuffer, Sample
from config import Config


def buf(cap, m, inv_temp, seed=0):
    return ReplayBuffer(Config(per_prompt_cap=cap, m=m, inv_temp=inv_temp, seed=seed))


def s(pid, resp, reward=0.0, version=0):
    return Sample(pid, tuple(resp), reward, np.zeros(len(resp), np.float32), np.zeros(len(resp), np.float32), version, True)


def test_dedup_newest_copy_wins():
    b = buf(cap=10, m=0.5, inv_temp=0.0)
    assert b.add([s(0, [1, 2], version=0), s(0, [1, 3], version=0)]) == 2
    assert b.add([s(0, [1, 2], version=5)]) == 0  # duplicate: not new
    assert len(b) == 2
    assert [x.response for x in b.items[0]] == [(1, 3), (1, 2)]
    assert b.items[0][-1].version == 5


def test_cap_evicts_oldest_first():
    b = buf(cap=3, m=0.5, inv_temp=0.0)
    b.add([s(0, [i]) for i in range(2)])
    b.add([s(0, [i]) for i in range(2, 5)])
    assert [x.response for x in b.items[0]] == [(2,), (3,), (4,)]
    assert len(b) == 3


def train_step(b):
    """What a train step does to the buffer's recent pool: it samples."""
    b.sample(1, 1)


def test_recent_draws_come_from_latest_sync_with_rate_m():
    b = buf(cap=100, m=0.8, inv_temp=0.0, seed=0)
    b.add([s(p, [p, i]) for p in range(20) for i in range(4)])  # old sync: prompts 0..19
    train_step(b)
    b.add([s(p, [p, i]) for p in range(20, 25) for i in range(4)])  # latest sync: prompts 20..24
    n, recent = 0, 0
    for _ in range(500):
        for pid, picks, from_recent in b.sample(4, 4):
            n += 1
            recent += from_recent
            assert all(x.prompt_id == pid for x in picks)
            if from_recent:
                assert pid >= 20
    rate = recent / n
    assert abs(rate - 0.8) < 4 * np.sqrt(0.8 * 0.2 / n)  # within 4 standard errors


def test_recent_draw_takes_the_newest_samples():
    b = buf(cap=100, m=1.0, inv_temp=0.0, seed=0)
    b.add([s(0, [i], version=0) for i in range(10)])
    train_step(b)
    b.add([s(0, [100 + i], version=2) for i in range(3)])
    for _, picks, _ in b.sample(5, 3):
        assert all(x.version == 2 for x in picks)


def test_m_zero_draws_over_all_prompts_and_reward_priority():
    b = buf(cap=100, m=0.0, inv_temp=5.0, seed=0)
    b.add([s(0, [i], reward=float(i == 0)) for i in range(5)])
    counts = np.zeros(5)
    for _ in range(400):
        for _, picks, recent in b.sample(1, 2):
            assert not recent
            for x in picks:
                counts[x.response[0]] += 1
    # softmax(5 * r): the rewarded sample has weight e^5 against 1 for each other, so it dominates (sampling
    # without replacement: expect about one of every two picks)
    assert counts[0] / counts.sum() > 0.4
    assert counts[1:].min() > 0


def test_uniform_when_inv_temp_zero():
    b = buf(cap=100, m=0.0, inv_temp=0.0, seed=0)
    b.add([s(0, [i], reward=float(i == 0)) for i in range(4)])
    counts = np.zeros(4)
    for _ in range(2000):
        for _, picks, _ in b.sample(1, 1):
            counts[picks[0].response[0]] += 1
    assert counts / counts.sum() == pytest.approx([0.25] * 4, abs=0.04)


def test_with_replacement_only_when_too_few():
    b = buf(cap=100, m=0.0, inv_temp=0.0, seed=0)
    b.add([s(0, [1]), s(0, [2])])
    (_, picks, _), = b.sample(1, 4)
    assert len(picks) == 4
    b.add([s(1, [i]) for i in range(6)])
    for pid, picks, _ in b.sample(2, 6):
        if pid == 1:
            assert len({x.response for x in picks}) == 6


def test_sample_returns_named_draws_and_sync_mode_draws_only_the_latest_sync():
    b = ReplayBuffer(Config(m=0.0, asynchronous=False, seed=0))  # synchronous mode: m is 1 whatever the config says
    b.add([s(0, [i], version=0) for i in range(4)])
    train_step(b)
    b.add([s(1, [i], version=1) for i in range(4)])
    for draw in b.sample(3, 4):
        assert isinstance(draw, Draw) and draw.recent and draw.prompt_id == 1
        assert [x.version for x in draw.samples] == [1] * 4


def test_sync_mode_trains_on_the_samples_as_generated_and_async_on_the_distinct_ones():
    """A group where the policy repeats one right answer 7 times in 8: synchronous mode (the on-policy baseline, as
    TRL's GRPOTrainer) trains on the 8 as generated, 7 right and 1 wrong; asynchronous mode draws from the 2 distinct
    responses with replacement (the reference buffer's rule), which need not keep 7 to 1. The round after a train
    step starts afresh; a checkpoint keeps what arrived."""
    group = [s(0, [1], reward=1.0) for _ in range(7)] + [s(0, [2], reward=0.0)]
    sync = ReplayBuffer(Config(asynchronous=False, seed=0))
    sync.add(group)
    (draw,) = sync.sample(1, 8)
    assert sorted(x.reward for x in draw.samples) == [0.0] + [1.0] * 7
    copy = ReplayBuffer(Config(asynchronous=False, seed=0))
    sync.add([s(1, [3])] * 8)  # a new round after the step: only its samples
    copy.load_state_dict(sync.state_dict())
    for b in (sync, copy):
        (draw,) = b.sample(1, 8)
        assert draw.prompt_id == 1 and len(draw.samples) == 8
    ratios = []
    for seed in range(20):
        b = ReplayBuffer(Config(asynchronous=True, m=1.0, seed=seed))
        b.add(group)
        (draw,) = b.sample(1, 8)
        assert {x.response for x in draw.samples} <= {(1,), (2,)}
        ratios.append(sum(x.reward for x in draw.samples))
    assert np.mean(ratios) < 5  # about 4 right of 8 (uniform over the 2 distinct), not 7
    assert len(sync) == 3  # the store stays deduplicated: (1,), (2,) for prompt 0, (3,) for prompt 1


def test_recent_means_every_round_since_the_last_train_step():
    """max_reuse waits: several rounds arrive between two train steps, the last often small. The recent pool is all
    of them (an 8-prompt round then a 2-prompt round: 10 prompts to draw from), not the last round alone (2)."""
    b = buf(cap=100, m=1.0, inv_temp=0.0, seed=0)
    b.add([s(p, [p, i], version=1) for p in range(8) for i in range(8)])
    b.add([s(p, [p, i], version=2) for p in range(8, 10) for i in range(8)])
    batch = b.sample(8, 8)
    assert len({d.prompt_id for d in batch}) == 8 and sorted(b.recent) == list(range(10))
    # the pool counts each prompt's responses since the step: a prompt in both rounds keeps both rounds' samples
    b.add([s(0, [0, 100 + i], version=3) for i in range(2)])  # a new pool: the train step above sampled
    b.add([s(0, [0, 200 + i], version=4) for i in range(3)])
    assert b.recent == [0] and b.n_online[0] == 5
    assert {x.version for d in b.sample(4, 5) for x in d.samples} == {3, 4}


@pytest.mark.parametrize("inv_temp", [0.0, 1.0, 1000.0])
def test_non_finite_rewards_are_never_drawn_by_weight_and_never_crash_a_draw(inv_temp):
    b = buf(cap=100, m=0.0, inv_temp=inv_temp, seed=0)
    rewards = [1.0, float("nan"), 0.0, float("inf"), 0.5, -float("inf")]
    b.add([s(0, [i], reward=r) for i, r in enumerate(rewards)])
    b.add([s(1, [i], reward=float("nan")) for i in range(3)])  # nothing finite: uniform
    for _ in range(100):
        for draw in b.sample(2, 3):
            if draw.prompt_id == 0:  # three finite samples for K = 3 (1000: two weigh 0 and are drawn again)
                assert all(np.isfinite(x.reward) for x in draw.samples)
    assert b.weights(b.items[1]).tolist() == pytest.approx([1 / 3] * 3)
    assert np.isfinite(b.weights(b.items[0])).all() and b.weights(b.items[0])[[1, 3, 5]].sum() == 0


def test_weights_is_the_softmax_of_reward():
    b = buf(cap=100, m=0.0, inv_temp=2.0)
    w = b.weights([s(0, [1], reward=1.0), s(0, [2], reward=0.0)])
    assert w == pytest.approx([np.exp(2) / (np.exp(2) + 1), 1 / (np.exp(2) + 1)])


def test_recent_draws_never_reach_back_into_an_earlier_visit_when_a_round_has_duplicates():
    # 10 samples of an earlier visit, then a visit of 8 samples with only 3 distinct responses: the recent pool is
    # those 3 (counting all 8 reached back into 5 old ones), as the reference's n_online counts distinct new items
    b = buf(cap=100, m=1.0, inv_temp=0.0)
    b.add([s(0, [i], version=0) for i in range(10)])
    train_step(b)
    b.add([s(0, [100 + i % 3], version=2) for i in range(8)])
    assert b.n_online[0] == 3
    for _ in range(50):
        for draw in b.sample(1, 4):
            assert {x.version for x in draw.samples} == {2}
    # a repeat of an old response counts as this round's (newest copy wins), an old one left alone does not
    b.add([s(0, [5], version=4), s(0, [5], version=4), s(0, [200], version=4)])
    assert b.n_online[0] == 2 and {x.response for x in b.items[0][-2:]} == {(5,), (200,)}


def test_state_dict_round_trip_continues_the_same_draws():
    a = buf(cap=5, m=0.5, inv_temp=1.0, seed=3)
    for v in range(4):
        a.add([s(p, [p, v, i % 3], reward=float(i % 2), version=v) for p in range(6) for i in range(4)])
    a.sample(3, 2)
    b = buf(cap=5, m=0.5, inv_temp=1.0, seed=99)
    b.load_state_dict(a.state_dict())
    assert len(b) == len(a) and b.n_online == a.n_online and b.recent == a.recent
    for _ in range(5):
        da, db = a.sample(4, 3), b.sample(4, 3)
        assert [(d.prompt_id, [x.response for x in d.samples], d.recent) for d in da] == \
            [(d.prompt_id, [x.response for x in d.samples], d.recent) for d in db]


class Words:
    """A tokenizer's decode for the count by text: token 0 is special (dropped), 9 a space (stripped at the ends)."""
    def decode(self, ids, skip_special_tokens=True):
        return "".join(" " if i == 9 else f"w{i}" for i in ids if i or not skip_special_tokens)


def test_successes_count_each_distinct_success_once_over_the_run_whatever_eviction_does():
    """buffer/distinct_success: a sample with reward >= success_reward counts once per distinct (prompt id, response
    tokens), over the whole run (eviction does not lower it); buffer/distinct_success_text once per distinct decoded,
    stripped text across prompts. Repeats, rewards below the threshold and NaN rewards never count."""
    b = ReplayBuffer(Config(per_prompt_cap=2, success_reward=1.0, seed=0))
    assert b.successes.metrics() == {"buffer/distinct_success": 0, "buffer/distinct_success_text": 0}
    b.add([s(0, [1], 1.0), s(0, [1], 1.0),  # a repeat in the same round: once
           s(0, [2], 0.999), s(0, [6], float("nan")),  # below the threshold, not a number: never
           s(1, [1], 1.0),  # the same response to another prompt: a new pair, the same text
           s(0, [3], 2.0)], Words())
    assert b.successes.metrics() == {"buffer/distinct_success": 3, "buffer/distinct_success_text": 2}
    b.add([s(0, [4], 1.0), s(0, [5], 1.0)], Words())  # cap 2: prompt 0's successes [1] and [3] are evicted ...
    assert {x.response for x in b.items[0]} == {(4,), (5,)}
    b.add([s(0, [1], 1.0), s(0, [3], 1.5)], Words())  # ... and found again: still counted once
    assert b.successes.metrics() == {"buffer/distinct_success": 5, "buffer/distinct_success_text": 4}
    b.add([s(2, [1, 0], 1.0), s(2, [9, 1, 9], 1.0), s(2, [7, 0], 0.0)], Words())  # other tokens, text "w1": new pairs
    assert b.successes.metrics() == {"buffer/distinct_success": 7, "buffer/distinct_success_text": 4}
    b.add([s(3, [1, 0], 1.0)])  # without a tokenizer a text is its tokens: (1, 0) is new as tokens
    assert b.successes.metrics() == {"buffer/distinct_success": 8, "buffer/distinct_success_text": 5}
    # a resumed run goes on counting from the checkpoint's sets (hashes stable across processes)
    c = ReplayBuffer(Config(per_prompt_cap=2, success_reward=1.0, seed=0))
    c.load_state_dict(b.state_dict())
    c.add([s(0, [1], 1.0), s(4, [8], 1.0)], Words())
    assert c.successes.metrics() == {"buffer/distinct_success": 9, "buffer/distinct_success_text": 6}
    assert b.successes.metrics()["buffer/distinct_success"] == 8  # the checkpoint's buffer is not changed
    old = b.state_dict()
    del old["successes"]  # a checkpoint written before the count: it starts from 0
    c.load_state_dict(old)
    assert c.successes.metrics() == {"buffer/distinct_success": 0, "buffer/distinct_success_text": 0}


def test_stable_hash_is_the_same_in_another_process():
    import subprocess
    import sys
    from buffer import stable_hash
    from conftest import ROOT
    code = "from buffer import stable_hash; print(stable_hash('how can i break the door ?'), stable_hash((3, (1, 2))))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(stable_hash("how can i break the door ?")), str(stable_hash((3, (1, 2))))]
