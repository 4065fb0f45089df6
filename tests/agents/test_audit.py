"""The audit trail: hash-chained per run; any edit, deletion or re-link is found and named."""

import asyncio
import json

from sqlalchemy import text

from mainspring.store.db import get_engine
from tests.agents.conftest import TERMINAL, CountTool, PolicyModel, make_runtime, spec, wait_status


def finished_run(tmp_path, db_url):
    rt = make_runtime(tmp_path, db_url, PolicyModel(calls=2), {"count": CountTool(tmp_path / "ledger")})
    rt.put_agent(spec())
    run = rt.start_run("tester", "count twice")

    async def main():
        await rt.start()
        try:
            await wait_status(rt, run.id, TERMINAL)
        finally:
            await rt.stop()

    asyncio.run(main())
    return rt, run.id


def sql(db_url, statement, **params):
    with get_engine(db_url).begin() as conn:
        conn.execute(text(statement), params)


def test_a_clean_run_verifies_and_exports_every_decision(tmp_path, db_url):
    rt, run_id = finished_run(tmp_path, db_url)
    verdict = rt.verify_audit(run_id)
    entries = [json.loads(line) for line in rt.export_audit(run_id)]
    assert verdict.ok and verdict.entries == len(entries) and verdict.head == entries[-1]["hash"]
    kinds = [e["kind"] for e in entries]
    assert kinds[0] == "run.created" and kinds[-1] == "run.finished"
    assert kinds.count("model.step") == 3 and kinds.count("tool.call") == 2
    model_step = next(e for e in entries if e["kind"] == "model.step")
    assert len(model_step["payload"]["input_hash"]) == 64 and "output" in model_step["payload"]
    assert all(e["prev_hash"] == p["hash"] for p, e in zip(entries, entries[1:]))


def test_editing_a_payload_is_detected_at_that_entry(tmp_path, db_url):
    rt, run_id = finished_run(tmp_path, db_url)
    sql(db_url, "UPDATE audit_log SET payload_json = replace(payload_json, 'count=1', 'count=9') "
                "WHERE run_id = :r AND kind = 'tool.call' AND seq = (SELECT min(seq) FROM audit_log "
                "WHERE run_id = :r AND kind = 'tool.call')", r=run_id)
    seq = next(json.loads(line)["seq"] for line in rt.export_audit(run_id) if '"count=9' in line)
    verdict = rt.verify_audit(run_id)
    assert not verdict.ok and verdict.broken_at == seq and "edited" in verdict.reason


def test_deleting_or_relinking_an_entry_is_detected(tmp_path, db_url):
    rt, run_id = finished_run(tmp_path, db_url)
    sql(db_url, "DELETE FROM audit_log WHERE run_id = :r AND seq = 3", r=run_id)
    verdict = rt.verify_audit(run_id)
    assert not verdict.ok and verdict.broken_at == 4 and "missing" in verdict.reason


def test_rewriting_a_hash_breaks_the_link_to_the_next_entry(tmp_path, db_url):
    rt, run_id = finished_run(tmp_path, db_url)
    sql(db_url, "UPDATE audit_log SET hash = :h WHERE run_id = :r AND seq = 2", r=run_id, h="f" * 64)
    verdict = rt.verify_audit(run_id)
    assert not verdict.ok and verdict.broken_at == 2
