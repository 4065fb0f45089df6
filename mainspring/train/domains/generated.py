"""Train and eval splits for the shipped domains, generated or drawn from a fixed pool.

The eval split depends only on the domain, never on the run's seed: runs with different seeds
(and before/after comparisons across them) are measured on the same held-out prompts. The train
split is drawn with the seed and never repeats an eval prompt's exact text, so held-out scores
are not memorised ones.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from mainspring.train.domains.base import DomainError, Sample

Item = tuple[str, dict[str, Any]]  # (the user's message, the reference the scorer reads)
Generator = Callable[[random.Random], Item]


def user(text: str, system: str | None = None) -> tuple[dict[str, str], ...]:
    """Chat messages of one user turn, with an optional system message."""
    head = ({"role": "system", "content": system},) if system else ()
    return (*head, {"role": "user", "content": text})


def generated_splits(name: str, make: Generator, seed: int, n_train: int, n_eval: int,
                     system: str | None = None) -> tuple[list[Sample], list[Sample]]:
    """`n_eval` distinct prompts from a seed-independent stream, then `n_train` distinct others from
    the seed's stream; raises DomainError if the generator cannot produce that many distinct prompts."""
    eval_items = _distinct(make, random.Random(f"{name}:eval"), n_eval, set(), name)
    taken = {text for text, _ in eval_items}
    train_items = _distinct(make, random.Random(f"{name}:train:{seed}"), n_train, taken, name)
    return _samples(name, "train", train_items, system), _samples(name, "eval", eval_items, system)


def pool_splits(name: str, pool: Sequence[Item], seed: int, n_eval: int, system: str | None = None,
                key: str | None = None) -> tuple[list[Sample], list[Sample]]:
    """A fixed pool split once (seed-independently) into eval and train; the seed orders train.
    Domains over one pool pass the same `key` to hold out the same entries."""
    key = key or name
    texts = [text for text, _ in pool]
    if len(set(texts)) != len(texts):
        dup = next(t for t in texts if texts.count(t) > 1)
        raise DomainError(f"domain {name!r}: the pool repeats the prompt {dup!r}")
    if not 0 < n_eval < len(pool):
        raise DomainError(f"domain {name!r}: cannot hold out {n_eval} of {len(pool)} prompts")
    order = list(range(len(pool)))
    random.Random(f"{key}:eval").shuffle(order)
    held, rest = sorted(order[:n_eval]), order[n_eval:]
    random.Random(f"{key}:train:{seed}").shuffle(rest)
    return (_samples(name, "train", [pool[i] for i in rest], system),
            _samples(name, "eval", [pool[i] for i in held], system))


def _distinct(make: Generator, rng: random.Random, n: int, taken: set[str], name: str) -> list[Item]:
    out: list[Item] = []
    seen = set(taken)
    for _ in range(max(1000, 50 * n)):  # a small prompt space shows up as an error, not a hang
        if len(out) == n:
            return out
        text, ref = make(rng)
        if text not in seen:
            seen.add(text)
            out.append((text, ref))
    if len(out) == n:
        return out
    raise DomainError(f"domain {name!r}: its generator gave only {len(out)} distinct prompts of the {n} asked")


def _samples(name: str, split: str, items: list[Item], system: str | None) -> list[Sample]:
    return [Sample(f"{name}-{split}-{i:04d}", name, user(text, system), ref) for i, (text, ref) in enumerate(items)]
