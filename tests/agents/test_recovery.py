"""A worker dies mid-call; another takes the run over from the journal. Completed steps never run again;
an idempotent call re-runs under the same key (one effect); a non-idempotent one waits for a human."""

import asyncio

import pytest

from tests.agents.conftest import TERMINAL, CountTool, PolicyModel, make_runtime, spec, wait_status


def crash_mid_call(tmp_path, db_url, tool_a, tool_b):
    """Runtime A starts the run and dies inside the tool call (no journal write); runtime B recovers it."""
    a = make_runtime(tmp_path, db_url, PolicyModel(), {"count": tool_a}, agent_lease_s=0.5)
    a.put_agent(spec())
    run = a.start_run("tester", "count once")

    async def phase_a():
        await a.start()
        while not tool_a.calls:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        await a.stop()  # like kill -9: the loop is gone, the journal says "running", the lease still A's

    asyncio.run(phase_a())
    b = make_runtime(tmp_path, db_url, PolicyModel(), {"count": tool_b}, agent_lease_s=0.5)
    return a, b, run.id


def test_an_idempotent_call_is_rerun_with_its_key_and_the_effect_stays_single(tmp_path, db_url):
    ledger = tmp_path / "ledger"
    a, b, run_id = crash_mid_call(tmp_path, db_url, CountTool(ledger, delay_after_s=5),
                                  second := CountTool(ledger))
    assert ledger.read_text().split() == [f"{run_id}/1/0"]  # the effect happened before the crash

    async def phase_b():
        await b.start()
        try:
            return await wait_status(b, run_id, TERMINAL)
        finally:
            await b.stop()

    done = asyncio.run(phase_b())
    assert done.status == "succeeded" and done.attempt == 2 and len(second.calls) == 1
    assert ledger.read_text().split() == [f"{run_id}/1/0"]
    types = [e.type for e in b.events(run_id)]
    assert types.count("run.recovered") == 1 and types.count("step.completed") == 2  # no step ran twice
    assert [s["seq"] for s in b.steps(run_id)] == [1, 2]


@pytest.mark.parametrize("decision, effects", [("approve", 1), ("reject", 0)])
def test_a_non_idempotent_call_cut_off_waits_for_a_human(tmp_path, db_url, decision, effects):
    ledger = tmp_path / "ledger"
    a, b, run_id = crash_mid_call(tmp_path, db_url, CountTool(ledger, idempotent=False, delay_s=5),
                                  second := CountTool(ledger, idempotent=False))

    async def phase_b():
        await b.start()
        try:
            waiting = await wait_status(b, run_id, {"waiting_approval"})
            assert waiting.pause_reason == "in_flight" and second.calls == []
            [interrupt] = b.interrupts(run_id)
            assert interrupt.kind == "in_flight"
            b.resolve(interrupt.id, decision, actor="oncall")
            return await wait_status(b, run_id, TERMINAL)
        finally:
            await b.stop()

    done = asyncio.run(phase_b())
    assert done.status == "succeeded" and len(second.calls) == effects
    assert len(ledger.read_text().split() if ledger.exists() else []) == effects
