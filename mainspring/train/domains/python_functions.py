"""`code`: write a small Python function; hidden unit tests run in the sandbox decide the score.

The code is taken from the first ```python fence that compiles and defines the function, else
from the reply itself, else from its first `def` on (dropping trailing prose or a line cut off by
max_tokens). Each completion is one sandbox job (profile "python", tightened: 5 s CPU, 10 s wall,
256 MB, no network, only the standard library): a harness runs every hidden test of the task,
each under a 0.5 s alarm (the first to time out ends the run), and prints one JSON line.

Score parts: `compiles` (the extracted code is valid Python) and `tests_passed` (fraction of the
hidden tests that evaluate to True); total = tests_passed. A job killed by a limit (an endless
loop, a memory bomb) passes no tests; a sandbox that cannot run is a scorer error.
"""

from __future__ import annotations

import json
import re
import secrets

from mainspring.sandbox import Profile, Sandbox, SandboxUnavailable, get_sandbox
from mainspring.train.domains.base import Domain, DomainError, DomainSettings, Sample, Score
from mainspring.train.domains.code_tasks import TASKS, CodeTask
from mainspring.train.domains.generated import pool_splits

NAME = "code"
N_EVAL = 8
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S)
_MAX_TRIMS = 40

# Runs inside the sandbox. The verdict goes to a copy of stdout taken before the solution runs and
# starts with a per-job nonce from stdin, so a solution's own prints (a JSON line, a closed
# sys.stdout) neither forge nor lose it. A solution that goes looking for the nonce can find it:
# this guards against accidents; deliberate reward hacking is the inspector's to catch.
HARNESS = r'''
import json, os, signal, sys
nonce = sys.stdin.readline().strip()
out = os.dup(1)
tests = json.load(open("tests.json"))

def alarm(signum, frame):
    raise TimeoutError("over the time limit")

signal.signal(signal.SIGALRM, alarm)
ns = {"__name__": "solution"}
passed, errors = 0, []
try:
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    exec(compile(open("solution.py").read(), "solution.py", "exec"), ns)
    loaded = True
except BaseException as exc:
    loaded, errors = False, [f"solution: {type(exc).__name__}"]
finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
for test in tests if loaded else ():
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        ok = eval(test, ns) is True
    except BaseException as exc:
        ok = False
        errors.append(f"{test}: {type(exc).__name__}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    passed += ok
    if errors and errors[-1].endswith("TimeoutError"):
        break  # an endless loop would eat every test's half second
os.write(out, (nonce + json.dumps({"passed": passed, "total": len(tests), "errors": errors[:5]}) + "\n").encode())
'''


def prompt(task: CodeTask) -> str:
    return (f"Write a Python function {task.signature} that {task.does}. For example, {task.example}. "
            "Reply with only the code.")


def _compiles(code: str) -> bool:
    try:
        compile(code, "solution.py", "exec")
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False


def extract_code(completion: str, function: str) -> str | None:
    """The solution in a reply: see the module docstring for the order of preference; None if no
    candidate compiles."""
    defines = re.compile(rf"^\s*def\s+{re.escape(function)}\s*\(", re.M)
    candidates = [m.group(1) for m in _FENCE.finditer(completion)] + [completion]
    first_def = re.search(r"^[ \t]*def\s", completion, re.M)
    if first_def:
        lines = completion[first_def.start():].splitlines()
        indent = len(lines[0]) - len(lines[0].lstrip())
        lines = [ln[indent:] if ln[:indent].isspace() else ln for ln in lines]  # prose-indented code
        for cut in range(len(lines), max(0, len(lines) - _MAX_TRIMS), -1):
            candidates.append("\n".join(lines[:cut]))
    good = [c for c in candidates if c.strip() and _compiles(c)]
    return next((c for c in good if defines.search(c)), good[0] if good else None)


class UnitTestScorer:
    """Runs a task's hidden tests against the reply's code, one sandbox job per completion."""

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        base = sandbox.profile("python")
        self.profile: Profile = base.model_copy(update={
            "cpu_s": 5, "wall_s": 10.0, "memory_mb": 256, "pids": 16, "runtime": False,
            "output_bytes": 64 * 1024, "workspace_mb": 16, "collect_mb": 0})

    def score(self, sample: Sample, completion: str) -> Score:
        code = extract_code(completion, sample.reference["function"])
        if code is None:
            return Score(0.0, {"compiles": 0.0, "tests_passed": 0.0})
        tests = sample.reference["tests"]
        nonce = secrets.token_hex(16)
        result = self.sandbox.run(["python3", "-I", "-S", "harness.py"], {
            "harness.py": HARNESS, "solution.py": code, "tests.json": json.dumps(tests)},
            profile=self.profile, stdin=nonce + "\n")
        verdict = next((ln[len(nonce):] for ln in result.stdout.splitlines() if ln.startswith(nonce)), None)
        passed = json.loads(verdict)["passed"] / len(tests) if verdict is not None else 0.0
        return Score(passed, {"compiles": 1.0, "tests_passed": passed})


_SOLUTIONS = {t.function: t.solution for t in TASKS}


def reference_completion(sample: Sample) -> str:
    """The task's correct solution in a python fence (KeyError for a function no task defines)."""
    return f"```python\n{_SOLUTIONS[sample.reference['function']]}\n```"


def build(seed: int = 0, sandbox: Sandbox | None = None) -> Domain:
    """The code domain; raises DomainError when this host cannot run sandboxed jobs."""
    sandbox = sandbox or get_sandbox()
    try:
        sandbox.prepare()
    except SandboxUnavailable as exc:
        raise DomainError(f"domain {NAME!r} runs unit tests in the sandbox, which is unavailable here: {exc}") from None
    pool = [(prompt(t), {"function": t.function, "tests": list(t.tests), "example": t.example}) for t in TASKS]
    train, eval_ = pool_splits(NAME, pool, seed, N_EVAL)
    return Domain(NAME, train, eval_, UnitTestScorer(sandbox), DomainSettings(max_tokens=96, temperature=0.7),
                  "small Python functions scored by hidden unit tests in the sandbox", reference_completion)
