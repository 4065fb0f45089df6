"""The minibench runner: each instance's problem statement as an ordinary coding run (recipe.py) on its snapshot,
the run's final diff judged by the hidden-test harness (harness.py), and the figures SWE-bench-style reports
give, per task and in total: resolved rate, pass@1 (the unbiased estimator over `samples` attempts a task),
iterations to green, tokens by kind, the cache hit rate (cached / prompt tokens), $ per resolved task (the runs'
list-price cost_u, micro-USD) and wall time; each attempt's steps go to a JSONL trajectory file.

The runner only queues runs and waits for them: whatever drives the runtime's runs drives these (its own worker
started in this process, as the tests do, or a server's worker on the same database, as `mainspring code bench`
does). A run that has not ended after `timeout_s` is cancelled and judged on the diff it has.

    report = run_minibench(runtime, "default", layout="task_first", trajectories=Path("traj.jsonl"))
    print(report.render()); json.dumps(report.to_dict())
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Sequence

from mainspring.agents.journal import JournalError
from mainspring.agents.runtime import AgentRuntime
from mainspring.scenarios.coding.harness import evaluate
from mainspring.scenarios.coding.instances import INSTANCES_FILE, Instance, load_instances
from mainspring.scenarios.coding.passk import mean_pass_at_k
from mainspring.scenarios.coding.recipe import LAYOUTS, CodingTask, coding_outcome, start_coding_run

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out", "paused"}  # paused: its budget ran out
CANCEL_WAIT_S = 30.0
MICRO = 1_000_000


@dataclass
class TaskResult:
    instance_id: str
    kind: str
    attempt: int  # 0..samples-1
    run_id: str
    status: str  # the run's
    stop_reason: str | None
    green: bool  # the agent's own view: the repository's visible tests passed
    resolved: bool  # the harness's: the hidden FAIL_TO_PASS and PASS_TO_PASS tests pass
    reason: str
    iterations: int  # test runs after edits
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_u: int
    wall_s: float  # the run, queued to ended
    eval_s: float  # the harness
    timed_out: bool = False
    error: str | None = None

    @property
    def iterations_to_green(self) -> int | None:
        return self.iterations if self.green else None

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out.update(iterations_to_green=self.iterations_to_green, cache_hit_rate=round(self.cache_hit_rate, 4),
                   cost_usd=self.cost_u / MICRO, wall_s=round(self.wall_s, 3), eval_s=round(self.eval_s, 3))
        return out

    def line(self) -> str:
        verdict = "resolved" if self.resolved else "not resolved"
        return (f"{self.instance_id} #{self.attempt}: {verdict} ({self.stop_reason or self.status}, "
                f"{self.iterations} iterations, {self.prompt_tokens} prompt tokens, "
                f"{self.cache_hit_rate:.0%} cached, {self.wall_s:.1f}s) - {self.reason}")


@dataclass
class MinibenchReport:
    model: str
    layout: str
    samples: int
    results: list[TaskResult] = field(default_factory=list)

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(r.instance_id for r in self.results))

    @property
    def resolved(self) -> int:
        return sum(r.resolved for r in self.results)

    @property
    def resolved_rate(self) -> float:
        return self.resolved / len(self.results) if self.results else 0.0

    @property
    def pass_at_1(self) -> float:
        counts = [(sum(1 for r in self.results if r.instance_id == t), sum(r.resolved for r in self.results
                                                                           if r.instance_id == t))
                  for t in self.tasks]
        return mean_pass_at_k(counts, 1)

    def tokens(self) -> dict[str, int]:
        return {"prompt": sum(r.prompt_tokens for r in self.results),
                "cached": sum(r.cached_tokens for r in self.results),
                "completion": sum(r.completion_tokens for r in self.results)}

    @property
    def cache_hit_rate(self) -> float:
        t = self.tokens()
        return t["cached"] / t["prompt"] if t["prompt"] else 0.0

    @property
    def cost_usd(self) -> float:
        return sum(r.cost_u for r in self.results) / MICRO

    @property
    def usd_per_resolved(self) -> float | None:
        return self.cost_usd / self.resolved if self.resolved else None

    @property
    def mean_iterations_to_green(self) -> float | None:
        its = [r.iterations_to_green for r in self.results if r.iterations_to_green is not None]
        return sum(its) / len(its) if its else None

    @property
    def mean_wall_s(self) -> float:
        return sum(r.wall_s + r.eval_s for r in self.results) / len(self.results) if self.results else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "layout": self.layout, "samples": self.samples, "tasks": len(self.tasks),
                "attempts": len(self.results), "resolved": self.resolved,
                "resolved_rate": round(self.resolved_rate, 4), "pass@1": round(self.pass_at_1, 4),
                "green": sum(r.green for r in self.results), "mean_iterations_to_green": self.mean_iterations_to_green,
                "tokens": self.tokens(), "cache_hit_rate": round(self.cache_hit_rate, 4),
                "cost_usd": self.cost_usd, "usd_per_resolved": self.usd_per_resolved,
                "mean_wall_s_per_task": round(self.mean_wall_s, 3), "results": [r.to_dict() for r in self.results]}

    def render(self) -> str:
        """A plain aligned table (pipes cleanly), one attempt a row, then the totals."""
        header = ["task", "kind", "resolved", "green", "iters", "prompt", "cached", "compl", "hit", "$", "wall s"]
        rows = [[r.instance_id + (f"#{r.attempt}" if self.samples > 1 else ""), r.kind,
                 "yes" if r.resolved else "no", "yes" if r.green else "no", str(r.iterations), str(r.prompt_tokens),
                 str(r.cached_tokens), str(r.completion_tokens), f"{r.cache_hit_rate:.0%}",
                 f"{r.cost_u / MICRO:.4f}", f"{r.wall_s + r.eval_s:.1f}"] for r in self.results]
        widths = [max(len(c) for c in col) for col in zip(header, *rows)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [header, *rows]]
        t, per = self.tokens(), self.usd_per_resolved
        its = self.mean_iterations_to_green
        lines += ["", f"model {self.model} · layout {self.layout} · {len(self.tasks)} tasks × {self.samples}",
                  f"resolved {self.resolved}/{len(self.results)} ({self.resolved_rate:.1%}) · pass@1 "
                  f"{self.pass_at_1:.3f} · iterations to green {'-' if its is None else f'{its:.2f}'}",
                  f"tokens: prompt {t['prompt']}, cached {t['cached']} ({self.cache_hit_rate:.1%}), completion "
                  f"{t['completion']}",
                  f"cost ${self.cost_usd:.6f} · per resolved task {'-' if per is None else f'${per:.6f}'} · "
                  f"wall {self.mean_wall_s:.1f}s per task"]
        return "\n".join(lines)


def _wait(runtime: AgentRuntime, run_id: str, timeout_s: float, poll_s: float) -> bool:
    """Until the run ends; False when `timeout_s` passed first (the run is then cancelled)."""
    deadline = time.monotonic() + timeout_s
    while runtime.run(run_id).status not in TERMINAL:
        if time.monotonic() >= deadline:
            try:
                runtime.act(run_id, "cancel", actor="minibench")
            except JournalError:  # it ended meanwhile
                return True
            stop = time.monotonic() + CANCEL_WAIT_S
            while runtime.run(run_id).status not in TERMINAL and time.monotonic() < stop:
                time.sleep(poll_s)
            return False
        time.sleep(poll_s)
    return True


def run_task(runtime: AgentRuntime, instance: Instance, model: str, *, layout: str = "map_first",
             attempt: int = 0, max_iterations: int = 3, max_steps: int = 30, max_tokens: int = 1024,
             hints: bool = False, timeout_s: float = 900.0, sandbox: Any = None, poll_s: float = 0.2,
             trajectory: IO[str] | None = None) -> TaskResult:
    """One attempt at one instance: the coding run, then the harness on its diff."""
    statement = instance.problem_statement
    if hints and instance.hints_text:
        statement += f"\n\nHints: {instance.hints_text}"
    task = CodingTask(statement, instance.snapshot, model=model, max_iterations=max_iterations, layout=layout,
                      max_steps=max_steps, max_tokens=max_tokens)
    started = time.monotonic()
    run = start_coding_run(runtime, task)
    ended = _wait(runtime, run.run_id, timeout_s, poll_s)
    outcome = coding_outcome(runtime, run.run_id)
    wall_s = time.monotonic() - started
    ev = evaluate(instance, outcome.diff, sandbox=sandbox)
    usage = outcome.usage
    result = TaskResult(instance.instance_id, instance.kind, attempt, run.run_id, outcome.status, outcome.stop_reason,
                        outcome.green, ev.resolved, ev.reason, outcome.iterations, usage["prompt_tokens"],
                        usage["cached_tokens"], usage["completion_tokens"], outcome.cost_u, wall_s, ev.wall_s,
                        timed_out=not ended, error=outcome.error)
    if trajectory is not None:
        record = {"instance_id": instance.instance_id, "attempt": attempt, "model": model, "layout": layout,
                  "run_id": run.run_id, "problem_statement": statement,
                  "repo_map": {"files": run.repo_map.files, "tokens": run.repo_map.tokens},
                  "focus": {"files": run.focus.files, "tokens": run.focus.tokens},
                  "steps": runtime.steps(run.run_id), "outcome": outcome.to_dict(), "evaluation": ev.to_dict(),
                  "result": result.to_dict()}
        trajectory.write(json.dumps(record, default=str) + "\n")
        trajectory.flush()
    return result


def run_minibench(runtime: AgentRuntime, model: str, *, tasks: Sequence[str | Instance] | None = None,
                  layout: str = "map_first", trajectories: Path | None = None,
                  progress: Callable[[TaskResult], None] | None = None, samples: int = 1, max_iterations: int = 3,
                  max_steps: int = 30, max_tokens: int = 1024, hints: bool = False, timeout_s: float = 900.0,
                  sandbox: Any = None,
                  instances_file: Path = INSTANCES_FILE, poll_s: float = 0.2) -> MinibenchReport:
    """Run the minibench (or the `tasks` given, by id or as Instances) `samples` times each with `model`;
    `progress` is called with each attempt's result as it is judged; max_iterations, max_steps and max_tokens
    (per model call) go to each CodingTask. ValueError for a bad argument (an unknown
    task id, a layout that is not one of LAYOUTS), before any run starts."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if samples < 1:
        raise ValueError("samples must be at least 1")
    if tasks is None:
        instances = load_instances(instances_file)
    else:
        ids = [t for t in tasks if isinstance(t, str)]
        named = {i.instance_id: i for i in load_instances(instances_file, ids)} if ids else {}
        instances = [t if isinstance(t, Instance) else named[t] for t in tasks]
    report = MinibenchReport(model, layout, samples)
    if trajectories is not None:
        Path(trajectories).parent.mkdir(parents=True, exist_ok=True)
    sink = open(trajectories, "w", encoding="utf-8") if trajectories is not None else None
    try:
        for inst in instances:
            for attempt in range(samples):
                result = run_task(runtime, inst, model, layout=layout, attempt=attempt, max_iterations=max_iterations,
                                  max_steps=max_steps, max_tokens=max_tokens, hints=hints, timeout_s=timeout_s,
                                  sandbox=sandbox, poll_s=poll_s, trajectory=sink)
                report.results.append(result)
                if progress is not None:
                    progress(result)
    finally:
        if sink is not None:
            sink.close()
    return report
