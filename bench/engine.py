"""Engine throughput: Mainspring vs transformers `generate()` vs llama.cpp, same model, same threads.

Workloads (token ids are built once and fed identically to every engine):
  a  single-stream decode: 16-token prompt, 128 new tokens
  b  prefill: one 2,000-token prompt, 1 new token
  c  agent: 32 requests sharing a 1,500-token system prompt, each + its own 50 tokens, 64 new tokens
Each (engine, workload) runs in a fresh process, so peak memory (max RSS) is its own. Output
tokens are forced (EOS banned) so every engine does the same work; greedy decoding throughout.

--device cuda runs Mainspring (MAINSPRING_DEVICE=cuda, bf16 unless --dtype says otherwise) and
transformers on the same GPU in the same precision; the report then names the GPU, the weights'
bytes and the device-to-device copy bandwidth measured in the same run, and gives each decode
rate as a fraction of the roofline (bandwidth / weight bytes: every decode step reads every weight).

    python bench/engine.py                       # all engines that are installed, all workloads
    python bench/engine.py --engines mainspring --workloads c
    python bench/engine.py --device cuda --engines mainspring,transformers
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from readme_table import write_table  # noqa: E402

WORKLOADS = {
    "a": dict(title="single-stream decode, 128 tokens", metric="decode tok/s"),
    "b": dict(title="prefill, 2,000-token prompt", metric="prefill tok/s"),
    "c": dict(title="agent: 32 × (1,500 shared + 50) prompt, 64 new", metric="total tok/s"),
}
ENGINES = ("mainspring", "transformers", "llama.cpp")
# --isa avx2: an AVX2-only proxy on an AVX-512 CPU, for every bench that starts children (this one, fast_variant.py,
# http_peers.py). llama.cpp's ggml is compiled for the build machine's CPU and is not capped.
ISA_CAPS = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}


def make_tokens(tokenizer, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    words = ("the agent reads a file then calls a tool and writes the result into the report while the "
             "model plans its next step with care about cost cache memory latency and the user's goal").split()
    text = " ".join(rng.choice(words) for _ in range(n * 2))
    ids = tokenizer.encode(text)
    assert len(ids) >= n
    return ids[:n]


def workload_prompts(w: str, tokenizer) -> tuple[list[list[int]], int]:
    if w == "a":
        return [make_tokens(tokenizer, 16, 1)], 128
    if w == "b":
        return [make_tokens(tokenizer, 2000, 2)], 1
    system = make_tokens(tokenizer, 1500, 3)
    return [system + make_tokens(tokenizer, 50, 100 + i) for i in range(32)], 64


# -- one engine, one workload, in this process ------------------------------------------------
def _dtype(device: str, dtype: str):
    """The torch dtype the engine runs `dtype` in on `device` (its own resolution: the peer gets the same)."""
    from mainspring.engine.placement import resolve_placement

    return resolve_placement(device, dtype).dtype


def run_mainspring(prompts, max_new, threads):
    from mainspring.config import get_settings
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.params import SamplingParams

    engine = LLMEngine.from_settings(get_settings(), threads=threads)
    params = SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True)
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - t
    return elapsed, sum(len(o.token_ids) for o in outs), sum(o.usage.cached_tokens for o in outs)


def run_transformers(prompts, max_new, threads, model_dir, device="cpu", dtype="auto"):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=_dtype(device, dtype)).eval().to(device)
    width = max(len(p) for p in prompts)
    pad = 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
                             do_sample=False, pad_token_id=pad)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t
    return elapsed, (out.shape[1] - width) * len(prompts), 0


def run_llamacpp(prompts, max_new, threads, gguf_path):
    import llama_cpp.llama_cpp as lib
    from llama_cpp import Llama

    # ggml's AMX kernels raise SIGILL where the CPU lists AMX but the VM has not enabled its
    # tile state (this machine); extra buffer types are how ggml picks them, so turn them off.
    defaults = lib.llama_model_default_params

    def no_extra_bufts():
        params = defaults()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = no_extra_bufts
    llm = Llama(model_path=str(gguf_path), n_ctx=4096, n_batch=512, n_threads=threads, n_threads_batch=threads,
                verbose=False)
    bias = {llm.token_eos(): -1e9}
    generated = 0
    t = time.perf_counter()
    for p in prompts:  # one sequence at a time; the binding reuses the longest common prompt prefix
        out = llm.create_completion(p, max_tokens=max_new, temperature=0.0, logit_bias=bias)
        generated += out["usage"]["completion_tokens"]
    elapsed = time.perf_counter() - t
    return elapsed, generated, 0


def child(engine: str, w: str, threads: int, device: str = "cpu", dtype: str = "auto") -> dict:
    from mainspring.config import get_settings
    from mainspring.engine.loader import load_model, resolve_model_path

    s = get_settings()
    loaded = load_model(s.model, s.cache_dir)
    prompts, max_new = workload_prompts(w, loaded.tokenizer)
    model_dir, gguf = loaded.path, resolve_model_path(s.model)
    del loaded
    if engine == "mainspring":
        elapsed, generated, cached = run_mainspring(prompts, max_new, threads)
    elif engine == "transformers":
        elapsed, generated, cached = run_transformers(prompts, max_new, threads, model_dir, device, dtype)
    else:
        elapsed, generated, cached = run_llamacpp(prompts, max_new, threads, gguf)
    prompt_tokens = sum(len(p) for p in prompts)
    rate = {"a": generated, "b": prompt_tokens, "c": prompt_tokens + generated}[w] / elapsed
    return dict(engine=engine, workload=w, seconds=round(elapsed, 2), prompt_tokens=prompt_tokens,
                generated=generated, cached=cached, rate=round(rate, 1),
                peak_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def available(engine: str) -> bool:
    mod = {"mainspring": "mainspring", "transformers": "transformers", "llama.cpp": "llama_cpp"}[engine]
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--workloads", default="a,b,c")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate the engines this many times per workload; the table shows medians")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda[:N]: both engines on that GPU")
    ap.add_argument("--dtype", default="auto", help="auto (fp32 on the CPU, bf16 on CUDA), fp32, bf16, fp16")
    ap.add_argument("--isa", choices=sorted(ISA_CAPS), help="cap the children's instruction set (torch, oneDNN, MKL)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine.json"))
    ap.add_argument("--update-readme", action="store_true",
                    help="write the table from --out (without running) into README.md between the bench markers")
    ap.add_argument("--child", nargs=2, metavar=("ENGINE", "WORKLOAD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child[0], args.child[1], args.threads, args.device, args.dtype)),
              flush=True)
        return
    if args.update_readme:
        write_table("engine", args.out, markdown)
        return
    engines = [e for e in args.engines.split(",") if e]
    for e in [e for e in engines if not available(e)]:
        print(f"skip {e}: not installed (pip install -e '.[bench]')", file=sys.stderr)
        engines.remove(e)
    results, runs = [], []
    for w in args.workloads.split(","):
        # engines alternate round by round, so a slow spell of a shared machine hits each of them
        per: dict[str, list[dict]] = {e: [] for e in engines}
        for r in range(args.rounds):
            for e in engines:
                env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MAINSPRING_DEVICE=args.device,
                           MAINSPRING_DTYPE=args.dtype, **ISA_CAPS.get(args.isa or "", {}))
                print(f"running {e} on workload {w} (round {r + 1}/{args.rounds}) ...", file=sys.stderr, flush=True)
                proc = subprocess.run([sys.executable, __file__, "--child", e, w, "--threads", str(args.threads),
                                       "--device", args.device, "--dtype", args.dtype],
                                      capture_output=True, text=True, env=env)
                line = next((out for out in proc.stdout.splitlines() if out.startswith("RESULT ")), None)
                if proc.returncode or line is None:
                    print(f"{e}/{w} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
                    continue
                per[e].append(json.loads(line[7:]))
                print("  " + line[7:], file=sys.stderr)
        for got in per.values():
            if got:
                runs += got
                results.append({**sorted(got, key=lambda x: x["rate"])[len(got) // 2], "rounds": len(got),
                                "rates": [x["rate"] for x in got]})
    load = os.getloadavg()
    from train import cpu_model

    gpu = gpu_facts(args.device) if args.device.startswith("cuda") else None
    if gpu is not None:
        roofline = gpu["copy_bytes_per_s"] / gpu["weight_bytes"]  # decode tok/s if a step only read the weights
        for r in results:
            if r["workload"] == "a":
                r["roofline_fraction"] = round(r["rate"] / roofline, 4)
        gpu["roofline_tok_s"] = round(roofline)
    report = {"cpu": cpu_model(), "threads": args.threads, "device": args.device, "dtype": args.dtype, "gpu": gpu,
              "isa_cap": args.isa,
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"), "loadavg_1m": round(load[0], 2),
              "results": results, "runs": runs,
              "command": "python bench/engine.py " + " ".join(sys.argv[1:])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(markdown(report))


def gpu_facts(device: str) -> dict:
    """The GPU's name, the model's weight bytes in the run's precision, and a device-to-device copy's bandwidth
    (bytes read + written per second, best of 5 copies of 2 GiB) measured here: the roofline's denominator."""
    import torch

    from mainspring.config import get_settings
    from mainspring.engine.loader import load_model

    loaded = load_model(get_settings().model, get_settings().cache_dir)
    dtype = _dtype(device, os.environ.get("MAINSPRING_DTYPE", "auto"))
    weight_bytes = sum(t.numel() for t in loaded.state_dict.values()) * torch.empty(0, dtype=dtype).element_size()
    src = torch.empty(2**30, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return {"name": torch.cuda.get_device_name(device), "weight_bytes": weight_bytes,
            "copy_bytes_per_s": round(2 * src.numel() * src.element_size() / best)}


def markdown(report: dict) -> str:
    by = {(r["engine"], r["workload"]): r for r in report["results"]}
    lines = ["| workload | metric | Mainspring | transformers | llama.cpp | vs transformers | vs llama.cpp "
             "| peak MB (ours / hf / llama.cpp) |",
             "|---|---|---|---|---|---|---|---|"]
    for w, meta in WORKLOADS.items():
        rows = [by.get((e, w)) for e in ENGINES]
        if not any(rows):
            continue
        rate = [f"{r['rate']:,.1f}" if r else "—" for r in rows]
        ours = rows[0]["rate"] if rows[0] else None
        ratio = [f"{ours / r['rate']:.2f}×" if ours and r else "—" for r in rows[1:]]
        mem = " / ".join(str(r["peak_mb"]) if r else "—" for r in rows)
        lines.append(f"| {meta['title']} | {meta['metric']} | {' | '.join(rate)} | {' | '.join(ratio)} | {mem} |")
    rounds = {w: max(r.get("rounds", 1) for r in report["results"] if r["workload"] == w)
              for w in dict.fromkeys(r["workload"] for r in report["results"])}
    if len(set(rounds.values())) > 1:
        median = "medians of alternating rounds (" + ", ".join(f"{w}: {k}" for w, k in rounds.items()) + "), "
    else:
        k = next(iter(rounds.values()), 1)
        median = f"median of {k} alternating rounds, " if k > 1 else ""
    cpu = f"{report['cpu']}, " if report.get("cpu") else ""
    if report.get("isa_cap"):
        cpu += f"capped at {report['isa_cap'].upper()} (--isa), "
    if report.get("omp_wait_policy", "default") != "default":
        cpu += f"OMP_WAIT_POLICY={report['omp_wait_policy']}, "
    gpu = report.get("gpu")
    dtype = report.get("dtype", "auto") if report.get("dtype", "auto") != "auto" else "bf16"
    fraction = by[("mainspring", "a")].get("roofline_fraction", 0) if ("mainspring", "a") in by else None
    where = (f"{gpu['name']}, {dtype}, peak MB is host memory, roofline {gpu['roofline_tok_s']:,} tok/s (copy "
             f"bandwidth / weight bytes), workload a at {fraction:.1%} of it; " if gpu and fraction is not None else "")
    lines.append(f"\n{median}{where}{cpu}{report['threads']} threads, load average {report['loadavg_1m']} at the end; "
                 f"`{report['command']}`")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
