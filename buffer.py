"""The trainer's replay buffer (paper section 3.2; the reference code's bbartoldson/TBA src/buffer_utils.py).

Per prompt: samples deduplicated by exact response tokens (the newest copy wins), at most `per_prompt_cap` kept,
oldest evicted first. A batch is B prompts x K samples. Each prompt draw is, with probability m, "recent": a prompt
that arrived since the last train step (in every sync round since then, however many), with K of its samples from
those rounds; otherwise the next prompt of a pass without replacement over the prompts seen when the pass began (a
new pass starts when one ends, as the reference's `sample_cid` cycles `offline_cids`), with K of its samples drawn
with the probabilities of `weights` (softmax(inv_temp * reward); inv_temp = 0: uniform). Recent draws walk their pool
the same way. A pass lags the arrivals: where prompts arrive faster than non-recent draws take them (m near 1),
those draws read prompts from well before the step.

Synchronous mode (async=false) is the on-policy baseline as its sources run it (TRL's GRPOTrainer, the asynchronous-
RLHF code): a step trains on the samples generated for it as they came, duplicates included (K of a prompt's S, or
all of them at S = K), so a group keeps the policy's own frequencies. Deduplicating there and refilling with
replacement would make a group a uniform draw over distinct responses: a correct answer the policy repeats 7 times
in 8 would weigh like the one wrong answer. The store itself stays deduplicated (it feeds the replay draws).

A new sampling rule for those draws goes in `weights`, switched by one new config field (config.py); a new rule for
which prompt is drawn goes in `sample`.

Besides what it holds, the buffer counts what it has found (`Successes`): the distinct successes it has received over
the run, which eviction does not lower (docs/diversity.md, "Does more search find more?").
"""
import hashlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


@dataclass
class Sample:
    prompt_id: int  # index of the prompt in the task's training set
    response: tuple  # response token ids (including EOS when the model stopped)
    reward: float  # task reward
    logp_behav: np.ndarray  # per-token log-probs under the policy that generated it (logits / temperature)
    logp_ref: np.ndarray  # per-token log-probs under the frozen reference (logits / temperature)
    version: int  # trainer step of the weights that generated it (0 = initial weights); in flight: its last token's
    finished: bool  # the response ended with EOS (not cut at max_new_tokens)
    # in-flight search (searcher.InFlightSearch): ((version, tokens), ...) oldest first, the weights each run of
    # response tokens came from; () = every token from `version` (chunked search)
    version_tokens: tuple = ()

    @property
    def version_first(self):
        """The oldest weights that generated any of its tokens (staleness counts from them)."""
        return self.version_tokens[0][0] if self.version_tokens else self.version

    @property
    def mixed(self):
        """Its tokens came from more than one weight version (a weight update landed while it was generated)."""
        return len(self.version_tokens) > 1


class Draw(NamedTuple):
    """One prompt of a batch: K of its samples, and whether it was drawn from the latest sync (probability m)."""
    prompt_id: int
    samples: list
    recent: bool


def stable_hash(value):
    """A 64-bit hash of a str or a tuple of ints that is the same in every process (Python's hash of a str is salted
    per process, so a resumed run would count its texts again)."""
    data = value.encode() if isinstance(value, str) else repr(value).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class Successes:
    """The distinct successes the buffer has received over the run, whatever it still holds (per_prompt_cap evicts, so
    what it holds undercounts what it found). A sample is a success when its reward is at least `threshold` (config
    success_reward; a NaN reward never is). `pairs`: one per distinct (prompt id, response tokens), the buffer's own
    notion of a distinct sample; `texts`: one per distinct response text (decoded without special tokens, stripped)
    across all prompts, e.g. redteam_modes' distinct successful attacks (its prompts are one text; at most 48), or the
    response tokens when no tokenizer is given. Memory: one 64-bit hash per distinct success in each set (under 100
    bytes each as a Python int in a set), so at most 2 per success generated; among 10^6 a collision has probability
    under 1e-7."""

    def __init__(self, threshold):
        self.threshold = threshold
        self.pairs, self.texts = set(), set()

    def add(self, samples, tok=None):
        for s in samples:
            if s.reward >= self.threshold:
                self.pairs.add(stable_hash((s.prompt_id, tuple(s.response))))
                text = tok.decode(list(s.response), skip_special_tokens=True).strip() if tok is not None else None
                self.texts.add(stable_hash(text if text is not None else tuple(s.response)))

    def metrics(self):
        return {"buffer/distinct_success": len(self.pairs), "buffer/distinct_success_text": len(self.texts)}


class ReplayBuffer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.cap = cfg.per_prompt_cap
        self.m = cfg.m if cfg.asynchronous else 1.0  # synchronous mode trains on exactly the latest sync's samples
        self.rng = np.random.default_rng(cfg.seed)
        self.items = {}  # prompt id -> list[Sample], oldest first
        self.n_online = {}  # prompt id -> its distinct responses since the last train step (its recent pool)
        self.recent = []  # prompt ids that arrived since the last train step
        self._arrived = {}  # prompt id -> the distinct responses that arrived for it since the last train step
        self._as_generated = {}  # synchronous mode: prompt id -> its samples since the last train step, repeats kept
        self._stepped = False  # a train step sampled since the last add: the next add starts a new recent pool
        self._recent_left = []  # recent ids not yet drawn since the pool changed (refilled when empty)
        self._all_left = []  # seen ids not yet drawn in the current pass over all prompts
        self.size = 0
        self.successes = Successes(cfg.success_reward)

    def __len__(self):
        return self.size

    def add(self, samples, tok=None):
        """Insert one sync round's trajectories; they join the recent pool of the rounds since the last train step, and
        its successes are counted (Successes; `tok`, the tokenizer, decodes them for the count by text). Returns the
        number of new (non-duplicate) samples."""
        if not samples:
            return 0
        self.successes.add(samples, tok)
        if self._stepped:
            self._arrived, self._as_generated, self._stepped = {}, {}, False
        new = 0
        for s in samples:
            items = self.items.setdefault(s.prompt_id, [])
            self._arrived.setdefault(s.prompt_id, set()).add(s.response)
            if not self.cfg.asynchronous:
                self._as_generated.setdefault(s.prompt_id, []).append(s)
            dup = next((i for i, old in enumerate(items) if old.response == s.response), None)
            if dup is None:
                new += 1
            else:
                items.pop(dup)  # newest copy wins
                self.size -= 1
            items.append(s)
            self.size += 1
            if len(items) > self.cap:
                items.pop(0)  # oldest first
                self.size -= 1
        for pid, responses in self._arrived.items():  # dedup moved every repeat to the end: the newest items are
            self.n_online[pid] = min(len(responses), len(self.items[pid]))  # exactly those since the last step
        self.recent = list(self._arrived)
        self._recent_left = []
        return new

    def _draw_prompt(self, left, pool):
        if not left:
            left.extend(self.rng.permutation(pool).tolist())
        return left.pop()

    def _pick(self, n_from, k, p=None):
        replace = (n_from if p is None else np.count_nonzero(p)) < k  # with replacement only when too few to pick
        return self.rng.choice(n_from, size=k, replace=replace, p=p)

    def weights(self, samples):
        """Probabilities of one prompt's samples for a draw that is not recent: softmax(inv_temp * reward) (paper
        section 3.2: "Softmax of Score" for TL;DR, inv_temp = 1; uniform for GSM8K, inv_temp = 0). A sample whose
        reward is not finite (the searchers make such rewards 0: rewards.score; a guard all the same) gets 0 while
        the prompt has others; all of them: uniform."""
        rewards = np.array([s.reward for s in samples], dtype=np.float64)
        finite = np.isfinite(rewards)
        if not finite.any():
            return np.full(len(rewards), 1.0 / len(rewards))
        logits = np.full(len(rewards), -np.inf)
        logits[finite] = self.cfg.inv_temp * (rewards[finite] - rewards[finite].max())
        return np.exp(logits) / np.exp(logits).sum()

    def sample(self, B, K):
        """B prompts x K samples (a train step): a list of B Draws."""
        self._stepped = True
        batch = []
        for _ in range(B):
            if self.recent and self.rng.random() < self.m:
                pid = self._draw_prompt(self._recent_left, self.recent)
                newest = self._as_generated.get(pid) or self.items[pid][-self.n_online[pid]:]
                batch.append(Draw(pid, [newest[i] for i in self._pick(len(newest), K)], True))
            else:
                pid = self._draw_prompt(self._all_left, list(self.items))
                items = self.items[pid]
                batch.append(Draw(pid, [items[i] for i in self._pick(len(items), K, self.weights(items))], False))
        return batch

    def state_dict(self):
        keys = ("items", "n_online", "recent", "_arrived", "_as_generated", "_stepped", "_recent_left", "_all_left",
                "size")
        return {k: getattr(self, k) for k in keys} | {"rng": self.rng.bit_generator.state,
                                                       "successes": (self.successes.pairs, self.successes.texts)}

    def load_state_dict(self, state):
        """Copies the containers, so the buffer that gave `state` can go on without changing this one."""
        self.items = {pid: list(samples) for pid, samples in state["items"].items()}
        self.n_online, self.size = dict(state["n_online"]), state["size"]
        self.recent, self._recent_left, self._all_left = (list(state[k])
                                                          for k in ("recent", "_recent_left", "_all_left"))
        self._arrived = {pid: set(r) for pid, r in state["_arrived"].items()}
        self._as_generated = {pid: list(r) for pid, r in state.get("_as_generated", {}).items()}
        self._stepped = state["_stepped"]
        self.rng.bit_generator.state = state["rng"]
        pairs, texts = state.get("successes", ((), ()))  # none in checkpoints written before the count: from 0
        self.successes.pairs, self.successes.texts = set(pairs), set(texts)
