"""Prompt caching: time to first token with and without the prefix cache, same engine, one run.

A 2,000-token shared prefix (think: a repository map or a long system prompt) is sent once to warm
the cache; then each of N requests = prefix + its own question is timed to its first token,
once on an engine with automatic prefix caching and once on the same engine with it off.

    python bench/prompt_cache.py [--prefix 2000] [--requests 5] [--threads 2]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "prompt_cache.json"))
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
    for label, caching in (("with cache", True), ("without cache", False)):
        engine = LLMEngine(loaded, EngineConfig(enable_prefix_caching=caching, threads=args.threads))
        time_to_first_token(engine, prefix + make_tokens(loaded.tokenizer, 40, 499))  # warm-up / fill the cache
        times, cached = zip(*(time_to_first_token(engine, p) for p in prompts))
        rows[label] = {"ttft_median_s": round(statistics.median(times), 3), "ttft_min_s": round(min(times), 3),
                       "cached_tokens_median": int(statistics.median(cached))}
        print(f"{label:>14}: TTFT median {rows[label]['ttft_median_s']:.3f} s, min {rows[label]['ttft_min_s']:.3f} s, "
              f"cached tokens {rows[label]['cached_tokens_median']}", file=sys.stderr)
    speedup = rows["without cache"]["ttft_median_s"] / rows["with cache"]["ttft_median_s"]
    report = {"prefix_tokens": args.prefix, "requests": args.requests, "threads": args.threads, **rows,
              "speedup": round(speedup, 1), "command": "python bench/prompt_cache.py " + " ".join(sys.argv[1:])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"| prefix | TTFT with cache | TTFT without cache | speed-up |\n|---|---|---|---|\n"
          f"| {args.prefix:,} tokens | {rows['with cache']['ttft_median_s']:.3f} s | "
          f"{rows['without cache']['ttft_median_s']:.3f} s | {speedup:.1f}× |")


if __name__ == "__main__":
    main()
