"""Record a privacy-safe trace of an agent-like workload on the real server (bench/traces/agent.jsonl).

The server runs in-process on 127.0.0.1 with MAINSPRING_RECORD_TRACE semantics; a few agents
talk to it through the `openai` SDK, concurrently, the way a coding-agent fleet does: every call
carries the same tool definitions and long system prompt, the agent's growing history (its own
replies and tool results) and one new message. The trace is what `mainspring sim` and
bench/prompt_cache.py replay; the engine's own cached-token counts are printed next to it.

    python bench/record_trace.py [--agents 3] [--turns 6] [--max-tokens 16] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "SmolLM2-135M-Instruct"

TOOLS = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {arg: {"type": "string", "description": arg_desc}}, "required": [arg]}}}
    for name, desc, arg, arg_desc in [
        ("read_file", "Read a text file of the repository and return its contents", "path", "repository path"),
        ("run_tests", "Run the test suite, or one test file, and return the summary", "target", "test path"),
        ("search", "Search the repository for a regular expression, return matching lines", "pattern", "regex"),
        ("edit_file", "Replace one exact snippet of a file with another", "patch", "unified diff"),
    ]
]
RULES = [
    "Read the relevant files before proposing a change, and quote the lines you rely on.",
    "Keep every change minimal: one concern per edit, no drive-by refactors, no reformatting.",
    "Run the tests that cover a change before you report it as done, and report their summary.",
    "Never print secrets, tokens or credentials, even when a file you read contains them.",
    "Prefer the standard library; a new dependency needs a reason the user can check.",
    "When a test fails, read the failure, form one hypothesis, and test that hypothesis first.",
    "Write type hints on public functions and a docstring that says why, not what.",
    "Ask before deleting files, rewriting history or changing a public interface.",
]


def system_prompt(paragraphs: int = 12) -> str:
    """About 1,200 tokens of stable instructions: the shared prefix every agent sends."""
    rng = random.Random(7)
    parts = ["You are a careful software engineering agent working in a Python repository."]
    for i in range(paragraphs):
        parts.append(f"Rule {i + 1}. " + " ".join(rng.sample(RULES, 4)))
    return "\n\n".join(parts)


def observation(agent: int, turn: int) -> str:
    rng = random.Random(1000 * agent + turn)
    lines = [f"tests/test_module_{agent}.py::test_case_{k} {'PASSED' if rng.random() < 0.8 else 'FAILED'}"
             for k in range(rng.randint(6, 16))]
    return (f"Step {turn + 1} of task {agent}: here is the output of the last command.\n" + "\n".join(lines)
            + "\nWhat do you do next? Answer with one action.")


def run_agent(client, agent: int, turns: int, max_tokens: int, system: str) -> list[tuple[int, int]]:
    """One agent's conversation; returns (prompt_tokens, cached_tokens) of each call."""
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": f"Task {agent}: make the failing tests of module {agent} pass."}]
    usage = []
    for turn in range(turns):
        r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=max_tokens,
                                           temperature=0)
        details = r.usage.prompt_tokens_details
        usage.append((r.usage.prompt_tokens, details.cached_tokens if details else 0))
        msg = r.choices[0].message
        if msg.tool_calls:
            calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                   "arguments": c.function.arguments}}
                     for c in msg.tool_calls]
            messages.append({"role": "assistant", "content": msg.content or "", "tool_calls": calls})
            messages += [{"role": "tool", "tool_call_id": c["id"], "content": observation(agent, turn)}
                         for c in calls]
        else:
            messages.append({"role": "assistant", "content": msg.content or ""})
            messages.append({"role": "user", "content": observation(agent, turn)})
    return usage


def serve(app):
    """uvicorn on a free 127.0.0.1 port in a daemon thread; returns (server, port)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 120
    while not srv.started:
        if time.monotonic() > deadline:
            raise SystemExit("the server did not start")
        time.sleep(0.05)
    return srv, sock.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "traces" / "agent.jsonl"))
    args = ap.parse_args()

    import openai

    from mainspring.api.app import create_app
    from mainspring.billing.trace import read_trace
    from mainspring.config import get_settings
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.engine import LLMEngine

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        trace_tmp = Path(tmp) / "trace.jsonl"  # the recorder appends: start from an empty file
        settings = get_settings().model_copy(update={"record_trace": str(trace_tmp), "threads": args.threads,
                                                     "database_url": f"sqlite:///{tmp}/bench.db"})
        engine = AsyncLLMEngine(LLMEngine.from_settings(settings))
        srv, port = serve(create_app(settings, engine=engine))
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0, timeout=300)
        system = system_prompt()
        t0 = time.perf_counter()
        try:
            with ThreadPoolExecutor(args.agents) as pool:
                usage = [u for us in pool.map(lambda a: run_agent(client, a, args.turns, args.max_tokens, system),
                                              range(args.agents)) for u in us]
        finally:
            srv.should_exit = True
            time.sleep(0.5)
            engine.close()
        wall = time.perf_counter() - t0
        out.write_text(trace_tmp.read_text())
    trace = read_trace(out)
    prompt, cached = sum(p for p, _ in usage), sum(c for _, c in usage)
    report = {"trace": str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else str(out),
              "requests": len(trace), "agents": args.agents, "turns": args.turns, "wall_s": round(wall, 1),
              "engine_prompt_tokens": prompt, "engine_cached_tokens": cached,
              "engine_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
              "command": "python bench/record_trace.py " + " ".join(sys.argv[1:])}
    results = ROOT / "bench" / "results" / "record_trace.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(report, indent=2))
    print(f"{len(trace)} requests recorded in {wall:.1f} s → {out}; the engine served {cached:,} of {prompt:,} "
          f"prompt tokens from its prefix cache ({report['engine_hit_rate']:.1%})")


if __name__ == "__main__":
    main()
