"""Arith: procedural GSM8K-format word problems small enough for a tiny model on CPU (docs/tasks.md).

    "Tom has 23 apples and buys 45 more. How many apples does Tom have now?"  ->  "23 + 45 = 68. #### 68"

Six kinds: one- and two-step addition, subtraction and multiplication (sums up to 99, products a <= 9 times b <= 20).
Source "procedural:<split>:<n>" gives the first n problems of split train, dev or test, generated from a fixed seed
per split. The splits are disjoint by construction: a question belongs to the split picked by a hash of its text, so
no test or dev question appears in any train set, whatever n. A .jsonl / .parquet path is read like GSM8K.
Prompt and reward are GSM8K's.
"""
import hashlib
import random

from rewards import DataError, gsm8k

PROMPT = gsm8k.PROMPT
DEFAULT_TRAIN = "procedural:train:20000"
DEFAULT_TEST = "procedural:test:500"
reward = gsm8k.reward
extract_answer = gsm8k.extract_answer

SEEDS = {"train": 1, "dev": 2, "test": 3}  # one fixed generator seed per split
NAMES = ["Tom", "Anna", "Sam", "Mia", "Ben", "Lily", "Max", "Emma", "Leo", "Zoe"]
ITEMS = ["apples", "pencils", "books", "cookies", "marbles", "stickers", "cards", "shells", "coins", "toys"]
CONTAINERS = ["boxes", "bags", "packs"]

# Question templates per kind; {n} name, {i} item, {c} container, {a} {b} {d} operands.
TEMPLATES = {
    "add1": ["{n} has {a} {i} and buys {b} more. How many {i} does {n} have now?",
             "{n} had {a} {i}. Then {n} found {b} more {i}. How many {i} does {n} have now?"],
    "sub1": ["{n} has {a} {i} and gives away {b}. How many {i} does {n} have left?",
             "{n} had {a} {i}. Then {n} lost {b} {i}. How many {i} does {n} have left?"],
    "mul1": ["{n} buys {a} {c} of {i}. Each has {b} {i}. How many {i} does {n} buy?",
             "{n} has {a} {c}. There are {b} {i} in each. How many {i} does {n} have?"],
    "add2": ["{n} has {a} {i}, buys {b} more and then finds {d} more. How many {i} does {n} have now?"],
    "sub2": ["{n} has {a} {i}, gives away {b} and then loses {d}. How many {i} does {n} have left?"],
    "mul2": ["{n} buys {a} {c} of {i}. Each has {b} {i}. Then {n} gives away {d}. How many {i} does {n} have left?",
             "{n} has {a} {c} with {b} {i} in each and finds {d} more {i}. How many {i} does {n} have now?"],
}
KINDS = list(TEMPLATES)


def make_problem(rng):
    """One random problem: (question, solution)."""
    kind = rng.choice(KINDS)
    t = rng.randrange(len(TEMPLATES[kind]))
    n, i, c = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(CONTAINERS)
    d = 0
    if kind == "add1":
        a = rng.randint(2, 90); b = rng.randint(2, 99 - a)
        steps = [(a, "+", b, a + b)]
    elif kind == "sub1":
        a = rng.randint(5, 99); b = rng.randint(2, a - 1)
        steps = [(a, "-", b, a - b)]
    elif kind == "mul1":
        a = rng.randint(2, 9); b = rng.randint(2, 20)
        steps = [(a, "*", b, a * b)]
    elif kind == "add2":
        a = rng.randint(2, 80); b = rng.randint(2, 90 - a); d = rng.randint(2, 99 - a - b)
        steps = [(a, "+", b, a + b), (a + b, "+", d, a + b + d)]
    elif kind == "sub2":
        a = rng.randint(10, 99); b = rng.randint(2, a - 5); d = rng.randint(2, a - b - 1)
        steps = [(a, "-", b, a - b), (a - b, "-", d, a - b - d)]
    else:  # mul2: multiply, then give away (template 0) or find more (template 1); d < 10 keeps solutions short
        a = rng.randint(2, 9); b = rng.randint(2, 20); p = a * b; d = rng.randint(2, min(9, p - 1))
        steps = [(a, "*", b, p), (p, "-", d, p - d) if t == 0 else (p, "+", d, p + d)]
    question = TEMPLATES[kind][t].format(n=n, i=i, c=c, a=a, b=b, d=d)
    solution = " ".join(f"{x} {op} {y} = {z}." for x, op, y, z in steps) + f" #### {steps[-1][3]}"
    return question, solution


def split_of(question):
    """The split a question belongs to, from a hash of its text: 5% test, 5% dev, 90% train."""
    h = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) % 20
    return "test" if h == 0 else "dev" if h == 1 else "train"


def generate(split, n):
    """The first n distinct problems of `split`, deterministic: list of (question, solution)."""
    rng, seen, out = random.Random(SEEDS[split]), set(), []
    while len(out) < n:
        q, s = make_problem(rng)
        if q not in seen and split_of(q) == split:
            seen.add(q)
            out.append((q, s))
    return out


def load(source, split):
    if source.endswith((".jsonl", ".json", ".parquet")):
        return gsm8k.load(source, split)
    parts = source.split(":")
    if (len(parts) != 3 or parts[0] != "procedural" or parts[1] not in SEEDS or not parts[2].isdigit()
            or int(parts[2]) < 1):
        raise DataError(f"arith data '{source}': expected procedural:<train|dev|test>:<n> or a .jsonl/.parquet file")
    return [{"prompt": PROMPT.format(question=q), "answer": s} for q, s in generate(parts[1], int(parts[2]))]
