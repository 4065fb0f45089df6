"""pytest in the sandbox, read back from its JUnit XML: which tests failed, why, and a short traceback.

One job per call, in the sandbox's `pytest` profile (no network, limits, the project's packages read-only):
the repository's files go in, `.junit-report.xml` comes back and is parsed, so the outcome never depends on
pytest's console format. `-o junit_family=xunit1` makes each <testcase> carry its file, from which the
pytest node id (`tests/test_a.py::TestX::test_y`) is rebuilt exactly; the default family has only the dotted
classname, which cannot tell a package from a class.

Used by the agent's `run_tests` tool (tools.py) and by the hidden-test harness.
"""

from __future__ import annotations

import hashlib
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

REPORT = ".junit-report.xml"
PROFILE = "pytest"
TRACEBACK_LINES = 15  # the end of a traceback: where the assertion and the failing line are
TRACEBACK_CHARS = 1500
MESSAGE_CHARS = 300


@dataclass(frozen=True)
class TestFailure:
    __test__ = False  # not a pytest test class, despite the name

    id: str  # pytest node id
    kind: str  # "failure" (an assertion or exception in the test) or "error" (setup, collection)
    message: str  # the assertion message, first lines
    traceback: str  # the last TRACEBACK_LINES lines


@dataclass
class TestReport:
    __test__ = False

    exit_code: int
    passed: list[str] = field(default_factory=list)
    failures: list[TestFailure] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    killed_by: str | None = None  # the sandbox limit that stopped pytest
    output_tail: str = ""  # pytest's console output, the end: what the XML cannot say (no report at all)
    wall_s: float = 0.0

    @property
    def green(self) -> bool:
        """Every selected test ran and passed (pytest exit 0: at least one test, no failure, no error)."""
        return self.exit_code == 0 and not self.failures and self.killed_by is None and bool(self.passed)

    @property
    def failed_ids(self) -> list[str]:
        return [f.id for f in self.failures]

    def signature(self) -> str:
        """What identifies this outcome: the failing ids with their messages' first lines (or how pytest ended
        when it wrote no report). Equal signatures after two different edits mean the fix is going in circles."""
        items = sorted(f"{f.id}\x00{f.message.splitlines()[0] if f.message else ''}" for f in self.failures)
        if not items and not self.green:
            items = [f"exit={self.exit_code} killed={self.killed_by}"]
        return hashlib.sha256("\n".join(items).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {"green": self.green, "exit_code": self.exit_code, "passed": len(self.passed),
                "failed": self.failed_ids, "skipped": len(self.skipped), "killed_by": self.killed_by,
                "signature": self.signature(),
                "failures": [{"id": f.id, "kind": f.kind, "message": f.message, "traceback": f.traceback}
                             for f in self.failures]}

    def summary(self) -> str:
        """The report as the model reads it: counts, then each failure with its message and traceback tail."""
        if self.green:
            return f"All {len(self.passed)} selected tests passed."
        head = (f"{len(self.failures)} failing, {len(self.passed)} passed, {len(self.skipped)} skipped "
                f"(pytest exit {self.exit_code}" + (f", stopped by the {self.killed_by} limit" if self.killed_by
                                                     else "") + ").")
        lines = [head]
        for f in self.failures:
            lines.append(f"\n{f.kind.upper()} {f.id}\n  {f.message}\n{f.traceback}")
        if not self.failures:
            lines.append("pytest wrote no test results; its output ends with:\n" + self.output_tail)
        return "\n".join(lines)


def node_id(case: ET.Element) -> str:
    """The pytest node id of an xunit1 <testcase>: its file, the class path after the module, the name."""
    name, classname, file = case.get("name", ""), case.get("classname", ""), case.get("file", "")
    if not file:
        return "::".join(p for p in (classname.replace(".", "/") + ".py" if classname else "", name) if p)
    module = file[:-3].replace("/", ".") if file.endswith(".py") else file.replace("/", ".")
    classes = classname[len(module) + 1:] if classname.startswith(module + ".") else ""
    return "::".join([file, *(c for c in classes.split(".") if c), name])


def _clip_tail(text: str) -> str:
    lines = (text or "").rstrip().splitlines()[-TRACEBACK_LINES:]
    out = "\n".join(lines)
    return out if len(out) <= TRACEBACK_CHARS else "…" + out[-TRACEBACK_CHARS:]


def parse_junit(xml: bytes | str, exit_code: int = 0) -> TestReport:
    """A TestReport from pytest's JUnit XML (xunit1 or xunit2)."""
    report = TestReport(exit_code=exit_code)
    root = ET.fromstring(xml)
    for case in root.iter("testcase"):
        nid = node_id(case)
        bad = next((child for child in case if child.tag in ("failure", "error")), None)
        if bad is not None:
            message = (bad.get("message") or "").strip()
            if len(message) > MESSAGE_CHARS:
                message = message[:MESSAGE_CHARS] + "…"
            report.failures.append(TestFailure(nid, bad.tag, message, _clip_tail(bad.text or "")))
        elif case.find("skipped") is not None:
            report.skipped.append(nid)
        else:
            report.passed.append(nid)
    return report


def pytest_command(ids: Sequence[str] = ()) -> list[str]:
    """The job's argv; `ids` are node ids or paths (never options: refused by `check_ids`)."""
    return ["python3", "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
            f"--junitxml={REPORT}", "--tb=short", *check_ids(ids)]


def check_ids(ids: Sequence[str]) -> list[str]:
    out = []
    for test_id in ids:
        if not isinstance(test_id, str) or not test_id.strip() or test_id.lstrip().startswith("-"):
            raise ValueError(f"not a test id: {test_id!r} (give node ids such as tests/test_x.py::test_y)")
        out.append(test_id.strip())
    return out


def run_pytest(sandbox: Any, files: Mapping[str, bytes], ids: Sequence[str] = (), *, profile: str = PROFILE,
               cancel: threading.Event | None = None) -> TestReport:
    """Run pytest over `files` (relative path -> bytes) in `sandbox` (a mainspring.sandbox.Sandbox)."""
    files = {k: v for k, v in files.items() if k != REPORT}  # a stale report must not pass for this run's
    result = sandbox.run(pytest_command(ids), files, profile, cancel=cancel)
    tail = (result.stdout + result.stderr)[-2000:]
    raw = result.files.get(REPORT)
    report = TestReport(exit_code=result.exit_code)
    if raw:
        try:
            report = parse_junit(raw, result.exit_code)
        except ET.ParseError:  # cut off mid-write (a limit): as if there were none
            pass
    report.killed_by, report.output_tail, report.wall_s = result.killed_by, tail, result.wall_s
    return report
