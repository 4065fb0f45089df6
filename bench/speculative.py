"""Speculative decoding: decode tokens/s of plain vs n-gram (prompt lookup) vs draft-model
(layer-skipped self-draft) decoding, greedy, one sequence, on the embedded model.

Tasks:
  edit  input-grounded: "rename a variable" in a ~450-token Python file; the 135M model replies with
        the file copied back (largely without the rename: that is the model's skill, not the engine's)
  free  free generation: a short story
Every configuration must produce token-identical output (asserted). Runs are interleaved and
repeated (the machine is shared); the table shows the best run of each, the JSON every run.

    python bench/speculative.py                     # 2 threads, 2 repeats
    python bench/speculative.py --repeats 3 --tasks edit
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CODE = '''def summarize(records, threshold):
    total = 0
    count = 0
    largest = None
    for record in records:
        value = record["value"]
        if value < threshold:
            continue
        total += value
        count += 1
        if largest is None or value > largest:
            largest = value
    average = total / count if count else 0.0
    return {"total": total, "count": count, "average": average, "largest": largest}


def format_report(summary, title):
    lines = [title, "=" * len(title)]
    lines.append(f"total:   {summary['total']:.2f}")
    lines.append(f"count:   {summary['count']}")
    lines.append(f"average: {summary['average']:.2f}")
    if summary["largest"] is not None:
        lines.append(f"largest: {summary['largest']:.2f}")
    return "\\n".join(lines)


def load_records(path):
    records = []
    with open(path) as f:
        for line in f:
            name, value = line.strip().split(",")
            records.append({"name": name, "value": float(value)})
    return records


def main(path, threshold=10.0):
    records = load_records(path)
    summary = summarize(records, threshold)
    print(format_report(summary, "Report for " + path))


def filter_by_name(records, prefix):
    selected = []
    for record in records:
        if record["name"].startswith(prefix):
            selected.append(record)
    return selected


def write_records(records, path):
    with open(path, "w") as f:
        for record in records:
            f.write(record["name"] + "," + str(record["value"]) + "\\n")
'''

TASKS = {
    "edit": dict(title="edit code (input-grounded)", max_tokens=480,
                 message="Rename the variable `records` to `rows` in this code. Reply with the full code only."
                         "\n\n```python\n" + CODE + "```"),
    "free": dict(title="free generation", max_tokens=256, message="Write a story about a dragon who learns to paint."),
}
CONFIGS = {"plain": None, "ngram": {"method": "ngram"}, "draft": {"method": "draft"}}


def run_one(loaded, spec: dict | None, prompt: list[int], max_tokens: int) -> dict:
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.params import SamplingParams
    from mainspring.engine.speculative import SpeculativeConfig

    engine = LLMEngine(loaded, EngineConfig(kv_cache_mb=256, speculative=SpeculativeConfig(**spec) if spec else None))
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    t0 = time.perf_counter()
    first = steps = 0.0
    out = None
    while engine.has_unfinished():
        for o in engine.step():
            out = o
            if not first and o.token_ids:
                first = time.perf_counter()
        steps += 1
    end = time.perf_counter()
    n = len(out.token_ids)
    row = dict(tokens=n, seconds=round(end - t0, 2), ttft=round(first - t0, 2), steps=int(steps),
               decode_tok_s=round((n - 1) / (end - first), 2), token_ids=out.token_ids)
    if engine.spec is not None:
        row.update(draft_tokens=engine.spec.num_draft_tokens, accepted_tokens=engine.spec.num_accepted_tokens)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "speculative.json"))
    ap.add_argument("--update-readme", action="store_true", help="write the table from --out into README.md")
    args = ap.parse_args()
    if args.update_readme:
        sys.path.insert(0, str(ROOT / "bench"))
        from readme_table import write_table

        write_table("speculative", args.out, markdown)
        return
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # 2 threads on a shared machine (engine notes §4)
    import torch

    torch.set_num_threads(args.threads)
    from mainspring.config import get_settings
    from mainspring.engine.loader import load_model

    s = get_settings()
    loaded = load_model(s.model, s.cache_dir)
    tok = loaded.tokenizer
    load_start = os.getloadavg()[0]
    results = []
    for task in args.tasks.split(","):
        t = TASKS[task]
        prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": t["message"]}]))
        runs: dict[str, list[dict]] = {c: [] for c in args.configs.split(",")}
        for rep in range(args.repeats):
            for name in runs:
                row = run_one(loaded, CONFIGS[name], prompt, t["max_tokens"])
                runs[name].append(row)
                print(f"{task} {name} #{rep}: {row['decode_tok_s']} tok/s, {row['tokens']} tokens, "
                      f"load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
        reference = runs["plain"][0]["token_ids"] if "plain" in runs else None
        for name, rows in runs.items():
            for row in rows:
                assert reference is None or row["token_ids"] == reference, f"{task}/{name}: output differs from plain"
        best = {name: max(rows, key=lambda r: r["decode_tok_s"]) for name, rows in runs.items()}
        results.append(dict(
            task=task, title=t["title"], prompt_tokens=len(prompt), output_tokens=best[next(iter(best))]["tokens"],
            identical=True, sample=tok.decode(reference[:60]) if reference else "",
            runs={name: [{k: v for k, v in r.items() if k != "token_ids"} for r in rows]
                  for name, rows in runs.items()},
            best={name: {k: v for k, v in r.items() if k != "token_ids"} for name, r in best.items()},
        ))
    report = dict(threads=args.threads, repeats=args.repeats, loadavg_1m_start=round(load_start, 2),
                  loadavg_1m_end=round(os.getloadavg()[0], 2), model=loaded.name,
                  configs={k: v for k, v in CONFIGS.items() if k in args.configs.split(",")},
                  command="python bench/speculative.py " + " ".join(sys.argv[1:]), results=results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(markdown(report))


def markdown(report: dict) -> str:
    names = list(report["configs"])
    head = ("| task | prompt / output tokens | " + " | ".join(f"{n} tok/s" for n in names)
            + " | acceptance (ngram / draft) |")
    lines = [head, "|" + "---|" * (len(names) + 3)]
    for r in report["results"]:
        b = r["best"]
        base = b.get("plain", {}).get("decode_tok_s")
        cells = []
        for n in names:
            v = b[n]["decode_tok_s"]
            cells.append(f"{v:.1f}" + (f" ({v / base:.2f}×)" if base and n != "plain" else ""))
        acc = " / ".join(f"{b[n]['accepted_tokens']}/{b[n]['draft_tokens']}" for n in names if "draft_tokens" in b[n])
        lines.append(f"| {r['title']} | {r['prompt_tokens']} / {r['output_tokens']} | {' | '.join(cells)} | {acc} |")
    lines.append(f"\nGreedy, 1 sequence, {report['threads']} threads, best of {report['repeats']} interleaved runs; "
                 f"outputs token-identical across configurations (asserted). Load average "
                 f"{report['loadavg_1m_start']} → {report['loadavg_1m_end']}; `{report['command']}`")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
