"""`math`: single-digit addition and subtraction, bare and as one-line word problems.

Sized for a 135M model, which gets some of these right and many wrong, so GRPO groups have reward
variance. The answer is the LAST integer in the completion: small models work towards the result
("4 + 4 = 8"), so the first integer is usually an operand. Echoing the prompt must never pay, so no
problem's answer equals its last operand (no 8 - 4).

Score: `answer` (1 if that integer is right), `format` (1 if the reply is the number alone);
total = answer x (0.8 + 0.2 x format): format only counts on a right answer, so it cannot be
farmed on its own.
"""

from __future__ import annotations

import random

from mainspring.train.domains.base import Domain, DomainSettings, Sample, Score
from mainspring.train.domains.extract import integers, is_bare_number
from mainspring.train.domains.generated import Item, generated_splits

NAME = "math"
N_TRAIN, N_EVAL = 256, 64
SUFFIX = "Reply with just the number."
_NAMES = ("Tom", "Anna", "Li", "Sara", "Omar", "Maya", "Ben", "Zoe", "Ivan", "Nora")
_THINGS = ("apples", "pens", "coins", "books", "cards", "eggs", "stamps", "shells")


def _difference(rng: random.Random) -> tuple[int, int]:
    """a > b > 0 with a - b != b: an echoed prompt's last number is never the answer."""
    a = rng.randint(3, 9)
    return a, rng.choice([b for b in range(1, a) if 2 * b != a])


def _bare(rng: random.Random) -> Item:
    if rng.random() < 0.6:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        op, answer = "+", a + b
    else:
        a, b = _difference(rng)
        op, answer = "-", a - b
    lead = rng.choice(("Compute", "What is"))
    end = "." if lead == "Compute" else "?"
    return f"{lead} {a} {op} {b}{end} {SUFFIX}", {"answer": answer}


def _word(rng: random.Random) -> Item:
    who, what = rng.choice(_NAMES), rng.choice(_THINGS)
    if rng.random() < 0.5:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        text = f"{who} has {a} {what} and gets {b} more. How many {what} does {who} have now?"
        answer = a + b
    else:
        a, b = _difference(rng)
        text = f"{who} has {a} {what} and gives away {b}. How many {what} are left?"
        answer = a - b
    return f"{text} {SUFFIX}", {"answer": answer}


def make(rng: random.Random) -> Item:
    return _word(rng) if rng.random() < 0.35 else _bare(rng)


def answer_score(correct: bool, completion: str) -> Score:
    """The numeric domains' score: a right answer earns 0.8, 1.0 when it is the bare number."""
    answer, fmt = float(correct), float(is_bare_number(completion))
    return Score(answer * (0.8 + 0.2 * fmt), {"answer": answer, "format": fmt})


class ArithmeticScorer:
    def score(self, sample: Sample, completion: str) -> Score:
        found = integers(completion)
        return answer_score(bool(found) and found[-1] == sample.reference["answer"], completion)


def reference_completion(sample: Sample) -> str:
    """The bare number: what a perfect model replies."""
    return str(sample.reference["answer"])


def build(seed: int = 0) -> Domain:
    train, eval_ = generated_splits(NAME, make, seed, N_TRAIN, N_EVAL)
    return Domain(NAME, train, eval_, ArithmeticScorer(), DomainSettings(max_tokens=32, temperature=0.7),
                  "single-digit addition and subtraction; the last integer of the reply is the answer",
                  reference_completion)
