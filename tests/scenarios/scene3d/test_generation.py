"""The embedded model, under constrained decoding, writes a schema-valid scene for every brief:
all 20 in one batched generate call within a bounded token budget."""

from __future__ import annotations

import jsonschema
import pytest

from mainspring.engine.config import EngineConfig
from mainspring.engine.engine import LLMEngine
from mainspring.scenarios.scene3d import evaluate, load_briefs
from mainspring.scenarios.scene3d.generate import generate_scenes
from mainspring.scenes import scene_json_schema

# SmolLM2's longest scene (a 5-object brief) runs to ~310 tokens: digits are a token each, and so
# is every key the grammar forces. The budget leaves room; a scene cut by it fails the test.
MAX_TOKENS = 512


@pytest.mark.slow
def test_every_brief_gets_a_schema_valid_scene(embedded):
    engine = LLMEngine(embedded, EngineConfig(kv_cache_mb=1024, max_num_batched_tokens=2048))
    briefs = load_briefs()
    generated = generate_scenes(engine, briefs, max_tokens=MAX_TOKENS)
    schema = jsonschema.Draft202012Validator(scene_json_schema())
    for g in generated:
        assert g.finish_reason == "stop", f"{g.brief.id}: cut at {g.completion_tokens} tokens: {g.text[-80:]!r}"
        doc = g.document()
        errors = [f"{e.json_path}: {e.message}" for e in schema.iter_errors(doc)]
        assert errors == [], g.brief.id
        assert [o["id"] for o in doc["objects"]] == g.brief.objects  # the brief's ids, in its order
        score = evaluate(doc, g.brief)  # whatever the model's layout is worth, the evaluator measures it
        assert 0.0 <= score.score <= 1.0 and (score.valid or score.violations)
    assert len(generated) == 20
