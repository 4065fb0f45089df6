"""Many runs at once (SQLite and Postgres): no "database is locked", no lost or duplicated event, exact side effects."""

import asyncio
import logging

from tests.agents.conftest import TERMINAL, CountTool, PolicyModel, make_runtime, spec, wait_status

RUNS, CALLS = 50, 2


def test_fifty_concurrent_runs(tmp_path, db_url, caplog):
    tool = CountTool(tmp_path / "ledger", delay_s=0.05)
    rt = make_runtime(tmp_path, db_url, PolicyModel(calls=CALLS), {"count": tool})
    rt.put_agent(spec())
    runs = [rt.start_run("tester", f"job {i}") for i in range(RUNS)]

    async def main():
        await rt.start()
        try:
            peak = 0
            while len(rt.worker.loops) or not all(r.status in TERMINAL for r in map(rt.run, [x.id for x in runs])):
                peak = max(peak, len(rt.worker.loops))
                await asyncio.sleep(0.05)
            return peak, [await wait_status(rt, r.id, TERMINAL) for r in runs]
        finally:
            await rt.stop()

    with caplog.at_level(logging.WARNING):
        peak, done = asyncio.run(main())
    assert "database is locked" not in caplog.text and "failed" not in caplog.text
    assert [r.status for r in done] == ["succeeded"] * RUNS
    assert peak >= RUNS // 2  # they really ran side by side
    keys = (tmp_path / "ledger").read_text().split()
    assert len(keys) == len(set(keys)) == RUNS * CALLS
    all_ids = []
    for run in runs:
        events = rt.events(run.id)
        types = [e.type for e in events]
        all_ids += [e.id for e in events]
        assert types[:2] == ["run.created", "run.claimed"] and types[-1] == "run.finished"
        assert types.count("step.completed") == CALLS + 1 and types.count("tool.finished") == CALLS
        assert types.count("tool.started") == CALLS
        assert [e.id for e in events] == sorted(e.id for e in events)
        assert rt.verify_audit(run.id).ok
    assert len(all_ids) == len(set(all_ids))
