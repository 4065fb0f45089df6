"""The pipeline's verify stage as a tool: `verify_research_report()` takes no arguments, so the model copies
nothing. It reads the report and the analysis from its own run's input artifacts (plans.task_run.goal_artifacts:
only blocks whose bytes still hash as given), re-executes the analysis's programs as p-1, p-2, … against the
filings store, resolves every citation, and ends the run (EndRun) with the verdict as the task's artifact.
Missing or tampered inputs are a verdict too (unverified, with the reason): the stage fails closed, never open.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mainspring.agents.plans.task_run import goal_artifacts
from mainspring.agents.tools.base import EndRun, ToolContext, ToolError
from mainspring.agents.tools.decorator import tool
from mainspring.config import Settings
from mainspring.scenarios.finance.filings import FilingsStore
from mainspring.scenarios.finance.pipeline import VERIFY_TOOL


def program_table(analysis: Any) -> dict[str, str]:
    """The analysis artifact's programs by the ids the report cites: p-1 for the first finding, and so on."""
    findings = analysis.get("findings", []) if isinstance(analysis, dict) else []
    return {f"p-{k}": str(f.get("program", "")) for k, f in enumerate(findings, 1) if isinstance(f, dict)}


def _unverified(reason: str) -> dict[str, Any]:
    return {"verified": False, "claims": [], "reason": reason}


def verdict_of(goal: str, store: FilingsStore) -> dict[str, Any]:
    from mainspring.scenarios.finance.verify import check_answer, verify_report

    inputs = goal_artifacts(goal)
    if "report" not in inputs or "analyse" not in inputs:
        return _unverified("the report or the analysis is missing from this run's inputs (or was altered)")
    report, analysis = json.loads(inputs["report"]), json.loads(inputs["analyse"])
    markdown = report.get("markdown") if isinstance(report, dict) else None
    if not isinstance(markdown, str) or not markdown.strip():
        return _unverified("the report is empty")
    answer = report.get("answer")
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (int, float))):
        return _unverified(f"the report's answer is not a number: {answer!r}")
    verdict = check_answer(verify_report(markdown, store, program_table(analysis)), markdown, answer)
    return json.loads(json.dumps(asdict(verdict), default=str))


def verify_stage_tools(settings: Settings) -> list:
    # the finance tools' own store cache, corpus check and workspace file: one way to open and record
    from mainspring.scenarios.finance.tools import VERDICT_FILE, _Stores, _workspace_lock

    stores = _Stores(Path(settings.cache_dir))

    @tool(name=VERIFY_TOOL, idempotent=True)
    def verify_research_report(ctx: ToolContext) -> str:
        """Check the report given to this task: re-run every program, resolve every citation. Ends the task
        with the verdict."""
        try:
            verdict = verdict_of(ctx.goal, stores.of(ctx))
        except ToolError as exc:  # no corpus attached, or one that cannot be read: unverified, never open
            verdict = _unverified(str(exc))
        with _workspace_lock(ctx) as folder:
            (folder / VERDICT_FILE).write_text(json.dumps(verdict, indent=2))
        failing = [c for c in verdict.get("claims", []) if c.get("status") != "ok"]
        summary = ("verified: every number is cited and re-computed" if verdict.get("verified") else
                   f"unverified: {verdict.get('reason') or f'{len(failing)} claims failed'}")
        raise EndRun(summary, json.dumps(verdict, sort_keys=True), "verified" if verdict.get("verified")
                     else "unverified")

    return [verify_research_report]
