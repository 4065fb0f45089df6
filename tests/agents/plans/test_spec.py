"""plans/spec.py: the plan document loads from YAML, JSON, a file or a dict; every refusal is a PlanError that
names the JSON path at fault; the run order is topological with ties in spec order; artifacts are canonical."""

import hashlib
import json

import pytest

from mainspring.agents.plans.spec import (PlanError, PlanSpec, artifact_bytes, artifact_hash, check_artifact,
                                          load_plan, plan_graph, validate_plan)


def plan(*tasks, **kw):
    """A PlanSpec from (id, depends_on, extra fields) tuples; agent "w", prompt "do it"."""
    return PlanSpec(goal="g", tasks=[{"id": t[0], "agent": "w", "prompt": "do it", "depends_on": list(t[1]),
                                      **(t[2] if len(t) > 2 else {})} for t in tasks], **kw)


def refused(spec, **kw) -> PlanError:
    with pytest.raises(PlanError) as e:
        validate_plan(spec, **kw)
    assert e.value.status == 400
    return e.value


YAML = """
goal: Write a report on {topic}
name: report
priority: 3
tasks:
  - id: research
    agent: researcher
    prompt: "Find sources for: {goal}"
    output_schema: {type: array, items: {type: string}}
  - id: summarise
    agent: writer
    prompt: "Summarise {item}"
    depends_on: [research]
    map_over: research
  - id: report
    agent: writer
    prompt: Write it up
    depends_on: [summarise]
    requires_approval: true
    on_failure: skip
"""


def test_yaml_json_file_and_dict_load_the_same_plan(tmp_path):
    from_yaml = load_plan(YAML)
    assert [t.id for t in from_yaml.tasks] == ["research", "summarise", "report"]
    assert from_yaml.tasks[1].map_over == "research" and from_yaml.tasks[2].on_failure == "skip"
    assert from_yaml.tasks[0].max_attempts == 2 and from_yaml.tasks[0].on_failure == "retry"  # defaults
    as_json = json.dumps(from_yaml.model_dump())
    assert load_plan(as_json) == from_yaml
    assert load_plan(from_yaml.model_dump()) == from_yaml
    (tmp_path / "plan.yaml").write_text(YAML)
    assert load_plan(tmp_path / "plan.yaml") == from_yaml
    assert load_plan(str(tmp_path / "plan.yaml")) == from_yaml
    assert validate_plan(from_yaml) == ["research", "summarise", "report"]


@pytest.mark.parametrize("text, param, message", [
    ("goal: g\ntasks: [\n", None, "not valid YAML"),
    ('{"goal": "g", "tasks": [}', None, "not valid JSON: Expecting value at line 1 column 25"),
    ("- just\n- a list\n", None, "a plan is a mapping with goal and tasks, not list"),
    ("tasks: [{id: a, agent: w, prompt: p}]", "goal", "goal: Field required"),
    ("goal: g\ntasks: [{id: a, agent: w, prompt: p}, {id: b, agent: w, prompt: p}, {id: Bad!, agent: w, prompt: p}]",
     "tasks[2].id", "tasks[2].id: String should match pattern"),
    ("goal: g\ntasks: [{id: a, agent: w, prompt: p, colour: red}]", "tasks[0].colour",
     "tasks[0].colour: Extra inputs are not permitted"),
    ("goal: g\ntasks: [{id: a, agent: w, prompt: p, on_failure: explode}]", "tasks[0].on_failure",
     "tasks[0].on_failure: Input should be 'fail', 'retry', 'skip' or 'replan'"),
    ("goal: g\ntasks: [{id: a, agent: w, prompt: p, max_attempts: 11}]", "tasks[0].max_attempts",
     "tasks[0].max_attempts: Input should be less than or equal to 10"),
    ("goal: g\ntasks: []", "tasks", "tasks: List should have at least 1 item"),
    ("goal: g\ncost_budget_usd: lots\ntasks: [{id: a, agent: w, prompt: p}]", "cost_budget_usd",
     "must be a decimal amount of USD"),
])
def test_bad_documents_name_the_path_at_fault(text, param, message):
    with pytest.raises(PlanError) as e:
        load_plan(text)
    assert e.value.param == param
    assert message in e.value.message
    assert e.value.status == 400


def test_a_yaml_error_says_where():
    with pytest.raises(PlanError) as e:
        load_plan("goal: g\ntasks: x: y\n")
    assert e.value.message == "not valid YAML: mapping values are not allowed here at line 2 column 9"


def test_duplicate_task_ids():
    e = refused(plan(("a", []), ("a", [])))
    assert (e.param, e.message) == ("tasks[1].id", "duplicate task id 'a' (also tasks[0])")


def test_dependency_on_an_unknown_task():
    e = refused(plan(("a", []), ("b", ["a", "zz"])))
    assert (e.param, e.message) == ("tasks[1].depends_on[1]", "task 'b' depends on unknown task 'zz'")


def test_a_dependency_listed_twice():
    e = refused(plan(("a", []), ("b", ["a", "a"])))
    assert (e.param, e.message) == ("tasks[1].depends_on[1]", "task 'b' lists 'a' twice in depends_on")


def test_map_over_must_be_a_dependency():
    e = refused(plan(("a", []), ("b", []), ("c", ["a"], {"map_over": "b", "prompt": "{item}"})))
    assert (e.param, e.message) == ("tasks[2].map_over", "task 'c' maps over 'b', which is not in its depends_on")


def test_item_only_in_a_fan_out_task():
    e = refused(plan(("a", [], {"prompt": "handle {item}"})))
    assert (e.param, e.message) == ("tasks[0].prompt", "task 'a' says {item} but maps over nothing (map_over)")


def test_a_cycle_is_spelled_out_in_order():
    e = refused(plan(("a", ["c"]), ("b", ["a"]), ("c", ["b"])))
    assert e.param == "tasks[0].depends_on"
    assert e.message == "dependency cycle: a → b → c → a (each task depends on the one before it)"


def test_the_cycle_named_is_a_real_one_not_what_hangs_off_it():
    # r is fine, w only waits on the cycle, x → y → z → x is the cycle (x also reads r)
    e = refused(plan(("r", []), ("w", ["z"]), ("x", ["r", "z"]), ("y", ["x"]), ("z", ["y"])))
    assert e.param == "tasks[2].depends_on"
    assert e.message == "dependency cycle: x → y → z → x (each task depends on the one before it)"


def test_a_task_depending_on_itself():
    e = refused(plan(("a", []), ("b", ["b"])))
    assert (e.param, e.message) == ("tasks[1].depends_on",
                                    "dependency cycle: b → b (each task depends on the one before it)")


def test_an_invalid_output_schema():
    e = refused(plan(("a", [], {"output_schema": {"type": "object", "properties": {"n": {"type": 5}}}})))
    assert e.param == "tasks[0].output_schema"
    assert e.message == ("task 'a': output_schema is not a valid JSON Schema: 5 is not valid under any of the "
                         "given schemas (at properties.n.type)")


def test_unknown_agents_and_tools_when_known_ones_are_given():
    spec = plan(("a", []), ("b", ["a"], {"agent": "critic"}))
    assert validate_plan(spec) == ["a", "b"]  # nothing to check against
    e = refused(spec, agents={"w": set()})
    assert (e.param, e.message) == ("tasks[1].agent", "task 'b' names unknown agent 'critic'")
    agents = {"w": {"files"}, "critic": {"python", "teleport"}}
    assert validate_plan(spec, agents=agents) == ["a", "b"]
    e = refused(spec, agents=agents, tools={"files", "python"})
    assert (e.param, e.message) == ("tasks[1].agent", "task 'b': agent 'critic' uses unknown tool 'teleport'")


def test_topological_order_is_stable_with_ties_in_spec_order():
    spec = plan(("d", ["b", "c"]), ("c", ["a"]), ("b", ["a"]), ("a", []), ("e", []))
    assert validate_plan(spec) == ["a", "c", "b", "d", "e"]
    graph = plan_graph(spec)
    assert graph.dependents == {"a": ["c", "b"], "b": ["d"], "c": ["d"], "d": [], "e": []}
    assert graph.rank["d"] == 3


def test_artifacts_are_canonical_and_their_hash_ignores_key_order():
    a = {"b": 1, "a": [1, 2.5, {"z": None, "y": "é"}]}
    b = {"a": [1, 2.5, {"y": "é", "z": None}], "b": 1}
    assert artifact_bytes(a) == artifact_bytes(b) == '{"a":[1,2.5,{"y":"é","z":null}],"b":1}'.encode()
    assert artifact_hash(a) == artifact_hash(b) == hashlib.sha256(artifact_bytes(a)).hexdigest()
    assert artifact_hash(a) != artifact_hash({"a": [1, 2.5], "b": 1})
    assert artifact_bytes(json.loads(artifact_bytes(a))) == artifact_bytes(a)  # decoding and re-encoding: same
    with pytest.raises(ValueError):
        artifact_bytes(float("nan"))


def test_check_artifact_names_the_first_error():
    schema = {"type": "object", "required": ["items"],
              "properties": {"items": {"type": "array", "items": {"type": "object", "required": ["n"],
                                                                  "properties": {"n": {"type": "integer"}}}}}}
    check_artifact(schema, {"items": [{"n": 1}, {"n": 2}]})
    check_artifact(None, ["anything", 1, None])
    with pytest.raises(PlanError) as e:
        check_artifact(schema, {"items": [{"n": 1}, {"n": "two"}, {"n": "three"}]})
    assert e.value.param == "artifact.items[1].n"
    assert e.value.message == ("the artifact does not match the output schema at artifact.items[1].n: 'two' is not "
                               "of type 'integer' (and 1 more errors)")
    with pytest.raises(PlanError) as e:
        check_artifact(None, {"when": object()})
    assert e.value.param == "artifact" and "not JSON" in e.value.message
