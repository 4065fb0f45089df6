"""The refinement loop on a scripted model: a violated constraint is fed back with its measured
gap and the ids involved, one JSON Patch fixes it, untouched objects keep their bytes, the
prompt only grows at its end; bad patches, invalid results, the round cap and the budget."""

from __future__ import annotations

import asyncio
import json

import pytest

from mainspring.scenarios.scene3d import load_briefs
from mainspring.scenarios.scene3d.generate import SYSTEM_PROMPT
from mainspring.scenarios.scene3d.refine import RefineConfig, refine
from mainspring.scenes.patch import dumps
from tests.scenarios.scene3d.scripted import ScriptedModel

CUP = next(b for b in load_briefs() if b.id == "cup_on_table")


def written(cup_y: float = 1.0) -> dict:
    """A scene in the decoding schema's form whose cup floats (cup_y - 0.8) m over the table."""
    return {"schema": "scene/0.1", "objects": [
        {"id": "table", "shape": "box", "size": [1.2, 0.75, 0.8], "position": [0, 0.375, 0]},
        {"id": "cup", "shape": "cylinder", "radius": 0.04, "height": 0.1, "position": [0.2, cup_y, 0.1]}],
        "camera": {"position": [1.8, 1.6, 2.2], "look_at": [0, 0.6, 0]}}


def patch(*ops: tuple[str, object]) -> str:
    return dumps({"patch": [{"op": "replace", "path": p, "value": v} for p, v in ops]})


FIX = patch(("/objects/1/position/1", 0.8))


def run(model, config=None):
    return asyncio.run(refine(model, CUP, config or RefineConfig()))


def test_a_violated_constraint_is_fixed_by_one_revision():
    model = ScriptedModel([dumps(written()), FIX])
    result = run(model)
    assert result.stop_reason == "passed" and result.passed
    assert [r.kind for r in result.rounds] == ["write", "patch"]
    first, fix = result.rounds
    assert first.score.score == pytest.approx(3 / 5)
    assert sorted(first.to_dict()["failed"]) == ["no_floating(*)", "on_top_of(cup, table)"]
    assert fix.applied and fix.error is None and fix.score.score == 1.0
    assert result.to_dict()["final_score"] == 1.0 and result.to_dict()["revisions"] == 1

    feedback = model.calls[1]["messages"][-1]["content"]  # what the model was told
    assert "on_top_of(cup, table): gap = 0.2 m" in feedback and "no_floating(*): gap = 0.2 m" in feedback
    assert "cup is /objects/1:" in feedback and "table is /objects/0:" in feedback  # ids and pointers
    assert '{"op":"replace","path":"/objects/1/position/1","value":0.8}' in feedback  # the verified repair
    assert f"The scene now: {dumps(written())}" in feedback
    # the revision was constrained to a JSON Patch of this document
    fmt = model.calls[1]["response_format"]["json_schema"]
    assert fmt["name"] == "scene_patch" and "/objects/1/position/1" in json.dumps(fmt["schema"])
    assert model.calls[0]["response_format"]["json_schema"]["name"] == "scene"
    # untouched objects are byte-identical; the stable prompt is a prefix of the next one
    assert dumps(result.doc["objects"][0]) == dumps(written()["objects"][0])
    assert dumps(result.doc["camera"]) == dumps(written()["camera"])
    assert model.calls[1]["messages"][:2] == model.calls[0]["messages"]
    assert model.calls[1]["messages"][0]["content"] == SYSTEM_PROMPT  # the one-shot prompt: round 0 is its baseline
    assert result.spend.cached_tokens > 0 and result.spend.to_dict()["cache_hit_rate"] > 0.2


def test_a_revision_that_breaks_what_passed_is_refused_and_the_next_one_lands():
    lifts_table = patch(("/objects/0/position/1", 1.0))  # on_floor(table) passed before
    model = ScriptedModel([dumps(written()), lifts_table, FIX])
    result = run(model)
    assert result.stop_reason == "passed" and len(result.rounds) == 3
    refused = result.rounds[1]
    assert not refused.applied and refused.error.startswith("your patch was not applied: it breaks on_floor(table)")
    assert model.calls[2]["messages"][-1]["content"].startswith(refused.error)
    assert result.doc["objects"][0] == written()["objects"][0]


def test_of_several_candidate_patches_the_checker_keeps_the_best_and_counts_them_all():
    lifts_table = patch(("/objects/0/position/1", 1.0))  # refused: on_floor(table) passed before
    idle = patch(("/objects/1/position/0", 0.25))  # applies, fixes nothing
    model = ScriptedModel([dumps(written()), lifts_table, idle, FIX])
    result = run(model, RefineConfig(candidates=3, candidate_temperature=0.7, seed=5))
    assert result.stop_reason == "passed" and [r.kind for r in result.rounds] == ["write", "patch"]
    fix = result.rounds[1]
    assert (fix.candidates, fix.chosen, fix.text, fix.applied, fix.error) == (3, 2, FIX, True, None)
    assert fix.to_dict()["candidates"] == 3 and fix.to_dict()["chosen"] == 2
    # all three were asked the same prompt: the first at the loop's temperature, the rest sampled, seeds apart
    asked = model.calls[1:]
    assert asked[0]["messages"] == asked[1]["messages"] == asked[2]["messages"]
    assert [c["temperature"] for c in asked] == [0.0, 0.7, 0.7]
    assert len({c["seed"] for c in asked}) == 3
    # only the kept answer joins the conversation; every candidate's tokens are spent and counted
    assert result.messages[-1] == {"role": "assistant", "content": FIX}
    assert [m["content"] for m in result.messages].count(idle) == 0
    prompt = len(json.dumps(asked[0]["messages"]))
    assert fix.prompt_tokens == 3 * prompt and fix.completion_tokens == len(lifts_table) + len(idle) + len(FIX)
    assert result.spend.completion_tokens == result.rounds[0].completion_tokens + fix.completion_tokens
    with pytest.raises(ValueError, match="candidates"):
        RefineConfig(candidates=0)


def test_when_no_candidate_applies_the_first_ones_refusal_is_fed_back():
    lifts_table = patch(("/objects/0/position/1", 1.0))
    negative = patch(("/objects/1/radius", -0.5))
    model = ScriptedModel([dumps(written()), lifts_table, negative, FIX, FIX])
    result = run(model, RefineConfig(candidates=2))
    refused, fixed = result.rounds[1:]
    assert (refused.chosen, refused.applied) == (0, False) and "breaks on_floor(table)" in refused.error
    assert model.calls[3]["messages"][-1]["content"].startswith(refused.error)
    assert fixed.applied and result.stop_reason == "passed"


def test_a_patch_that_cannot_apply_or_breaks_the_scene_is_refused_and_said_so():
    unreadable = '{"patch":[{"op":"replace","path":"/objects/1/position/1"'  # cut short: no value
    negative = patch(("/objects/1/radius", -0.5))  # schema-shaped, but the scene would be invalid
    # the cut-short answer is what a length-limited call returns: no grammar finished it
    model = _Unchecked(ScriptedModel([dumps(written()), unreadable, negative, FIX]), skip={1})
    result = asyncio.run(refine(model, CUP, RefineConfig()))
    r1, r2, r3 = result.rounds[1:]
    assert not r1.applied and "not JSON" in r1.error
    assert not r2.applied and "makes the scene invalid" in r2.error and "radius" in r2.error
    assert r3.applied and result.stop_reason == "passed"
    told = [c["messages"][-1]["content"] for c in model.calls[2:]]
    assert told[0].startswith("your answer is not JSON") and told[1].startswith("your patch was not applied")
    assert result.doc["objects"][1]["radius"] == 0.04


def test_the_round_cap_and_the_token_budget_stop_the_loop():
    idle = patch(("/objects/1/position/0", 0.25))  # applies, fixes nothing
    capped = run(ScriptedModel([dumps(written()), idle, idle, idle]))
    assert capped.stop_reason == "max_rounds" and len(capped.rounds) == 4
    assert capped.final.score == pytest.approx(3 / 5)
    assert [r.applied for r in capped.rounds[1:]] == [True, False, False]  # the same patch again is no change
    assert capped.rounds[2].error.startswith("your patch changes nothing")
    one = run(ScriptedModel([dumps(written()), idle]), RefineConfig(max_rounds=1))
    assert one.stop_reason == "max_rounds" and len(one.rounds) == 2
    broke = run(ScriptedModel([dumps(written()), idle, FIX]), RefineConfig(token_budget=1))
    assert broke.stop_reason == "budget" and len(broke.rounds) == 1  # the first scene spent it all
    none = run(ScriptedModel([dumps(written())]), RefineConfig(max_rounds=0))
    assert none.stop_reason == "max_rounds" and none.to_dict()["first_score"] == pytest.approx(0.6)


def test_a_scene_that_passes_at_once_takes_no_revision_and_a_cut_one_stops():
    done = run(ScriptedModel([dumps(written(0.8))]))
    assert done.stop_reason == "passed" and len(done.rounds) == 1
    cut = asyncio.run(refine(_Unchecked(ScriptedModel(['{"schema":"scene/0.1","obj']), skip={0}), CUP))
    assert cut.stop_reason == "no_scene" and cut.doc is None and "not JSON" in cut.rounds[0].error


class _Unchecked(ScriptedModel):
    """Calls numbered in `skip` are answered without the format check: a length-cut answer."""

    def __init__(self, inner: ScriptedModel, skip: set[int]) -> None:
        super().__init__(inner.answers)
        self.inner, self.skip = inner, skip
        self.calls = inner.calls

    async def chat(self, messages, *, response_format=None, **kwargs):
        n = len(self.calls)
        return await super().chat(messages, response_format=None if n in self.skip else response_format, **kwargs)
