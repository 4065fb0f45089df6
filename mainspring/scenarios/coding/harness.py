"""The hidden-test harness (SWE-bench's, without Docker): does a model's patch resolve an instance?

1. copy the instance's snapshot to a temporary folder (the host's; the snapshot is never written);
2. apply the model's unified diff: `git apply` (hunk line counts recounted, as models miscount them), else GNU
   `patch` with some fuzz after a dry run, so a half-applied patch never gets tested; a diff neither takes is
   "not resolved", with their messages as the reason;
3. put every test file back as the snapshot has it (the model's edits to tests, new test files and conftest.py
   included, are dropped and listed: a fix does not get to choose its judges), then apply the hidden test patch;
4. run FAIL_TO_PASS + PASS_TO_PASS by node id with pytest in the sandbox (pytest_run.py: the `pytest` profile,
   no network, limits; results from JUnit XML);
5. resolved = every FAIL_TO_PASS test passed and every PASS_TO_PASS test passed (a test that did not run, say
   because its module no longer imports, did not pass).

    ev = evaluate(instance, diff, sandbox=sandbox)     # ev.resolved, ev.reason, ev.tests[id] -> "passed" | ...
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from mainspring.scenarios.coding.instances import Instance
from mainspring.scenarios.coding.pytest_run import PROFILE, TestReport, run_pytest
from mainspring.scenarios.coding.workcopy import copy_repository, is_test_path
from mainspring.scenarios.coding.workcopy import _files as tree_files  # the diff's own view of a tree

APPLY_TIMEOUT_S = 30
PATCH_FUZZ = 3
REASON_CHARS = 600


@dataclass
class Evaluation:
    instance_id: str
    resolved: bool
    applied: bool  # the model's patch applied (an empty patch applies, changing nothing)
    reason: str  # why it is (not) resolved, in a sentence
    tests: dict[str, str] = field(default_factory=dict)  # node id -> passed | failed | error | skipped | not run
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    dropped_test_edits: list[str] = field(default_factory=list)  # the model's changes to test files, undone
    apply_method: str = ""  # "git apply" | "patch" | "" (empty patch, or none took)
    wall_s: float = 0.0
    report: TestReport | None = None

    def outcome(self, ids: Sequence[str]) -> dict[str, str]:
        return {i: self.tests.get(i, "not run") for i in ids}

    def to_dict(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "resolved": self.resolved, "applied": self.applied,
                "reason": self.reason, "apply_method": self.apply_method,
                "FAIL_TO_PASS": self.outcome(self.fail_to_pass), "PASS_TO_PASS": self.outcome(self.pass_to_pass),
                "dropped_test_edits": self.dropped_test_edits, "wall_s": round(self.wall_s, 3)}


def _run(argv: list[str], cwd: Path, diff: str) -> subprocess.CompletedProcess[str]:
    # GIT_CEILING_DIRECTORIES: git must not find a repository above the temporary folder and apply into it
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(cwd.parent), "LC_ALL": "C"}
    return subprocess.run(argv, cwd=cwd, input=diff, capture_output=True, text=True, timeout=APPLY_TIMEOUT_S,
                          env=env)


def apply_patch(root: Path, diff: str) -> tuple[bool, str]:
    """Apply a unified diff (a/ b/ prefixes) to the tree at `root`: (applied, the method or why not)."""
    if not diff.endswith("\n"):
        diff += "\n"  # a diff cut at its last line's end is still that diff
    git = _run(["git", "apply", "--recount", "--whitespace=nowarn", "-"], root, diff)
    if git.returncode == 0:
        return True, "git apply"
    patch_argv = ["patch", "--batch", "--forward", "-p1", f"--fuzz={PATCH_FUZZ}", "--no-backup-if-mismatch",
                  "--reject-file=-"]
    dry = _run([*patch_argv, "--dry-run"], root, diff)
    if dry.returncode == 0:
        done = _run(patch_argv, root, diff)
        if done.returncode == 0:
            return True, "patch"
    why = (git.stderr.strip() or git.stdout.strip()) + " | patch: " + (dry.stdout.strip() or dry.stderr.strip())
    return False, why[:REASON_CHARS]


def restore_test_files(root: Path, snapshot: Path) -> list[str]:
    """Every test file of `root` back as in `snapshot` (changed ones restored, new ones removed, removed ones
    put back); returns the paths that differed."""
    mine, theirs = tree_files(root), tree_files(snapshot)
    changed = []
    for rel in sorted(set(mine) | set(theirs)):
        if not is_test_path(rel):
            continue
        if rel not in theirs:
            mine[rel].unlink()
        elif rel not in mine or mine[rel].read_bytes() != theirs[rel].read_bytes():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(theirs[rel], root / rel)
        else:
            continue
        changed.append(rel)
    return changed


def _outcomes(report: TestReport) -> dict[str, str]:
    out = {i: "passed" for i in report.passed}
    out.update({i: "skipped" for i in report.skipped})
    out.update({f.id: "failed" if f.kind == "failure" else "error" for f in report.failures})
    return out


def _verdict(inst: Instance, tests: dict[str, str], report: TestReport) -> tuple[bool, str]:
    f2p = [i for i in inst.FAIL_TO_PASS if tests.get(i) != "passed"]
    p2p = [i for i in inst.PASS_TO_PASS if tests.get(i) != "passed"]
    if not f2p and not p2p:
        return True, f"all {len(inst.FAIL_TO_PASS)} FAIL_TO_PASS and {len(inst.PASS_TO_PASS)} PASS_TO_PASS tests pass"
    parts = []
    if f2p:
        parts.append(f"{len(f2p)} of {len(inst.FAIL_TO_PASS)} FAIL_TO_PASS tests do not pass ({', '.join(f2p[:3])}"
                     + (", …" if len(f2p) > 3 else "") + ")")
    if p2p:
        parts.append(f"{len(p2p)} PASS_TO_PASS tests broke ({', '.join(p2p[:3])}" + (", …" if len(p2p) > 3 else "")
                     + ")")
    if report.killed_by:
        parts.append(f"pytest was stopped by the sandbox's {report.killed_by} limit")
    return False, "; ".join(parts)


def evaluate(instance: Instance, model_patch: str, *, sandbox: Any = None, profile: str = PROFILE) -> Evaluation:
    """Evaluate `model_patch` (a unified diff against the snapshot; "" for none) on `instance` with its hidden
    tests, in `sandbox` (the process-wide one by default)."""
    started = time.monotonic()
    ev = Evaluation(instance.instance_id, False, False, "", fail_to_pass=list(instance.FAIL_TO_PASS),
                    pass_to_pass=list(instance.PASS_TO_PASS))
    with tempfile.TemporaryDirectory(prefix="mainspring-harness-") as tmp:
        root = Path(tmp) / "repo"
        copy_repository(instance.snapshot, root)
        if model_patch.strip():
            ok, how = apply_patch(root, model_patch)
            if not ok:
                ev.reason, ev.wall_s = f"the patch does not apply: {how}", time.monotonic() - started
                return ev
            ev.apply_method = how
        ev.applied = True
        ev.dropped_test_edits = restore_test_files(root, instance.snapshot)
        ok, how = apply_patch(root, instance.test_patch)
        if not ok:  # on a restored tree this is a broken instance, not a model's failure
            raise ValueError(f"instance {instance.instance_id}: the hidden test patch does not apply: {how}")
        files = {rel: p.read_bytes() for rel, p in sorted(tree_files(root).items())}
    if sandbox is None:
        from mainspring.sandbox import get_sandbox

        sandbox = get_sandbox()
    report = run_pytest(sandbox, files, instance.test_ids, profile=profile)
    ev.report, ev.tests = report, _outcomes(report)
    ev.resolved, ev.reason = _verdict(instance, ev.tests, report)
    ev.wall_s = time.monotonic() - started
    return ev


def evaluate_many(pairs: Sequence[tuple[Instance, str]], *, sandbox: Any = None, workers: int = 2,
                  profile: str = PROFILE) -> list[Evaluation]:
    """`evaluate` over (instance, patch) pairs, `workers` sandbox jobs at a time; results in the pairs' order."""
    if workers <= 1 or len(pairs) <= 1:
        return [evaluate(i, p, sandbox=sandbox, profile=profile) for i, p in pairs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="harness") as pool:
        return list(pool.map(lambda pair: evaluate(pair[0], pair[1], sandbox=sandbox, profile=profile), pairs))


def resolved_rate(evaluations: Sequence[Evaluation]) -> float:
    return sum(e.resolved for e in evaluations) / len(evaluations) if evaluations else 0.0
