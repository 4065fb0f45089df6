"""Scorer functions that the user-domain tests name as "tests.train.scorers:<function>"."""

import math

from mainspring.train.domains.base import Score


def constant(sample, completion):
    return 0.25


def exact(sample, completion):
    """A float: 1.0 when the reply is the reference answer."""
    return float(completion.strip() == sample.reference["answer"])


def as_score(sample, completion):
    hit = completion.strip() == sample.reference["answer"]
    return Score(float(hit), {"exact": float(hit), "short": float(len(completion) < 10)})


def as_dict(sample, completion):
    return {"total": 0.5, "parts": {"half": 0.5}}


def not_a_score(sample, completion):
    return "great"


def raises(sample, completion):
    raise ValueError("no answer field")


def nan(sample, completion):
    return math.nan


NOT_CALLABLE = 3


def vowels(sample, completion):
    """A reward with variance even for a random model's text: the share of vowels among letters."""
    letters = [c for c in completion.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0
