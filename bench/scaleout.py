"""Scale-out: engine replicas behind the prefix-aware router, against round-robin and one replica, in one run.

(1) routing: a multi-tenant agent trace (each tenant its own system prompt, salted per tenant as the API
    does; each agent a conversation that grows turn by turn; agents run at once, turns one after another)
    over 2 engine replicas on a local Ray cluster routed by prefix, the same 2 routed round-robin, and one
    replica with every thread. Reported: prefix-cache hit rate (cached / prompt tokens), total tokens/s
    (prompt + generated over wall time) and the median turn latency. Target: prefix routing keeps the single
    replica's hit rate; round-robin loses it.

    python bench/scaleout.py                         # 4 tenants x 2 agents x 3 turns, 2 threads in all
    python bench/scaleout.py --tenants 8 --turns 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from readme_table import write_table  # noqa: E402

WORDS = ("the agent reads a file then calls a tool and writes the result into the report while the model "
         "plans its next step with care about cost cache memory latency and the user's goal").split()


def text_tokens(tokenizer, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    ids = tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(n * 2)))
    return ids[:n]


def make_trace(tokenizer, tenants: int, agents: int, system_tokens: int, user_tokens: int) -> list[dict]:
    """One entry per agent: its tenant (the cache salt), its system prompt and the user messages of its turns
    are drawn per turn in `run_trace` (seeded), so every configuration replays the same tokens."""
    out = []
    for t in range(tenants):
        system = text_tokens(tokenizer, system_tokens, 1000 + t)
        for a in range(agents):
            out.append({"tenant": f"tenant-{t}", "system": system, "agent": a, "seed": 100 * t + a,
                        "user_tokens": user_tokens})
    return out


async def run_agent(pool, tokenizer, agent: dict, turns: int, new_tokens: int) -> list[dict]:
    from mainspring.engine.params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    convo = list(agent["system"])
    rows = []
    for turn in range(turns):
        convo += text_tokens(tokenizer, agent["user_tokens"], agent["seed"] * 31 + turn)
        start = time.perf_counter()
        out = await pool.generate(convo, params, cache_salt=agent["tenant"])
        rows.append({"prompt": out.usage.prompt_tokens, "cached": out.usage.cached_tokens,
                     "completion": out.usage.completion_tokens, "seconds": time.perf_counter() - start})
        convo += out.token_ids
    return rows


def run_config(label: str, replicas: int, threads: int, policy: str, trace: list[dict], tokenizer,
               turns: int, new_tokens: int) -> dict:
    from mainspring.cluster.engine_replicas import ReplicaPool
    from mainspring.cluster.prefix_router import RouterConfig
    from mainspring.config import get_settings

    print(f"starting {label}: {replicas} replica(s) x {threads} thread(s), routing {policy} ...", file=sys.stderr)
    pool = ReplicaPool.start(get_settings(), replicas, RouterConfig(policy=policy), threads=threads)
    try:
        async def everything():
            return await asyncio.gather(*(run_agent(pool, tokenizer, a, turns, new_tokens) for a in trace))

        start = time.perf_counter()
        per_agent = asyncio.run(everything())
        wall = time.perf_counter() - start
        requests = {n: s.requests for n, s in pool.stats.items()}
    finally:
        pool.close()
    rows = [r for agent in per_agent for r in agent]
    prompt, cached = sum(r["prompt"] for r in rows), sum(r["cached"] for r in rows)
    completion = sum(r["completion"] for r in rows)
    result = {"config": label, "replicas": replicas, "threads_each": threads, "policy": policy,
              "requests": len(rows), "prompt_tokens": prompt, "cached_tokens": cached,
              "hit_rate": round(cached / prompt, 4), "seconds": round(wall, 2),
              "total_tok_s": round((prompt + completion) / wall, 1),
              "turn_p50_s": round(statistics.median(r["seconds"] for r in rows), 3), "per_replica": requests}
    print(f"  {json.dumps(result)}", file=sys.stderr)
    return result


def markdown(report: dict) -> str:
    rows = report["routing"]
    base = next(r for r in rows if r["replicas"] == 1)
    lines = ["| configuration | hit rate | total tok/s | vs one replica | median turn s | requests per replica |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        spread = " / ".join(str(v) for v in r["per_replica"].values())
        lines.append(f"| {r['config']} | {r['hit_rate']:.1%} | {r['total_tok_s']:,.0f} | "
                     f"{r['total_tok_s'] / base['total_tok_s']:.2f}× | {r['turn_p50_s']:.2f} | {spread} |")
    lines.append("")
    lines.append(f"{report['cpu']}, {report['threads']} threads in all, {report['trace']}; `{report['command']}`")
    return "\n".join(lines)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--agents", type=int, default=2, help="agents per tenant")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--system-tokens", type=int, default=640)
    ap.add_argument("--user-tokens", type=int, default=40)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2, help="threads in all: one replica gets them all, two split them")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scaleout.json"))
    ap.add_argument("--update-readme", action="store_true", help="only render the saved results into the docs")
    args = ap.parse_args()
    if args.update_readme:
        write_table("scaleout", args.out, markdown)
        return

    from mainspring.cluster import ray_cluster
    from mainspring.config import get_settings
    from mainspring.engine.loader import load_model

    s = get_settings()
    tokenizer = load_model(s.model, s.cache_dir).tokenizer
    trace = make_trace(tokenizer, args.tenants, args.agents, args.system_tokens, args.user_tokens)
    ray_cluster.connect(s.model_copy(update={"ray_address": s.ray_address or "local"}), num_cpus=args.threads)
    split = max(1, args.threads // 2)
    try:
        configs = [("one replica", 1, args.threads, "prefix"), ("2 replicas, prefix-aware", 2, split, "prefix"),
                   ("2 replicas, round-robin", 2, split, "round_robin")]
        results = [run_config(label, n, t, policy, trace, tokenizer, args.turns, args.new_tokens)
                   for label, n, t, policy in configs]
    finally:
        ray_cluster.disconnect()
    report = {"routing": results, "cpu": cpu_model(), "threads": args.threads, "load_average": os.getloadavg()[0],
              "trace": f"{args.tenants} tenants x {args.agents} agents x {args.turns} turns, "
                       f"{args.system_tokens}-token system prompts, {args.user_tokens}-token user turns, "
                       f"{args.new_tokens} new tokens",
              "command": "python bench/scaleout.py " + " ".join(sys.argv[1:])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(markdown(report))


if __name__ == "__main__":
    main()
