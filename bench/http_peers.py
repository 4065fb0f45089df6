"""Mainspring's OpenAI server against vLLM's CPU build, through both OpenAI servers, one client.

Workloads (the token ids of bench/engine.py, sent as token-id prompts to /v1/completions, greedy,
exactly N new tokens: min_tokens = max_tokens, streamed so time to first token is measured):
  a  single-stream decode: 16-token prompt, 128 new tokens
  b  prefill: one 2,000-token prompt, 1 new token
  c  agent: 32 concurrent requests sharing a 1,500-token prompt, each + its own 50 tokens, 64 new
  d  the -fast variant, single stream as (a): Mainspring's `<model>-fast`; vLLM has no such
     variant, so its row is its (a) in its fastest dtype
(a) and (d) also send TTFT_SAMPLES one-token requests (the prompt with another first token each): their time to
first token is the median over those and the long one.
Servers start one at a time, never two at once (they would share the two cores), and rounds
alternate them, so a slow spell of a shared machine hits each of them. Per server: start-up time
(launch to a first completion), peak RSS summed over its process tree (vLLM runs its engine in a
child process), and the figures per workload; the table shows medians and Mainspring/peer ratios.
The client is one asyncio event loop with a connection per request (as vLLM's own serving bench): it
shares the cores with the server, and a thread per request cost four times the CPU (see complete_all).

    python bench/http_peers.py --vllm-python /work/venvs/vllm/bin/python   # setup: bench/README.md
    python bench/http_peers.py --servers mainspring --workloads a,d         # ours only
    python bench/http_peers.py --vllm-python ... --isa avx2                 # both servers capped at AVX2

`--isa avx2` is an AVX2-only proxy on a CPU with AVX-512: every server's torch, oneDNN and MKL are capped at
AVX2 (bench/engine.py's ISA_CAPS), and vLLM's own feature probes answer "no" above AVX2
(bench/isa_avx2/sitecustomize.py), so it loads its AVX2 kernels. The memory system stays this machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from engine import ISA_CAPS, workload_prompts  # noqa: E402  (the same token ids as the in-process bench)
from fast_variant import bench_prompt  # noqa: E402
from readme_table import write_table  # noqa: E402

WORKLOADS = {
    "a": dict(title="single-stream decode, 128 tokens", metric="decode tok/s"),
    "b": dict(title="prefill, 2,000-token prompt", metric="prefill tok/s"),
    "c": dict(title="agent: 32 × (1,500 shared + 50), 64 new", metric="total tok/s"),
    "d": dict(title="-fast variant, single-stream decode", metric="decode tok/s"),
}
SERVERS = ("mainspring", "vllm-fp32", "vllm-bf16")
CLIENT = "httpx.AsyncClient, one event loop"  # before 2026-12-06: httpx, one thread per request
MODEL = "smollm2"
START_TIMEOUT_S = 900  # vLLM's first start compiles its kernels for minutes


@dataclass
class Server:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen | None = None
    url: str = ""
    started_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def start(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        t = time.perf_counter()
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(self.argv + ["--port", str(port)], env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = t + START_TIMEOUT_S
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    complete(self.url, MODEL, [1, 2, 3], 1)  # a first completion: the server is ready
                    # and one through the -fast name (vLLM serves it as an alias): Mainspring builds a second engine
                    # behind it, whose first call otherwise paid its warm-up (~20 ms) inside workload (d)'s TTFT
                    complete(self.url, f"{MODEL}-fast", [1, 2, 3], 1)
                    self.started_s = time.perf_counter() - t
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not answer within {START_TIMEOUT_S} s; see {self.log}")

    def memory_mb(self) -> tuple[int, int]:
        """(peak, current) RSS summed over the server and its descendants (VmHWM, VmRSS; read before
        they exit)."""
        import psutil

        root = psutil.Process(self.proc.pid)
        peak = now = 0
        for p in [root, *root.children(recursive=True)]:
            try:
                status = dict(line.split(":", 1) for line in Path(f"/proc/{p.pid}/status").read_text().splitlines())
            except OSError:
                continue
            peak += int(status["VmHWM"].split()[0])
            now += int(status["VmRSS"].split()[0])
        return round(peak / 1024), round(now / 1024)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_server(name: str, args, model_dir: Path, logs: Path) -> Server:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), **ISA_CAPS.get(args.isa or "", {}))
    if name == "mainspring":
        env["MAINSPRING_THREADS"] = str(args.threads)
        argv = [sys.executable, "-m", "mainspring.cli", "serve", "--host", "127.0.0.1"]
        return Server(name, argv, env, logs / f"{name}.log")
    venv = Path(args.vllm_python).parent.parent
    iomp = venv / "lib" / "libiomp5.so"
    env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=f"0-{args.threads - 1}",
               VLLM_USE_AOT_COMPILE="0", **({"LD_PRELOAD": str(iomp)} if iomp.exists() else {}))
    if args.isa:  # its kernel choice reads torch.cpu's probes, which the caps above do not reach
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "bench" / f"isa_{args.isa}"),
                                                          env.get("PYTHONPATH")]))
    dtype = {"vllm-fp32": "float32", "vllm-bf16": "bfloat16"}[name]
    argv = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", MODEL, f"{MODEL}-fast", "--dtype", dtype, "--enable-prefix-caching",
            "--enable-prompt-tokens-details", "--max-model-len", "8192", "--host", "127.0.0.1"]
    return Server(name, argv, env, logs / f"{name}.log")


# -- the client: the same for every server -----------------------------------------------------
async def stream_completion(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], n: int) -> dict:
    """One streamed completion of exactly n tokens: time to first token, total time, usage."""
    body = {"model": model, "prompt": prompt, "max_tokens": n, "min_tokens": n, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}
    t = time.perf_counter()
    ttft, usage = None, None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                ttft = time.perf_counter() - t
            usage = chunk.get("usage") or usage
    total = time.perf_counter() - t
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return dict(ttft=ttft if ttft is not None else total, seconds=total,
                completion_tokens=usage["completion_tokens"], prompt_tokens=usage["prompt_tokens"],
                cached=cached)


async def _concurrently(url: str, model: str, prompts: list[list[int]], n: int) -> list[dict]:
    limits = httpx.Limits(max_connections=len(prompts), max_keepalive_connections=len(prompts))
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        return list(await asyncio.gather(*(stream_completion(client, url, model, p, n) for p in prompts)))


def complete_all(url: str, model: str, prompts: list[list[int]], n: int) -> list[dict]:
    """Every prompt at once, each its own connection, from one event loop on one thread. The client shares the
    machine's cores with the server: 32 threads of a blocking client spent ~1.3 s of CPU on workload (c) (the
    GIL passed between them for every token of every stream), an event loop ~0.3 s; vLLM's own serving bench
    drives its server the same way."""
    return asyncio.run(_concurrently(url, model, prompts, n))


def complete(url: str, model: str, prompt: list[int], n: int) -> dict:
    return complete_all(url, model, [prompt], n)[0]


TTFT_SAMPLES = 10  # extra one-token requests of workloads (a) and (d), for their TTFT median


def run_workload(url: str, w: str, tokenizer, prompt: str = "a") -> dict:
    prompts, n = bench_prompt(prompt, tokenizer) if w in ("a", "d") else workload_prompts(w, tokenizer)
    model = f"{MODEL}-fast" if w == "d" else MODEL
    t = time.perf_counter()
    outs = complete_all(url, model, prompts, n)
    elapsed = time.perf_counter() - t
    generated = sum(o["completion_tokens"] for o in outs)
    prompt_tokens = sum(o["prompt_tokens"] for o in outs)
    burst = False
    if w in ("a", "d"):  # decode rate: tokens after the first over the time after the first
        o = outs[0]
        # a server that sends the whole text at the end (or in one burst) streamed nothing to time: its rate is
        # then over the whole call, and the row says so
        burst = o["seconds"] - o["ttft"] < 0.05 * o["seconds"]
        rate = generated / o["seconds"] if burst else (generated - 1) / (o["seconds"] - o["ttft"])
    elif w == "b":
        rate = prompt_tokens / outs[0]["ttft"]
    else:
        rate = (prompt_tokens + generated) / elapsed
    ttfts = sorted(o["ttft"] for o in outs)
    if w in ("a", "d"):  # one request's time to first token swings ±20 ms: the median of TTFT_SAMPLES more
        # one-token requests, each prompt's first token another (so no prefix of it is cached)
        first = prompts[0]
        ttfts = sorted([ttfts[0], *(complete(url, model, [(first[0] + 1 + i) % 32000, *first[1:]], 1)["ttft"]
                                    for i in range(TTFT_SAMPLES))])
    return dict(workload=w, rate=round(rate, 1), seconds=round(elapsed, 2), generated=generated,
                prompt_tokens=prompt_tokens, cached=sum(o["cached"] for o in outs),
                ttft_p50_s=round(statistics.median(ttfts), 3), ttft_max_s=round(ttfts[-1], 3),
                **({"burst": True} if burst else {}))


def workloads_of(server: str, wanted: list[str]) -> list[str]:
    return [w for w in wanted if not (w == "d" and server != "mainspring")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default=",".join(SERVERS))
    ap.add_argument("--workloads", default="a,b,c,d")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", choices=("a", "chat"), default="a",
                    help="of the single-stream workloads (a, d): bench/engine.py's (a), whose greedy output "
                         "loops, or bench/fast_variant.py's chat story")
    ap.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON", ""),
                    help="the python of vLLM-CPU's own virtualenv (or VLLM_PYTHON)")
    ap.add_argument("--isa", choices=sorted(ISA_CAPS),
                    help="cap every server's instruction set (an AVX2-only proxy on an AVX-512 CPU)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "http_peers.json"))
    ap.add_argument("--update-readme", action="store_true",
                    help="write the table from --out (without running) into README.md between the bench markers")
    args = ap.parse_args()
    if args.update_readme:
        write_table("http_peers", args.out, markdown)
        return
    servers = [s for s in args.servers.split(",") if s]
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":  # the test suite's setting, inherited
        print("warning: OMP_WAIT_POLICY=PASSIVE reaches every server; it puts OpenMP threads to sleep between "
              "parallel regions and halved Mainspring's single-stream decode on AMD EPYC (18 vs 40 tok/s)",
              file=sys.stderr)
    if any(s.startswith("vllm") for s in servers) and not Path(args.vllm_python or "/nonexistent").exists():
        print("skip vLLM: give --vllm-python (its own virtualenv; bench/README.md)", file=sys.stderr)
        servers = [s for s in servers if not s.startswith("vllm")]
    wanted = [w for w in args.workloads.split(",") if w]

    from mainspring.config import get_settings
    from mainspring.engine.loader import load_model

    s = get_settings()
    loaded = load_model(s.model, s.cache_dir)  # also converts the Hugging Face folder vLLM loads
    tokenizer, model_dir = loaded.tokenizer, loaded.path
    del loaded
    logs = Path(tempfile.mkdtemp(prefix="http-peers-"))
    per: dict[tuple[str, str], list[dict]] = {}
    starts: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for name in servers:
            server = make_server(name, args, model_dir, logs)
            print(f"round {r + 1}/{args.rounds}: starting {name} ...", file=sys.stderr, flush=True)
            try:
                server.start(free_port())
                for w in workloads_of(name, wanted):
                    got = run_workload(server.url, w, tokenizer, args.prompt)
                    per.setdefault((name, w), []).append(got)
                    print(f"  {name}/{w}: {json.dumps(got)}", file=sys.stderr, flush=True)
                peak, now = server.memory_mb()
                starts.setdefault(name, []).append(dict(start_s=round(server.started_s, 1), peak_rss_mb=peak,
                                                        rss_end_mb=now))
            except (RuntimeError, httpx.HTTPError) as exc:
                print(f"  {name} failed: {exc}", file=sys.stderr)
            finally:
                server.stop()
    results = []
    for (name, _w), got in per.items():
        mid = sorted(got, key=lambda x: x["rate"])[len(got) // 2]
        results.append({**mid, "server": name, "rounds": len(got), "rates": [x["rate"] for x in got]})
    from train import cpu_model

    report = {"cpu": cpu_model(), "threads": args.threads, "prompt": args.prompt,
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"), "isa_cap": args.isa,
              "client": CLIENT,
              "loadavg_1m": round(os.getloadavg()[0], 2), "results": results,
              "servers": {n: dict(start_s=statistics.median(x["start_s"] for x in v),
                                  peak_rss_mb=max(x["peak_rss_mb"] for x in v),
                                  rss_end_mb=max(x["rss_end_mb"] for x in v)) for n, v in starts.items()},
              "logs": str(logs), "command": "python bench/http_peers.py " + " ".join(sys.argv[1:])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(markdown(report))


def markdown(report: dict) -> str:
    by = {(r["server"], r["workload"]): r for r in report["results"]}

    def cell(server: str, w: str) -> dict | None:
        return by.get((server, "a" if w == "d" and server != "mainspring" else w))

    lines = ["| workload | metric | Mainspring | vLLM fp32 | vLLM bf16 | vs fp32 | vs bf16 "
             "| TTFT p50 s (ours / fp32 / bf16) |",
             "|---|---|---|---|---|---|---|---|"]
    for w, meta in WORKLOADS.items():
        rows = [cell(s, w) for s in SERVERS]
        if not rows[0] and not any(rows[1:]) or (w == "d" and not rows[0]):
            continue
        rate = [f"{r['rate']:,.1f}{' †' if r.get('burst') else ''}" if r else "—" for r in rows]
        ours = rows[0]["rate"] if rows[0] else None
        ratio = [f"{ours / r['rate']:.2f}×" if ours and r else "—" for r in rows[1:]]
        ttft = " / ".join(f"{r['ttft_p50_s']:.2f}" if r else "—" for r in rows)
        lines.append(f"| {meta['title']} | {meta['metric']} | {' | '.join(rate)} | {' | '.join(ratio)} | {ttft} |")
    if any(r.get("burst") for r in report["results"]):
        lines.append("\n† the server sent the text in one burst at the end: the rate is over the whole call")
    if report.get("note"):
        lines.append("\n" + report["note"])
    servers = report.get("servers", {})
    if servers:
        lines.append("\n" + "; ".join(f"{n}: start-up {v['start_s']} s, RSS peak {v['peak_rss_mb']} MB, at the end "
                                      f"{v.get('rss_end_mb', '—')} MB"
                                      for n, v in servers.items()))
    per_server = {n: max(r["rounds"] for r in report["results"] if r["server"] == n)
                  for n in dict.fromkeys(r["server"] for r in report["results"])}
    if len(set(per_server.values())) == 1:
        rounds = f"median of {next(iter(per_server.values()))} alternating rounds"
    else:  # a server that failed to start in a round has fewer
        rounds = "medians of alternating rounds (" + ", ".join(f"{n}: {k}" for n, k in per_server.items()) + ")"
    lines.append(f"\nprompt {report.get('prompt', 'a')} for (a) and (d), {rounds}, "
                 f"{report['cpu']}{' capped at ' + report['isa_cap'].upper() if report.get('isa_cap') else ''}, "
                 f"{report['threads']} threads, "
                 f"OMP_WAIT_POLICY={report.get('omp_wait_policy', 'default')}, "
                 f"load average {report['loadavg_1m']} at the end; "
                 f"`{report['command']}`")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
