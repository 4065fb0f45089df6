"""Scale-out: engine replicas behind the prefix-aware router, against round-robin and one replica, in one run.

(1) routing: a multi-tenant agent trace (each tenant its own system prompt, salted per tenant as the API
    does; each agent a conversation that grows turn by turn; agents run at once, turns one after another)
    over 2 engine replicas on a local Ray cluster routed by prefix, the same 2 routed round-robin, and one
    replica with every thread. Reported: prefix-cache hit rate (cached / prompt tokens), total tokens/s
    (prompt + generated over wall time) and the median turn latency. Target: prefix routing keeps the single
    replica's hit rate; round-robin loses it.

(2) workers: agent steps per second with 1, 2 and 4 worker processes (`mainspring worker`'s runtime, with a
    scripted model and a tool that returns at once, so the time is the runtime's and the database's) on SQLite
    and on Postgres (a throwaway cluster, tests/pg.py, unless --postgres-url names one).

(3) claims: 50 processes (each a worker of its own, with its own connection) claim 300 queued runs one at a time
    on Postgres, with the product's FOR UPDATE SKIP LOCKED against plain FOR UPDATE: per-claim latency and
    claims per second.

    python bench/scaleout.py                         # every part
    python bench/scaleout.py --part routing --tenants 8 --turns 4
    python bench/scaleout.py --part workers --runs 200
    python bench/scaleout.py --part claims
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
from train import cpu_model  # noqa: E402

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


def run_workers(db: str, workers: int, runs: int, tmp: Path) -> dict:
    """Start `workers` worker processes on `db`, then queue `runs` runs; steps/s until all have finished."""
    import subprocess

    from sqlalchemy import func, select

    from mainspring.agents import journal
    from mainspring.agents.spec import AgentSpec
    from mainspring.agents.tables import RunRow, StepRow
    from mainspring.store.db import dispose_engines, init_db, session

    init_db(db)
    env = {**os.environ, "MAINSPRING_DATABASE_URL": db, "MAINSPRING_THREADS": "1", "MAINSPRING_FAST_VARIANT": "0"}
    logs = [tmp / f"worker-{i}.log" for i in range(workers)]
    procs = [subprocess.Popen([sys.executable, "-m", "tests.agents.scaleout_process", "worker", str(tmp), "0"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w")) for log in logs]
    try:
        deadline = time.monotonic() + 120
        while not all(log.exists() and "driving runs" in log.read_text() for log in logs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit("a worker did not start: " + " | ".join(log.read_text()[-500:] for log in logs))
            time.sleep(0.1)
        agent = journal.put_agent(db, AgentSpec(name="counter", model="policy", tools=["count"]))
        start = time.perf_counter()
        ids = [journal.create_run(db, agent.id, f"count {i}").id for i in range(runs)]
        while True:
            with session(db, readonly=True) as s:
                left = s.scalar(select(func.count()).select_from(RunRow)
                                .where(RunRow.id.in_(ids), RunRow.status.not_in(("succeeded", "failed"))))
            if not left:
                break
            time.sleep(0.05)
        wall = time.perf_counter() - start
        with session(db, readonly=True) as s:
            steps = s.scalar(select(func.count()).select_from(StepRow).where(StepRow.run_id.in_(ids)))
            failed = s.scalar(select(func.count()).select_from(RunRow)
                              .where(RunRow.id.in_(ids), RunRow.status != "succeeded"))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        dispose_engines()
    return {"workers": workers, "runs": runs, "steps": steps, "failed": failed, "seconds": round(wall, 2),
            "steps_per_s": round(steps / wall, 1)}


def workers_part(runs: int, counts: list[int], postgres_url: str | None) -> list[dict]:
    import tempfile

    cluster = None
    if postgres_url is None:
        sys.path.insert(0, str(ROOT))
        from tests.pg import PgCluster

        cluster = PgCluster().start()
    results = []
    try:
        for backend in ("sqlite", "postgres"):
            for n in counts:
                with tempfile.TemporaryDirectory(prefix="scaleout-") as tmp:
                    if backend == "sqlite":
                        db = f"sqlite:///{tmp}/bench.db"
                    elif cluster is not None:
                        db = cluster.url(cluster.create_database())
                    else:
                        db = postgres_url
                    print(f"workers: {n} on {backend} ...", file=sys.stderr)
                    row = {"backend": backend, **run_workers(db, n, runs, Path(tmp))}
                    print(f"  {json.dumps(row)}", file=sys.stderr)
                    results.append(row)
    finally:
        if cluster is not None:
            cluster.stop()
    return results


def _claimer(db: str, runs: int, skip_locked: bool, seed: int, claimed, empty, ready, go, out) -> None:
    """One claiming worker process: its own interpreter and one connection, as a `mainspring worker` has."""
    from sqlalchemy import create_engine, text

    from mainspring.agents import leases
    from mainspring.store import db as store_db

    store_db._engines[db] = create_engine(db, pool_size=1, max_overflow=0)
    owner = leases.new_owner()
    rng = random.Random(seed)
    latencies: list[float] = []
    with store_db.session(db, readonly=True) as s:  # connect before the clock starts
        s.execute(text("SELECT 1"))
    ready.release()
    go.wait()
    while claimed.value < runs:
        t = time.perf_counter()
        got = leases.claim(db, owner, 1, 600, skip_locked=skip_locked)
        latencies.append(time.perf_counter() - t)
        with claimed.get_lock():
            claimed.value += len(got)
        if not got:  # as a worker does between polls (0.2 s there), jittered so they do not move in step
            with empty.get_lock():
                empty.value += 1
            time.sleep(rng.uniform(0.02, 0.08))
    out.put(latencies)
    store_db.dispose_engines()


def claim_latency(db: str, workers: int, runs: int, skip_locked: bool) -> dict:
    """`workers` processes claim `runs` queued runs one at a time, pausing after a claim that found nothing; the
    latency of every claim call and claims per second from the moment all of them are connected. Processes,
    not threads: threads of one process share its interpreter lock, which on 2 cores hid the locking mode."""
    import multiprocessing as mp

    from mainspring.agents import journal
    from mainspring.agents.spec import AgentSpec
    from mainspring.store import db as store_db

    store_db.init_db(db)
    agent = journal.put_agent(db, AgentSpec(name="counter", model="policy", tools=["count"]))
    for i in range(runs):
        journal.create_run(db, agent.id, f"claim {i}")
    store_db.dispose_engines()  # no pooled connection may cross the fork
    ctx = mp.get_context("fork")
    claimed, empty = ctx.Value("i", 0), ctx.Value("i", 0)
    ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(db, runs, skip_locked, i, claimed, empty, ready, go, out))
             for i in range(workers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    start = time.perf_counter()
    go.set()
    latencies = [x for _ in procs for x in out.get()]
    wall = time.perf_counter() - start
    for p in procs:
        p.join()
    lat = sorted(latencies)
    return {"skip_locked": skip_locked, "workers": workers, "runs": claimed.value, "seconds": round(wall, 2),
            "claims_per_s": round(claimed.value / wall, 1), "p50_ms": round(lat[len(lat) // 2] * 1e3, 1),
            "p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 1), "empty_claims": empty.value}


def claims_part(workers: int, runs: int, postgres_url: str | None) -> list[dict]:
    cluster = None
    if postgres_url is None:
        sys.path.insert(0, str(ROOT))
        from tests.pg import PgCluster

        cluster = PgCluster().start()
    results = []
    try:
        for skip in (True, False):
            db = cluster.url(cluster.create_database()) if cluster is not None else postgres_url
            print(f"claims: {workers} workers, {'SKIP LOCKED' if skip else 'plain FOR UPDATE'} ...", file=sys.stderr)
            row = claim_latency(db, workers, runs, skip)
            print(f"  {json.dumps(row)}", file=sys.stderr)
            results.append(row)
    finally:
        if cluster is not None:
            cluster.stop()
    return results


def claims_markdown(rows: list[dict]) -> list[str]:
    lines = ["| claiming on Postgres 15 | claims/s | p50 claim | p99 claim | claims that found nothing |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {'FOR UPDATE SKIP LOCKED' if r['skip_locked'] else 'plain FOR UPDATE'}, {r['workers']} "
                     f"workers, {r['runs']} runs | {r['claims_per_s']:,.0f} | {r['p50_ms']} ms | {r['p99_ms']} ms | "
                     f"{r.get('empty_claims', '—')} |")
    return lines


def workers_markdown(rows: list[dict]) -> list[str]:
    counts = sorted({r["workers"] for r in rows})
    by = {(r["backend"], r["workers"]): r for r in rows}
    lines = ["| database | " + " | ".join(f"{n} worker{'s' if n > 1 else ''}" for n in counts) + " |",
             "|---|" + "---|" * len(counts)]
    for backend in ("sqlite", "postgres"):
        cells = []
        for n in counts:
            r = by.get((backend, n))
            cells.append("—" if r is None else f"{r['steps_per_s']:,.0f} steps/s"
                         + (f" ({r['failed']} failed)" if r["failed"] else ""))
        lines.append(f"| {'SQLite' if backend == 'sqlite' else 'Postgres 15'} | " + " | ".join(cells) + " |")
    return lines


def markdown(report: dict) -> str:
    rows = report.get("routing") or []
    if not rows:
        lines = []
    else:
        lines = routing_markdown(rows)
    if report.get("workers"):
        if lines:
            lines.append("")
        lines += workers_markdown(report["workers"])
        lines.append("")
        w = report["workers"][0]
        lines.append(f"Agent steps (journaled model and tool steps) per second, {w['runs']} runs of "
                     f"{w['steps'] // w['runs']} steps per configuration (scripted model, a tool that returns at "
                     "once), worker processes of 1 thread each, from the first run queued to the last finished.")
    if report.get("claims"):
        lines += ["", *claims_markdown(report["claims"])]
    lines.append("")
    for part, m in report["measured_on"].items():  # parts may be rerun alone, on another machine
        trace = f"; trace: {report.get('trace', '')}" if part == "routing" else ""
        lines.append(f"- {part}: {m['cpu']}, {report['threads']} threads in all, load average "
                     f"{m['load_average']:.2f} at the end{trace}; `{m['command']}`")
    return "\n".join(lines)


def machine(command: str) -> dict:
    return {"cpu": cpu_model(), "load_average": round(os.getloadavg()[0], 2), "command": command}


def routing_markdown(rows: list[dict]) -> list[str]:
    base = next(r for r in rows if r["replicas"] == 1)
    lines = ["| configuration | hit rate | total tok/s | vs one replica | median turn s | requests per replica |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        spread = " / ".join(str(v) for v in r["per_replica"].values())
        lines.append(f"| {r['config']} | {r['hit_rate']:.1%} | {r['total_tok_s']:,.0f} | "
                     f"{r['total_tok_s'] / base['total_tok_s']:.2f}× | {r['turn_p50_s']:.2f} | {spread} |")
    return lines


def routing_part(args) -> tuple[list[dict], str]:
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
    return results, (f"{args.tenants} tenants x {args.agents} agents x {args.turns} turns, "
                     f"{args.system_tokens}-token system prompts, {args.user_tokens}-token user turns, "
                     f"{args.new_tokens} new tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("all", "routing", "workers", "claims"), default="all",
                    help="one part; the others keep their saved results")
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--agents", type=int, default=2, help="agents per tenant")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--system-tokens", type=int, default=640)
    ap.add_argument("--user-tokens", type=int, default=40)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2, help="threads in all: one replica gets them all, two split them")
    ap.add_argument("--runs", type=int, default=200, help="(2) runs per configuration")
    ap.add_argument("--workers", default="1,2,4", help="(2) worker process counts")
    ap.add_argument("--postgres-url", default=None, help="(2) an empty Postgres database; default: a throwaway "
                    "cluster (needs Debian's postgresql-15)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scaleout.json"))
    ap.add_argument("--update-readme", action="store_true", help="only render the saved results into the docs")
    args = ap.parse_args()
    if args.update_readme:
        write_table("scaleout", args.out, markdown)
        return
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() and args.part != "all" else {}
    measured = report.setdefault("measured_on", {})
    if "cpu" in report:  # results saved before parts recorded their own machine: all parts then shared one
        for part in ("routing", "workers", "claims"):
            if part in report:
                measured.setdefault(part, {"cpu": report["cpu"], "load_average": report["load_average"],
                                           "command": report["command"]})
        for key in ("cpu", "load_average", "command"):
            report.pop(key)
    command = "python bench/scaleout.py " + " ".join(sys.argv[1:])
    if args.part in ("all", "routing"):
        report["routing"], report["trace"] = routing_part(args)
        measured["routing"] = machine(command)
    if args.part in ("all", "workers"):
        report["workers"] = workers_part(args.runs, [int(n) for n in args.workers.split(",")], args.postgres_url)
        measured["workers"] = machine(command)
    if args.part in ("all", "claims"):
        report["claims"] = claims_part(50, 300, args.postgres_url)
        measured["claims"] = machine(command)
    report["threads"] = args.threads
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(markdown(report))


if __name__ == "__main__":
    main()
