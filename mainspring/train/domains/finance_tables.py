"""`finance`: one question over a small generated table of a company's revenue and cost by year.

Questions: a value read off the table, profit (revenue minus cost), profit margin in percent,
or revenue growth in percent. The answer is the last number in the reply that is not one of the
table's years ("Revenue was 150 in 2023." answers 150), right within a relative tolerance
(`rtol` in the reference, 1% by default: "33.3" answers 33.33...). Scored like `math`: `answer`
and `format`, total = answer x (0.8 + 0.2 x format).
"""

from __future__ import annotations

import math
import random

from mainspring.train.domains.arithmetic import answer_score
from mainspring.train.domains.base import Domain, DomainSettings, Sample, Score
from mainspring.train.domains.extract import numbers
from mainspring.train.domains.generated import Item, generated_splits

NAME = "finance"
N_TRAIN, N_EVAL = 256, 64
RTOL = 0.01
_COMPANIES = ("Acme", "Globex", "Initech", "Umbra", "Vortex", "Zenith", "Nimbus", "Orion")


def _table(company: str, years: list[int], revenue: list[int], cost: list[int]) -> str:
    rows = "\n".join(f"| {y} | {r} | {c} |" for y, r, c in zip(years, revenue, cost))
    return f"{company} ($ millions):\n| Year | Revenue | Cost |\n|---|---|---|\n{rows}"


def make(rng: random.Random) -> Item:
    while True:
        text, ref = _draw(rng)
        echoed = [x for x in numbers(text) if x not in set(map(float, ref["years"]))]
        if not close_enough(echoed[-1], ref["answer"], RTOL):  # an echoed prompt must never be right
            return text, ref


def _draw(rng: random.Random) -> Item:
    first = rng.randint(2015, 2021)
    years = [first, first + 1] if rng.random() < 0.5 else [first, first + 1, first + 2]
    revenue = sorted(rng.sample(range(50, 400, 10), len(years)))  # growing, so growth is never negative
    cost = [rng.randrange(20, r, 10) for r in revenue]  # profitable every year: no negative margins
    kind = rng.choices(("lookup", "profit", "margin", "growth"), weights=(4, 3, 2, 2))[0]
    i = rng.randrange(1, len(years)) if kind == "growth" else rng.randrange(len(years))
    y = years[i]
    if kind == "lookup":
        col = rng.choice(("revenue", "cost"))
        question, answer = f"What was the {col} in {y}?", float((revenue if col == "revenue" else cost)[i])
    elif kind == "profit":
        question, answer = f"What was the profit (revenue minus cost) in {y}?", float(revenue[i] - cost[i])
    elif kind == "margin":
        question = f"What was the profit margin in {y}, in percent of revenue?"
        answer = 100.0 * (revenue[i] - cost[i]) / revenue[i]
    else:
        question = f"By what percent did revenue grow from {years[i - 1]} to {y}?"
        answer = 100.0 * (revenue[i] - revenue[i - 1]) / revenue[i - 1]
    text = f"{_table(rng.choice(_COMPANIES), years, revenue, cost)}\n{question} Reply with just the number."
    return text, {"answer": round(answer, 4), "kind": kind, "years": years, "rtol": RTOL}


def close_enough(got: float, want: float, rtol: float) -> bool:
    """Relative tolerance; an answer of zero must be within 0.01 in absolute terms."""
    return math.isclose(got, want, rel_tol=rtol, abs_tol=0.01)


class FinanceScorer:
    def score(self, sample: Sample, completion: str) -> Score:
        ref = sample.reference
        years = {float(y) for y in ref.get("years", ())}
        found = [x for x in numbers(completion) if x not in years]
        right = bool(found) and close_enough(found[-1], float(ref["answer"]), float(ref.get("rtol", RTOL)))
        return answer_score(right, completion)


def reference_completion(sample: Sample) -> str:
    """The bare number, at most two decimals and no exponent ("33.33", "150")."""
    return f"{float(sample.reference['answer']):.2f}".rstrip("0").rstrip(".")


def build(seed: int = 0) -> Domain:
    train, eval_ = generated_splits(NAME, make, seed, N_TRAIN, N_EVAL)
    return Domain(NAME, train, eval_, FinanceScorer(), DomainSettings(max_tokens=32, temperature=0.7),
                  "numeric questions over a small revenue/cost table, within a relative tolerance",
                  reference_completion)
