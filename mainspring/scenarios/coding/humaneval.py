"""HumanEval-style functions scored with pass@k: each problem is a prompt (signature + docstring), a hidden
`check(candidate)` test and an entry point, as openai/human-eval has them (minibench_data/humaneval.jsonl, ten
written for this repository). A model callable turns a prompt into a completion; n completions are sampled per
problem and each program (prompt + completion + test + `check(entry_point)`) runs in the sandbox.

One sandbox job per problem runs its samples, each in its own interpreter with a timeout (a sample that loops
or crashes fails alone), in batches that fit the profile's wall time; a sample passes when its program exits 0.

    report = evaluate_passk(chat_completer(model), n=5, ks=(1, 5), sandbox=sandbox)
    report.pass_at(1)
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from mainspring.scenarios.coding.instances import DATA_DIR
from mainspring.scenarios.coding.passk import mean_pass_at_k, pass_at_k

PROBLEMS_FILE = DATA_DIR / "humaneval.jsonl"
PROFILE = "python"
SAMPLE_TIMEOUT_S = 3.0
WALL_MARGIN_S = 5.0  # of the profile's wall time: the interpreter starting, the files going in and out
ERROR_CHARS = 300
Completer = Callable[[str], str]  # prompt -> the code that follows it

# runs inside the sandbox: each samples/*.py in its own interpreter, results as JSON on stdout
RUNNER = """\
import json, os, subprocess, sys
out = []
for name in sorted(os.listdir("samples")):
    try:
        done = subprocess.run([sys.executable, "-I", "-B", os.path.join("samples", name)], capture_output=True,
                              timeout={timeout})
        out.append([name, done.returncode == 0, done.stderr.decode(errors="replace")[-{chars}:]])
    except subprocess.TimeoutExpired:
        out.append([name, False, "timed out after {timeout}s"])
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str

    def program(self, completion: str) -> str:
        return f"{self.prompt}{completion}\n\n{self.test}\n\ncheck({self.entry_point})\n"


def load_problems(path: Path = PROBLEMS_FILE, ids: Sequence[str] | None = None) -> list[Problem]:
    problems = [Problem(**{k: r[k] for k in Problem.__dataclass_fields__})
                for r in (json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()
                          if line.strip())]
    if ids is None:
        return problems
    by_id = {p.task_id: p for p in problems}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise ValueError(f"unknown problems {unknown}; known: {', '.join(by_id)}")
    return [by_id[i] for i in ids]


@dataclass
class ProblemResult:
    task_id: str
    passed: list[bool]
    errors: list[str] = field(default_factory=list)  # each failed sample's stderr tail

    @property
    def n(self) -> int:
        return len(self.passed)

    @property
    def c(self) -> int:
        return sum(self.passed)

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "n": self.n, "c": self.c, "errors": self.errors}


def _batch_size(sandbox: Any, timeout_s: float) -> int:
    try:
        wall_s = float(sandbox.profile(PROFILE).wall_s)
    except (AttributeError, KeyError, ValueError):
        wall_s = 30.0
    return max(1, int((wall_s - WALL_MARGIN_S) // timeout_s))


def run_samples(problem: Problem, completions: Sequence[str], *, sandbox: Any,
                timeout_s: float = SAMPLE_TIMEOUT_S) -> ProblemResult:
    """Run each completion's program against the problem's hidden test in the sandbox."""
    result = ProblemResult(problem.task_id, [])
    runner = RUNNER.format(timeout=timeout_s, chars=ERROR_CHARS).encode()
    size = _batch_size(sandbox, timeout_s)
    for start in range(0, len(completions), size):
        batch = completions[start:start + size]
        files = {"runner.py": runner,
                 **{f"samples/{i:04d}.py": problem.program(c).encode() for i, c in enumerate(batch)}}
        done = sandbox.run(["python3", "-B", "runner.py"], files, PROFILE)
        try:
            rows = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):  # the job itself was stopped: none of the batch counts as passed
            rows = [[f"{i:04d}.py", False, f"the sandbox job ended without results (exit {done.exit_code}, "
                     f"{done.killed_by or 'no limit hit'}): {done.stderr[-ERROR_CHARS:]}"] for i in range(len(batch))]
        for _, passed, error in rows:
            result.passed.append(bool(passed))
            if not passed:
                result.errors.append(error)
    return result


@dataclass
class PassKReport:
    n: int
    ks: tuple[int, ...]
    results: list[ProblemResult] = field(default_factory=list)

    def pass_at(self, k: int) -> float:
        return mean_pass_at_k([(r.n, r.c) for r in self.results], k)

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "problems": len(self.results),
                **{f"pass@{k}": round(self.pass_at(k), 4) for k in self.ks},
                "results": [{**r.to_dict(), **{f"pass@{k}": round(pass_at_k(r.n, r.c, k), 4) for k in self.ks}}
                            for r in self.results]}

    def render(self) -> str:
        lines = [f"{r.task_id:<14} {r.c}/{r.n} correct" for r in self.results]
        lines.append(" · ".join(f"pass@{k} {self.pass_at(k):.3f}" for k in self.ks)
                     + f" over {len(self.results)} problems, n={self.n}")
        return "\n".join(lines)


def evaluate_passk(complete: Completer, problems: Sequence[Problem] | None = None, *, n: int = 5,
                   ks: Sequence[int] = (1,), sandbox: Any = None, timeout_s: float = SAMPLE_TIMEOUT_S) -> PassKReport:
    """Sample `n` completions per problem from `complete` and score them; pass@k for each k in `ks` (k <= n)."""
    if n < 1 or not ks or any(not 1 <= k <= n for k in ks):
        raise ValueError(f"need n >= 1 and every k in 1..n, not n={n}, ks={list(ks)}")
    if sandbox is None:
        from mainspring.sandbox import get_sandbox

        sandbox = get_sandbox()
    report = PassKReport(n, tuple(ks))
    for problem in problems if problems is not None else load_problems():
        completions = [complete(problem.prompt) for _ in range(n)]
        report.results.append(run_samples(problem, completions, sandbox=sandbox, timeout_s=timeout_s))
    return report


FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)
SYSTEM = ("Complete the Python function. Reply with the whole function (its signature, then the body) in one "
          "```python code block, and nothing else.")


def extract_code(reply: str) -> str:
    """The code of a chat reply: its first fenced block, else the reply as it is."""
    m = FENCE.search(reply)
    return (m.group(1) if m else reply).rstrip() + "\n"


def chat_completer(model: Any, *, temperature: float = 0.8, max_tokens: int = 384) -> Completer:
    """A Completer over a ChatModel: the reply's code follows the prompt, so a whole function redefines the
    prompt's (whose docstring alone is a valid body) and an indented body continues it."""
    async def ask(prompt: str) -> str:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        try:
            return (await model.chat(messages, temperature=temperature, max_tokens=max_tokens)).text
        finally:  # an HTTP client's pool belongs to this call's event loop: closed with it, not leaked
            aclose = getattr(model, "aclose", None)
            if aclose is not None:
                await aclose()

    def complete(prompt: str) -> str:
        return "\n" + extract_code(asyncio.run(ask(prompt)))
    return complete
