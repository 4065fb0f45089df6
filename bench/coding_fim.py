"""Fill-in-the-middle latency for as-you-type completion, through the HTTP API of a real server process.

Per sample: a Python file cut at a cursor, ~1,500 tokens before it (the prompt) and ~200 after it (the
suffix). A first completion opens the file (its prefix is not cached yet); then the cursor moves on (a few
characters typed, another suffix) and a second completion reuses the prefix from the prefix cache: that
second call is what an editor waits for while you type. Each completion is exactly 20 tokens
(min_tokens = max_tokens = 20), greedy, streamed; we time the first token and the whole answer. p50 over
the samples, per model variant (the standard model and its -fast variant).

The embedded SmolLM2 has no FIM tokens, so /v1/completions refuses a suffix on it. Its weights are served
here under a tokenizer with StarCoder's markers instead (three of its unused special tokens renamed, the
same trick as tests/api/test_fim.py): the compute of a 20-token FIM completion is what the model's size and
the prompt's length make it, whatever the middle says.

    python bench/coding_fim.py [--samples 10] [--threads 2] [--variants standard,fast]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from http_peers import Server, free_port  # noqa: E402  (one way to run a server process for a bench)
from train import cpu_model  # noqa: E402  (bench/train.py: the one CPU-model reader of bench/)

FIM_MARKERS = {3: "<fim_prefix>", 4: "<fim_suffix>", 5: "<fim_middle>"}  # SmolLM2's <repo_name>, <reponame>, <file_sep>
NEW_TOKENS = 20


def fim_folder(out: Path) -> Path:
    """The embedded model's converted folder with StarCoder's FIM markers in its tokenizer; weights linked."""
    from mainspring.config import get_settings
    from mainspring.engine.loader import ensure_hf_dir, resolve_model_path

    src = ensure_hf_dir(resolve_model_path("smollm2"), get_settings().cache_dir)
    dst = out / "SmolLM2-135M-Instruct"  # the embedded model's name: its price-sheet entry prices it
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            (dst / f.name).symlink_to(f)
        elif f.name != "tokenizer.json":
            shutil.copy(f, dst / f.name)
    tok = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    for added in tok["added_tokens"]:
        if added["id"] in FIM_MARKERS:
            del tok["model"]["vocab"][added["content"]]
            added["content"] = FIM_MARKERS[added["id"]]
            tok["model"]["vocab"][added["content"]] = added["id"]
    (dst / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    return dst


def source_file(seed: int, tokenizer, prefix_tokens: int, suffix_tokens: int) -> tuple[str, str]:
    """(prefix, suffix) of a synthetic Python module, each cut at a line end near its token target."""
    def functions(start: int):
        i = start
        while True:
            verb = ("scale", "clamp", "total", "ratio", "shift")[i % 5]
            yield (f"def {verb}_{seed}_{i}(values, factor={i % 7 + 1}):\n"
                   f"    \"\"\"Return the values of record {i} adjusted by factor, skipping None.\"\"\"\n"
                   f"    out = []\n    for v in values:\n        if v is None:\n            continue\n"
                   f"        out.append(v * factor + {seed + i})\n    return out\n\n\n")
            i += 1

    def take(gen, budget: int) -> str:
        text = ""
        for chunk in gen:
            if len(tokenizer.encode(text + chunk)) > budget:
                return text
            text += chunk
        return text

    prefix = "import math\nfrom dataclasses import dataclass\n\n\n" + take(functions(0), prefix_tokens - 40)
    prefix += f"def mean_{seed}(values):\n    \"\"\"The arithmetic mean of the values that are not None.\"\"\"\n    "
    suffix = "\n\n\n" + take(functions(1000), suffix_tokens)
    return prefix, suffix


def complete(url: str, model: str, prompt: str, suffix: str) -> dict:
    body = {"model": model, "prompt": prompt, "suffix": suffix, "max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    t = time.perf_counter()
    ttft, usage = None, None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                ttft = time.perf_counter() - t
            usage = chunk.get("usage") or usage
    total = time.perf_counter() - t
    return {"ttft_s": ttft if ttft is not None else total, "total_s": total, "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
            "completion_tokens": usage["completion_tokens"]}


def p50(rows: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--prefix", type=int, default=1500, help="tokens before the cursor")
    ap.add_argument("--suffix", type=int, default=200, help="tokens after the cursor")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default="standard,fast")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "coding_fim.json"))
    args = ap.parse_args()

    from mainspring.engine.fim import fim_format
    from mainspring.engine.tokenizer import Tokenizer

    work = Path(tempfile.mkdtemp(prefix="bench-fim-"))
    server = None
    try:
        folder = fim_folder(work)
        tokenizer = Tokenizer.from_dir(folder)
        fim = fim_format(tokenizer)
        assert fim is not None, "the renamed markers are StarCoder's"
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MAINSPRING_THREADS=str(args.threads),
                   MAINSPRING_MODEL=str(folder), MAINSPRING_DATA_DIR=str(work / "data"),
                   MAINSPRING_SERVE_AGENT_WORKER="false", MAINSPRING_FAST_VARIANT=str("fast" in args.variants))
        env.pop("MAINSPRING_DATABASE_URL", None)
        argv = [sys.executable, "-m", "mainspring.cli", "serve", "--host", "127.0.0.1"]
        server = Server("mainspring", argv, env, work / "server.log")
        server.start(free_port())
        name = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        report: dict = {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": args.threads,
                        "loadavg_1m_before": round(os.getloadavg()[0], 2), "model": name, "fim_family": fim.family,
                        "prefix_tokens": args.prefix, "suffix_tokens": args.suffix, "new_tokens": NEW_TOKENS,
                        "samples": args.samples, "variants": {},
                        "command": "python bench/coding_fim.py " + " ".join(sys.argv[1:])}
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        models = {v: name + ("-fast" if v == "fast" else "") for v in variants}
        for model in models.values():
            complete(server.url, model, *source_file(999, tokenizer, 200, 50))  # warm-up: kernels, allocator
        cold: dict[str, list[dict]] = {v: [] for v in variants}
        warm: dict[str, list[dict]] = {v: [] for v in variants}
        for i in range(args.samples):
            for k, variant in enumerate(variants):  # alternated, so a busy spell of the machine hits each
                prefix, suffix = source_file(i + 500 * k, tokenizer, args.prefix, args.suffix)  # a new file: cold
                cold[variant].append(complete(server.url, models[variant], prefix, suffix))
                # the cursor moved on: a few characters typed, the rest of the file after it
                warm[variant].append(complete(server.url, models[variant], prefix + "total = ", suffix[40:]))
        for variant in variants:
            c, w = cold[variant], warm[variant]
            row = {"first_call": {k: p50(c, k) for k in ("ttft_s", "total_s")},
                   "second_call": {k: p50(w, k) for k in ("ttft_s", "total_s")},
                   "second_call_total_s_all": sorted(round(r["total_s"], 3) for r in w),
                   "prompt_tokens_p50": int(statistics.median(r["prompt_tokens"] for r in w)),
                   "cached_tokens_p50": int(statistics.median(r["cached_tokens"] for r in w)),
                   "completion_tokens": sorted({r["completion_tokens"] for r in c + w})}
            report["variants"][variant] = row
            print(f"{models[variant]}: first call p50 {row['first_call']['total_s']:.3f} s, second (cached) p50 "
                  f"{row['second_call']['total_s']:.3f} s (first token {row['second_call']['ttft_s']:.3f} s), "
                  f"cached {row['cached_tokens_p50']}/{row['prompt_tokens_p50']} prompt tokens", file=sys.stderr)
        report["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    except BaseException:
        if server is not None and server.log.exists():  # the server's own account of what went wrong
            print(f"--- server log tail\n{server.log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
        raise
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"FIM, {args.prefix:,}-token prefix + {args.suffix}-token suffix, {NEW_TOKENS} new tokens, "
          f"{report['cpu']}, {args.threads} threads\n\n| variant | first call p50 | second call p50 (prefix cached) "
          f"| second call, first token | cached / prompt tokens |\n|---|---|---|---|---|")
    for variant, row in report["variants"].items():
        print(f"| {variant} | {row['first_call']['total_s']:.3f} s | {row['second_call']['total_s']:.3f} s | "
              f"{row['second_call']['ttft_s']:.3f} s | {row['cached_tokens_p50']} / {row['prompt_tokens_p50']} |")


if __name__ == "__main__":
    main()
