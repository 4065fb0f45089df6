"""Prompt caching: time to first token with and without the prefix cache, same engine, one run.

A 2,000-token shared prefix (think: a repository map or a long system prompt) is sent once to warm
the cache; then each of N requests = prefix + its own question is timed to its first token,
once on an engine with automatic prefix caching and once on the same engine with it off.

Then the recorded agent trace (bench/traces/agent.jsonl, from bench/record_trace.py) is replayed
by the cost simulator under this server's cache policy (kv_blocks, with the engine's real KV
capacity) and price sheet: token-weighted hit rate, input-cost and total-cost reduction vs no cache.

    python bench/prompt_cache.py [--prefix 2000] [--requests 5] [--threads 2] [--trace FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from engine import make_tokens  # noqa: E402  (same synthetic text as bench/engine.py)


def time_to_first_token(engine, prompt: list[int]) -> tuple[float, int]:
    from mainspring.engine.params import SamplingParams

    t = time.perf_counter()
    rid = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1))
    cached = 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid and out.token_ids:
                cached = out.usage.cached_tokens
    return time.perf_counter() - t, cached


def trace_economics(trace: Path, capacity_tokens: int) -> dict:
    """The simulator's verdict on a recorded trace, under this server's policy and price sheet."""
    from mainspring.billing.cache_replay import policy
    from mainspring.billing.prices import load_price_sheet
    from mainspring.billing.simulator import simulate
    from mainspring.billing.trace import read_trace
    from mainspring.config import get_settings

    requests = read_trace(trace)
    sheet = load_price_sheet(get_settings().prices_file or None)
    sim = simulate(requests, [policy("kv_blocks", capacity_tokens=capacity_tokens)], sheet,
                   scenarios=("no_cache", "cache"))
    r = sim.get("cache", "kv_blocks")
    out = {"trace": str(trace.relative_to(ROOT)) if trace.is_relative_to(ROOT) else str(trace),
           "requests": len(requests), "policy": "kv_blocks", "kv_capacity_tokens": capacity_tokens,
           "price_sheet_version": sheet.version, "input_tokens": r.totals.input_total,
           "cache_read_tokens": r.totals.cache_read, "hit_rate": round(r.hit_rate, 4),
           "input_cost_reduction_x": round(r.input_factor, 2), "total_cost_reduction_x": round(r.total_factor, 2),
           "input_cost_saved": round(1 - 1 / r.input_factor, 4), "total_cost_saved": round(1 - 1 / r.total_factor, 4)}
    recorded = ROOT / "bench" / "results" / "record_trace.json"
    if recorded.exists():  # what the engine itself reported while the trace was recorded
        rec = json.loads(recorded.read_text())
        if rec.get("trace") == out["trace"]:
            out["engine_hit_rate_when_recorded"] = rec.get("engine_hit_rate")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "prompt_cache.json"))
    ap.add_argument("--trace", default=str(ROOT / "bench" / "traces" / "agent.jsonl"),
                    help="recorded trace to replay with the cost simulator")
    args = ap.parse_args()

    import torch

    from mainspring.config import get_settings
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.loader import load_model

    torch.set_num_threads(args.threads)
    s = get_settings()
    loaded = load_model(s.model, s.cache_dir)
    prefix = make_tokens(loaded.tokenizer, args.prefix, 7)
    prompts = [prefix + make_tokens(loaded.tokenizer, 40, 500 + i) for i in range(args.requests)]
    rows = {}
    capacity = 0
    for label, caching in (("with cache", True), ("without cache", False)):
        engine = LLMEngine(loaded, EngineConfig(enable_prefix_caching=caching, threads=args.threads))
        time_to_first_token(engine, prefix + make_tokens(loaded.tokenizer, 40, 499))  # warm-up / fill the cache
        if caching:
            capacity = engine.block_manager.num_blocks * engine.config.block_size
        times, cached = zip(*(time_to_first_token(engine, p) for p in prompts))
        rows[label] = {"ttft_median_s": round(statistics.median(times), 3), "ttft_min_s": round(min(times), 3),
                       "cached_tokens_median": int(statistics.median(cached))}
        print(f"{label:>14}: TTFT median {rows[label]['ttft_median_s']:.3f} s, min {rows[label]['ttft_min_s']:.3f} s, "
              f"cached tokens {rows[label]['cached_tokens_median']}", file=sys.stderr)
    speedup = rows["without cache"]["ttft_median_s"] / rows["with cache"]["ttft_median_s"]
    report = {"prefix_tokens": args.prefix, "requests": args.requests, "threads": args.threads, **rows,
              "speedup": round(speedup, 1), "command": "python bench/prompt_cache.py " + " ".join(sys.argv[1:])}
    econ = trace_economics(Path(args.trace), capacity) if Path(args.trace).exists() else None
    if econ is not None:
        report["trace_economics"] = econ
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"| prefix | TTFT with cache | TTFT without cache | speed-up |\n|---|---|---|---|\n"
          f"| {args.prefix:,} tokens | {rows['with cache']['ttft_median_s']:.3f} s | "
          f"{rows['without cache']['ttft_median_s']:.3f} s | {speedup:.1f}× |")
    if econ is None:
        print(f"(no trace at {args.trace}: record one with bench/record_trace.py)", file=sys.stderr)
        return
    measured = econ.get("engine_hit_rate_when_recorded")
    print(f"\n| trace (kv_blocks, price sheet {econ['price_sheet_version']}) | requests | hit rate | input cost | "
          f"total cost |\n|---|---|---|---|---|\n| {econ['trace']} | {econ['requests']} | {econ['hit_rate']:.1%}"
          f"{f' (engine: {measured:.1%})' if measured is not None else ''} | "
          f"−{econ['input_cost_saved']:.1%} ({econ['input_cost_reduction_x']:.2f}×) | "
          f"−{econ['total_cost_saved']:.1%} ({econ['total_cost_reduction_x']:.2f}×) |")


if __name__ == "__main__":
    main()
