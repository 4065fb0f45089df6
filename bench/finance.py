"""The finance eval through a real server process: the four-stage research pipeline (collect, analyse, report,
verify; every number cited and re-computed) against one long-context prompt over the same filings, on the same
questions and the same model, in one run.

    python bench/finance.py                      # 12 questions, two of each type, the embedded model
    python bench/finance.py --questions 30
    python bench/finance.py --upstream-model gpt-4.1-mini    # also a model the server reaches upstream
                                                             # (MAINSPRING_UPSTREAMS configured in the env)
    python bench/finance.py --update-readme      # only render the saved results into docs/benchmarks.md

Reported per model and method: correct answers (the answer in whole units within the question's tolerance;
"not reported" only as null), reports the verifier passed, verified claims (numbers whose citation resolves to the
same value in the period the text names), citation precision, prompt / cached tokens, list-price cost and cost per
correct answer. The long-context prompt has no citations to check: its claims columns are empty, and its filings
are cut to what fits the model's context (said in the row).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from http_peers import Server, free_port  # noqa: E402
from readme_table import write_table  # noqa: E402
from train import cpu_model  # noqa: E402

ANSWER_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer"], "properties": {
    "answer": {"type": ["number", "null"]}}}
LONG_CONTEXT = "You answer a question about company filings from the filings below. Give the answer in whole " \
               "units (dollars, shares; a ratio or growth as a percent), or null when the filings do not report it."


def filings_text(store, manifest, tickers: list[str], budget_chars: int) -> tuple[str, int]:
    """The companies' filings, newest first, page by page, until `budget_chars`: (text, filings included)."""
    ciks = {c.cik for c in manifest.companies if c.ticker in tickers}
    chosen = sorted((f for f in manifest.filings if f.cik in ciks), key=lambda f: f.filed, reverse=True)
    parts, used, included = [], 0, 0
    for f in chosen:
        pages = [store.read(f.doc_id, p) for p in range(1, store.page_count(f.doc_id) + 1)]
        body = f"## {f.doc_id} ({f.form}, filed {f.filed})\n" + "\n".join(pages)
        if used + len(body) > budget_chars:
            break
        parts.append(body)
        used += len(body)
        included += 1
    return "\n\n".join(parts), included


def run_long_context(url: str, model: str, corpus: Path, questions, context_tokens: int, cache_dir: Path) -> dict:
    import httpx

    from mainspring.billing.prices import load_price_sheet, micro_usd, rates_for
    from mainspring.scenarios.finance.corpus import load_manifest
    from mainspring.scenarios.finance.evaluate import is_correct
    from mainspring.scenarios.finance.filings import FilingsStore

    store, manifest, sheet = FilingsStore.open(corpus, cache_dir), load_manifest(corpus), load_price_sheet(None)
    budget = (context_tokens - 512) * 6  # characters; figures tokenize densely, so start high and cut on a 400
    rows, filings_used = [], []
    with httpx.Client(base_url=url, timeout=900) as client:
        for q in questions:
            for _ in range(4):  # the window is the server's to judge: a prompt it refuses as too long is cut
                text, n = filings_text(store, manifest, q.companies, budget)
                body = {"model": model, "max_tokens": 32, "temperature": 0,
                        "messages": [{"role": "system", "content": f"{LONG_CONTEXT}\n\n{text}"},
                                     {"role": "user", "content": q.question}],
                        "response_format": {"type": "json_schema",
                                            "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}}
                r = client.post("/v1/chat/completions", json=body)
                if r.status_code != 400 or n <= 1:
                    break
                budget = int(budget * 0.75)
            filings_used.append(n)
            if r.status_code >= 400:
                rows.append({"id": q.id, "correct": False, "error": r.text[:300], "prompt": 0, "cached": 0,
                             "completion": 0, "cost_u": 0})
                continue
            out = r.json()
            try:
                answer = json.loads(out["choices"][0]["message"]["content"]).get("answer")
            except (ValueError, AttributeError):
                answer = None
            u = out["usage"]
            cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            rates = rates_for(sheet, model, "standard", u["prompt_tokens"]) if model in sheet.models else None
            cost = 0 if rates is None else (micro_usd(u["prompt_tokens"] - cached, rates.input)
                                            + micro_usd(cached, rates.cached_input)
                                            + micro_usd(u["completion_tokens"], rates.output))
            rows.append({"id": q.id, "correct": is_correct(q, answer if isinstance(answer, (int, float)) else None),
                         "prompt": u["prompt_tokens"], "cached": cached, "completion": u["completion_tokens"],
                         "cost_u": cost})
    store.close()
    correct = sum(r["correct"] for r in rows)
    cost_u = sum(r["cost_u"] for r in rows)
    return {"questions": len(rows), "correct": correct, "accuracy": correct / len(rows) if rows else 0.0,
            "reports_verified": None, "correct_and_verified": None, "verified_claims_rate": None,
            "citation_precision": None,
            "prompt_tokens": sum(r["prompt"] for r in rows), "cached_tokens": sum(r["cached"] for r in rows),
            "completion_tokens": sum(r["completion"] for r in rows), "cost_usd": cost_u / 1e6,
            "cost_per_correct_usd": cost_u / 1e6 / correct if correct else None,
            "filings_in_prompt": f"{min(filings_used, default=0)}-{max(filings_used, default=0)}", "rows": rows}


def run_pipeline(url: str, model: str, corpus: Path, questions, max_tokens: int, tool_steps: int) -> dict:
    import httpx

    from mainspring.scenarios.finance.evaluate import as_rows, run_eval, summarize
    from mainspring.scenarios.finance.pipeline import put_agents

    with httpx.Client(base_url=url, timeout=120) as client:
        put_agents(client, model, max_tokens=max_tokens, tool_steps=tool_steps)
        results = run_eval(client, str(corpus), questions, progress=lambda r: print(
            f"  {r.id} {r.question_type}: {'right' if r.correct else 'wrong'}, "
            f"{'verified' if r.verified else 'unverified'} ({r.claims_ok}/{r.claims} claims) {r.error or ''}",
            file=sys.stderr))
    return {**summarize(results), "rows": as_rows(results)}


def pct(v) -> str:
    return "-" if v is None else f"{v:.0%}"


def usd(v) -> str:
    return "-" if v is None else f"${v:.6f}"


def markdown(report: dict) -> str:
    lines = ["| model | method | correct | verified reports | correct and verified | verified claims | "
             "citation precision | prompt tokens | cached | cost | cost per correct |", "|---" * 11 + "|"]
    for model, methods in report["models"].items():
        for method, r in methods.items():
            verified = "-" if r["reports_verified"] is None else f"{r['reports_verified']}/{r['questions']}"
            both = "-" if r["correct_and_verified"] is None else f"{r['correct_and_verified']}/{r['questions']}"
            label = method + (f" ({r['filings_in_prompt']} filings fit)" if "filings_in_prompt" in r else "")
            lines.append(f"| {model} | {label} | {r['correct']}/{r['questions']} | {verified} | {both} | "
                         f"{pct(r['verified_claims_rate'])} | {pct(r['citation_precision'])} | "
                         f"{r['prompt_tokens']:,} | {r['cached_tokens']:,} | {usd(r['cost_usd'])} | "
                         f"{usd(r['cost_per_correct_usd'])} |")
    lines += ["", f"- {report['questions']} questions ({report['pick']}); {report['cpu']}, {report['threads']} "
              f"threads, load average {report['loadavg_1m_after']:.2f} at the end; `{report['command']}`"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=12, help="taken from each type in turn")
    ap.add_argument("--seed", type=int, default=0, help="the corpus's seed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=512, help="per model call of a stage (at least 448)")
    ap.add_argument("--tool-steps", type=int, default=4, help="model steps of the collect stage")
    ap.add_argument("--context-tokens", type=int, default=8192, help="the model's window, for the long prompt")
    ap.add_argument("--upstream-model", default=None, help="also run a model the server reaches upstream")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "finance.json"))
    ap.add_argument("--update-readme", action="store_true", help="only render the saved results into the docs")
    args = ap.parse_args()
    if args.update_readme:
        write_table("finance", args.out, markdown)
        return
    from mainspring.scenarios.finance.corpus import generate_corpus, load_questions
    from mainspring.scenarios.finance.evaluate import pick_questions

    work = Path(tempfile.mkdtemp(prefix="bench-finance-"))
    corpus = work / "allowed" / "corpus"
    generate_corpus(corpus, args.seed)
    questions = pick_questions(load_questions(corpus), args.questions)
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MAINSPRING_THREADS=str(args.threads),
               MAINSPRING_DATA_DIR=str(work / "data"), MAINSPRING_HOST="127.0.0.1", MAINSPRING_PORT=str(port),
               MAINSPRING_AGENT_ATTACH_ROOTS=json.dumps([str(work / "allowed")]))
    env.pop("MAINSPRING_DATABASE_URL", None)
    server = Server("mainspring", [sys.executable, "-m", "mainspring.cli", "serve", "--host", "127.0.0.1"], env,
                    work / "server.log")
    report: dict = {"cpu": cpu_model(), "threads": args.threads, "questions": len(questions),
                    "pick": "each type in turn", "models": {},
                    "command": "python bench/finance.py " + " ".join(sys.argv[1:])}
    try:
        server.start(port)
        import httpx

        embedded = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        for model in [embedded] + ([args.upstream_model] if args.upstream_model else []):
            print(f"{model} · pipeline …", file=sys.stderr)
            pipeline = run_pipeline(server.url, model, corpus, questions, args.max_tokens, args.tool_steps)
            print(f"{model} · one long-context prompt …", file=sys.stderr)
            long = run_long_context(server.url, model, corpus, questions, args.context_tokens, work / "cache")
            report["models"][model] = {"pipeline": pipeline, "long-context prompt": long}
        report["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))


if __name__ == "__main__":
    main()
