"""`mainspring inspect` and the gate of `mainspring train`: exit codes (0 clean, 1 an error finding,
2 bad input), the --json shape, the report files. Fake checks make the exit codes independent of
what the real checks find; the config tests at the end run the real model-free checks."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from mainspring.cli import app
from mainspring.train.inspect import runner
from mainspring.train.inspect.findings import Finding
from mainspring.train.inspect.runner import Check


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def fake_checks(monkeypatch, severity: str = "info") -> None:
    def check(d, options):
        return [Finding("fake.check", severity, d.name, f"a {severity} about {d.name}", (d.train[0].id,),
                        {"n": 1}, "nothing")]
    monkeypatch.setattr(runner, "builtin_checks", lambda model=True: ([Check("fake.check", check)], []))


def test_clean_domains_exit_0_with_a_table_and_a_report(monkeypatch, tmp_path):
    fake_checks(monkeypatch, "warning")
    r = run("inspect", "math,json", "--no-model", "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["domain", "error", "warning", "info"]
    assert lines[1].split() == ["math", "0", "1", "0"] and lines[2].split() == ["json", "0", "1", "0"]
    assert "warning math fake.check: a warning about math [math-train-0000]" in r.stdout
    assert f"report: {tmp_path / 'report.md'}" in r.stdout
    assert (tmp_path / "report.md").exists() and (tmp_path / "findings.json").exists()


def test_an_error_finding_exits_1(monkeypatch, tmp_path):
    fake_checks(monkeypatch, "error")
    r = run("inspect", "math", "--no-model", "--out", str(tmp_path))
    assert r.exit_code == 1, r.output
    assert "error math fake.check" in r.stdout


def test_json_output_shape(monkeypatch, tmp_path):
    fake_checks(monkeypatch, "error")
    r = run("inspect", "finance", "--no-model", "--json", "--max-items", "5", "--out", str(tmp_path))
    assert r.exit_code == 1
    doc = json.loads(r.stdout)  # stdout is the JSON alone
    assert set(doc) == {"target", "domains", "model_checks", "counts", "errors", "report", "findings"}
    assert doc["domains"] == ["finance"] and doc["errors"] == 1 and doc["model_checks"] is False
    assert doc["counts"] == {"finance": {"info": 0, "warning": 0, "error": 1}}
    f = doc["findings"][0]
    assert set(f) == {"check", "severity", "domain", "message", "item_ids", "evidence", "fix"}
    assert f["item_ids"] == ["finance-train-0000"] and doc["report"] == str(tmp_path / "report.md")


@pytest.mark.parametrize("args, says", [
    (["poetry"], "unknown domain 'poetry'"),
    (["math,poetry"], "unknown domain 'poetry'"),
    ([","], "unknown domain"),
    (["{tmp}/missing.yaml"], "cannot read config"),
    (["{tmp}/bad.yaml"], "not valid YAML"),
    (["{tmp}/wrong.yaml"], "group_size"),
    (["{tmp}/list.yaml"], "must be a mapping"),
    (["{tmp}/unknown.yaml"], "unknown domain 'poetry'"),
    (["math", "--samples", "0"], "--samples"),
])
def test_bad_input_exits_2(monkeypatch, tmp_path, args, says):
    fake_checks(monkeypatch)
    (tmp_path / "bad.yaml").write_text("domains: [{name: json\n")
    (tmp_path / "wrong.yaml").write_text("domains: [{name: json}]\ngroup_size: 1\n")
    (tmp_path / "list.yaml").write_text("- json\n")
    (tmp_path / "unknown.yaml").write_text("domains: [{name: poetry}]\n")
    r = run("inspect", *[a.format(tmp=tmp_path) for a in args], "--no-model", "--out", str(tmp_path / "out"))
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output


# -- the train gate -------------------------------------------------------------------------------
@pytest.fixture
def trained(monkeypatch):
    """run_training replaced by a recorder: the gate is tested, not the training."""
    calls = []

    def fake_run(cfg, run_dir, **kw):
        calls.append(kw)
        return SimpleNamespace(run_dir=run_dir, gate_passed=True)

    monkeypatch.setattr("mainspring.train.trainer.run_training", fake_run)
    return calls


def write_config(tmp_path, body: str = "domains: [{name: math, train_size: 8, eval_size: 4}]\nsteps: 1\n"):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(body)
    return cfg


def test_train_stops_on_an_error_finding(monkeypatch, tmp_path, trained):
    fake_checks(monkeypatch, "error")
    r = run("train", str(write_config(tmp_path)), "--out", str(tmp_path / "run"))
    assert r.exit_code == 1 and not trained
    assert "inspection found errors" in r.stderr and "--no-inspect" in r.stderr
    assert "error math fake.check" in r.stderr
    assert (tmp_path / "run" / "inspect" / "report.md").exists()


def test_train_runs_after_a_clean_inspection_with_the_inspected_domains(monkeypatch, tmp_path, trained):
    fake_checks(monkeypatch, "warning")
    r = run("train", str(write_config(tmp_path)), "--out", str(tmp_path / "run"))
    assert r.exit_code == 0, r.output
    assert "inspection: no errors, 1 warnings" in r.stderr
    assert list(trained[0]["domains"]) == ["math"] and len(trained[0]["domains"]["math"].train) == 8


def test_train_no_inspect_skips_the_gate(monkeypatch, tmp_path, trained):
    fake_checks(monkeypatch, "error")
    r = run("train", str(write_config(tmp_path)), "--out", str(tmp_path / "run"), "--no-inspect")
    assert r.exit_code == 0, r.output
    assert trained[0]["domains"] is None and not (tmp_path / "run" / "inspect").exists()


def test_train_bad_domain_is_still_exit_2(tmp_path, trained):
    r = run("train", str(write_config(tmp_path, "domains: [{name: poetry}]\n")), "--out", str(tmp_path / "run"))
    assert r.exit_code == 2 and "unknown domain 'poetry'" in r.stderr and not trained


# -- a config with a user domain, through the real model-free checks ----------------------------------
def user_config(tmp_path, broken: bool):
    facts = [("Capital of France?", "Paris"), ("Capital of Peru?", "Lima"),
             ("Largest planet in the solar system?", "Jupiter"), ("Chemical symbol for gold?", "Au"),
             ("Author of Hamlet?", "Shakespeare"), ("Boiling point of water in Celsius at sea level?", "100"),
             ("Fastest land animal?", "Cheetah"), ("Square root of 81?", "9")]
    lines = [{"id": f"q{i}", "prompt": q, "answer": a, "completion": a, "split": "eval" if i >= 6 else "train"}
             for i, (q, a) in enumerate(facts)]
    if broken:  # the label the scorer checks disagrees with the known-right completion
        lines[2]["answer"] = "Saturn"
    data = tmp_path / "facts.jsonl"
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return write_config(tmp_path, f"domains: [{{name: facts, data: {data}, scorer: tests.train.scorers:exact}}]\n")


def test_config_with_a_clean_user_domain_has_no_error(tmp_path):
    r = run("inspect", str(user_config(tmp_path, broken=False)), "--no-model", "--json", "--out", str(tmp_path / "o"))
    doc = json.loads(r.stdout)
    assert doc["domains"] == ["facts"]
    assert r.exit_code == 0, [f for f in doc["findings"] if f["severity"] == "error"]


def test_config_with_a_broken_reference_exits_1_naming_it(tmp_path):
    r = run("inspect", str(user_config(tmp_path, broken=True)), "--no-model", "--json", "--out", str(tmp_path / "o"))
    assert r.exit_code == 1
    errors = [f for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"]
    assert any("q2" in f["item_ids"] and f["check"].startswith("verifier.") for f in errors), errors
