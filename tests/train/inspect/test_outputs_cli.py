"""`mainspring inspect-outputs`: a batch output file (with its input file for the schemas) or the agent
journal's model steps, scoped to a project; exit 1 at --fail-on, 2 on bad input; the report's plot."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from mainspring.cli import app

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def batch_files(tmp_path):
    """Ten requests that promised SCHEMA: seven valid answers, one invalid, one refusal, one failure."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}
    inp.write_text("".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                       "body": {"messages": [], "response_format": fmt}}) + "\n" for i in range(10)))

    def answer(cid: str, text: str) -> dict:
        return {"custom_id": cid, "error": None, "response": {"status_code": 200, "body": {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}}}

    lines = [answer(f"r{i}", json.dumps({"city": f"town {i}"})) for i in range(7)]
    lines += [answer("r7", '{"town": 1}'), answer("r8", "I'm sorry, but I can't help with that."),
              {"custom_id": "r9", "response": None, "error": {"code": "server_error", "message": "x"}}]
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return inp, out


def test_a_batch_output_is_checked_against_its_input_schemas(tmp_path):
    inp, out = batch_files(tmp_path)
    r = run("inspect-outputs", str(out), "--input", str(inp), "--out", str(tmp_path / "report"))
    assert r.exit_code == 0, r.output  # served-output findings are warnings: exit 0 unless --fail-on warning
    assert r.stdout.splitlines()[1].split() == ["out", "0", "3", "1"]  # schema, refusals, errors; the summary
    assert "warning out outputs.schema: 78% of 9 outputs match their JSON schema [r7, r8]" in r.stdout
    assert (tmp_path / "report" / "report.md").exists() and (tmp_path / "report" / "output_lengths.png").exists()
    strict = run("inspect-outputs", str(out), "-i", str(inp), "--fail-on", "warning", "--json",
                 "--out", str(tmp_path / "r2"))
    assert strict.exit_code == 1
    doc = json.loads(strict.stdout)
    assert doc["records"] == 10 and doc["counts"] == {"out": {"info": 1, "warning": 3, "error": 0}}
    found = {f["check"]: f for f in doc["findings"]}
    assert found["outputs.refusals"]["item_ids"] == ["r8"] and found["outputs.errors"]["item_ids"] == ["r9"]


def test_without_the_input_file_no_schema_is_checked(tmp_path):
    _, out = batch_files(tmp_path)
    doc = json.loads(run("inspect-outputs", str(out), "--json", "--out", str(tmp_path / "o")).stdout)
    assert "outputs.schema" not in {f["check"] for f in doc["findings"]}


def journal(tmp_path) -> str:
    """A database with two projects' agent runs: one model step each, one of them a refusal."""
    from mainspring.agents.tables import StepRow

    url = f"sqlite:///{tmp_path / 'platform.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE projects (id INTEGER PRIMARY KEY, name VARCHAR(64) UNIQUE)"))
        conn.execute(sa.text("CREATE TABLE runs (id VARCHAR(64) PRIMARY KEY, project_id INTEGER)"))
        conn.execute(sa.text("INSERT INTO projects VALUES (1, 'alpha'), (2, 'beta')"))
        conn.execute(sa.text("INSERT INTO runs VALUES ('run_a', 1), ('run_b', 2)"))
    StepRow.__table__.create(engine)  # type: ignore[attr-defined]
    with engine.begin() as conn:
        for i, (sid, run_id, text) in enumerate([("s_a", "run_a", "Done: the file is written."),
                                                 ("s_b", "run_b", "I'm sorry, but I can't do that.")]):
            conn.execute(StepRow.__table__.insert().values(  # type: ignore[attr-defined]
                id=sid, run_id=run_id, seq=i, kind="model", status="completed",
                output_json=json.dumps({"role": "assistant", "content": text})))
    engine.dispose()
    return url


def test_agent_runs_are_scoped_to_a_project(tmp_path, monkeypatch):
    monkeypatch.setenv("MAINSPRING_DATABASE_URL", journal(tmp_path))
    every = json.loads(run("inspect-outputs", "--agent-runs", "--json", "--out", str(tmp_path / "a")).stdout)
    assert every["name"] == "agents" and every["records"] == 2
    alpha = run("inspect-outputs", "--agent-runs", "--project", "alpha", "--fail-on", "warning", "--json",
                "--out", str(tmp_path / "b"))
    doc = json.loads(alpha.stdout)
    assert alpha.exit_code == 0 and doc["records"] == 1 and doc["name"] == "agents-alpha"  # beta's refusal unseen
    beta = run("inspect-outputs", "--agent-runs", "-p", "beta", "--fail-on", "warning", "--out", str(tmp_path / "c"))
    assert beta.exit_code == 1 and "outputs.refusals" in beta.stdout
    missing = run("inspect-outputs", "--agent-runs", "-p", "gamma")
    assert missing.exit_code == 2 and "no project named 'gamma'" in missing.output


@pytest.mark.parametrize("args, says", [
    ([], "one of them"),
    (["{tmp}/out.jsonl", "--agent-runs"], "one of them"),
    (["{tmp}/missing.jsonl"], "no such file"),
    (["{tmp}/out.jsonl", "--input", "{tmp}/missing.jsonl"], "no such file"),
    (["{tmp}/out.jsonl", "--project", "alpha"], "pass --agent-runs"),
    (["--agent-runs", "--input", "{tmp}/in.jsonl"], "--input belongs"),
    (["{tmp}/out.jsonl", "--fail-on", "info"], "--fail-on"),
    (["{tmp}/binary.jsonl"], "utf-8"),
    (["--agent-runs"], "no agent journal"),
])
def test_bad_input_exits_2(tmp_path, monkeypatch, args, says):
    monkeypatch.setenv("MAINSPRING_DATABASE_URL", f"sqlite:///{tmp_path / 'none.db'}")
    batch_files(tmp_path)
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    r = run("inspect-outputs", *[a.format(tmp=tmp_path) for a in args], "--out", str(tmp_path / "o"))
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output
    assert not (tmp_path / "none.db").exists()  # inspection creates nothing
