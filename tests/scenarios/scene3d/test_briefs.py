"""The 20 briefs: well formed, and each reference scene is valid, round-trips through glTF and
passes every constraint of its brief."""

from __future__ import annotations

import pytest

from mainspring.scenarios.scene3d import evaluate, load_briefs
from mainspring.scenes import from_gltf, load_scene, to_gltf

BRIEFS = load_briefs()


def test_there_are_twenty_distinct_briefs_covering_every_constraint_type():
    assert len(BRIEFS) == 20 and len({b.id for b in BRIEFS}) == 20
    used = {c.type for b in BRIEFS for c in b.constraints}
    from mainspring.scenes.constraint_model import CONSTRAINT_TYPES

    assert used == set(CONSTRAINT_TYPES)
    for b in BRIEFS:
        referenced = {getattr(c, k) for c in b.constraints for k in ("a", "b") if getattr(c, k, None)}
        assert referenced <= set(b.objects), b.id  # a brief names every id its checks use
        assert b.request().endswith(f"Use the ids: {', '.join(b.objects)}.")


@pytest.mark.parametrize("brief", BRIEFS, ids=lambda b: b.id)
def test_the_reference_scene_passes_its_brief(brief):
    score = evaluate(brief.reference, brief)
    failed = [str(r) for r in score.results if not r.passed]
    assert score.valid and score.missing == [] and failed == []
    assert score.score == 1.0 and len(score.results) == len(brief.constraints)


@pytest.mark.parametrize("brief", BRIEFS, ids=lambda b: b.id)
def test_the_reference_scene_round_trips_through_gltf(brief):
    scene = load_scene(brief.reference)
    assert load_scene(from_gltf(to_gltf(scene))) == scene
