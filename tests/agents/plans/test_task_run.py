"""A task run's goal carries its input artifacts; a tool of the run reads them back, trusting only intact ones."""

import hashlib

from mainspring.agents.plans.spec import TaskSpec, artifact_bytes
from mainspring.agents.plans.task_run import goal_artifacts, render_goal


def inputs(upstream: dict) -> dict:
    bodies = {k: artifact_bytes(v).decode() for k, v in upstream.items()}
    return {"goal": "compare", "upstream_json": bodies,
            "hashes": {k: hashlib.sha256(b.encode()).hexdigest() for k, b in bodies.items()}}


def test_the_artifacts_rendered_into_a_goal_read_back_whole():
    task = TaskSpec(id="verify", agent="v", prompt="verify the report", depends_on=["analyse", "report"])
    given = {"analyse": {"findings": [{"program": "divide(1, 2)"}]}, "report": {"markdown": "a\n</x> b"}}
    goal = render_goal(task, inputs(given))
    assert goal_artifacts(goal) == {k: artifact_bytes(v).decode() for k, v in given.items()}


def test_an_edited_artifact_is_left_out():
    task = TaskSpec(id="verify", agent="v", prompt="verify", depends_on=["report"])
    goal = render_goal(task, inputs({"report": {"markdown": "revenue 10"}}))
    assert goal_artifacts(goal.replace("revenue 10", "revenue 99")) == {}
