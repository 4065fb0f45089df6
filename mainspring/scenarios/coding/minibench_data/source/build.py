"""Builds ../instances.jsonl from the task sources beside this file (tasks_<repo>.py), the way SWE-bench derives
its instances: for each task, the gold patch and the hidden test patch are the diffs of the snapshot with the
task's edits, and FAIL_TO_PASS / PASS_TO_PASS come from running the tests (host pytest) before and after the
gold patch, both with the hidden tests in. A task whose gold patch leaves a test failing, or that has no
FAIL_TO_PASS test, stops the build. A "naive" fix (the tempting one that breaks a PASS_TO_PASS test) is kept
as `naive_patch` and must resolve nothing.

A dev tool, not part of the package's code; from the checkout:
    .venv/bin/python mainspring/scenarios/coding/minibench_data/source/build.py
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from mainspring.scenarios.coding.pytest_run import REPORT, TestReport, parse_junit, pytest_command
from mainspring.scenarios.coding.workcopy import copy_repository, unified_diff

HERE = Path(__file__).resolve().parent
DATA = HERE.parent
REPOS = ("moneykit", "csvtext", "spans")
FIELDS = ("instance_id", "repo", "problem_statement", "hints_text", "FAIL_TO_PASS", "PASS_TO_PASS", "patch",
          "test_patch", "kind", "difficulty", "underspecified", "naive_patch")

Edit = tuple[str, "str | None", str]  # file, exact text to replace (None: append), replacement


def apply_edits(root: Path, edits: list[Edit]) -> None:
    for file, search, replace in edits:
        path = root / file
        text = path.read_text() if path.exists() else ""
        if search is None:
            text += replace
        else:
            if text.count(search) != 1:
                raise SystemExit(f"{root.name}: {file}: the text to replace occurs {text.count(search)} times: "
                                 f"{search!r}")
            text = text.replace(search, replace, 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def tree(base: Path, tmp: Path, name: str, *edits: list[Edit]) -> Path:
    root = tmp / name
    copy_repository(base, root)
    for e in edits:
        apply_edits(root, e)
    return root


def run_tests(root: Path) -> TestReport:
    argv = [sys.executable, *pytest_command()[1:], "-p", "no:randomly"]
    done = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=120)
    return parse_junit((root / REPORT).read_bytes(), done.returncode)


def build_task(task: dict, tmp: Path) -> dict:
    base = DATA / task["repo"]
    iid = task["instance_id"]
    gold = tree(base, tmp, f"{iid}-gold", task["gold"])
    hidden = tree(base, tmp, f"{iid}-tests", task["tests"])
    record = {**task, "patch": unified_diff(base, gold), "test_patch": unified_diff(base, hidden)}
    before = run_tests(hidden)
    after = run_tests(tree(base, tmp, f"{iid}-gold-tests", task["gold"], task["tests"]))
    if after.failures or not after.passed:
        raise SystemExit(f"{iid}: the gold patch leaves tests failing: {after.failed_ids}")
    failing = set(before.failed_ids)
    record["FAIL_TO_PASS"] = sorted(t for t in after.passed if t in failing)
    record["PASS_TO_PASS"] = sorted(t for t in after.passed if t in before.passed)
    if not record["FAIL_TO_PASS"]:
        raise SystemExit(f"{iid}: no test fails before the gold patch")
    record["naive_patch"] = ""
    if task.get("naive"):
        naive = tree(base, tmp, f"{iid}-naive", task["naive"])
        record["naive_patch"] = unified_diff(base, naive)
        broken = set(run_tests(tree(base, tmp, f"{iid}-naive-tests", task["naive"], task["tests"])).failed_ids)
        if not broken & set(record["PASS_TO_PASS"]):
            raise SystemExit(f"{iid}: the naive fix breaks no PASS_TO_PASS test")
    record.setdefault("underspecified", False)
    return {k: record[k] for k in FIELDS}


def main() -> None:
    sys.path.insert(0, str(HERE))
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for repo in REPOS:
            for task in importlib.import_module(f"tasks_{repo}").TASKS:
                out.append(build_task(task, Path(tmp)))
                print(task["instance_id"], len(out[-1]["FAIL_TO_PASS"]), "FAIL_TO_PASS,",
                      len(out[-1]["PASS_TO_PASS"]), "PASS_TO_PASS")
    (DATA / "instances.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))


if __name__ == "__main__":
    main()
