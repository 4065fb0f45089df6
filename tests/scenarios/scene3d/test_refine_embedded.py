"""The refinement loop with the real embedded model on 3 briefs, end to end through LocalModel
(constrained scene, constrained JSON Patch answers, the engine's prefix cache). The 135M model
may revise badly; what must hold is the loop's behaviour and its records."""

from __future__ import annotations

import asyncio
import json

import pytest

from mainspring.engine.async_engine import AsyncLLMEngine
from mainspring.engine.config import EngineConfig
from mainspring.engine.engine import LLMEngine
from mainspring.models.local import LocalModel
from mainspring.scenarios.scene3d import load_briefs
from mainspring.scenarios.scene3d.refine import RefineConfig, refine
from mainspring.scenes.patch import apply_patch

pytestmark = pytest.mark.slow
BRIEFS = [b for b in load_briefs() if b.id in ("cup_on_table", "stacked_books", "ball_left_of_box")]


def test_the_embedded_model_through_the_loop_on_three_briefs(embedded):
    engine = AsyncLLMEngine(LLMEngine(embedded, EngineConfig(kv_cache_mb=512, max_num_batched_tokens=2048)))
    config = RefineConfig(max_rounds=2)

    async def all_briefs():
        model = LocalModel(engine)
        return await asyncio.gather(*(refine(model, b, config) for b in BRIEFS))

    try:
        results = asyncio.run(all_briefs())
    finally:
        engine.close()
    assert len(results) == 3
    for brief, result in zip(BRIEFS, results):
        rounds = result.rounds
        assert rounds[0].kind == "write" and rounds[0].finish_reason == "stop", brief.id  # the grammar finished it
        assert result.stop_reason in ("passed", "max_rounds"), brief.id
        assert len(rounds) <= 1 + config.max_rounds
        if result.stop_reason == "max_rounds":
            assert len(rounds) == 1 + config.max_rounds and result.final.results
        scene = json.loads(result.messages[2]["content"])  # the first scene, as the conversation holds it
        for r in rounds[1:]:
            assert r.kind == "patch" and r.patch is not None or r.error, (brief.id, r.text)
            if r.applied:
                scene = apply_patch(scene, r.patch)
            assert r.cached_tokens > 0, "each revision's prompt extends the one before: the prefix cache serves it"
        assert scene == result.doc  # the records replay to the final scene
        assert result.final.score >= result.first.score  # a revision that loses ground is refused
        tokens = result.spend.to_dict()
        assert tokens["prompt_tokens"] == sum(r.prompt_tokens for r in rounds)
        assert tokens["completion_tokens"] == sum(r.completion_tokens for r in rounds)
        assert result.to_dict()["rounds"][0]["num_constraints"] == len(brief.constraints)
