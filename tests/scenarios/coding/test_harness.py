"""The hidden-test harness in the real sandbox: over every minibench instance the gold patch resolves and the
empty patch does not (SWE-bench's self-check); each tempting naive fix breaks a PASS_TO_PASS test and is not
resolved; a patch that does not apply is not resolved and says why; a model's edit of the hidden tests is undone
before they run; the instances themselves are well formed."""

from __future__ import annotations

import json

import pytest

from mainspring.scenarios.coding.harness import apply_patch, evaluate, evaluate_many, resolved_rate
from mainspring.scenarios.coding.instances import INSTANCES_FILE, load_instances, parse_instance
from mainspring.scenarios.coding.workcopy import copy_repository, unified_diff

INSTANCES = load_instances()
BY_ID = {i.instance_id: i for i in INSTANCES}


def test_the_minibench_has_the_task_kinds_of_the_design():
    assert len(INSTANCES) == 15 and len({i.repo for i in INSTANCES}) == 3
    kinds = {i.kind for i in INSTANCES}
    assert {"off-by-one", "rounding mode", "missing edge case", "signature change across two files",
            "naive fix breaks a PASS_TO_PASS test", "underspecified"} <= kinds
    assert sum(i.underspecified for i in INSTANCES) == 1
    for inst in INSTANCES:
        assert inst.FAIL_TO_PASS and inst.PASS_TO_PASS, inst.instance_id
        assert not set(inst.FAIL_TO_PASS) & set(inst.PASS_TO_PASS)
        # the gold patch leaves the tests alone; the hidden test patch touches only tests
        assert all(not f.startswith("diff --git a/tests/") for f in inst.patch.splitlines() if f.startswith("diff"))
        assert all(f.startswith("diff --git a/tests/") for f in inst.test_patch.splitlines() if f.startswith("diff"))
    signature_changes = [i for i in INSTANCES if i.kind == "signature change across two files"]
    assert all(i.patch.count("diff --git") == 2 for i in signature_changes)


def test_gold_patches_resolve_every_instance_and_empty_patches_none(sandbox):
    pairs = [(i, i.patch) for i in INSTANCES] + [(i, "") for i in INSTANCES]
    results = evaluate_many(pairs, sandbox=sandbox, workers=2)
    gold, empty = results[:len(INSTANCES)], results[len(INSTANCES):]
    assert resolved_rate(gold) == 1.0, [(e.instance_id, e.reason) for e in gold if not e.resolved]
    assert resolved_rate(empty) == 0.0, [e.instance_id for e in empty if e.resolved]
    for g, e in zip(gold, empty):
        assert g.apply_method in ("git apply", "patch") and g.applied
        assert all(v == "passed" for v in g.outcome(g.fail_to_pass + g.pass_to_pass).values())
        # without a fix, every FAIL_TO_PASS test fails and every PASS_TO_PASS test passes
        assert e.applied and e.apply_method == "" and "FAIL_TO_PASS tests do not pass" in e.reason
        assert set(e.outcome(e.fail_to_pass).values()) <= {"failed", "error"}, e.to_dict()
        assert set(e.outcome(e.pass_to_pass).values()) == {"passed"}, e.to_dict()


def test_naive_fixes_pass_their_target_but_break_a_pass_to_pass_test(sandbox):
    naive = [i for i in INSTANCES if i.naive_patch]
    assert len(naive) == 3
    for ev in evaluate_many([(i, i.naive_patch) for i in naive], sandbox=sandbox, workers=2):
        assert not ev.resolved and ev.applied
        assert "PASS_TO_PASS tests broke" in ev.reason, ev.reason
        assert "passed" in ev.outcome(ev.fail_to_pass).values()  # the naive fix does what the issue said


def test_a_patch_that_does_not_apply_is_not_resolved(sandbox):
    inst = BY_ID["spans-1"]
    stale = inst.patch.replace("-        return self.start <= point <= self.end",
                               "-        return self.begin <= point <= self.stop")
    ev = evaluate(inst, stale, sandbox=sandbox)
    assert (ev.resolved, ev.applied, ev.report) == (False, False, None)
    assert ev.reason.startswith("the patch does not apply:") and "interval.py" in ev.reason
    assert evaluate(inst, "this is not a diff\n", sandbox=sandbox).applied is False


def test_a_model_edit_of_the_hidden_tests_is_undone(sandbox, tmp_path):
    """A "fix" that rewrites the failing hidden test and adds a conftest.py that passes every test still fails."""
    inst = BY_ID["moneykit-1"]
    before, after = tmp_path / "a", tmp_path / "b"
    copy_repository(inst.snapshot, before)
    copy_repository(inst.snapshot, after)
    test_file = after / "tests" / "test_money.py"
    test_file.write_text(test_file.read_text() + "\n\ndef test_round_minor_halves_away_from_zero():\n    pass\n")
    (after / "tests" / "conftest.py").write_text(
        "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
    cheat = unified_diff(before, after)
    assert "tests/conftest.py" in cheat
    ev = evaluate(inst, cheat, sandbox=sandbox)
    assert ev.applied and not ev.resolved
    assert ev.dropped_test_edits == ["tests/conftest.py", "tests/test_money.py"]
    assert ev.tests["tests/test_money.py::test_round_minor_halves_away_from_zero"] == "failed"
    # the same cheat next to the real fix: the fix is kept, the cheat dropped, and it resolves
    fixed = evaluate(inst, inst.patch + cheat, sandbox=sandbox)
    assert fixed.resolved and fixed.dropped_test_edits == ["tests/conftest.py", "tests/test_money.py"]


def test_a_patch_that_creates_a_file_applies(sandbox, tmp_path):
    """The coding run's diff (workcopy.unified_diff) of a fix that moves code into a new module."""
    inst = BY_ID["spans-2"]
    before, after = tmp_path / "a", tmp_path / "b"
    copy_repository(inst.snapshot, before)
    copy_repository(inst.snapshot, after)
    (after / "spans" / "_empty.py").write_text("def nothing(items):\n    return not items\n")
    merge = after / "spans" / "merge.py"
    text = merge.read_text().replace("from spans.interval import Interval\n",
                                     "from spans._empty import nothing\nfrom spans.interval import Interval\n")
    merge.write_text(text.replace("    out = [ordered[0]]\n", "    if nothing(ordered):\n        return []\n"
                                  "    out = [ordered[0]]\n"))
    ev = evaluate(inst, unified_diff(before, after), sandbox=sandbox)
    assert ev.resolved and ev.applied, ev.reason


def test_apply_patch_falls_back_to_patch_with_fuzz(tmp_path):
    inst = BY_ID["csvtext-2"]
    copy_repository(inst.snapshot, tmp_path / "repo")
    # the first context line is not quite the file's (as in a model's hand-written diff): git refuses, patch's
    # fuzz takes it
    moved = inst.patch.replace('raise ValueError("width must be at least 1")', 'raise ValueError("width < 1")')
    assert moved != inst.patch
    target = tmp_path / "repo" / "csvtext" / "format.py"
    assert apply_patch(tmp_path / "repo", moved) == (True, "patch")
    assert "text[:width - 1]" in target.read_text() and not list((tmp_path / "repo").rglob("*.orig"))


def test_a_patch_half_of_which_applies_changes_nothing(tmp_path):
    inst = BY_ID["spans-4"]  # two files
    copy_repository(inst.snapshot, tmp_path / "repo")
    broken = inst.patch.replace("-def due_date(start: date, days: int) -> date:", "-def due_date(when, n):")
    before = {p: p.read_bytes() for p in (tmp_path / "repo").rglob("*.py")}
    ok, why = apply_patch(tmp_path / "repo", broken)
    assert not ok and "schedule.py" in why
    assert {p: p.read_bytes() for p in (tmp_path / "repo").rglob("*.py")} == before


def test_bad_instance_records_are_refused():
    record = json.loads(INSTANCES_FILE.read_text().splitlines()[0])
    assert parse_instance(record).instance_id == record["instance_id"]
    assert parse_instance({**record, "FAIL_TO_PASS": json.dumps(record["FAIL_TO_PASS"])}).FAIL_TO_PASS == tuple(
        record["FAIL_TO_PASS"])  # SWE-bench's JSON strings
    for bad in ({"FAIL_TO_PASS": []}, {"repo": "nowhere"}, {"patch": ""}, {"PASS_TO_PASS": [3]}):
        with pytest.raises(ValueError):
            parse_instance({**record, **bad})
    with pytest.raises(ValueError, match="unknown instance"):
        load_instances(ids=["nope-1"])
