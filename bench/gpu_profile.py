"""Where a step's time goes on CUDA: bench/engine.py's workloads (a) and (c) under torch.profiler, on the
configured model (MAINSPRING_MODEL; bench/gpu_check.sh makes a random-weights one where nothing can be
downloaded). Prints, per workload, the wall time per engine step, the GPU's busy share of it, and the top ops
by CPU and by CUDA time; writes the same as JSON.

    python bench/gpu_profile.py [--out engine_cuda_profile.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from engine import workload_prompts  # noqa: E402


def profile(engine, prompts, max_new: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from mainspring.engine.params import SamplingParams

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    params = SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True)
    engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm kernels
    steps = 0
    for p in prompts:
        engine.add_request(p, params)
    with torch_profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        sync()
        t = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
            steps += 1
        sync()
        wall = time.perf_counter() - t
    events = prof.key_averages()
    cuda_total = sum(e.self_device_time_total for e in events) / 1e6
    by_cpu = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
    by_cuda = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:15]
    return {"steps": steps, "wall_s": round(wall, 3), "ms_per_step": round(1000 * wall / steps, 2),
            "gpu_busy_share": round(cuda_total / wall, 3),
            "top_cpu": [(e.key, round(e.self_cpu_time_total / 1e3, 1), e.count) for e in by_cpu],
            "top_cuda": [(e.key, round(e.self_device_time_total / 1e3, 1), e.count) for e in by_cuda]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="engine_cuda_profile.json")
    ap.add_argument("--workloads", default="a,c")
    args = ap.parse_args()
    from mainspring.config import get_settings
    from mainspring.engine.engine import LLMEngine

    engine = LLMEngine.from_settings(get_settings())
    report = {}
    for w in args.workloads.split(","):
        prompts, max_new = workload_prompts(w, engine.tokenizer)
        report[w] = profile(engine, prompts, max_new)
        r = report[w]
        print(f"workload {w}: {r['steps']} steps, {r['ms_per_step']} ms/step, GPU busy {r['gpu_busy_share']:.0%}")
        for title in ("top_cpu", "top_cuda"):
            print(f"  {title} (op, ms, calls):")
            for row in r[title][:10]:
                print(f"    {row[0][:60]:60s} {row[1]:10.1f} {row[2]:8d}")
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
