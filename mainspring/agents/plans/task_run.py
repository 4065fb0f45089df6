"""What a plan task's run is given: the model it calls (`route`) and its goal (`render_goal`; a tool of the run
reads the input artifacts back with `goal_artifacts`).

The scheduler creates each task's run from these (scheduler.py); admission reads `route` to know which model a
run will load before it starts (admission.py).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from mainspring.agents.plans.spec import PlanSpec, TaskSpec


def route(plan: PlanSpec, task: TaskSpec, attempt: int) -> str | None:
    """The model a task's run calls instead of its agent's, or None. With the plan's `simple_model`, a simple task
    (declared, or "auto": a prompt of at most 60 words reading at most one upstream artifact) runs its first
    attempt on it; a retry escalates to the agent's own, stronger model (a failed schema check, a failed run)."""
    if plan.simple_model is None or attempt > 1:
        return None
    simple = task.complexity == "simple" or (
        task.complexity == "auto" and len(task.prompt.split()) <= 60 and len(task.depends_on) <= 1)
    return plan.simple_model if simple else None


def render_goal(spec: TaskSpec, inputs: dict[str, Any]) -> str:
    """The run's goal: the prompt (the planner's revision, if any), then every input artifact verbatim with its
    hash."""
    prompt = inputs.get("prompt") or spec.prompt
    text = prompt.replace("{goal}", inputs["goal"])
    if "item_json" in inputs:
        text = text.replace("{item}", inputs["item_json"])
    parts = [text]
    if "{goal}" not in prompt:
        parts.append(f"The plan's goal: {inputs['goal']}")
    if "item_json" in inputs and "{item}" not in prompt:
        parts.append(f'<item index="{inputs["item_index"]}" sha256="{inputs["item_sha256"]}">\n'
                     f'{inputs["item_json"]}\n</item>')
    for key, body in inputs["upstream_json"].items():
        parts.append(f'<artifact task="{key}" sha256="{inputs["hashes"][key]}">\n{body}\n</artifact>')
    return "\n\n".join(parts)


ARTIFACT_BLOCK = re.compile(r'<artifact task="([^"]+)" sha256="([0-9a-f]{64})">\n(.*?)\n</artifact>', re.S)


def goal_artifacts(goal: str) -> dict[str, str]:
    """The input artifacts in a task run's goal, by task: the JSON text of each block whose bytes still hash to
    the sha256 it was given with (a block that does not is left out, so a tool never trusts edited input)."""
    return {task: body for task, digest, body in ARTIFACT_BLOCK.findall(goal)
            if hashlib.sha256(body.encode()).hexdigest() == digest}
