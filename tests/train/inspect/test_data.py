"""Malformed items: the shipped domains are well formed; each kind of planted defect is an error."""

from __future__ import annotations

import dataclasses

import pytest

from mainspring.train.config import DomainSpec
from mainspring.train.domains.base import Domain, Sample, Score
from mainspring.train.domains.registry import builtin_names, load_domain
from mainspring.train.inspect.data import DATA_CHECKS, REQUIRED_REFERENCE_KEYS, check_malformed
from mainspring.train.inspect.findings import InspectOptions

OPTS = InspectOptions(use_embeddings=False)


class Zero:
    def score(self, sample: Sample, completion: str) -> Score:
        return Score(0.0)


def user(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


def test_every_shipped_domain_has_a_reference_table() -> None:
    assert set(builtin_names()) <= set(REQUIRED_REFERENCE_KEYS)


@pytest.mark.parametrize("name", builtin_names())
def test_shipped_domains_are_well_formed(name: str) -> None:
    assert check_malformed(load_domain(DomainSpec(name=name)), OPTS) == []


def test_planted_malformed_items_in_a_shipped_domain() -> None:
    base = load_domain(DomainSpec(name="math"))
    s = base.train[0]
    bad = [
        dataclasses.replace(s, id="no-user", messages=({"role": "system", "content": "hi"},)),
        dataclasses.replace(s, id="empty", messages=user("   ")),
        dataclasses.replace(s, id="role", messages=({"role": "robot", "content": "x"}, *user("What is 1 + 2?"))),
        dataclasses.replace(s, id="no-messages", messages=()),
        dataclasses.replace(s, id="no-answer", reference={"solution": 3}),
        dataclasses.replace(s, id="nan", reference={"answer": float("nan")}),
        dataclasses.replace(s, id="text-answer", reference={"answer": "three"}),
        dataclasses.replace(s, id="not-str", messages=({"role": "user", "content": 5},)),  # type: ignore[dict-item]
    ]
    d = dataclasses.replace(base, train=[*base.train, *bad])
    found = check_malformed(d, OPTS)
    assert all(f.severity == "error" and f.check == "data.malformed" for f in found)
    flagged = {i for f in found for i in f.item_ids}
    assert flagged == {b.id for b in bad}


def test_unknown_domain_items_must_agree_on_reference_keys() -> None:
    train = [Sample(f"t{i}", "u", user(f"question {i}"), {"answer": i, "source": "x"}) for i in range(10)]
    eval_ = [Sample("e0", "u", user("held out"), {"answer": 1, "source": "y"})]
    assert check_malformed(Domain("u", train, eval_, Zero()), OPTS) == []
    train.append(Sample("hole", "u", user("question 99"), {"answer": 99}))
    train.append(Sample("inf", "u", user("question 98"), {"answer": float("inf"), "source": "x",
                                                          "nested": {"w": [1.0, float("nan")]}}))
    found = check_malformed(Domain("u", train, eval_, Zero()), OPTS)
    assert {(f.message.split(": ", 1)[1], f.item_ids) for f in found} == {
        ("reference lacks 'source', which the other items have", ("hole",)),
        ("reference answer is not a finite number", ("inf",)),
    }


def test_data_checks_never_crash_or_modify_a_malformed_domain() -> None:
    train = [Sample("a", "u", ({"role": "user"},), {}),  # type: ignore[typeddict-item]
             Sample("b", "u", ({"content": "x"},), {"answer": float("nan")}),  # type: ignore[typeddict-item]
             Sample("c", "u", user("fine"), {})]
    eval_ = [Sample("e", "u", user("fine"), {})]
    d = Domain("u", train, eval_, Zero())
    before = repr(d.train) + repr(d.eval)
    for check in DATA_CHECKS:
        check(d, OPTS)
    assert repr(d.train) + repr(d.eval) == before
    assert {i for f in check_malformed(d, OPTS) for i in f.item_ids} == {"a", "b"}
