"""Agent runtime overhead: what journaling, leases and scheduling add to each step, and steps/s at 50 runs.

A step here is one model call plus one tool call. The model and the tool answer at once (TEST-ONLY scripted
policy), so the time is the runtime's own. The peer is the same model and tool driven by a bare in-memory
loop (no database): the difference per step is the price of durability.

    python bench/agent_runtime.py [--steps 200] [--runs 50] [--update-readme]
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

from mainspring.agents.runtime import AgentRuntime  # noqa: E402
from mainspring.agents.spec import AgentLimits, AgentSpec  # noqa: E402
from mainspring.agents.tools.base import ToolContext, ToolResult  # noqa: E402
from mainspring.config import Settings  # noqa: E402
from mainspring.engine.outputs import Usage  # noqa: E402
from mainspring.models import ChatModel, Completion, ToolCall  # noqa: E402


class Policy(ChatModel):
    """TEST-ONLY: a tool call until `steps` tool results are in, then a final answer; no latency."""

    model = "policy"

    def __init__(self, steps: int):
        self.steps = steps

    async def chat(self, messages, **kwargs):
        done = sum(m["role"] == "tool" for m in messages)
        usage = Usage(10, 0, 5)
        if done < self.steps:
            return Completion("", [ToolCall(f"c{done}", "noop", "{}")], "tool_calls", usage, self.model)
        return Completion("finished", [], "stop", usage, self.model)

    async def stream(self, messages, **kwargs):
        raise NotImplementedError


class Noop:
    name, description, parameters = "noop", "does nothing", {"type": "object", "properties": {}}
    idempotent, requires_approval, timeout_s, retries = True, False, 10.0, 0

    async def call(self, args, ctx):
        return ToolResult("ok")


async def bare_loop(steps: int) -> float:
    """The peer: the same calls, history in a list, nothing durable."""
    model, tool = Policy(steps), Noop()
    messages = [{"role": "system", "content": "x"}, {"role": "user", "content": "go"}]
    t = time.perf_counter()
    while True:
        completion = await model.chat(messages, tools=[{}])
        messages.append(completion.to_message())
        if not completion.tool_calls:
            break
        for call in completion.tool_calls:
            result = await tool.call({}, ToolContext("r", call.id, call.id, Path("/tmp")))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result.content})
    return time.perf_counter() - t


async def durable(runs: int, steps: int, data_dir: Path) -> tuple[float, int]:
    settings = Settings(data_dir=data_dir, agent_max_runs=max(64, runs))
    rt = AgentRuntime(settings, models=lambda name, project=None: Policy(steps), tools={"noop": Noop()},
                      db_url=f"sqlite:///{data_dir / 'bench.db'}")
    rt.put_agent(AgentSpec(name="bench", model="policy", tools=["noop"],
                           limits=AgentLimits(max_steps=steps + 5, context_tokens=10**6)))
    ids = [rt.start_run("bench", f"job {i}").id for i in range(runs)]
    await rt.start()
    t = time.perf_counter()
    while any(rt.run(i).status not in ("succeeded", "failed") for i in ids):
        await asyncio.sleep(0.005)
    elapsed = time.perf_counter() - t
    await rt.stop()
    failed = [i for i in ids if rt.run(i).status != "succeeded"]
    assert not failed, failed
    return elapsed, sum(rt.run(i).step_count for i in ids)


def markdown(report: dict) -> str:
    s, c = report["single"], report["concurrent"]
    return "\n".join([
        "| workload | durable runtime | bare in-memory loop | overhead |", "|---|---|---|---|",
        f"| one run, {s['steps']} steps (model + tool each) | {s['durable_ms_per_step']} ms/step | "
        f"{s['bare_ms_per_step']} ms/step | +{s['overhead_ms_per_step']} ms/step |",
        f"| {c['runs']} runs at once, {c['steps_per_run']} steps each | {c['steps_per_s']} steps/s | — | — |",
        f"\nSQLite (WAL) on local disk, {os.cpu_count()} cores, load average {report['loadavg_1m']}; "
        f"`{report['command']}`"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--run-steps", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "agent_runtime.json"))
    ap.add_argument("--update-readme", action="store_true")
    args = ap.parse_args()
    if args.update_readme:
        write_table("agent_runtime", args.out, markdown)
        return
    with tempfile.TemporaryDirectory() as d:
        bare = asyncio.run(bare_loop(args.steps))
        one, steps = asyncio.run(durable(1, args.steps, Path(d) / "one"))
        many, total = asyncio.run(durable(args.runs, args.run_steps, Path(d) / "many"))
    per = one / steps * 1000
    bare_per = bare / (args.steps + 1) * 1000
    report = {
        "single": {"steps": steps, "durable_ms_per_step": round(per, 2), "bare_ms_per_step": round(bare_per, 3),
                   "overhead_ms_per_step": round(per - bare_per, 2)},
        "concurrent": {"runs": args.runs, "steps_per_run": args.run_steps + 1, "steps": total,
                       "seconds": round(many, 2), "steps_per_s": round(total / many, 1)},
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "command": "python bench/agent_runtime.py " + " ".join(sys.argv[1:]),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(markdown(report))


if __name__ == "__main__":
    main()
