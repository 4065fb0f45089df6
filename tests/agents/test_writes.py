"""The journal's batched writes (mainspring/agents/writes.py; what each change writes: journal.py): two
transactions a step, each committed before what it tells of is acted on, fenced by the lease, group-committed
across runs without mixing their outcomes; and the incrementally built prompt hashes and measures exactly like a
full serialisation of it."""

import asyncio
import json

import pytest
from sqlalchemy import func, select, text

from mainspring.agents import context, journal, leases, writes
from mainspring.agents.journal import LeaseLost
from mainspring.agents.tables import EventRow, StepRow, ToolCallRow
from mainspring.agents.tools.base import openai_schema
from mainspring.engine.outputs import Usage
from mainspring.store.db import get_engine, session
from tests.agents.conftest import TERMINAL, CountTool, PolicyModel, drive, make_runtime, spec, wait_status


def journal_now(db_url, run_id):
    """What a crash right now would leave: steps and tool calls as committed."""
    with session(db_url, readonly=True) as s:
        steps = {st.seq: st.status for st in s.scalars(select(StepRow).where(StepRow.run_id == run_id))}
        calls = {c.id: (c.status, c.result_json)
                 for c in s.scalars(select(ToolCallRow).where(ToolCallRow.run_id == run_id))}
        return steps, calls


class WatchingModel(PolicyModel):
    """TEST-ONLY: checks, at each call, that its step is journaled as started and every earlier result is in."""

    def __init__(self, db_url, **kw):
        super().__init__(**kw)
        self.db_url, self.checks = db_url, []

    async def chat(self, messages, **kwargs):
        run_id = self.run_id
        steps, calls = await asyncio.to_thread(journal_now, self.db_url, run_id)
        seq = max(steps)
        self.checks.append(steps[seq] == "started" and all(s == "completed" for q, s in steps.items() if q < seq)
                           and all(st == "completed" and res for st, res in calls.values()))
        return await super().chat(messages, **kwargs)


class WatchingTool(CountTool):
    """TEST-ONLY: checks, before its effect, that its start and the step that asked for it are committed."""

    async def call(self, args, ctx):
        steps, calls = await asyncio.to_thread(journal_now, self.db_url, ctx.run_id)
        self.checks.append(calls[ctx.call_id][0] == "running" and all(s == "completed" for s in steps.values()))
        return await super().call(args, ctx)


def test_each_write_is_committed_before_it_is_acted_on_in_two_transactions_a_step(tmp_path, db_url, monkeypatch):
    groups = []
    real = writes.commit_group
    monkeypatch.setattr(writes, "commit_group", lambda db, owner, batches: groups.append(len(batches)) or
                        real(db, owner, batches))
    model = WatchingModel(db_url, calls=3)
    tool = WatchingTool(tmp_path / "ledger")
    tool.db_url, tool.checks = db_url, []
    rt = make_runtime(tmp_path, db_url, model, {"count": tool})
    rt.put_agent(spec())
    run = rt.start_run("tester", "count three times")
    model.run_id = run.id
    done = drive(rt, lambda: wait_status(rt, run.id, TERMINAL))
    assert done.status == "succeeded" and done.step_count == 4
    assert model.checks == [True] * 4 and tool.checks == [True] * 3
    # step start; then (answer + call start), (call result + next step start) for each call; then answer + end
    assert sum(groups) == 2 * 4 and rt.verify_audit(run.id).ok
    types = [e.type for e in rt.events(run.id)]
    assert types[2:7] == ["step.started", "step.completed", "tool.started", "tool.finished", "step.started"]
    assert types[-2:] == ["step.completed", "run.finished"]


def claimed(rt, db_url, goal, owner):
    run = rt.start_run("tester", goal)
    assert (run.id, False) in leases.claim(db_url, owner, 5, 30)
    return journal.load_state(db_url, run.id)


def a_step(state):
    batch = writes.Batch(state.run.id)
    step = journal.begin_step(batch, state, state.next_seq, "model", "0" * 64)
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "count", "arguments": "{}"}}]}
    [call] = journal.complete_model_step(batch, state, step, message, Usage(10, 0, 2), 7, {"count"})
    journal.start_call(batch, call, "{}")
    return batch


def counts(db_url, run_id):
    with session(db_url, readonly=True) as s:
        return tuple(s.scalar(select(func.count()).select_from(t).where(t.run_id == run_id))
                     for t in (StepRow, ToolCallRow, EventRow))


def test_a_worker_that_lost_its_lease_writes_nothing_and_others_in_its_group_still_commit(tmp_path, db_url):
    rt = make_runtime(tmp_path, db_url, PolicyModel(), {"count": CountTool(tmp_path / "ledger")})
    rt.put_agent(spec())
    mine, taken = claimed(rt, db_url, "mine", "w1"), claimed(rt, db_url, "taken over", "w1")
    with get_engine(db_url).begin() as conn:  # another worker took the second run over
        conn.execute(text("UPDATE runs SET lease_owner = 'w2' WHERE id = :r"), {"r": taken.run.id})
    before = counts(db_url, taken.run.id)
    with pytest.raises(LeaseLost):
        writes.commit(db_url, "w1", a_step(taken))
    assert counts(db_url, taken.run.id) == before

    outcomes = writes.commit_group(db_url, "w1", [a_step(taken), a_step(mine)])
    assert isinstance(outcomes[0], LeaseLost) and outcomes[1] is None
    assert counts(db_url, taken.run.id) == before and counts(db_url, mine.run.id)[:2] == (1, 1)
    fresh = rt.run(mine.run.id)
    assert (fresh.step_count, fresh.prompt_tokens, fresh.cost_u) == (1, 10, 7)  # the in-memory counters' twin
    assert rt.verify_audit(mine.run.id).ok and rt.verify_audit(taken.run.id).ok


def test_the_incremental_prompt_hashes_like_the_messages_the_model_saw(tmp_path, db_url):
    """input_hash and the size estimate come from cached parts; compare them with serialising everything."""
    model = PolicyModel(calls=6)
    tool = CountTool(tmp_path / "ledger")
    rt = make_runtime(tmp_path, db_url, model, {"count": tool})
    rt.put_agent(spec(context_tokens=256, keep_recent_steps=1))
    run = rt.start_run("tester", "count six times " + "with a long goal " * 20)
    done = drive(rt, lambda: wait_status(rt, run.id, TERMINAL))
    assert done.status == "succeeded"
    steps = [s for s in rt.steps(run.id) if s["kind"] == "model"]
    with session(db_url, readonly=True) as s:
        hashes = list(s.scalars(select(StepRow.input_hash).where(StepRow.run_id == run.id, StepRow.kind == "model")
                                .order_by(StepRow.seq)))
    tools = [openai_schema(tool)]
    assert len(hashes) == len(steps) == len(model.seen)
    assert hashes == [context.input_hash(seen, tools) for seen in model.seen]
    assert any(m[2]["content"].startswith("Summary of earlier steps") for m in model.seen[2:])  # it compacted

    state = journal.load_state(db_url, run.id)  # from scratch, then again from the cache: the same prompt
    first, again = context.build_prompt(state), context.build_prompt(state)
    for prompt in (first, again):
        assert prompt.tokens() == context.estimate_tokens(prompt.messages)
        assert prompt.input_hash(tools) == context.input_hash(prompt.messages, tools)
        assert json.dumps(prompt.messages) == json.dumps(context.build_messages(state))
