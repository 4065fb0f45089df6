"""Long context on the embedded model: sinks + window vs dense, cold KV tiers, and the speed remedies.

Sections (all by default, `--sections ppl,decode,kvquant,speed`):
  ppl      perplexity on a long English text (Debian's license texts, /usr/share/common-licenses)
           past the trained context: dense (within the context only), window only, window + sinks
  decode   decode ms/token with 1k..64k tokens of context, dense vs window + sinks. The context's
           KV is filled with random values instead of a real prefill (a 64k-token prefill takes
           hours here); a decode step's cost depends on how many keys it reads, not their values
  kvquant  KV bytes per token and perplexity change with the cold tier at int8 and int4 (the
           last `--hot` tokens fp32, older blocks quantized KIVI-style), vs fp32 KV on the same text
  speed    speculative decoding (bench/speculative.py) and the -fast variant vs the plain engine
           and llama.cpp (bench/fast_variant.py), run as their own benches; `--peers reuse` reads
           their last results from bench/results/ instead of running them again

    python bench/long_context.py                      # everything, ~25 min on 2 threads
    python bench/long_context.py --sections ppl --tokens 16384   # re-measure one section (merged into --out)
    python bench/long_context.py --update-readme
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# distinct texts first; the GPL-2 / MPL-1.1 / LGPL-3 tail (partly like earlier ones, but thousands of
# tokens away, out of any window's reach) takes the text past 4x the embedded model's 8,192 context
LICENSES = ("GPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "LGPL-2.1", "Artistic", "CC0-1.0", "GPL-1", "BSD",
            "GPL-2", "MPL-1.1", "LGPL-3")
RESULTS = ROOT / "bench" / "results"


def long_text(tokenizer, n: int) -> list[int]:
    text = "\n\n".join((Path("/usr/share/common-licenses") / name).read_text() for name in LICENSES)
    ids = tokenizer.encode(text)
    if len(ids) < n:
        raise SystemExit(f"the license texts give {len(ids)} tokens, fewer than --tokens {n}")
    return ids[:n]


def section_ppl(engine, ids: list[int], context: int, window: int) -> dict:
    from mainspring.engine.kv_policy import KVPolicy
    from mainspring.engine.perplexity import perplexity

    out = {"tokens": len(ids), "context": context, "window": window, "sinks": 4}
    t = time.perf_counter()
    dense = perplexity(engine, ids[:context], None, chunk=512, progress=True)
    out["dense_s"] = round(time.perf_counter() - t, 1)
    runs = {"dense": dense}
    for name, sinks in (("window", 0), ("sinks", 4)):
        t = time.perf_counter()
        runs[name] = perplexity(engine, ids, KVPolicy(window=window, sink_tokens=sinks), chunk=512, progress=True)
        out[f"{name}_s"] = round(time.perf_counter() - t, 1)
        out[f"{name}_peak_kv_mb"] = round(runs[name].kv_bytes_peak / 2**20, 1)
    out["dense_peak_kv_mb"] = round(dense.kv_bytes_peak / 2**20, 1)
    # scored token i predicts token i+1: [window, context-1) is where every variant has a full window
    inside, past = (window, context - 1), (context - 1, len(ids) - 1)
    for name, r in runs.items():
        out[f"{name}_ppl_inside"] = round(r.ppl(*inside), 3)
        if name != "dense":
            out[f"{name}_ppl_past"] = round(r.ppl(*past), 3)
    print(json.dumps(out), file=sys.stderr)
    return out


def section_decode(engine, lengths: list[int], window: int, steps: int) -> dict:
    import torch

    from mainspring.engine.kv_policy import KVPolicy
    from mainspring.engine.params import SamplingParams
    from mainspring.engine.scheduler import ScheduledSeq
    from mainspring.engine.sequence import Sequence

    bm, runner = engine.block_manager, engine.runner
    g = torch.Generator().manual_seed(0)
    runner.cache.normal_(0.0, 1.0, generator=g)  # real-looking numbers, no NaN/denormal slow paths
    rows = []
    for n in lengths:
        row = {"context": n}
        for name, policy in (("dense", None), ("sparse", KVPolicy(window=window, sink_tokens=4))):
            ids = torch.randint(100, 40000, (n,), generator=g).tolist()
            seq = Sequence(f"decode-{n}-{name}", ids, SamplingParams(), kv_policy=policy,
                           cache_salt=f"bench-{n}-{name}")
            bm.allocate(seq)
            seq.num_computed_tokens = n - 1  # "prefilled": the KV of tokens < n-1 is in the cache
            runner.apply_kv_policy([seq], bm)
            times = []
            for i in range(steps + 2):
                t = time.perf_counter()
                logits, _ = runner.execute([ScheduledSeq(seq, 1)])
                seq.num_computed_tokens += 1
                seq.append_token(int(logits[0].argmax()))
                bm.may_append(seq)
                runner.apply_kv_policy([seq], bm)
                if i >= 2:  # two warm-up steps
                    times.append(time.perf_counter() - t)
            bm.deallocate(seq)
            times.sort()
            row[f"{name}_ms"] = round(1000 * times[len(times) // 2], 2)
            row[f"{name}_keys"] = n if policy is None else min(n, window + 4)
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    return {"window": window, "steps": steps, "rows": rows}


def section_kvquant(loaded, ids: list[int], hot: int, threads: int) -> dict:
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.kv_policy import KVPolicy, KVPolicyConfig
    from mainspring.engine.kv_quant import ColdKVStore
    from mainspring.engine.perplexity import perplexity

    out = {"tokens": len(ids), "hot_tokens": hot, "rows": []}
    base = None
    for bits in (None, 8, 4):
        policy_cfg = KVPolicyConfig(cold_bits=bits) if bits else None
        eng = LLMEngine(loaded, EngineConfig(kv_cache_mb=512, threads=threads, kv_policy=policy_cfg))
        policy = KVPolicy(hot_tokens=hot) if bits else None
        t = time.perf_counter()
        r = perplexity(eng, ids, policy, chunk=32, progress=True)
        c = loaded.config
        fp32 = ColdKVStore.fp32_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads, c.head_dim)
        per_token = eng.runner.cold_store.bytes_per_token() if bits else fp32
        row = {"kv": f"int{bits}" if bits else "fp32", "ppl": round(r.ppl(), 4), "cold_bytes_per_token": per_token,
               "cold_ratio": round(fp32 / per_token, 2), "kv_mb_at_end": round(r.kv_bytes_peak / 2**20, 1),
               "seconds": round(time.perf_counter() - t, 1)}
        if base is None:
            base = row["ppl"]
        row["ppl_change_pct"] = round(100 * (row["ppl"] / base - 1), 3)
        row["effective_ratio"] = round(out["rows"][0]["kv_mb_at_end"] / row["kv_mb_at_end"], 2) if out["rows"] else 1.0
        print(json.dumps(row), file=sys.stderr)
        out["rows"].append(row)
        del eng
    return out


def section_speed(peers: str, threads: int) -> dict:
    out = {}
    for name, script, extra in (("speculative", "speculative.py", ["--repeats", "2"]),
                                ("fast_variant", "fast_variant.py", ["--repeats", "3"])):
        path = RESULTS / f"{name}.json"
        if peers == "run":
            print(f"running bench/{script} ...", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, str(ROOT / "bench" / script), "--threads", str(threads), *extra],
                           check=True, stdout=subprocess.DEVNULL)
        if path.exists():
            report = json.loads(path.read_text())
            report["reused"] = peers != "run"
            report["measured"] = time.strftime("%Y-%m-%d", time.gmtime(path.stat().st_mtime))
            out[name] = report
    return out


def markdown(r: dict) -> str:
    lines = []
    if "ppl" in r:
        p = r["ppl"]
        lines += [f"Perplexity on {p['tokens']:,} tokens of license text (trained context {p['context']:,}; window "
                  f"{p['window']:,}, 4 sinks):", "",
                  "| attention | ppl, tokens {w}–{c} | ppl past the context | peak KV MB |".format(
                      w=f"{p['window']:,}", c=f"{p['context']:,}"), "|---|---|---|---|",
                  f"| dense | {p['dense_ppl_inside']} | — (beyond training) | {p['dense_peak_kv_mb']} |",
                  f"| window only | {p['window_ppl_inside']} | {p['window_ppl_past']} | {p['window_peak_kv_mb']} |",
                  f"| window + sinks | {p['sinks_ppl_inside']} | {p['sinks_ppl_past']} | {p['sinks_peak_kv_mb']} |",
                  f"\nSinks vs window only past the context: {p['window_ppl_past'] / p['sinks_ppl_past']:.1f}× lower "
                  "perplexity.", ""]
    if "decode" in r:
        d = r["decode"]
        lines += [f"Decode ms/token (one sequence; KV filled with random values, window {d['window']:,} + 4 sinks):",
                  "", "| context | dense ms | sparse ms | dense / sparse |", "|---|---|---|---|"]
        for row in d["rows"]:
            lines.append(f"| {row['context']:,} | {row['dense_ms']} | {row['sparse_ms']} | "
                         f"{row['dense_ms'] / row['sparse_ms']:.2f}× |")
        lines.append("")
    if "kvquant" in r:
        q = r["kvquant"]
        lines += [f"Cold KV tier ({q['tokens']:,} tokens, last {q['hot_tokens']} fp32, older blocks quantized; keys "
                  "per channel, values per token, group 32):", "",
                  "| KV | bytes/token (cold) | vs fp32 | KV MB at the end | perplexity | change |",
                  "|---|---|---|---|---|---|"]
        for row in q["rows"]:
            lines.append(f"| {row['kv']} | {row['cold_bytes_per_token']:,.0f} | {row['cold_ratio']}× | "
                         f"{row['kv_mb_at_end']} ({row['effective_ratio']}×) | "
                         f"{row['ppl']} | {row['ppl_change_pct']:+.2f}% |")
        lines.append("")
    if "speed" in r:
        s = r["speed"]
        if "speculative" in s:
            for t in s["speculative"]["results"]:
                b = t["best"]
                lines.append(f"Speculative, {t['title']}: plain {b['plain']['decode_tok_s']:.1f} tok/s, n-gram "
                             f"{b['ngram']['decode_tok_s']:.1f} "
                             f"({b['ngram']['decode_tok_s'] / b['plain']['decode_tok_s']:.2f}×), "
                             "identical greedy output.")
        if "fast_variant" in s:
            by = {x["engine"]: x for x in s["fast_variant"]["results"]}
            if {"plain", "fast"} <= set(by):
                llama = by.get("llama.cpp")
                lines.append(f"-fast single-stream decode: {by['fast']['rate']:.1f} tok/s "
                             f"vs plain {by['plain']['rate']:.1f} "
                             f"({by['fast']['rate'] / by['plain']['rate']:.2f}×)"
                             + (f" vs llama.cpp {llama['rate']:.1f} ({by['fast']['rate'] / llama['rate']:.2f}×)."
                                if llama else "."))
        lines.append("(speed rows from bench/speculative.py and bench/fast_variant.py, "
                     + ("reused from " + s.get("speculative", {}).get("measured", "?")
                        if any(v.get("reused") for v in s.values()) else "run now") + ")")
    lines.append(f"\n{r['threads']} threads, load average {r['loadavg_start']} → {r['loadavg_end']}; `{r['command']}`")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="ppl,decode,kvquant,speed")
    ap.add_argument("--tokens", type=int, default=32768, help="text length for ppl (default 4x the context)")
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--lengths", default="1024,4096,16384,65536")
    ap.add_argument("--steps", type=int, default=12, help="decode steps timed per context length")
    ap.add_argument("--quant-tokens", type=int, default=4096)
    ap.add_argument("--hot", type=int, default=128, help="fp32 tokens of the cold-tier runs")
    ap.add_argument("--peers", choices=("run", "reuse", "skip"), default="run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS / "long_context.json"))
    ap.add_argument("--update-readme", action="store_true", help="write the table from --out into README.md")
    args = ap.parse_args()
    if args.update_readme:
        sys.path.insert(0, str(ROOT / "bench"))
        from readme_table import write_table

        write_table("long_context", args.out, markdown)
        return
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(args.threads)
    from mainspring.config import get_settings
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.kv_quant import ColdKVStore
    from mainspring.engine.loader import load_model

    s = get_settings()
    loaded = load_model(s.model, s.cache_dir)
    sections = args.sections.split(",")
    report = {"threads": args.threads, "loadavg_start": round(os.getloadavg()[0], 2), "model": loaded.name}
    out_path = Path(args.out)
    if set(sections) != {"ppl", "decode", "kvquant", "speed"} and out_path.exists():
        # one section re-measured: keep the others' last figures, and say so in the command line
        previous = json.loads(out_path.read_text())
        report = {**previous, **report, "merged_from": previous.get("command")}
    lengths = [int(x) for x in args.lengths.split(",")]
    if "ppl" in sections or "decode" in sections:
        # the largest dense context decides the pool: 64k tokens x 46 KB
        c = loaded.config
        need_tokens = max(lengths + [c.max_position_embeddings]) + 1024
        per_token = ColdKVStore.fp32_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads, c.head_dim)
        mb = need_tokens * per_token // 2**20 + 64
        engine = LLMEngine(loaded, EngineConfig(kv_cache_mb=mb, threads=args.threads))
        if "ppl" in sections:
            ids = long_text(loaded.tokenizer, args.tokens)
            report["ppl"] = section_ppl(engine, ids, loaded.config.max_position_embeddings, args.window)
        if "decode" in sections:
            report["decode"] = section_decode(engine, lengths, args.window, args.steps)
        del engine
    if "kvquant" in sections:
        report["kvquant"] = section_kvquant(loaded, long_text(loaded.tokenizer, args.quant_tokens),
                                            args.hot, args.threads)
    if "speed" in sections and args.peers != "skip":
        report["speed"] = section_speed(args.peers, args.threads)
    report["loadavg_end"] = round(os.getloadavg()[0], 2)
    report["command"] = "python bench/long_context.py " + " ".join(sys.argv[1:])
    if report.get("merged_from"):
        report["command"] += f"` merged into `{report['merged_from']}"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(markdown(report))


if __name__ == "__main__":
    main()
