"""The planted-defect suite: copies of each shipped domain with known defects (planted.py). The
inspection must name every planted item, flag the broken verifiers, and find nothing of severity
error in the clean shipped domains. Model-free, except difficulty with a fake source."""

from __future__ import annotations

import pytest

from mainspring.train.config import DomainSpec
from mainspring.train.domains.base import Domain
from mainspring.train.domains.registry import load_domain
from mainspring.train.inspect.findings import Finding, InspectOptions
from mainspring.train.inspect.report import reward_length, write_report
from mainspring.train.inspect.runner import inspect_domain
from tests.train.inspect import planted

SHIPPED = ["json", "math", "code", "scene", "finance"]
OPTIONS = InspectOptions(samples=4, use_embeddings=False)  # embeddings: a model download, not needed here
# which checks may name a planted kind: the family of the check's dotted name
FAMILY = {"exact_duplicate": ("data.exact_duplicates",), "near_duplicate": ("data.near_duplicates",
                                                                           "data.exact_duplicates"),
          "leak": ("data.leak",), "near_leak": ("data.leak", "data.leak_reworded", "data.leak_semantic"),
          "broken_reference": ("verifier.",), "all_solved": ("difficulty.always_solved",),
          "never_solved": ("difficulty.never_solved",)}


@pytest.fixture(scope="module")
def shipped(request) -> dict[str, Domain]:
    """Small copies of the shipped domains (code: a few tasks, each scored in the sandbox)."""
    out = {}
    for name in SHIPPED:
        if name == "code":
            from mainspring.train.domains import python_functions

            d = python_functions.build(0, sandbox=request.getfixturevalue("sandbox"))
            out[name] = planted.small(d, 4, 2)
        else:
            out[name] = planted.small(load_domain(DomainSpec(name=name)))
    return out


def named(findings: list[Finding], prefixes: tuple[str, ...], ids: tuple[str, ...]) -> list[str]:
    """The planted ids no finding of the given check family names."""
    hit = {i for f in findings if f.check.startswith(prefixes) for i in f.item_ids}
    return [i for i in ids if i not in hit]


def summary(findings: list[Finding]) -> list[str]:
    return [f"{f.severity} {f.check} {list(f.item_ids)[:4]}: {f.message}" for f in findings if f.severity != "info"]


@pytest.mark.parametrize("name", SHIPPED)
def test_clean_shipped_domain_has_no_error(shipped, name):
    d = shipped[name]
    findings = inspect_domain(d, OPTIONS, source=planted.FakeSource())
    errors = [f for f in findings if f.severity == "error"]
    assert not errors, summary(errors)
    assert any(f.check.startswith("difficulty.") for f in findings)  # the model checks did run


@pytest.mark.parametrize("name", SHIPPED)
def test_planted_data_defects_are_named(shipped, name):
    p = planted.plant_data(shipped[name])
    before = planted.snapshot(p.domain)
    findings = inspect_domain(p.domain, OPTIONS)
    assert planted.snapshot(p.domain)[:2] == before[:2]  # inspection never modifies the data
    missed = {kind: named(findings, FAMILY[kind], ids) for kind, ids in p.defects.items()}
    assert not any(missed.values()), (missed, summary(findings))
    errors = {f.check for f in findings if f.severity == "error"}
    assert "data.exact_duplicates" in errors or "data.leak" in errors  # training on it would be wrong
    assert any(c.startswith("verifier.") for c in errors), summary(findings)  # the broken reference


@pytest.mark.parametrize("name", SHIPPED)
def test_always_true_verifier_is_an_error(shipped, name):
    findings = inspect_domain(planted.always_true(shipped[name]), OPTIONS)
    assert any(f.check.startswith("verifier.") and f.severity == "error" for f in findings), summary(findings)


@pytest.mark.parametrize("name", SHIPPED)
def test_length_hackable_scorer_is_flagged(shipped, name):
    findings = inspect_domain(planted.length_hackable(shipped[name]), OPTIONS)
    flagged = [f for f in findings if f.check == "hacking.length" and f.severity in ("warning", "error")]
    assert flagged, summary(findings)


@pytest.mark.parametrize("name", SHIPPED)
def test_all_solved_and_never_solved_items_are_named(shipped, name):
    source, defects = planted.plant_difficulty(shipped[name])
    findings = inspect_domain(shipped[name], OPTIONS, source=source)
    missed = {kind: named(findings, FAMILY[kind], ids) for kind, ids in defects.items()}
    assert not any(missed.values()), (missed, summary(findings))
    assert not any(f.check == "difficulty.no_signal" for f in findings)  # the rest still has signal


def test_a_domain_without_any_signal_is_an_error(shipped):
    d = shipped["math"]
    source = planted.FakeSource(solved=frozenset(s.id for s in d.train))
    findings = inspect_domain(d, OPTIONS, source=source)
    assert any(f.check == "difficulty.no_signal" and f.severity == "error" for f in findings), summary(findings)


def test_the_report_names_every_planted_item(shipped, tmp_path):
    p = planted.plant_data(shipped["math"])
    source, defects = planted.plant_difficulty(p.domain)
    findings = inspect_domain(p.domain, OPTIONS, source=source)
    md = write_report(findings, tmp_path, ["math"]).read_text()
    for ids in [*p.defects.values(), *defects.values()]:
        for i in ids:
            assert f"`{i}`" in md, i
    assert (tmp_path / "pass_rates.png").exists() and "](reward_vs_length.png)" in md
    series = {label for label, _, _ in reward_length(findings)["math"]}
    assert {"completions", "filler", "wrong answer", "reference"} <= series  # model samples and probe curves
