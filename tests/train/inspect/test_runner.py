"""The runner (checks that fail are findings, model checks only with a source) and the report
(markdown, findings.json, plots from whatever evidence exists), with fake checks: no model."""

from __future__ import annotations

import json

from mainspring.train.domains.base import Domain, Sample, Score
from mainspring.train.inspect import runner
from mainspring.train.inspect.findings import Finding, InspectOptions
from mainspring.train.inspect.report import cluster_sizes, pass_rates, reward_length, write_report
from mainspring.train.inspect.runner import Check, counts, has_errors, inspect_domain, inspect_domains


class Exact:
    def score(self, sample: Sample, completion: str) -> Score:
        return Score(float(completion == sample.reference["answer"]))


def domain(name: str = "toy") -> Domain:
    def s(i: int, split: str) -> Sample:
        return Sample(f"{name}-{split}-{i}", name, ({"role": "user", "content": f"say {i}"},), {"answer": str(i)})
    return Domain(name, [s(i, "train") for i in range(4)], [s(9, "eval")], Exact(),
                  reference_completion=lambda x: x.reference["answer"])


def finds(check: str, severity: str = "warning", **evidence):
    def fn(d, options, source=None):
        return [Finding(check, severity, d.name, f"{check} on {d.name}", (d.train[0].id,), evidence, "fix it")]
    return fn


def test_a_raising_check_is_an_error_finding_and_the_others_still_run():
    def boom(d, options):
        raise KeyError("answer")

    out = inspect_domain(domain(), InspectOptions(), checks=[Check("x.boom", boom), Check("x.ok", finds("x.ok"))])
    assert [f.check for f in out] == ["runner.check_failed", "x.ok"]
    failed = out[0]
    assert failed.severity == "error" and failed.domain == "toy"
    assert failed.message.startswith("check x.boom failed: KeyError") and failed.evidence["check"] == "x.boom"
    assert "boom" in failed.evidence["traceback"]


def test_a_check_past_its_time_limit_is_an_error_finding_and_the_others_still_run():
    import threading

    release = threading.Event()

    def hangs(d, options):
        release.wait(30)
        return []

    def boom(d, options):
        raise KeyError("answer")

    opts = InspectOptions(check_timeout_s=0.2)
    try:
        out = inspect_domain(domain(), opts, checks=[Check("x.hangs", hangs), Check("x.boom", boom),
                                                     Check("x.ok", finds("x.ok"))])
    finally:
        release.set()
    assert [(f.check, f.severity) for f in out] == [("runner.check_timeout", "error"), ("runner.check_failed", "error"),
                                                    ("x.ok", "warning")]
    assert "x.hangs did not finish in 0.2 s" in out[0].message and out[0].evidence["timeout_s"] == 0.2
    assert "boom" in out[1].evidence["traceback"]  # an exception in the timed thread keeps its traceback


def test_a_check_returning_garbage_is_an_error_finding():
    out = inspect_domain(domain(), checks=[Check("x.bad", lambda d, o: {"not": "a list"}),
                                           Check("x.mixed", lambda d, o: ["a string"])])
    assert [f.check for f in out] == ["runner.check_failed"] * 2
    assert "not a list of findings" in out[0].message


def test_model_checks_run_only_with_a_source():
    seen = []

    def model_check(d, options, source):
        seen.append(source)
        return []

    checks = [Check("m.check", model_check, needs_model=True), Check("x.free", finds("x.free"))]
    assert [f.check for f in inspect_domain(domain(), checks=checks)] == ["x.free"] and not seen
    source = object()
    inspect_domain(domain(), checks=checks, source=source)  # type: ignore[arg-type]
    assert seen == [source]


def test_inspect_domains_in_order_without_a_bar_off_a_terminal():
    ds = {"a": domain("a"), "b": domain("b")}
    out = inspect_domains(ds, checks=[Check("x.one", finds("x.one", "error"))])
    assert [f.domain for f in out] == ["a", "b"] and has_errors(out)
    assert counts(out, ["a", "b", "c"])["c"] == {"info": 0, "warning": 0, "error": 0}
    assert counts(out)["a"]["error"] == 1
    assert not has_errors([Finding("x", "warning", "a", "m")])


def test_a_missing_check_module_is_a_warning_not_a_crash(monkeypatch):
    monkeypatch.setattr(runner, "BUILTIN", (("no_such_module", "check_nothing", False),))
    out = inspect_domain(domain())
    assert [(f.check, f.severity, f.domain) for f in out] == [("runner.unavailable", "warning", "toy")]
    checks, missing = runner.builtin_checks()
    assert checks == [] and "no_such_module.check_nothing" in missing[0].message


def test_checks_do_not_see_model_checks_when_no_source(monkeypatch):
    monkeypatch.setattr(runner, "BUILTIN", (("runner", "has_errors", True),))
    assert runner.builtin_checks(model=False) == ([], [])


# -- report ---------------------------------------------------------------------------------------
def sample_findings() -> list[Finding]:
    return [
        Finding("difficulty.pass_rate", "info", "math", "pass rate 0.4",
                evidence={"histogram": {"bins": [0, 0.5, 1], "counts": [3, 4, 1]}}),
        Finding("difficulty.pass_rate", "info", "json", "pass rate", evidence={"pass_rates": {"a": 0.1, "b": 1.0}}),
        Finding("hacking.length", "warning", "math", "reward grows with length | suspicious",
                ("math-1",), {"lengths": [1, 10, 100], "rewards": [0.1, 0.5, 0.9], "spearman": 0.97}),
        Finding("hacking.constant", "warning", "json", "a constant string", evidence={"points": [[1, 0.5], [3, 0.7]]}),
        Finding("data.exact_duplicates", "error", "math", "2 copies", ("math-1", "math-1-dup")),
        Finding("data.near_duplicates", "warning", "json", "clusters", evidence={"clusters": [["a", "b", "c"]]}),
        Finding("verifier.reference", "error", "math", "the reference fails",
                tuple(f"math-{i}" for i in range(50)), {"worst": "x" * 500, "nested": {"list": list(range(20))}},
                "fix the reference"),
    ]


def test_report_has_a_table_every_finding_with_ids_and_plots(tmp_path):
    findings = sample_findings()
    path = write_report(findings, tmp_path / "out", ["math", "json", "scene"])
    md = path.read_text()
    assert path.name == "report.md"
    assert "| math | 2 | 1 | 1 |" in md and "| scene | 0 | 0 | 0 |" in md
    assert "`math-1-dup`" in md and "and 10 more" in md and "fix: fix the reference" in md
    assert "\\|" not in md.split("## Findings")[0]  # no stray escapes in the table (no pipes in names)
    assert "reward grows with length | suspicious" in md  # messages are not table cells
    for png in ("pass_rates.png", "reward_vs_length.png", "duplicate_clusters.png"):
        assert (tmp_path / "out" / png).stat().st_size > 1000 and f"]({png})" in md
    dumped = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert dumped["domains"] == ["math", "json", "scene"] and len(dumped["findings"]) == len(findings)
    assert dumped["findings"][6]["item_ids"][-1] == "math-49" and dumped["counts"]["math"]["error"] == 2


def test_report_skips_plots_without_evidence_and_tolerates_odd_evidence(tmp_path):
    odd = [Finding("difficulty.pass_rate", "info", "a", "m", evidence={"histogram": "broken", "pass_rates": None}),
           Finding("hacking.length", "warning", "a", "m", evidence={"lengths": [1, 2], "rewards": [1]}),
           Finding("data.near_duplicates", "warning", "a", "m", evidence={"cluster_sizes": "many"}),
           Finding("other.thing", "info", "a", "m", evidence={"x": object()})]
    assert not pass_rates(odd) and not reward_length(odd) and not cluster_sizes(odd)
    write_report(odd, tmp_path, ["a"])
    assert not list(tmp_path.glob("*.png"))
    assert "### a" in (tmp_path / "report.md").read_text()
    empty = write_report([], tmp_path / "empty", ["a"])
    assert "No findings." in empty.read_text()


def test_plot_data_from_the_evidence_kinds():
    f = sample_findings()
    assert sorted(pass_rates(f)["math"]) == [0, 0, 0, 0.5, 0.5, 0.5, 0.5, 1]
    assert reward_length(f)["json"] == [("completions", [1.0, 3.0], [0.5, 0.7])]
    curves = [Finding("hacking.length_correlation", "info", "m", "x", evidence={
        "levels_words": [0, 8, 32], "families": {"filler": {"rewards": [0, 0.2, 0.9]}, "ref": {"spearman": 1}}})]
    assert reward_length(curves) == {"m": [("filler", [0.0, 8.0, 32.0], [0.0, 0.2, 0.9])]}
    assert cluster_sizes(f) == {"math": [2], "json": [3]}
