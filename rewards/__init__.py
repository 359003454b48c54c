"""Tasks: one module per task. A task module defines

    DEFAULT_TRAIN, DEFAULT_TEST          data used when the config leaves train_data / test_data empty
    load(source, split) -> list[dict]     records with "prompt" (the full formatted prompt) and "answer"
    reward(completion, answer) -> float   the scalar reward of one completion

and optionally `correct(completion, answer) -> bool` (default: reward >= 1), which evaluation reports as accuracy.
Adding a task is adding a file here; nothing else changes.
"""
import importlib
import json
import os


class DataError(Exception):
    """Bad or missing data: printed as one line, exit code 2."""


def get_task(name):
    try:
        return importlib.import_module(f"rewards.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"rewards.{name}":
            raise DataError(f"unknown task '{name}': no rewards/{name}.py") from None
        raise


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
        raise DataError(f"'{source}' is not a local file; loading it from the hub needs `pip install datasets`") from None
    try:
        ds = datasets.load_dataset(source, hub_config, split=split)
    except Exception as e:  # network, unknown id, ...
        raise DataError(f"could not load dataset '{source}' split '{split}' from the hub: {str(e).splitlines()[0]}") from None
    return list(enumerate(ds, 1))


def require(source, rows, keys):
    """Check that every row has the keys the task needs; name the first bad line."""
    if not rows:
        raise DataError(f"{source}: empty dataset")
    for line, row in rows:
        missing = [k for k in keys if not isinstance(row.get(k), str)]
        if missing:
            raise DataError(f"{source}:{line}: missing text field(s) {', '.join(missing)}")
