"""The financial-research tools, over the filings corpus attached to the run as its `docs` folder:

- `list_filings(company, form, fy)`: which filings there are;
- `get_fact(concept, company, period, unit)`: a reported value, its fact id and the filing it comes from (the
  latest filed wins; a restated value says what it superseded);
- `search_filings(query, company, period)`: passages, each with the `[D:doc p.N c.S-E]` marker that cites it;
- `read_filing(doc_id, page)`: a page with each line's character offset, so a span can be cited exactly;
- `compute(program)`: runs a FinQA-style program (programs.py) and numbers it p-1, p-2, … in the run's
  workspace (`finance/programs.jsonl`), keyed by the call's idempotency key: a crash re-run answers with the
  same id instead of taking the next;
- `verify_report(markdown)`: the verifier's verdict over the run's programs (saved as `finance/verdict.json`).

Every result's `data` carries the structured facts, spans, program or verdict, so they land in the journal and
the audit trail. Registered for every agent through the `mainspring.agent_tools` entry point (pyproject.toml).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Iterator

from pydantic import Field

from mainspring.agents.tools.base import ToolContext, ToolError, ToolResult
from mainspring.agents.tools.decorator import FunctionTool, tool
from mainspring.config import Settings, get_settings
from mainspring.scenarios.finance.filings import FilingsError, FilingsStore
from mainspring.scenarios.finance.page_text import render_with_offsets
from mainspring.scenarios.finance.programs import ProgramError, run_program
from mainspring.scenarios.finance.verify import verify_report as run_verifier

TOOL_NAMES = ("list_filings", "get_fact", "search_filings", "read_filing", "compute", "verify_report")
WORKSPACE_DIR = "finance"
PROGRAMS_FILE = "programs.jsonl"
VERDICT_FILE = "verdict.json"
LIST_LIMIT = 60


class _Stores:
    """One open store per corpus folder and manifest version in this process (the BM25 index lives in it)."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self._open: dict[tuple[str, int, int], FilingsStore] = {}
        self._lock = threading.Lock()

    def of(self, ctx: ToolContext) -> FilingsStore:
        folder = ctx.attachments.get("docs")
        if not folder:
            raise ToolError("no filings folder is attached to this run (attachment 'docs' with a manifest.json)")
        manifest = Path(os.path.realpath(folder)) / "manifest.json"
        if not manifest.is_file():
            raise ToolError(f"the attached folder {Path(folder).name!r} is not a filings corpus (no manifest.json)")
        info = manifest.stat()
        key = (str(manifest.parent), info.st_size, info.st_mtime_ns)
        with self._lock:
            if key not in self._open:
                try:
                    self._open[key] = FilingsStore.open(manifest.parent, self.cache_dir)
                except (FilingsError, ValueError) as exc:
                    raise ToolError(f"the filings corpus cannot be read: {exc}") from exc
            return self._open[key]


@contextmanager
def _workspace_lock(ctx: ToolContext) -> Iterator[Path]:
    """The run's finance folder, held against the run's other calls (one process or several)."""
    folder = Path(ctx.workspace) / WORKSPACE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load_programs(workspace: Path) -> list[dict[str, Any]]:
    """The programs this run computed, in order (p-1 first)."""
    path = Path(workspace) / WORKSPACE_DIR / PROGRAMS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _asked(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except FilingsError as exc:
        raise ToolError(str(exc.args[0] if exc.args else exc)) from None


def _money(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.4f}".rstrip("0")


def finance_tools(settings: Settings | None = None) -> list[FunctionTool]:
    settings = settings or get_settings()
    stores = _Stores(Path(settings.cache_dir))

    @tool(name="list_filings", idempotent=True, timeout_s=120)
    def list_filings(ctx: ToolContext, company: str | None = None, form: str | None = None,
                     fy: int | None = None) -> ToolResult:
        """List the filings in the attached corpus: doc id, company, form, fiscal period, dates, pages.

        Args:
            company: ticker, CIK or name; all companies when omitted
            form: 10-K, 10-Q, 10-K/A or 8-K
            fy: fiscal year the filing covers, e.g. 2023
        """
        store = stores.of(ctx)
        rows = _asked(store.list_filings, company=company, form=form, fy=fy)
        lines = [f"{f.doc_id}: {f.ticker} {f.form} FY{f.fy} {f.fp}, period ended {f.period_end}, filed {f.filed}, "
                 f"accn {f.accn}{f', amends {f.amends}' if f.amends else ''}, {store.page_count(f.doc_id)} pages"
                 for f in rows[:LIST_LIMIT]]
        more = (f"\n… and {len(rows) - LIST_LIMIT} more (narrow by company, form or fy)"
                if len(rows) > LIST_LIMIT else "")
        return ToolResult("\n".join(lines) + more if rows else "no filings match",
                          data={"filings": [asdict(f) for f in rows]})

    @tool(name="get_fact", idempotent=True, timeout_s=120)
    def get_fact(ctx: ToolContext, concept: str, company: str, period: str, unit: str | None = None) -> ToolResult:
        """A reported value: its fact id (cite it as [F:fact_id] or use it in a program as F:fact_id), value in
        whole units and the filing it comes from. The latest filed value wins over one it restated.

        Args:
            concept: e.g. us-gaap:Revenues, us-gaap:NetIncomeLoss (the prefix may be left out)
            company: ticker, CIK or name
            period: FY2023 (fiscal year), FY2023Q2 (the quarter's three months), FY2023Q2YTD (year to date);
                for a balance, the value at the period's end
            unit: USD, shares, USD/shares or pure, when the concept has several
        """
        answer = _asked(stores.of(ctx).get_fact, concept, company, period, unit)
        f = answer.fact
        text = (f"{f.fact_id}: {f.concept} {f.period} ({f.start or ''}{'..' if f.start else 'at '}{f.end}) = "
                f"{_money(f.val)} {f.unit}, from {f.doc_id or f.accn} ({f.form} filed {f.filed})")
        for old in answer.superseded:
            text += (f"\nsupersedes {old.fact_id} = {_money(old.val)} {old.unit} from {old.doc_id or old.accn} "
                     f"({old.form} filed {old.filed})")
        return ToolResult(text, data={"fact": asdict(f), "superseded": [asdict(o) for o in answer.superseded]})

    @tool(name="search_filings", idempotent=True, timeout_s=300)
    def search_filings(ctx: ToolContext, query: str, company: str | None = None, period: str | None = None,
                       k: Annotated[int, Field(ge=1, le=20)] = 8) -> ToolResult:
        """Find passages in the filings (keyword search). Each comes with the marker that cites it.

        Args:
            query: key terms, e.g. "adjusted EBITDA reconciliation"
            company: ticker, CIK or name, to search one company's filings
            period: FY2023 or FY2023Q2, to search the filings of one fiscal period
            k: how many passages
        """
        if not query.strip():
            raise ToolError("the query is empty")
        hits = _asked(stores.of(ctx).search, query, company=company, period=period, k=k)
        blocks = [f"[{n}] [D:{h.doc_id} p.{h.page} c.{h.start}-{h.end}]\n{h.text}" for n, h in enumerate(hits, 1)]
        return ToolResult("\n\n".join(blocks) or "no matching passages",
                          data={"passages": [asdict(h) for h in hits]})

    @tool(name="read_filing", idempotent=True, timeout_s=120)
    def read_filing(ctx: ToolContext, doc_id: str, page: Annotated[int, Field(ge=1)] = 1) -> ToolResult:
        """Read one page of a filing. Each line starts with its character offset (c.N|), so the characters
        S to E of the page are cited as [D:doc_id p.N c.S-E].

        Args:
            doc_id: the filing, as list_filings names it
            page: page number, from 1
        """
        store = stores.of(ctx)
        text = _asked(store.read, doc_id, page)
        pages = store.page_count(doc_id)
        return ToolResult(f"{doc_id} page {page} of {pages}:\n{render_with_offsets(text)}",
                          data={"doc_id": doc_id, "page": page, "pages": pages, "text": text})

    @tool(name="compute", idempotent=True, timeout_s=120)
    def compute(ctx: ToolContext, program: str) -> ToolResult:
        """Run a program over fact ids and cited spans, e.g. divide(subtract(F:f-aaaaaaaaaa, F:f-bbbbbbbbbb),
        F:f-bbbbbbbbbb). Operations: add, subtract, multiply, divide, greater, exp, growth (a/b - 1), average,
        sum, table_sum, min, max, abs, negate; steps separated by commas, #k is step k's result. Returns the
        program's id (cite the number it computes as [P:p-N]) and value.

        Args:
            program: the program text
        """
        store = stores.of(ctx)
        with _workspace_lock(ctx) as folder:
            known = load_programs(ctx.workspace)
            record = next((r for r in known if r.get("key") == ctx.idempotency_key), None)
            if record is None:
                try:
                    result = run_program(program, store)
                except ProgramError as exc:
                    raise ToolError(f"the program fails: {exc}") from None
                record = {"id": f"p-{len(known) + 1}", "key": ctx.idempotency_key, "program": program,
                          "value": result.value, "steps": result.steps,
                          "inputs": [asdict(i) for i in result.inputs]}
                with open(folder / PROGRAMS_FILE, "a") as out:
                    out.write(json.dumps(record, sort_keys=True) + "\n")
        inputs = ", ".join(f"{i['ref']} = {_money(i['value'])}" for i in record["inputs"]) or "constants only"
        data = {k: v for k, v in record.items() if k != "key"}
        return ToolResult(f"{record['id']} = {record['value']:.10g} (inputs: {inputs})", data=data)

    @tool(name="verify_report", idempotent=True, timeout_s=300)
    def verify_report(ctx: ToolContext, markdown: str) -> ToolResult:
        """Check a Markdown report: every number must be followed in its sentence by a citation ([F:...],
        [D:...] or [P:p-N] for a program this run computed) that states or computes it, in the period the text
        names. Returns the verdict and the failing claims.

        Args:
            markdown: the report
        """
        store = stores.of(ctx)
        programs = {r["id"]: r["program"] for r in load_programs(ctx.workspace)}
        verdict = run_verifier(markdown, store, programs)
        body = json.loads(json.dumps(asdict(verdict), default=str))
        with _workspace_lock(ctx) as folder:
            (folder / VERDICT_FILE).write_text(json.dumps(body, indent=2))
        return ToolResult(verdict.markdown, data=body)

    return [list_filings, get_fact, search_filings, read_filing, compute, verify_report]


def agent_tool_pack(settings: Settings) -> list[FunctionTool]:
    """This scenario's tools for every agent run: the `mainspring.agent_tools` entry point (pyproject.toml); the
    research pipeline's verify stage (pipeline_tools.py) among them."""
    from mainspring.scenarios.finance.pipeline_tools import verify_stage_tools

    return finance_tools(settings) + verify_stage_tools(settings)
