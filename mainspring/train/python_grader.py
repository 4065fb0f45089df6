"""Running a `python` grader's source in the sandbox: `grade(sample, item) -> float`, one job per call.

The user's source is untrusted code, so it never runs in this process: it goes into a fresh sandbox
(mainspring/sandbox: no network, its own namespaces, time and memory limits) as `grader.py`, beside a
small harness that reads {"sample", "item"} as JSON on stdin, calls `grade`, and prints the score on a
line of its own behind a marker (the grader may print as it likes). The limits are the `grader` sandbox
profile, which MAINSPRING_SANDBOX_PROFILES_FILE can override.
"""

from __future__ import annotations

import json
import math
from typing import Any

from mainspring.sandbox import Profile, Sandbox, SandboxError

MARK = "@@mainspring-grade@@"
PROFILE = Profile(name="grader", cpu_s=10, wall_s=20, memory_mb=512, pids=32, output_bytes=256 * 1024, collect_mb=0,
                  workspace_mb=64)

HARNESS = f'''
import json, math, sys, traceback
sys.path.insert(0, ".")
def report(**kw):
    sys.stdout.write("\\n{MARK}" + json.dumps(kw) + "\\n")
payload = json.load(sys.stdin)
try:
    import grader
    score = grader.grade(payload["sample"], payload["item"])
except BaseException as exc:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    report(error=f"{{type(exc).__name__}}: {{exc}}", traceback="".join(tb[-3:])[-2000:])
    sys.exit(1)
if isinstance(score, bool) or not isinstance(score, (int, float)):
    report(error=f"grade() returned {{type(score).__name__}}, not a number")
    sys.exit(1)
report(score=float(score))
'''


class PythonGraderError(RuntimeError):
    """The grader's code failed: raised, returned a non-number, or hit a sandbox limit."""


def run_python_grader(sandbox: Sandbox, source: str, sample: dict[str, Any], item: dict[str, Any]) -> float:
    """The score `grade(sample, item)` returns in the sandbox; raises PythonGraderError with the reason."""
    profile = sandbox.profiles.get("grader", PROFILE)
    stdin = json.dumps({"sample": sample, "item": item}, ensure_ascii=False, default=str)
    try:
        result = sandbox.run(["python3", "run_grader.py"], {"grader.py": source, "run_grader.py": HARNESS},
                             profile, stdin=stdin)
    except SandboxError as exc:
        raise PythonGraderError(f"the sandbox could not run the python grader: {exc}") from None
    if result.killed_by:
        raise PythonGraderError(f"the python grader was stopped by the {result.killed_by.replace('_', ' ')} limit "
                                f"(profile {profile.name!r}: {profile.wall_s:g} s wall, {profile.cpu_s} s CPU, "
                                f"{profile.memory_mb} MB)")
    report = _report(result.stdout)
    if report is None:
        tail = (result.stderr or result.stdout).strip()[-500:]
        raise PythonGraderError(f"the python grader exited with code {result.exit_code} without a score"
                                + (f": {tail}" if tail else ""))
    if "error" in report:
        raise PythonGraderError(f"the python grader raised {report['error']}")
    score = report.get("score")
    if not isinstance(score, (int, float)) or not math.isfinite(score):
        raise PythonGraderError(f"the python grader returned a non-finite score {score!r}")
    return float(score)


def _report(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARK):
            try:
                return json.loads(line[len(MARK):])
            except ValueError:
                return None
    return None
