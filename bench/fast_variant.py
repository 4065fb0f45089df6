"""Single-stream decode of the `-fast` variant vs the plain engine vs llama.cpp, side by side.

Workload (a) of bench/engine.py: the same 16-token prompt, 128 new tokens, greedy, EOS banned,
same thread count. Its prompt is random words from a 30-word list, and greedy continuations of it
loop, which prompt-lookup drafts predict almost perfectly; `--prompt chat` asks for a story through
the chat template instead, where drafts are accepted less often. Each engine runs in its own
process (peak memory is its own), `--repeats` times; the table shows the median rate (decode
tok/s = generated tokens / wall time of the call).

  plain      LLMEngine, fp32 weights (bf16 with --device cuda)
  int4       the -fast engine's weights (the format measured fastest on this CPU), no speculative decoding
  fast       build_fast_engine(): those weights + speculative decoding (the `-fast` model)
  llama.cpp  llama-cpp-python on the embedded Q4_1 GGUF (if `llama_cpp` imports)

    python bench/fast_variant.py                      # all, 2 threads, 3 repeats
    python bench/fast_variant.py --engines plain,fast --threads 1
    python bench/fast_variant.py --prompt chat --out bench/results/fast_variant_chat.json
    python bench/fast_variant.py --isa avx2 --out bench/results/fast_variant_avx2.json  # an AVX2-only proxy
    python bench/fast_variant.py --device cuda --engines plain,int4,fast   # on a GPU (bench/gpu_check.sh)

`--isa avx2` caps torch, oneDNN and MKL at AVX2 in the children (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA,
MKL_ENABLE_INSTRUCTIONS) on a CPU that has more: the kernels, and the kernel choice, are those of an AVX2-only
CPU; memory bandwidth and core are still this machine's, so it is a proxy, not an AVX2 machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from engine import ISA_CAPS, available, run_llamacpp, workload_prompts  # noqa: E402

ENGINES = ("plain", "int4", "fast", "llama.cpp")
CHAT = "Write a short story about a robot who learns to paint."


def bench_prompt(kind: str, tokenizer) -> tuple[list[list[int]], int]:
    if kind == "a":
        return workload_prompts("a", tokenizer)
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": CHAT}]))], 128


def build_engine(name: str, threads: int):
    from mainspring.config import get_settings
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.fast_variant import build_fast_engine

    s = get_settings().model_copy(update={"threads": threads})
    if name == "plain":
        return LLMEngine.from_settings(s)
    return build_fast_engine(s.model_copy(update={"fast_speculative": "off"}) if name == "int4" else s)


def child(name: str, threads: int, repeats: int, prompt: str) -> dict:
    from mainspring.config import get_settings
    from mainspring.engine.loader import load_model, resolve_model_path

    s = get_settings()
    loaded = load_model(s.model, s.cache_dir)
    prompts, max_new = bench_prompt(prompt, loaded.tokenizer)
    gguf = resolve_model_path(s.model)
    del loaded
    runs, tokens, extra = [], None, {}
    if name == "llama.cpp":
        for _ in range(repeats):
            elapsed, generated, _ = run_llamacpp(prompts, max_new, threads, gguf)
            runs.append(generated / elapsed)
    else:
        from mainspring.engine.params import SamplingParams

        t = time.perf_counter()
        engine = build_engine(name, threads)
        extra["startup_s"] = round(time.perf_counter() - t, 2)
        params = SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True)
        for _ in range(repeats):
            t = time.perf_counter()
            out = engine.generate(prompts, params)[0]
            runs.append(len(out.token_ids) / (time.perf_counter() - t))
            tokens = out.token_ids
        stats = engine.stats()
        if "spec_draft_tokens" in stats:
            extra["spec_acceptance"] = round(stats["spec_accepted_tokens"] / max(1, stats["spec_draft_tokens"]), 3)
        extra["speculative"] = dataclasses.asdict(engine.config.speculative) if engine.config.speculative else None
        extra["quantization"] = getattr(engine.config, "quantization", None)
        from mainspring.engine.cpu import detect

        extra["cpu_features"] = detect().summary()  # after any --isa cap
        choice = getattr(engine, "kernel_choice", None)
        if choice is not None:  # what the per-CPU measurement picked, and why
            extra["weights"], extra["weights_reason"] = choice.name, choice.reason
    return dict(engine=name, runs=[round(r, 1) for r in runs], rate=round(statistics.median(runs), 1),
                tokens=tokens, peak_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), **extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", choices=("a", "chat"), default="a",
                    help="bench/engine.py's workload a, or a chat story")
    ap.add_argument("--isa", choices=sorted(ISA_CAPS), help="cap the instruction set the children's kernels use")
    ap.add_argument("--device", help="MAINSPRING_DEVICE for the children (cuda: every engine in bf16 on the GPU; "
                    "its -fast weights are int4 on torch's CUDA kernel)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fast_variant.json"))
    ap.add_argument("--child", metavar="ENGINE", help=argparse.SUPPRESS)
    ap.add_argument("--update-readme", action="store_true", help="write the table from --out into README.md")
    args = ap.parse_args()
    if args.update_readme:
        sys.path.insert(0, str(ROOT / "bench"))
        from readme_table import write_table

        write_table("fast_variant", args.out, markdown)
        return
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.threads, args.repeats, args.prompt)), flush=True)
        return
    load_before = round(os.getloadavg()[0], 2)
    results = []
    for name in [e for e in args.engines.split(",") if e]:
        if name == "llama.cpp" and not available(name):
            print("skip llama.cpp: llama_cpp is not installed (pip install -e '.[bench]')", file=sys.stderr)
            continue
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), **ISA_CAPS.get(args.isa or "", {}))
        if args.device:
            env["MAINSPRING_DEVICE"] = args.device
        print(f"running {name} ...", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, __file__, "--child", name, "--threads", str(args.threads),
                               "--repeats", str(args.repeats), "--prompt", args.prompt],
                              capture_output=True, text=True, env=env)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode or line is None:
            print(f"{name} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        results.append(json.loads(line[7:]))
        print("  " + json.dumps({k: v for k, v in results[-1].items() if k != "tokens"}), file=sys.stderr)
    by = {r["engine"]: r for r in results}
    if "int4" in by and "fast" in by:  # speculative decoding is meant to keep int4's greedy tokens
        by["fast"]["same_tokens_as_int4"] = by["fast"]["tokens"] == by["int4"]["tokens"]
    from train import cpu_model

    report = {"cpu": cpu_model(), "device": args.device or "cpu", "prompt": args.prompt, "threads": args.threads,
              "repeats": args.repeats,
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"), "isa_cap": args.isa,
              "loadavg_1m_before": load_before,
              "loadavg_1m_after": round(os.getloadavg()[0], 2), "results": results,
              "command": "python bench/fast_variant.py " + " ".join(sys.argv[1:])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(markdown(report))


def markdown(report: dict) -> str:
    by = {r["engine"]: r for r in report["results"]}
    plain, llama = by.get("plain"), by.get("llama.cpp")
    lines = ["| engine | decode tok/s (median) | runs | vs plain | vs llama.cpp | peak MB | notes |",
             "|---|---|---|---|---|---|---|"]
    for name in ENGINES:
        r = by.get(name)
        if r is None:
            continue
        vs_plain = f"{r['rate'] / plain['rate']:.2f}×" if plain else "—"
        vs_llama = f"{r['rate'] / llama['rate']:.2f}×" if llama else "—"
        notes = []
        if r.get("spec_acceptance") is not None:
            notes.append(f"draft acceptance {r['spec_acceptance']:.0%}")
        if "same_tokens_as_int4" in r:
            notes.append("same tokens as int4" if r["same_tokens_as_int4"] else "tokens differ from int4")
        lines.append(f"| {name} | {r['rate']:,.1f} | {', '.join(map(str, r['runs']))} | {vs_plain} | {vs_llama} | "
                     f"{r['peak_mb']} | {'; '.join(notes)} |")
    cpu = f"{report['cpu']}, " if report.get("cpu") else ""
    if report.get("device", "cpu") != "cpu":
        cpu = f"on {report['device']}, host {cpu}"
    if report.get("isa_cap"):
        cpu += f"capped at {report['isa_cap'].upper()} (--isa), "
    lines.append(f"\nprompt {report.get('prompt', 'a')}, {cpu}{report['threads']} threads, "
                 f"{report['repeats']} runs each, "
                 f"load average {report['loadavg_1m_before']} before / {report['loadavg_1m_after']} after; "
                 f"`{report['command']}`")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
