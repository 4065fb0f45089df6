"""Output quality checks on served outputs: clean sets and planted defects (schema violations,
refusals, truncation, empty outputs, failures), and the batch and agent-journal loaders."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from mainspring.train.inspect.outputs import (OutputRecord, check_outputs, is_refusal, records_from_agent_runs,
                                              records_from_batch)

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def by_check(findings):
    return {f.check: f for f in findings}


def clean(n: int = 20) -> list[OutputRecord]:
    return [OutputRecord(f"r{i}", json.dumps({"name": f"p{i}", "age": i}), SCHEMA, "stop") for i in range(n)] + \
        [OutputRecord(f"t{i}", f"Paris is the capital of France, note {i}.", None, "stop") for i in range(n)]


def test_clean_outputs_give_only_measurements():
    found = by_check(check_outputs(clean()))
    assert set(found) == {"outputs.summary", "outputs.schema"}
    assert all(f.severity == "info" for f in found.values())
    assert found["outputs.schema"].evidence["valid_rate"] == 1.0
    s = found["outputs.summary"].evidence
    assert s["records"] == 40 and s["finish_reasons"] == {"stop": 40} and sum(s["histogram_words"]["counts"]) == 40


def test_schema_violations_are_flagged_by_id():
    recs = clean(10) + [OutputRecord("bad_type", '{"name": "x", "age": "old"}', SCHEMA, "stop"),
                        OutputRecord("extra", '{"name": "x", "age": 1, "pet": "cat"}', SCHEMA, "stop"),
                        OutputRecord("not_json", "Sure! Here is the JSON: {", SCHEMA, "stop"),
                        OutputRecord("cut", '{"name": "x", "a', SCHEMA, "length")]
    f = by_check(check_outputs(recs))["outputs.schema"]
    assert f.severity == "warning" and set(f.item_ids) == {"bad_type", "extra", "not_json", "cut"}
    assert f.evidence["valid_rate"] == pytest.approx(10 / 14, abs=1e-4)
    assert "age" in f.evidence["reasons"]["bad_type"] and "token cap" in f.evidence["reasons"]["cut"]


def test_an_invalid_schema_is_its_own_finding():
    recs = [OutputRecord("s", "{}", {"type": "no-such-type"}, "stop")]
    found = by_check(check_outputs(recs))
    assert found["outputs.bad_schema"].item_ids == ("s",)


def test_refusals_are_counted_and_warned_above_the_rate():
    refusals = ["I'm sorry, but I can't help with that request.", "I cannot assist with creating malware.",
                "As an AI language model, I cannot give medical advice.", "I must decline to answer.",
                "Sorry, I\u2019m unable to provide that."]
    recs = clean(10) + [OutputRecord(f"no{i}", t, None, "stop") for i, t in enumerate(refusals)]
    f = by_check(check_outputs(recs))["outputs.refusals"]
    assert f.severity == "warning" and len(f.item_ids) == 5
    # one in many is a measurement, not a warning
    f = by_check(check_outputs(clean(50) + recs[-1:]))["outputs.refusals"]
    assert f.severity == "info"


@pytest.mark.parametrize("text", ["I can't wait to see the results!", "Sorry for the delay, here is the answer: 42.",
                                  "The function cannot return None here.", "I am happy to help with that.",
                                  "He said: \"I cannot help you\" and left.",
                                  "She wrote \u201cI'm sorry, I can't assist\u201d on the card."])
def test_ordinary_answers_are_not_refusals(text):
    assert not is_refusal(text)


def test_a_refusal_quoted_late_in_an_answer_is_not_one():
    assert not is_refusal("Here is the story you asked for. " * 12 + "The robot said: I cannot help you.")


def test_truncation_empty_outputs_and_failures():
    recs = clean(5) + [OutputRecord(f"long{i}", "word " * 64, None, "length") for i in range(3)] + \
        [OutputRecord("blank", "   \n", None, "stop"), OutputRecord("failed", "", None, "error")]
    found = by_check(check_outputs(recs, name="batch_1"))
    assert found["outputs.truncated"].severity == "warning" and len(found["outputs.truncated"].item_ids) == 3
    assert found["outputs.empty"].item_ids == ("blank",)  # a failed request is not an empty output
    assert found["outputs.errors"].item_ids == ("failed",)
    assert {f.domain for f in found.values()} == {"batch_1"}


def test_no_records_is_a_finding():
    assert [f.check for f in check_outputs([])] == ["outputs.no_records"]


# -- loaders ------------------------------------------------------------------------------------------------
def test_batch_output_with_its_input_file(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(json.dumps(x) for x in [
        {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [], "response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "p", "schema": SCHEMA}}}},
        {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [], "response_format": {"type": "json_object"}}},
        {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}},
    ]) + "\n")

    def ok(cid, *choices):
        return {"id": "batch_req_1", "custom_id": cid, "error": None,
                "response": {"status_code": 200, "request_id": "r", "body": {"choices": list(choices)}}}

    out = tmp_path / "out.jsonl"
    lines = [ok("a", {"index": 0, "message": {"role": "assistant", "content": '{"name": "x"}'},
                      "finish_reason": "stop"}),
             ok("b", {"index": 0, "message": {"role": "assistant", "content": "[1]"}, "finish_reason": "stop"},
                {"index": 1, "message": {"role": "assistant", "content": "{}"}, "finish_reason": "length"}),
             ok("c", {"index": 0, "message": {"content": None, "tool_calls": [{"function": {"name": "f"}}]},
                      "finish_reason": "tool_calls"}),
             {"id": "batch_req_2", "custom_id": "d", "response": None, "error": {"code": "x", "message": "y"}},
             {"id": "batch_req_3", "custom_id": "e", "error": None,
              "response": {"status_code": 400, "request_id": "r", "body": {"error": {"message": "bad"}}}}]
    out.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n\n")
    recs = {r.id: r for r in records_from_batch(out, inp)}
    assert set(recs) == {"a", "b", "b#1", "c", "d", "e", "line6"}
    assert recs["a"].expected_schema == SCHEMA and recs["b"].expected_schema == {"type": "object"}
    assert recs["c"].expected_schema is None and "\"f\"" in recs["c"].text
    assert recs["b#1"].finish_reason == "length"
    assert all(recs[k].finish_reason == "error" for k in ("d", "e", "line6"))
    found = by_check(check_outputs(recs.values()))
    assert set(found["outputs.schema"].item_ids) == {"a", "b"}  # a misses age; b is an array
    assert set(found["outputs.errors"].item_ids) == {"d", "e", "line6"}


def test_completions_endpoint_output_without_an_input_file(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"custom_id": "x", "error": None, "response": {"status_code": 200, "body": {
        "choices": [{"index": 0, "text": "hello", "finish_reason": "stop"}]}}}) + "\n")
    assert records_from_batch(out) == [OutputRecord("x", "hello", None, "stop")]


def test_agent_journal_steps(tmp_path):
    import sqlalchemy as sa

    from mainspring.agents.tables import StepRow

    url = f"sqlite:///{tmp_path / 'agents.db'}"
    engine = sa.create_engine(url)
    StepRow.__table__.create(engine)  # type: ignore[attr-defined]
    t0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
    rows = [("s1", "completed", {"role": "assistant", "content": "The answer is 4."}),
            ("s2", "completed", {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "search"}}]}),
            ("s3", "failed", None),
            ("s4", "completed", {"role": "assistant", "content": "I'm sorry, but I can't do that."}),
            ("s5", "started", None)]
    with engine.begin() as conn:
        for i, (sid, status, msg) in enumerate(rows):
            conn.execute(StepRow.__table__.insert().values(  # type: ignore[attr-defined]
                id=sid, run_id="run1" if i < 3 else "run2", seq=i, kind="model", status=status,
                output_json=None if msg is None else json.dumps(msg), started_at=t0 + timedelta(seconds=i)))
        conn.execute(StepRow.__table__.insert().values(  # type: ignore[attr-defined]
            id="c1", run_id="run1", seq=9, kind="compaction", status="completed",
            output_json=json.dumps({"summary": "..."}), started_at=t0))
    engine.dispose()
    recs = records_from_agent_runs(url)
    assert [(r.id, r.finish_reason) for r in recs] == [("s1", "stop"), ("s2", "tool_calls"), ("s3", "error"),
                                                       ("s4", "stop")]
    assert [r.id for r in records_from_agent_runs(url, run_ids=["run2"])] == ["s4"]
    found = by_check(check_outputs(recs, name="agents"))
    assert found["outputs.refusals"].item_ids == ("s4",) and found["outputs.errors"].item_ids == ("s3",)
    assert "outputs.empty" not in found  # a tool-calling step has no text but is not empty


def test_a_database_without_a_journal_is_a_clear_error(tmp_path):
    import sqlalchemy as sa

    with pytest.raises(ValueError, match="no agent journal"):
        records_from_agent_runs(f"sqlite:///{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()  # inspection creates nothing
    other = sa.create_engine(f"sqlite:///{tmp_path / 'other.db'}")
    with other.begin() as conn:
        conn.execute(sa.text("CREATE TABLE things (id INTEGER)"))
    with pytest.raises(ValueError, match="no `steps` table"):
        records_from_agent_runs(other)
    other.dispose()
