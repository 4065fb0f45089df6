"""Plan orchestration overhead: a 1,000-task DAG through the plan scheduler against the same DAG driven by a client
as plain runs, and how long a high-priority task waits on a full system.

The DAG has `--layers` layers of equal width; each task depends on one task of the layer before (a forest of
chains, so every layer's tasks run side by side). Every task is one run whose model answers at once (TEST-ONLY
scripted policy): the time is the runtime's and the scheduler's own. The peer drives the same DAG without plans:
it starts each layer's runs through the same runtime, at most --slots at once (a new one as one ends), waits
for the layer, then starts the next. Both keep the same number of runs in flight. Then preemption latency:
with every slot held by a slow low-priority task, a high-priority plan is created; the time until its run
exists, and until it finishes. Last, deadlock detection latency: plans of three tasks that wait for each
other's messages in a ring; the time from the ring closing until the scheduler records the deadlock.

    python bench/orchestration.py [--tasks 1000] [--layers 10] [--slots 16] [--update-readme]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from readme_table import write_table  # noqa: E402

from mainspring.agents.plans.spec import PlanSpec  # noqa: E402
from mainspring.agents.runtime import AgentRuntime  # noqa: E402
from mainspring.agents.spec import AgentSpec  # noqa: E402
from mainspring.config import Settings  # noqa: E402
from mainspring.engine.outputs import Usage  # noqa: E402
from mainspring.models import ChatModel, Completion, ToolCall  # noqa: E402

TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")


class Instant(ChatModel):
    """TEST-ONLY: answers at once; "slow" in the instructions makes each answer take `slow_s`."""

    model = "instant"

    def __init__(self, slow_s: float = 0.0) -> None:
        self.slow_s = slow_s

    async def chat(self, messages, **kwargs):
        if self.slow_s and "slow" in (messages[0].get("content") or ""):
            await asyncio.sleep(self.slow_s)
        return Completion("done", [], "stop", Usage(10, 0, 2), self.model)

    async def stream(self, messages, **kwargs):  # pragma: no cover
        raise NotImplementedError


class Waiter(ChatModel):
    """TEST-ONLY: an agent whose instructions are "wait X" first waits for a message from task X, then answers."""

    model = "instant"

    async def chat(self, messages, **kwargs):
        system = messages[0].get("content") or ""
        if system.startswith("wait ") and kwargs.get("tools") and not any(m["role"] == "tool" for m in messages):
            call = ToolCall("w", "wait_for_message", json.dumps({"sender": system.split()[1]}))
            return Completion("", [call], "tool_calls", Usage(10, 0, 2), self.model)
        return Completion("done", [], "stop", Usage(10, 0, 2), self.model)

    async def stream(self, messages, **kwargs):  # pragma: no cover
        raise NotImplementedError


async def deadlock_latency(rt: AgentRuntime, rounds: int) -> dict:
    """`rounds` plans of three tasks waiting on each other in a ring: from the moment the ring closes (the last
    of its three waits opens) until the scheduler has recorded the deadlock, as the database times them."""
    from sqlalchemy import func, select

    from mainspring.agents.plans.tables import DeadlockRow, PlanWaitRow
    from mainspring.store.db import session

    for name, target in (("wa", "b"), ("wb", "c"), ("wc", "a")):
        rt.put_agent(AgentSpec(name=name, model="instant", instructions=f"wait {target}",
                               tools=["wait_for_message"]))
    latencies = []
    for _ in range(rounds):
        plan = await asyncio.to_thread(rt.plans.create, PlanSpec(goal="ring", tasks=[
            {"id": k, "agent": f"w{k}", "prompt": "x", "on_failure": "fail"} for k in "abc"]))
        await wait_plan(rt, plan.id)
        with session(rt.db, readonly=True) as s:
            closed = s.scalar(select(func.max(PlanWaitRow.since)).where(PlanWaitRow.plan_id == plan.id))
            found = s.scalar(select(DeadlockRow.detected_at).where(DeadlockRow.plan_id == plan.id))
        latencies.append((found - closed).total_seconds())
    latencies.sort()
    return {"rounds": rounds, "median_ms": round(latencies[len(latencies) // 2] * 1e3, 1),
            "max_ms": round(latencies[-1] * 1e3, 1)}


def runtime(data_dir: Path, slots: int, model: ChatModel) -> AgentRuntime:
    data_dir.mkdir(parents=True, exist_ok=True)
    s = Settings(data_dir=data_dir, plan_max_running=slots)  # the workers keep their default 64 runs
    rt = AgentRuntime(s, models=lambda name, project=None: model, tools={},
                      db_url=f"sqlite:///{data_dir / 'bench.db'}")
    rt.put_agent(AgentSpec(name="w", model="instant", instructions="work", tools=[]))
    rt.put_agent(AgentSpec(name="slow", model="instant", instructions="slow work", tools=[]))
    return rt


def dag(tasks: int, layers: int) -> PlanSpec:
    width = tasks // layers
    return PlanSpec(goal="bench", tasks=[
        {"id": f"l{layer}-{i}", "agent": "w", "prompt": "x",
         "depends_on": [f"l{layer - 1}-{i}"] if layer else []}
        for layer in range(layers) for i in range(width)])


async def wait_plan(rt: AgentRuntime, plan_id: str) -> str:
    while True:
        status = (await asyncio.to_thread(rt.plans.get, plan_id)).status
        if status in TERMINAL:
            return status
        await asyncio.sleep(0.05)


async def planned(rt: AgentRuntime, spec: PlanSpec) -> float:
    t = time.perf_counter()
    plan = await asyncio.to_thread(rt.plans.create, spec)
    status = await wait_plan(rt, plan.id)
    assert status == "succeeded", status
    return time.perf_counter() - t


async def client_driven(rt: AgentRuntime, tasks: int, layers: int, slots: int) -> float:
    """Layer by layer, at most `slots` runs in flight (as the scheduler keeps), each started when one ends."""
    width = tasks // layers
    t = time.perf_counter()
    for layer in range(layers):
        todo, running = [f"l{layer}-{i}" for i in range(width)], set()
        while todo or running:
            while todo and len(running) < slots:
                running.add((await asyncio.to_thread(rt.start_run, "w", todo.pop(0))).id)
            runs = await asyncio.to_thread(lambda: {r.id: r.status for r in rt.runs(limit=width * 4)})
            running = {r for r in running if runs.get(r) not in TERMINAL}
            await asyncio.sleep(0.01)
    return time.perf_counter() - t


async def preemption(rt: AgentRuntime, slots: int) -> dict:
    low = await asyncio.to_thread(rt.plans.create, PlanSpec(goal="low", tasks=[
        {"id": f"s{i}", "agent": "slow", "prompt": "x"} for i in range(slots)]))
    while sum(t.status == "running" for t in await asyncio.to_thread(rt.plans.tasks, low.id)) < slots:
        await asyncio.sleep(0.02)
    t = time.perf_counter()
    high = await asyncio.to_thread(rt.plans.create, PlanSpec(goal="high", priority=9, tasks=[
        {"id": "urgent", "agent": "w", "prompt": "x"}]))
    while (await asyncio.to_thread(rt.plans.tasks, high.id))[0].run_id is None:
        await asyncio.sleep(0.005)
    started = time.perf_counter() - t
    await wait_plan(rt, high.id)
    finished = time.perf_counter() - t
    await wait_plan(rt, low.id)
    return {"started_s": round(started, 3), "finished_s": round(finished, 3)}


def measure(args) -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("plan", "client"):  # each on a fresh database
            rt = runtime(Path(tmp) / name, args.slots, Instant())

            async def go(rt=rt, name=name):
                await rt.start()
                try:
                    if name == "plan":
                        return await planned(rt, dag(args.tasks, args.layers))
                    return await client_driven(rt, args.tasks, args.layers, args.slots)
                finally:
                    await rt.stop()
            out[name] = asyncio.run(go())
            print(f"{name}: {out[name]:.1f} s", file=sys.stderr, flush=True)
        rt = runtime(Path(tmp) / "preempt", 2, Instant(slow_s=args.slow_s))

        async def pre():
            await rt.start()
            try:
                return await preemption(rt, 2)
            finally:
                await rt.stop()
        out["preemption"] = asyncio.run(pre())
        rt = runtime(Path(tmp) / "deadlock", 4, Waiter())

        async def ring():
            await rt.start()
            try:
                return await deadlock_latency(rt, args.deadlock_rounds)
            finally:
                await rt.stop()
        out["deadlock"] = asyncio.run(ring())
    return out


def markdown(report: dict) -> str:
    n = report["tasks"]
    plan, client = report["plan_s"], report["client_s"]
    lines = ["| DAG | plan scheduler | client-driven plain runs | plan speed (client time / plan time) |",
             "|---|---|---|---|",
             f"| {n:,} tasks, {report['layers']} layers, {report['slots']} slots | {plan:.1f} s "
             f"({n / plan:.0f} tasks/s, {plan / n * 1e3:.1f} ms per task) | {client:.1f} s "
             f"({n / client:.0f} tasks/s) | {client / plan:.2f}× |"]
    p = report["preemption"]
    lines.append(f"\nPreemption, every slot held by a slow task ({report['slow_s']} s per step): the high-priority "
                 f"task's run existed after {p['started_s']} s and finished after {p['finished_s']} s. "
                 + (f"A 3-task wait-for cycle was detected {report['deadlock']['median_ms']} ms (median of "
                    f"{report['deadlock']['rounds']}; max {report['deadlock']['max_ms']} ms) after it closed. "
                    if "deadlock" in report else "") +
                 f"{report['cpu']}, load average {report['loadavg_1m']}; `{report['command']}`")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--slow-s", type=float, default=5.0, help="each step of the slow tasks (preemption)")
    ap.add_argument("--deadlock-rounds", type=int, default=5, help="3-task wait-for rings timed")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "orchestration.json"))
    ap.add_argument("--update-readme", action="store_true")
    args = ap.parse_args()
    if args.update_readme:
        write_table("orchestration", args.out, markdown)
        return
    got = measure(args)
    from train import cpu_model

    report = {"tasks": args.tasks, "layers": args.layers, "slots": args.slots, "slow_s": args.slow_s,
              "plan_s": round(got["plan"], 2), "client_s": round(got["client"], 2), "preemption": got["preemption"],
              "deadlock": got["deadlock"],
              "cpu": cpu_model(), "loadavg_1m": round(os.getloadavg()[0], 2),
              "command": "python bench/orchestration.py " + " ".join(sys.argv[1:])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(markdown(report))


if __name__ == "__main__":
    main()
