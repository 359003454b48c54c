"""Countdown: reach a target number from given numbers with + - * / and parentheses, each number used at most once.

    "Using the numbers 3, 5, 2, make 16. ..."  ->  "... Answer: (3 + 5) * 2"

The arithmetic game used for RL post-training by TinyZero and by COUNTDOWN.toml in bbartoldson/tba-prime
(the TBA' code of the paper's section 6).
Source "procedural:<split>:<n>" gives the first n problems of split train, dev or test, generated from a fixed seed per
split: 3 or 4 numbers from 1..99 combined in a random order by random operations whose results are positive integers,
so every problem is solvable by construction (the record's "solution" is one way). As in arith.py, a problem belongs
to the split picked by a hash of its numbers and target, so the splits are disjoint whatever n.
A .jsonl / .json / .parquet file (or hub id) has one problem per row: "numbers" (a list of positive integers; "nums",
the key of the hub set Jiayi-Pan/Countdown-Tasks-3to4, is accepted too) and "target" (an integer).

Prompt: the gsm8k/arith frame, asking for the expression as the final line "Answer: <expression>".
Reward: 1.0 when the expression after the last "Answer:" (to the end of its line; an optional "= <target>" after it
is allowed) is made only of integers, + - * /, parentheses and unary minus, uses each given number at most once, and
equals the target exactly (fractions.Fraction; division by zero scores 0); else 0.0. The text is parsed with `ast`
and evaluated by walking the tree, never by eval, after the multiset check, so values stay bounded by the given
numbers; exponentiation and every other syntax are rejected, and expressions longer than MAX_EXPR_CHARS score 0.
The reward never raises. The record's "answer" is JSON text: {"numbers": [...], "target": t}.
"""
import ast
import functools
import hashlib
import json
import operator
import random
import re
from collections import Counter
from fractions import Fraction

from rewards import DataError, read_records

PROMPT = ("[MATH TASK] Problem:\n"
          "Using the numbers {numbers}, make {target}. You may use + - * / and parentheses, and each number at most "
          "once. Write the expression on the last line as \"Answer: <expression>\".\n\nSolution:\n")
DEFAULT_TRAIN = "procedural:train:20000"
DEFAULT_TEST = "procedural:test:500"

SEEDS = {"train": 1, "dev": 2, "test": 3}  # one fixed generator seed per split
MAX_TARGET = 999  # generated targets lie in 1..MAX_TARGET
MAX_NUMBERS, MAX_NUMBER = 8, 10**6  # limits on problems read from files
MAX_EXPR_CHARS = 200  # longer answers score 0 unparsed
ALLOWED = re.compile(r"[0-9+\-*/() ]+")  # characters an expression may contain (no '.', '_', letters, ...)
ANSWER = "answer:"
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


# --- data -----------------------------------------------------------------------------------------------------------

def make_problem(rng):
    """One random solvable problem: (numbers, target, solution)."""
    while True:
        numbers = [rng.randint(1, 99) for _ in range(rng.choice([3, 4]))]
        items = [(str(x), x) for x in numbers]  # (expression text, value), combined pairwise until one is left
        while len(items) > 1:
            (ta, a), (tb, b) = [items.pop(rng.randrange(len(items))) for _ in range(2)]
            options = [(f"{ta} + {tb}", a + b), (f"{ta} * {tb}", a * b)]
            if a != b:
                options.append((f"{ta} - {tb}", a - b) if a > b else (f"{tb} - {ta}", b - a))
            if b > 1 and a % b == 0:
                options.append((f"{ta} / {tb}", a // b))
            if a > 1 and b % a == 0:
                options.append((f"{tb} / {ta}", b // a))
            text, value = rng.choice(options)
            items.append((text if not items else f"({text})", value))
        solution, target = items[0]
        if target <= MAX_TARGET:
            return numbers, target, solution


def split_of(numbers, target):
    """The split a problem belongs to, from a hash of its sorted numbers and target: 5% test, 5% dev, 90% train."""
    key = f"{sorted(numbers)}|{target}"
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 20
    return "test" if h == 0 else "dev" if h == 1 else "train"


def generate(split, n):
    """The first n distinct problems of `split`, deterministic: list of (numbers, target, solution)."""
    rng, seen, out = random.Random(SEEDS[split]), set(), []
    while len(out) < n:
        numbers, target, solution = make_problem(rng)
        key = (tuple(sorted(numbers)), target)
        if key not in seen and split_of(numbers, target) == split:
            seen.add(key)
            out.append((numbers, target, solution))
    return out


def record(numbers, target, solution=None):
    r = {"prompt": PROMPT.format(numbers=", ".join(map(str, numbers)), target=target),
         "answer": json.dumps({"numbers": numbers, "target": target})}
    if solution is not None:
        r["solution"] = solution
    return r


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def load(source, split):
    if source.startswith("procedural:"):
        parts = source.split(":")
        if len(parts) != 3 or parts[1] not in SEEDS or not parts[2].isdigit() or int(parts[2]) < 1:
            raise DataError(f"countdown data '{source}': expected procedural:<train|dev|test>:<n> or a "
                            ".jsonl/.parquet file")
        return [record(*p) for p in generate(parts[1], int(parts[2]))]
    rows = read_records(source, split)
    if not rows:
        raise DataError(f"{source}: empty dataset")
    out = []
    for line, row in rows:
        numbers, target = row.get("numbers", row.get("nums")), row.get("target")
        if not (isinstance(numbers, list) and 1 <= len(numbers) <= MAX_NUMBERS
                and all(_is_int(x) and 1 <= x <= MAX_NUMBER for x in numbers)):
            raise DataError(f"{source}:{line}: 'numbers' must be a list of 1..{MAX_NUMBERS} integers in "
                            f"1..{MAX_NUMBER}")
        if not _is_int(target):
            raise DataError(f"{source}:{line}: 'target' must be an integer")
        out.append(record(numbers, target))
    return out


# --- reward ---------------------------------------------------------------------------------------------------------

def extract(completion):
    """The expression after the last 'Answer:' (case-insensitive) up to the end of its line, or None."""
    i = completion.lower().rfind(ANSWER)
    if i < 0:
        return None
    text = completion[i + len(ANSWER):].split("\n", 1)[0]
    text = text.replace("\u00d7", "*").replace("\u00f7", "/").replace("\u2212", "-")  # × ÷ and the minus sign
    return text.strip().rstrip(".").strip().strip("$`").strip()


def literals(node):
    """The integer literals of a parsed expression, or None when it holds anything but + - * /, unary minus, ints."""
    if isinstance(node, ast.Constant) and _is_int(node.value):
        return [node.value]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return literals(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        left, right = literals(node.left), literals(node.right)
        return None if left is None or right is None else left + right
    return None


def value(node):
    """Exact value of an expression that `literals` accepted; raises ZeroDivisionError on division by zero."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        return -value(node.operand)
    return OPS[type(node.op)](value(node.left), value(node.right))


@functools.lru_cache(maxsize=65536)
def problem(answer):
    """(Counter of the given numbers, target) from a record's answer field."""
    data = json.loads(answer)
    return Counter(data["numbers"]), data["target"]


def check(expression, numbers, target):
    """True when `expression` is safe, uses each of `numbers` (a Counter) at most once and equals `target`."""
    if "=" in expression:  # "expr = target" is fine, any other right-hand side is not
        expression, rhs = expression.split("=", 1)
        if rhs.strip() != str(target):
            return False
    if not expression or len(expression) > MAX_EXPR_CHARS or not ALLOWED.fullmatch(expression):
        return False
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    used = literals(tree.body)
    if used is None or Counter(used) - numbers:  # bad syntax, or a number not given / used too often
        return False
    try:
        return value(tree.body) == target
    except ZeroDivisionError:
        return False


def reward(completion, answer):
    """1.0 when the final 'Answer: <expression>' reaches the target with the given numbers, else 0.0. Never raises."""
    try:
        expression = extract(completion)
        numbers, target = problem(answer)
        return 1.0 if expression is not None and check(expression, numbers, target) else 0.0
    except Exception:  # a malformed answer field or a pathological completion scores 0, never ends a run
        return 0.0
