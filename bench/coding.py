"""The coding minibench through a real server process: the repository map first in the prompt (the product's
layout) against the task first, with the embedded model, and with an upstream model when one is configured.

Each layout runs `mainspring code bench --layout L --json` against the same server: every task an ordinary
coding run driven by the server's worker, its diff judged by the hidden-test harness. Reported per layout:
resolved rate, pass@1, prompt / cached / completion tokens, the prefix-cache hit rate, the input cost (list
prices of the model's sheet: uncached input + cached input) per task, and wall time per task. The figure of
merit is the input cost of task-first over map-first: the map and the instructions are the same for every turn
of a run, so with the map first every turn after the first reads them from the prefix cache; with the task first
the per-task text comes before them and only the instructions' tokens can be shared across tasks.

    python bench/coding.py                                  # the embedded model, all 15 tasks, both layouts
    python bench/coding.py --tasks spans-1,moneykit-1
    python bench/coding.py --upstream-model gpt-4.1-mini    # also a model the server reaches upstream
                                                            # (MAINSPRING_UPSTREAMS configured in the env)
    python bench/coding.py --replay                         # also the gold trajectories, replayed

An upstream is any OpenAI-compatible server listed in MAINSPRING_UPSTREAMS_FILE and priced in MAINSPRING_PRICES_FILE
(the bench reads its prices from that sheet). Offline, a second `mainspring serve --port 8477` on its own data dir
stands in for one: list it as `{name: loopback, base_url: http://127.0.0.1:8477/v1, models: [{name: gpt-4.1-mini,
upstream_name: SmolLM2-135M-Instruct}]}`; the runs then go through the upstream proxy, its usage and cached tokens
as the upstream reports them (the figures are the embedded model's, under another name).

`--replay` adds what a model that works in several turns would cost, which the one-turn embedded model cannot
show: each task's gold fix as a fixed trajectory (run_tests, view_file, one edit_file per hunk of the gold patch,
run_tests), its tool calls scripted (so every task resolves in both layouts) while every turn's prompt
is prefilled by the server's engine (max_tokens 1), so the prompt and cached token counts are the engine's own.
Those runs are driven in this process, on their own database, against the same server.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from http_peers import Server, free_port  # noqa: E402
from readme_table import write_table  # noqa: E402
from train import cpu_model  # noqa: E402

LAYOUTS = ("map_first", "task_first")
REPLAY = "gold trajectories, replayed"


def gold_edits(patch: str) -> list[tuple[str, str, str]]:
    """(file, search, replace) per hunk of a unified diff: the hunk's old lines and its new lines."""
    edits: list[tuple[str, str, str]] = []
    path, old, new = None, [], []

    def flush() -> None:
        if path is not None and (old or new):
            edits.append((path, "".join(old), "".join(new)))
    for line in patch.splitlines(keepends=True):
        if line.startswith("+++ "):
            flush()
            path, old, new = line[4:].strip().removeprefix("b/"), [], []
        elif line.startswith("@@"):
            flush()
            old, new = [], []
        elif path is not None and line[:1] in (" ", "-", "+") and not line.startswith(("--- ", "diff ")):
            if line[:1] in (" ", "-"):
                old.append(line[1:])
            if line[:1] in (" ", "+"):
                new.append(line[1:])
    flush()
    return edits


def replay_calls(instance) -> list:
    from mainspring.models import ToolCall

    edits = gold_edits(instance.patch)
    calls = [ToolCall("t0", "run_tests", "{}"),
             ToolCall("v0", "view_file", json.dumps({"file": edits[0][0], "start": 1}))]
    calls += [ToolCall(f"e{i}", "edit_file", json.dumps({"file": f, "search": a, "replace": b}))
              for i, (f, a, b) in enumerate(edits)]
    return calls + [ToolCall("t1", "run_tests", "{}")]


def replay_model(url: str, model: str, instances: list):
    """A ChatModel whose answers are each task's gold trajectory and whose usage is the server's prefill of the
    very prompt (scripted answers; real tokens). The task is found by its statement, the turn by the number of
    assistant turns so far, so a retried call answers the same."""
    from mainspring.models import ChatModel, Completion
    from mainspring.models.openai_compatible import OpenAICompatibleModel

    plans = {i.problem_statement: replay_calls(i) for i in instances}
    upstream = OpenAICompatibleModel(url + "/v1", None, model=model, timeout=300)

    class Replay(ChatModel):
        async def chat(self, messages, **kwargs):
            kwargs.update(max_tokens=1, temperature=0.0)
            measured = await upstream.chat(messages, **kwargs)
            plan = plans[next(m["content"] for m in messages if m["role"] == "user")]
            turn = sum(m["role"] == "assistant" for m in messages)
            if turn >= len(plan):
                return Completion("done", [], "stop", measured.usage, model)
            return Completion("", [plan[turn]], "tool_calls", measured.usage, model)

        async def stream(self, messages, **kwargs):
            raise NotImplementedError("the runtime calls chat")

    return Replay()


def run_replay(url: str, model: str, layout: str, tasks: str | None, work: Path) -> dict:
    """The minibench with the gold trajectories replayed, in this process, on a database of its own."""
    import asyncio

    from mainspring.agents.runtime import AgentRuntime
    from mainspring.config import Settings
    from mainspring.scenarios.coding.instances import load_instances
    from mainspring.scenarios.coding.minibench import run_minibench
    from mainspring.scenarios.coding.tools import coding_tools

    instances = load_instances(ids=[t.strip() for t in tasks.split(",")] if tasks else None)
    settings = Settings(data_dir=work / f"replay-{layout}")
    runtime = AgentRuntime(settings, models=lambda name, project=None: replay_model(url, model, instances),
                           tools={t.name: t for t in coding_tools(settings)},
                           db_url=f"sqlite:///{work / f'replay-{layout}.db'}")

    async def main():
        await runtime.start()
        try:
            return await asyncio.to_thread(run_minibench, runtime, model, tasks=instances, layout=layout,
                                           max_iterations=3, max_steps=20, timeout_s=600,
                                           progress=lambda r: print(r.line(), file=sys.stderr))
        finally:
            await runtime.stop()
    return asyncio.run(main()).to_dict()


def input_usd(report: dict, prices: dict) -> float:
    """Uncached prompt tokens at the input price plus cached ones at the cached-input price (per 1M tokens)."""
    t = report["tokens"]
    uncached = t["prompt"] - t["cached"]
    return float((Decimal(uncached) * Decimal(prices["input"]) + Decimal(t["cached"]) * Decimal(
        prices["cached_input"])) / Decimal(1_000_000))


def sheet_prices(model: str) -> dict:
    """The model's standard-tier input prices on the server's sheet (MAINSPRING_PRICES_FILE, else the built-in one;
    zero for a model it does not list): an upstream model is priced only there."""
    from mainspring.billing.prices import PriceError, load_price_sheet
    from mainspring.config import get_settings

    try:
        rates = load_price_sheet(get_settings().prices_file or None).rates(model, "standard")
    except PriceError:
        return {"input": "0", "cached_input": "0"}
    return {"input": str(rates.input), "cached_input": str(rates.cached_input)}


def run_layout(env: dict, model: str, layout: str, tasks: str | None, work: Path, timeout_s: float,
               max_tokens: int) -> dict:
    argv = [sys.executable, "-m", "mainspring.cli", "code", "bench", "--model", model, "--layout", layout, "--json",
            "--trajectories", str(work / f"{model.replace('/', '_')}-{layout}.jsonl"), "--timeout", str(timeout_s),
            "--max-tokens", str(max_tokens)]
    if tasks:
        argv += ["--tasks", tasks]
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mainspring code bench exited {done.returncode}: {done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    report["bench_wall_s"] = round(time.perf_counter() - started, 1)
    print(done.stderr.strip()[-4000:], file=sys.stderr)
    return report


def summarize(report: dict, prices: dict) -> dict:
    tasks = max(1, report["attempts"])
    usd = input_usd(report, prices)
    return {"resolved": report["resolved"], "attempts": report["attempts"], "resolved_rate": report["resolved_rate"],
            "pass@1": report["pass@1"], "green": report["green"], "tokens": report["tokens"],
            "cache_hit_rate": report["cache_hit_rate"], "input_usd_per_task": usd / tasks,
            "cost_usd": report["cost_usd"], "wall_s_per_task": report["mean_wall_s_per_task"],
            "stop_reasons": sorted({r["stop_reason"] or r["status"] for r in report["results"]})}


def markdown(report: dict) -> str:
    lines = ["| model | layout | resolved | pass@1 | prompt tokens | cached | hit rate | input $ per task | "
             "wall s per task |", "|---|---|---|---|---|---|---|---|---|"]
    for model, by_layout in report["models"].items():
        for layout, r in by_layout.items():
            t = r["tokens"]
            lines.append(f"| {model} | {layout} | {r['resolved']}/{r['attempts']} | {r['pass@1']:.2f} | "
                         f"{t['prompt']:,} | {t['cached']:,} | {r['cache_hit_rate']:.1%} | "
                         f"${r['input_usd_per_task']:.7f} | {r['wall_s_per_task']:.1f} |")
    lines.append("")
    for model, by_layout in report["models"].items():
        if all(k in by_layout for k in LAYOUTS) and by_layout["map_first"]["input_usd_per_task"]:
            ratio = by_layout["task_first"]["input_usd_per_task"] / by_layout["map_first"]["input_usd_per_task"]
            lines.append(f"- {model}: task-first input costs {ratio:.2f}× map-first's per task")
    lines.append(f"- {report['cpu']}, {report['threads']} threads, load average {report['loadavg_1m_after']:.2f} "
                 f"at the end; `{report['command']}`")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=None, help="comma-separated instance ids (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per attempt")
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens per model call (an edit fits in 256)")
    ap.add_argument("--upstream-model", default=None, help="also run a model the server reaches upstream")
    ap.add_argument("--replay", action="store_true", help="also the gold trajectories replayed (see above)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "coding.json"))
    ap.add_argument("--update-readme", action="store_true", help="only render the saved results into the docs")
    args = ap.parse_args()
    if args.update_readme:
        write_table("coding", args.out, markdown)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-coding-"))
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MAINSPRING_THREADS=str(args.threads),
               MAINSPRING_DATA_DIR=str(work / "data"), MAINSPRING_HOST="127.0.0.1", MAINSPRING_PORT=str(port))
    env.pop("MAINSPRING_DATABASE_URL", None)
    server = Server("mainspring", [sys.executable, "-m", "mainspring.cli", "serve", "--host", "127.0.0.1"], env,
                    work / "server.log")
    report: dict = {"cpu": cpu_model(), "threads": args.threads, "tasks": args.tasks or "all", "models": {},
                    "command": "python bench/coding.py " + " ".join(sys.argv[1:])}
    try:
        server.start(port)
        import httpx

        embedded = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        for model in [embedded] + ([args.upstream_model] if args.upstream_model else []):
            prices = sheet_prices(model)
            report["models"][model] = {}
            for layout in LAYOUTS:
                print(f"{model} · {layout} …", file=sys.stderr)
                raw = run_layout(env, model, layout, args.tasks, work, args.timeout, args.max_tokens)
                report["models"][model][layout] = summarize(raw, prices)
        if args.replay:
            prices = sheet_prices(embedded)
            report["models"][f"{embedded}, {REPLAY}"] = {}
            for layout in LAYOUTS:
                print(f"{REPLAY} · {layout} …", file=sys.stderr)
                raw = run_replay(server.url, embedded, layout, args.tasks, work)
                report["models"][f"{embedded}, {REPLAY}"][layout] = summarize(raw, prices)
        report["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))


if __name__ == "__main__":
    main()
