"""Copies of shipped domains with known defects, for the planted-defect suite (test_planted.py).

Every plant is generic, so the same functions plant defects in any domain that has a reference
completion (the acceptance plants the same kinds in data sets not in the repo):
- `plant_data`: an exact duplicate, a near duplicate (one word added to the longest prompt), an eval
  prompt copied into train (and one lightly edited), and a broken reference (the first value of the
  reference whose change fails the reference completion, which stays the one for the original);
- `always_true`: the scorer replaced by one that pays full marks for anything;
- `length_hackable`: the scorer blended with a reward that grows with the completion's length;
- `FakeSource`: a CompletionSource that always solves some items, never solves others, and solves
  half of the samples of the rest (so a clean domain has GRPO signal everywhere).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

from mainspring.train.config import DomainSpec
from mainspring.train.domains.base import Domain, Sample, Score, score_safely
from mainspring.train.domains.registry import load_domain


@dataclass
class Planted:
    domain: Domain
    defects: dict[str, tuple[str, ...]] = field(default_factory=dict)  # kind -> the planted items' ids


def small(domain: Domain, n_train: int = 40, n_eval: int = 16) -> Domain:
    """A copy with the first items of each split (fast checks; planted items go after these)."""
    return dataclasses.replace(domain, train=list(domain.train[:n_train]), eval=list(domain.eval[:n_eval]))


def with_text(sample: Sample, new_id: str, text: str) -> Sample:
    """`sample` with a new id and its last user message replaced by `text`."""
    last = max(i for i, m in enumerate(sample.messages) if m["role"] == "user")
    messages = tuple({**m, "content": text} if i == last else dict(m) for i, m in enumerate(sample.messages))
    return Sample(new_id, sample.domain, messages, copy.deepcopy(sample.reference))


def _user_text(sample: Sample) -> str:
    return [m["content"] for m in sample.messages if m["role"] == "user"][-1]


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to the scalar leaves of a JSON-like value, depth first."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaves(v, (*path, k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))]
    return [path] if isinstance(value, (bool, int, float, str)) else []


def _wrong(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 + 1  # far outside any relative tolerance
    return value + "_broken"


def _replaced(value: Any, path: tuple[Any, ...]) -> Any:
    """A deep copy of `value` with the leaf at `path` made wrong (tuples stay tuples)."""
    if not path:
        return _wrong(value)
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {k: _replaced(v, rest) if k == head else copy.deepcopy(v) for k, v in value.items()}
    return type(value)(_replaced(v, rest) if i == head else copy.deepcopy(v) for i, v in enumerate(value))


def break_reference(domain: Domain, sample: Sample) -> Sample:
    """`sample` with the first value of its reference whose change makes the (unchanged) reference
    completion fail the scorer: the label no longer agrees with the known-right answer."""
    assert domain.reference_completion is not None, f"{domain.name} has no reference completion"
    completion = domain.reference_completion(sample)
    before = domain.scorer.score(sample, completion).total
    for path in _leaves(sample.reference):
        broken = dataclasses.replace(sample, reference=_replaced(sample.reference, path))
        after = score_safely(domain.scorer, broken, completion)
        if after.error is None and after.total < before - 0.1:  # fails, without making the scorer crash
            return broken
    raise AssertionError(f"{domain.name}: no value of {sample.reference} changes the reference's score")


def plant_data(domain: Domain) -> Planted:
    """A copy of `domain` with data defects planted; `domain` itself is not changed."""
    train, eval_ = list(domain.train), list(domain.eval)
    d = dataclasses.replace(domain, train=train, eval=eval_)
    exact_src = train[0]
    exact = dataclasses.replace(exact_src, id=f"{exact_src.id}-exact-dup", reference=copy.deepcopy(exact_src.reference))
    # the longest prompt: one added word is then a small share of its n-grams in any domain
    near_src = max(train[1:], key=lambda s: len(_user_text(s).split()))
    near = with_text(near_src, f"{near_src.id}-near-dup", _user_text(near_src) + " Thanks.")
    leak_src, leak_near_src = eval_[0], max(eval_[1:], key=lambda s: len(_user_text(s).split()))
    leak = with_text(leak_src, f"{leak_src.id}-leaked", _user_text(leak_src))
    leak_near = with_text(leak_near_src, f"{leak_near_src.id}-leaked-near", _user_text(leak_near_src) + " Thanks.")
    # a broken reference: the label the scorer reads no longer matches the known-right completion
    # (not a source of another plant: a copy of a broken item would differ from it by its reference)
    victim_i = next(i for i in range(len(train) // 2, len(train)) if train[i].id not in {exact_src.id, near_src.id})
    victim = train[victim_i]
    assert domain.reference_completion is not None, f"{domain.name} has no reference completion"
    right = {s.id: domain.reference_completion(s) for s in train + eval_}
    train[victim_i] = break_reference(domain, victim)
    train += [exact, near, leak, leak_near]
    originals = {**right, exact.id: right[exact_src.id], near.id: right[near_src.id],
                 leak.id: right[leak_src.id], leak_near.id: right[leak_near_src.id]}
    d.reference_completion = lambda s: originals[s.id]
    d.__post_init__()  # the copy keeps Domain's own invariants (unique ids, splits disjoint by id)
    return Planted(d, {"exact_duplicate": (exact.id,), "near_duplicate": (near.id,), "leak": (leak.id,),
                       "near_leak": (leak_near.id,), "broken_reference": (victim.id,)})


class AlwaysTrue:
    """A verifier that accepts everything."""

    def score(self, sample: Sample, completion: str) -> Score:
        return Score(1.0)


class LengthHackable:
    """The real score blended with a length bonus: a long wrong answer outscores a short right one."""

    def __init__(self, base: Any, cap_chars: int = 200):
        self.base, self.cap = base, cap_chars

    def score(self, sample: Sample, completion: str) -> Score:
        real = self.base.score(sample, completion).total
        bonus = min(1.0, len(completion) / self.cap)
        return Score(0.3 * real + 0.7 * bonus, {"real": real, "length": bonus})


def always_true(domain: Domain) -> Domain:
    return dataclasses.replace(domain, train=list(domain.train), eval=list(domain.eval), scorer=AlwaysTrue())


def length_hackable(domain: Domain) -> Domain:
    return dataclasses.replace(domain, train=list(domain.train), eval=list(domain.eval),
                               scorer=LengthHackable(domain.scorer))


@dataclass
class FakeSource:
    """Completions without a model: the reference completion (right) or an empty reply (wrong)."""

    solved: frozenset[str] = frozenset()  # always right
    never: frozenset[str] = frozenset()  # always wrong
    calls: list[int] = field(default_factory=list)

    def complete(self, domain: Domain, samples: Sequence[Sample], n: int) -> list[list[str]]:
        self.calls.append(len(samples))
        assert domain.reference_completion is not None
        out = []
        for s in samples:
            right = domain.reference_completion(s)
            if s.id in self.solved:
                out.append([right] * n)
            elif s.id in self.never:
                out.append([""] * n)
            else:  # half right: every other item a group with reward variance
                out.append([right if i % 2 == 0 else "" for i in range(n)])
        return out


def plant_difficulty(domain: Domain, k: int = 3) -> tuple[FakeSource, dict[str, tuple[str, ...]]]:
    """A source that always solves k train items and never solves k others (fewer in a small domain:
    at least half the items keep their signal, else the whole domain has none)."""
    ids = [s.id for s in domain.train]
    k = max(1, min(k, len(ids) // 4))
    solved, never = tuple(ids[:k]), tuple(ids[k:2 * k])
    return FakeSource(frozenset(solved), frozenset(never)), {"all_solved": solved, "never_solved": never}


def snapshot(domain: Domain) -> tuple[Any, ...]:
    """Everything a check could change, to compare before and after (inspection never modifies)."""
    return (copy.deepcopy(domain.train), copy.deepcopy(domain.eval), domain.scorer, domain.settings)


def domain(name: str) -> Domain:
    """A small copy (12 train, 6 eval) of shipped domain `name`: quick to inspect."""
    return small(load_domain(DomainSpec(name=name), 0), 12, 6)


def with_scorer(d: Domain, scorer) -> Domain:
    return dataclasses.replace(d, train=list(d.train), eval=list(d.eval), scorer=scorer)


def by_check(findings):
    out: dict[str, list] = {}
    for f in findings:
        out.setdefault(f.check, []).append(f)
    return out
