"""Verifier soundness (check_verifier) and the probes it scores: a clean case and a planted defect
of each kind, on copies of shipped domains and on a user's data file."""

import dataclasses
import json
import math
import random
import time

import pytest

from mainspring.train.config import DomainSpec
from mainspring.train.domains.base import Sample, Score
from mainspring.train.domains.registry import builtin_names, load_domain
from mainspring.train.domains.user import user_domain
from mainspring.train.inspect.findings import InspectOptions
from mainspring.train.inspect.probes import code_of, filler, padded, wrong_answers
from mainspring.train.inspect.verifier import check_verifier
from tests.train.inspect.planted import always_true, by_check, domain, length_hackable, snapshot, with_scorer

OPTS = InspectOptions(max_items=12, score_timeout_s=5.0)
PURE = [n for n in builtin_names() if n != "code"]


@pytest.mark.parametrize("name", PURE)
def test_every_shipped_reference_scores_full_marks(name):
    d = load_domain(DomainSpec(name=name), 0)
    assert d.reference_completion is not None
    for s in d.train[:40] + d.eval[:20]:
        assert d.scorer.score(s, d.reference_completion(s)).total >= 0.999, s.id


@pytest.mark.parametrize("name", ["math", "json", "scene", "finance"])
def test_clean_domains_have_no_findings_and_are_not_modified(name):
    d = domain(name)
    before = snapshot(d)
    findings = check_verifier(d, OPTS)
    assert findings == [], [f.message for f in findings]
    assert snapshot(d) == before


def test_a_broken_reference_is_an_error_naming_the_item():
    d = domain("math")
    victim = d.train[3]
    right = d.reference_completion
    d.reference_completion = lambda s: "12345" if s.id == victim.id else right(s)
    found = by_check(check_verifier(d, OPTS))
    (f,) = found["verifier.reference"]
    assert f.severity == "error" and f.item_ids == (victim.id,)
    assert f.evidence["examples"][0]["total"] == 0.0 and f.evidence["examples"][0]["parts"]["answer"] == 0.0


def test_no_reference_is_one_warning_and_worthless_probes_still_run():
    d = dataclasses.replace(domain("math"), reference_completion=None)
    found = by_check(check_verifier(d, OPTS))
    assert [f.severity for f in found["verifier.no_reference"]] == ["warning"]
    assert "cannot check soundness" in found["verifier.no_reference"][0].message
    assert not any(f.severity == "error" for fs in found.values() for f in fs)
    found = by_check(check_verifier(with_scorer(d, always_true(d).scorer), OPTS))
    assert {f.evidence["probe"] for f in found["verifier.accepts_wrong"]} == {"empty", "echo", "filler", "constant"}


def test_an_always_true_verifier_accepts_wrong_answers_and_has_flat_reward():
    found = by_check(check_verifier(always_true(domain("json")), OPTS))
    probes = {f.evidence["probe"]: f.severity for f in found["verifier.accepts_wrong"]}
    assert probes["json_values"] == probes["empty"] == probes["other_reference"] == "error"
    assert found["verifier.flat_reward"][0].severity == "error"
    assert "verifier.reference" not in found


def test_a_few_accepted_wrong_answers_are_a_warning():
    d = domain("math")
    lenient = d.train[0].id

    class Lenient:
        def score(self, sample, completion):
            if sample.id == lenient and completion.strip().isdigit():
                return Score(1.0)  # any number is right for this one item
            return d.scorer.score(sample, completion)

    found = by_check(check_verifier(with_scorer(d, Lenient()), OPTS))
    wrong = found["verifier.accepts_wrong"]
    assert wrong and all(f.severity == "warning" and f.item_ids == (lenient,) for f in wrong)


def test_length_hackable_scorer_padding_and_filler():
    found = by_check(check_verifier(length_hackable(domain("math")), OPTS))
    assert found["verifier.padding"][0].severity == "error"
    assert {f.evidence["probe"]: f.severity for f in found["verifier.accepts_wrong"]}["filler"] == "error"
    assert found["verifier.reference"][0].severity == "error"  # 0.3 x real: a right answer no longer pays


def test_nondeterministic_scorer():
    d = domain("math")
    rng = random.Random(0)

    class Noisy:
        def score(self, sample, completion):
            s = d.scorer.score(sample, completion)
            return Score(max(0.0, s.total - 0.2 * rng.random()), s.parts)

    (f,) = by_check(check_verifier(with_scorer(d, Noisy()), OPTS))["verifier.nondeterministic"]
    assert f.severity == "error" and len(f.item_ids) > 5


def test_a_hanging_scorer_is_a_timeout_error_and_is_not_called_forever():
    d = domain("math")
    calls = []

    class Slow:
        def score(self, sample, completion):
            calls.append(sample.id)
            time.sleep(0.5)
            return d.scorer.score(sample, completion)

    start = time.monotonic()
    found = by_check(check_verifier(with_scorer(d, Slow()), InspectOptions(max_items=12, score_timeout_s=0.05)))
    (f,) = found["verifier.timeout"]
    assert f.severity == "error" and f.item_ids and f.evidence["skipped"] > 0
    assert len(calls) < 12 and time.monotonic() - start < 5


@pytest.mark.parametrize("bad", ["raise", "nan", "none"])
def test_a_failing_scorer_is_a_finding_not_a_crash(bad):
    class Broken:
        def score(self, sample, completion):
            if bad == "raise":
                raise RuntimeError("boom")
            return Score(math.nan) if bad == "nan" else None

    found = by_check(check_verifier(with_scorer(domain("math"), Broken()), OPTS))
    assert found["verifier.scorer_error"][0].severity == "error"
    assert found["verifier.reference"][0].severity == "error"
    assert "error" in found["verifier.reference"][0].evidence["examples"][0]


def test_user_domain_references_from_completion_field(tmp_path):
    lines = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "answer": 2 * i, "split": "eval" if i < 3 else "train",
              **({"completion": str(2 * i)} if i != 5 else {})} for i in range(1, 9)]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))

    class Exact:
        def score(self, sample, completion):
            return Score(float(completion.strip() == str(sample.reference["answer"])))

    d = user_domain("sums", path, Exact())
    assert d.reference_completion is not None and d.reference_completion(d.eval[0]) == "2"
    found = by_check(check_verifier(d, InspectOptions()))
    (f,) = found["verifier.no_reference"]
    assert f.severity == "warning" and f.item_ids == ("q5",)
    assert all(f.severity != "error" for fs in found.values() for f in fs)
    path.write_text("\n".join(json.dumps({k: v for k, v in x.items() if k != "completion"}) for x in lines))
    assert user_domain("sums", path, Exact()).reference_completion is None


def test_wrong_answers_by_shape():
    code = "```python\ndef f(x):\n    return x + 1\n```"
    got = wrong_answers(code)
    assert set(got) == {"returns_none", "returns_constant"} and "return None" in got["returns_none"]
    assert got["returns_constant"].startswith("```python\n") and code_of(got["returns_constant"]) is not None
    got = wrong_answers('{"name": "Ann", "age": 30, "city": "Oslo", "ok": true}', other='{"name": "Bo"}')
    assert json.loads(got["json_values"]) == {"name": "Oslo", "age": 38, "city": "Ann", "ok": False}
    assert got["other_reference"] == '{"name": "Bo"}'
    got = wrong_answers("The profit was 150.5 in total.")
    assert got == {"numbers_shifted": "The profit was 188.5 in total.",
                   "numbers_doubled": "The profit was 301.0 in total."}
    assert wrong_answers("Paris", other="Paris") == {}
    assert padded("8", 3) == "8\n\n" + filler(3) and not any(c.isdigit() for c in filler(50))


def test_code_domain_references_pass_and_wrong_solutions_fail(sandbox):
    d = load_domain(DomainSpec(name="code"), 0, sandbox=sandbox)
    findings = check_verifier(d, InspectOptions(max_items=2))
    assert findings == [], [f.message for f in findings]


def test_samples_are_not_modified_by_probing():
    d = domain("scene")
    refs = [json.dumps(s.reference, sort_keys=True) for s in d.train]
    check_verifier(always_true(d), OPTS)
    assert refs == [json.dumps(s.reference, sort_keys=True) for s in d.train]
    assert isinstance(d.train[0], Sample)
