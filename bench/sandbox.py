"""Sandbox cost: start-up overhead of one job, and throughput of many short jobs, against plain processes.

Start-up: `python3 -c pass` (and `/bin/true`) run N times, interleaved, once as a plain subprocess and once
through Sandbox.run with every layer (slot uid, cgroups, tmpfs workspace, bwrap, seccomp, Landlock shim);
medians and the difference. Throughput: 100 short Python jobs, 8 at a time, both ways.

    python bench/sandbox.py [--runs 20] [--jobs 100] [--update-readme]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from readme_table import write_table  # noqa: E402

from mainspring.config import Settings  # noqa: E402
from mainspring.sandbox import Sandbox  # noqa: E402

PYTHON = "/usr/bin/python3"
SHORT_JOB = "print(sum(i * i for i in range(20000)))"


def startup(sandbox: Sandbox, runs: int) -> list[dict]:
    rows = []
    for label, argv, profile in [("python3 -c pass", [PYTHON, "-c", "pass"], "python"),
                                 ("/bin/true", ["/bin/true"], "shell")]:
        plain, boxed = [], []
        for _ in range(runs):  # interleaved so drift in machine load hits both alike
            t = time.perf_counter()
            subprocess.run(argv, check=True)
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            result = sandbox.run(argv, profile=profile)
            boxed.append(time.perf_counter() - t)
            assert result.ok, result.stderr
        p, b = statistics.median(plain) * 1000, statistics.median(boxed) * 1000
        rows.append({"job": label, "plain_ms": round(p, 1), "sandbox_ms": round(b, 1), "extra_ms": round(b - p, 1)})
        print(f"{label:18} plain {p:7.1f} ms   sandbox {b:7.1f} ms   extra {b - p:6.1f} ms", flush=True)
    return rows


async def throughput(sandbox: Sandbox, jobs: int, concurrency: int) -> dict:
    gate = asyncio.Semaphore(concurrency)

    async def plain_one() -> None:
        async with gate:
            proc = await asyncio.create_subprocess_exec(PYTHON, "-c", SHORT_JOB, stdout=subprocess.DEVNULL)
            assert await proc.wait() == 0

    t = time.perf_counter()
    await asyncio.gather(*(plain_one() for _ in range(jobs)))
    plain_s = time.perf_counter() - t
    t = time.perf_counter()
    results = await asyncio.gather(*(sandbox.arun([PYTHON, "-c", SHORT_JOB]) for _ in range(jobs)))
    boxed_s = time.perf_counter() - t
    assert all(r.ok and r.stdout.strip() == str(sum(i * i for i in range(20000))) for r in results)
    row = {"jobs": jobs, "concurrency": concurrency, "plain_jobs_per_s": round(jobs / plain_s, 1),
           "sandbox_jobs_per_s": round(jobs / boxed_s, 1), "ratio": round(plain_s / boxed_s, 2)}
    print(f"{jobs} jobs x{concurrency}: plain {row['plain_jobs_per_s']} jobs/s, sandbox {row['sandbox_jobs_per_s']} "
          f"jobs/s ({row['ratio']}x)", flush=True)
    return row


def markdown(report: dict) -> str:
    lines = ["| job | plain | sandboxed | extra |", "|---|---|---|---|"]
    for r in report["startup"]:
        lines.append(f"| start-up, `{r['job']}` (median of {report['runs']}) | {r['plain_ms']} ms | "
                     f"{r['sandbox_ms']} ms | +{r['extra_ms']} ms |")
    t = report["throughput"]
    lines.append(f"| {t['jobs']} short Python jobs, {t['concurrency']} at a time | {t['plain_jobs_per_s']} jobs/s | "
                 f"{t['sandbox_jobs_per_s']} jobs/s | {t['ratio']}× of plain |")
    lines.append(f"\n{os.cpu_count()} cores, load average {report['loadavg_1m']} at the end; "
                 f"layers: {report['layers']}; `{report['command']}`")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sandbox.json"))
    ap.add_argument("--update-readme", action="store_true", help="write the table from --out into README.md")
    args = ap.parse_args()
    if args.update_readme:
        write_table("sandbox", args.out, markdown)
        return
    sandbox = Sandbox(Settings(sandbox_slots=args.concurrency))
    sandbox.prepare()
    host = sandbox.host
    layers = ", ".join(filter(None, [
        "slot uid" if host.is_root else None, f"cgroups ({sandbox.cgroups.describe()})",
        f"bwrap {'.'.join(map(str, host.bwrap_version))}", "seccomp",
        f"Landlock ABI {host.landlock_abi}" if host.landlock_abi else None]))
    report = {"runs": args.runs, "startup": startup(sandbox, args.runs),
              "throughput": asyncio.run(throughput(sandbox, args.jobs, args.concurrency)),
              "layers": layers, "loadavg_1m": round(os.getloadavg()[0], 2),
              "command": "python bench/sandbox.py " + " ".join(sys.argv[1:])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(markdown(report))


if __name__ == "__main__":
    main()
