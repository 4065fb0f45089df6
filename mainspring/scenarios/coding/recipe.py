"""The coding agent as an ordinary durable agent run: an AgentSpec whose system prompt is the instructions and
the repository map, the task as the goal, and the coding tools (tools.py); the run loop is the runtime's own.

Prompt layout for the prefix cache: system = fixed instructions + the repository's map (ranked without the task:
the same for every run on the repository) + the task's focus map (ranked for the task), then the task (the run's
goal), then the append-only history of steps. So every turn of a run reads the turns before it from the prefix
cache, and every run on the same repository reads the instructions and the map.
The loop closes in `run_tests` (tools.py), which ends the run on green, on the same failure twice or at the
iteration cap; the budget pauses it and `max_steps` bounds the rest.
The run is journaled, audited, resumable and priced like any other; its result holds the final diff.

    run = start_coding_run(runtime, CodingTask("fix the rounding in money.py", Path("~/src/money")))
    ... the runtime's worker drives it ...
    outcome = coding_outcome(runtime, run.run_id)    # status, stop reason, green, iterations, the diff
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mainspring.agents.runtime import AgentRuntime
from mainspring.agents.spec import AgentLimits, AgentSpec
from mainspring.scenarios.coding.repo_map import DEFAULT_BUDGET, RepoMap, TokenCounter, build_repo_map, estimate_tokens
from mainspring.scenarios.coding.tools import TOOL_NAMES
from mainspring.scenarios.coding.workcopy import MAX_ITERATIONS, TaskOptions, WorkCopy
from mainspring.store.ids import new_id

AGENT_NAME = "coding"
FOCUS_SHARE = 4  # the task's focus map gets 1/4 of the map budget, the repository's map the rest
STOP_REASONS = ("tests_green", "same_failure", "max_iterations")  # set by run_tests (tools.py)
LAYOUTS = ("map_first", "task_first")  # where the task text goes (CodingTask.layout)
INSTRUCTIONS = """\
You are a careful software engineer. You change a Python repository to do what the task asks, and the
repository's tests tell you when you are done. Work in this order:
1. Call run_tests() to see what fails now.
2. Read the code the failures point at: view_file(file, start) shows 100 numbered lines, search_code(query)
   finds a name in every file. The repository map below lists the files and signatures most relevant first.
3. Fix the code with edit_file(file, search, replace): `search` is exact text copied from the file, occurring
   once. Do not edit the tests unless the task says so: such edits are refused.
4. Call run_tests() again and read the failures; fix and test again. When the tests pass the run ends by itself.
Call one tool at a time. Keep each change small and explain in one sentence what you change and why."""


@dataclass
class CodingTask:
    task: str
    repo: Path
    model: str = "default"
    max_iterations: int = 3  # test runs after edits: 1..5
    allow_test_edits: bool = False
    test_ids: list[str] = field(default_factory=list)  # what run_tests runs by default; empty: all
    map_tokens: int = DEFAULT_BUDGET
    max_steps: int = 30
    max_tokens: int = 1024  # per model call: an edit's arguments can be long
    token_budget: int | None = None
    cost_budget_usd: str | None = None
    temperature: float = 0.0
    # "map_first": instructions + map, the same for every turn and, the instructions, for every run (the cached
    # prefix); "task_first": the task text heads the system prompt, before the map (the baseline bench/coding.py
    # compares against: no prefix is shared across tasks)
    layout: str = "map_first"

    def check(self) -> None:
        """ValueError naming what is wrong (the CLI's exit 2)."""
        if not self.task.strip():
            raise ValueError("the task is empty: say what to change")
        if not self.repo.is_dir():
            raise ValueError(f"no such repository folder: {self.repo}")
        if not 1 <= self.max_iterations <= MAX_ITERATIONS:
            raise ValueError(f"--max-iterations must be 1..{MAX_ITERATIONS}, not {self.max_iterations}")
        if self.map_tokens < 0:
            raise ValueError("the map's token budget cannot be negative")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {self.layout!r}")


def instructions(repo_map: str, focus: str = "", task: str | None = None) -> str:
    """The system prompt: the instructions, the repository's map, then the task's focus map; with `task` (the
    task_first layout) the task text comes first."""
    head = f"Task: {task}\n\n" if task is not None else ""
    tail = f"\nMost relevant to this task (the files it names first):\n{focus}" if focus else ""
    return f"{head}{INSTRUCTIONS}\n\nRepository map (files, classes and signatures):\n{repo_map}{tail}"


def prompt_maps(task: CodingTask, *, cache_dir: Path | None = None,
                count_tokens: TokenCounter = estimate_tokens) -> tuple[RepoMap, RepoMap]:
    """(the repository's map, the task's focus map), together within `task.map_tokens`.

    The repository's map is ranked without the task, so it is the same for every task on the same files: with the
    instructions before it, it is a prefix every run on the repository shares in the prefix cache, not only every
    turn of one run. The focus map, a quarter of the budget, is ranked for the task (the files it names and
    mentions first) and comes after it; the task itself follows as the run's goal."""
    focus_budget = task.map_tokens // FOCUS_SHARE
    shared = build_repo_map(task.repo, "", budget=task.map_tokens - focus_budget, count_tokens=count_tokens,
                            cache_dir=cache_dir)
    focus = build_repo_map(task.repo, task.task, budget=focus_budget, count_tokens=count_tokens,
                           cache_dir=cache_dir)
    return shared, focus


def coding_spec(task: CodingTask, repo_map: str, focus: str = "") -> AgentSpec:
    system = instructions(repo_map, focus, task.task if task.layout == "task_first" else None)
    return AgentSpec(name=AGENT_NAME, model=task.model, instructions=system, tools=list(TOOL_NAMES),
                     temperature=task.temperature,
                     limits=AgentLimits(max_steps=task.max_steps, max_tokens=task.max_tokens,
                                        token_budget=task.token_budget, cost_budget_usd=task.cost_budget_usd,
                                        context_tokens=max(6000, 4 * task.map_tokens + 4000)))


def run_workspace(data_dir: Path, run_id: str) -> Path:
    """Where the run loop puts a run's workspace (agents/loop.py, `_call_with_retries`)."""
    return Path(data_dir) / "runs" / run_id / "workspace"


@dataclass
class CodingRun:
    run_id: str
    agent_id: str
    repo_map: RepoMap  # the repository's, shared by every task on it
    workcopy: WorkCopy
    focus: RepoMap  # the task's


def start_coding_run(runtime: AgentRuntime, task: CodingTask, *,
                     count_tokens: TokenCounter = estimate_tokens) -> CodingRun:
    """Map the repository, put the agent version with that map, prepare the working copy under the run id the
    run will have (so no tool can run before it exists), then queue the run."""
    task.check()
    settings = runtime.settings
    repo_map, focus = prompt_maps(task, cache_dir=settings.cache_dir / "repo_map", count_tokens=count_tokens)
    agent = runtime.put_agent(coding_spec(task, repo_map.text, focus.text))
    run_id = new_id("run_")
    workcopy = WorkCopy.prepare(run_workspace(settings.data_dir, run_id), task.repo,
                                TaskOptions(task.allow_test_edits, task.max_iterations, list(task.test_ids)))
    runtime.start_run(agent.id, task.task, run_id=run_id)
    return CodingRun(run_id, agent.id, repo_map, workcopy, focus)


@dataclass
class CodingOutcome:
    run_id: str
    status: str  # the run's: succeeded, failed, paused (budget), …
    stop_reason: str | None  # tests_green | same_failure | max_iterations | max_steps | final_answer | …
    green: bool
    iterations: int
    diff: str  # the working copy against the snapshot, now
    result: str | None
    error: str | None
    usage: dict[str, int]
    cost_u: int

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def coding_outcome(runtime: AgentRuntime, run_id: str) -> CodingOutcome:
    """The run's outcome so far; the diff is read from the working copy, so a run paused by its budget or
    ended by max_steps has one too."""
    run = runtime.run(run_id)
    wc = WorkCopy(run_workspace(runtime.settings.data_dir, run_id))
    state = wc.load_state() if wc.meta.exists() else {"iterations": 0}
    green = False
    if run.stop_reason in STOP_REASONS and run.result:
        try:
            green = bool(json.loads(run.result).get("green"))
        except (ValueError, AttributeError):
            green = False
    return CodingOutcome(run_id, run.status, run.stop_reason, green, int(state["iterations"]),
                         wc.diff() if wc.repo.exists() else "", run.result, run.error,
                         {"prompt_tokens": run.prompt_tokens, "cached_tokens": run.cached_tokens,
                          "completion_tokens": run.completion_tokens}, run.cost_u)
