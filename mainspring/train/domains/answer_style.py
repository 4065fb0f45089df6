"""`terse` and `verbose`: the same simple questions, one asking for a one-word answer, the other
for a full sentence. They are meant to conflict (the interference demo): their prompts differ
only in the last three or four words, so one shared update pulls the answer length both ways and
naively summed training regresses one of them. Loadable by name, not in the default set.

Both check the answer (`correct`: an accepted answer is among the reply's words, case-insensitive),
and both give 0 to a reply that repeats the question (an echoed prompt is a "full sentence").
- terse: `one_word` = 1 / number of words (0 for an empty reply); total = 0.7 one_word + 0.3 correct.
- verbose: `length` = min(1, words / 6), `period` = the reply ends with a full stop,
  `sentence` = both (6 or more words ending in "."); total = 0.4 length + 0.3 period + 0.3 correct.
"""

from __future__ import annotations

from typing import Callable

from mainspring.train.domains.base import Domain, DomainSettings, Sample, Score
from mainspring.train.domains.extract import words
from mainspring.train.domains.facts import FACTS
from mainspring.train.domains.generated import pool_splits

TERSE, VERBOSE = "terse", "verbose"
N_EVAL = 16
TERSE_ASK = "Answer in one word."
VERBOSE_ASK = "Answer in a full sentence."
SENTENCE_WORDS = 6


def _echoes(sample: Sample, completion: str) -> bool:
    return sample.reference["question"].casefold() in completion.casefold()


def _correct(sample: Sample, said: list[str]) -> float:
    accepted = {a.casefold() for a in sample.reference["answers"]}
    return float(any(w.casefold() in accepted for w in said))


class TerseScorer:
    def score(self, sample: Sample, completion: str) -> Score:
        said = [] if _echoes(sample, completion) else words(completion)
        one_word = 1.0 / len(said) if said else 0.0
        correct = _correct(sample, said)
        return Score(0.7 * one_word + 0.3 * correct, {"one_word": one_word, "correct": correct})


class VerboseScorer:
    def score(self, sample: Sample, completion: str) -> Score:
        said = [] if _echoes(sample, completion) else words(completion)
        length = min(1.0, len(said) / SENTENCE_WORDS)
        period = float(completion.rstrip().endswith(".") and bool(said))
        correct = _correct(sample, said)
        parts = {"sentence": float(length == 1.0 and period == 1.0), "length": length, "period": period,
                 "correct": correct}
        return Score(0.4 * length + 0.3 * period + 0.3 * correct, parts)


def terse_reference(sample: Sample) -> str:
    """The canonical answer, one word."""
    return str(sample.reference["answers"][0])


def verbose_reference(sample: Sample) -> str:
    """The canonical answer in a sentence of seven words, ending in a full stop."""
    return f"The answer to this question is {sample.reference['answers'][0]}."


def _build(name: str, ask: str, scorer, settings: DomainSettings, seed: int, description: str,
           reference: Callable[[Sample], str]) -> Domain:
    pool = [(f"{question} {ask}", {"question": question, "answers": list(answers)}) for question, answers in FACTS]
    train, eval_ = pool_splits(name, pool, seed, N_EVAL, key="facts")  # one held-out set for both
    return Domain(name, train, eval_, scorer, settings, description, reference)


def build_terse(seed: int = 0) -> Domain:
    return _build(TERSE, TERSE_ASK, TerseScorer(), DomainSettings(max_tokens=16, temperature=1.0), seed,
                  "simple facts answered in one word (conflicts with 'verbose')", terse_reference)


def build_verbose(seed: int = 0) -> Domain:
    return _build(VERBOSE, VERBOSE_ASK, VerboseScorer(), DomainSettings(max_tokens=48, temperature=1.0), seed,
                  "simple facts answered in a full sentence (conflicts with 'terse')", verbose_reference)


# as user-domain scorers ("mainspring.train.domains.answer_style:score_terse"): the same rewards over
# any data file whose lines carry "question" and "answers" (bench/train_demo.py's same-prompt conflict)
def score_terse(sample: Sample, completion: str) -> Score:
    return TerseScorer().score(sample, completion)


def score_verbose(sample: Sample, completion: str) -> Score:
    return VerboseScorer().score(sample, completion)
