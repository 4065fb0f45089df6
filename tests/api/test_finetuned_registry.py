"""The fine-tuned model registry without loading weights: who sees which folder, one load per model however
many ask at once, and the least recently used engine retired (closed once idle) past the cap."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import pytest

from mainspring.api import finetuned
from mainspring.api.finetuned import FineTunedModels
from mainspring.config import Settings
from mainspring.store.db import init_db, session
from mainspring.store.tables import FineTuningJobRow, Project


class FakeEngine:
    def __init__(self, name: str) -> None:
        self.name, self.closed, self.busy = name, False, False
        self.engine = SimpleNamespace(has_unfinished=lambda: self.busy)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def registry(tmp_path, monkeypatch):
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/db.sqlite", finetuned_max_loaded=2)
    db = init_db(settings.resolved_database_url())
    with session(db) as s:
        s.add_all([Project(id=1, name="acme"), Project(id=2, name="rival")])
        s.flush()
        s.add(FineTuningJobRow(id="ftjob-a", project_id=1, model="Base", training_file="f", seed=0, status="succeeded",
                               method_json="{}", config_json="{}", attempts=1, fine_tuned_model="ft:Base::ftjob-a"))
    for name in ("ft:Base::ftjob-a", "operator-model", "ft:Base::ftjob-c"):
        (settings.finetuned_path / name).mkdir(parents=True)
        (settings.finetuned_path / name / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    (settings.finetuned_path / ".tmp-half-published").mkdir()
    reg = FineTunedModels(settings, db)
    loads: list[str] = []

    def fake_load(m):
        loads.append(m.id)
        time.sleep(0.05)
        return FakeEngine(m.id)

    monkeypatch.setattr(reg, "_load", fake_load)
    monkeypatch.setattr(finetuned, "RETIRE_GRACE_S", 0.0)
    reg.loads = loads
    return reg


def key(project_id):
    return SimpleNamespace(project_id=project_id)


def test_a_jobs_model_is_its_projects_and_an_operators_is_everyones(registry):
    assert {m.id for m in registry.visible(key(1))} == {"ft:Base::ftjob-a", "operator-model", "ft:Base::ftjob-c"}
    assert {m.id for m in registry.visible(key(2))} == {"operator-model", "ft:Base::ftjob-c"}
    assert {m.id for m in registry.visible(None)} == {"operator-model", "ft:Base::ftjob-c"}
    assert (registry.find(key(2), "ft:Base::ftjob-a") is None
            and registry.find(key(1), "ft:Base::ftjob-a").public is False)
    assert registry.find(key(1), "../db.sqlite") is None and registry.find(key(1), ".tmp-half-published") is None
    assert registry.find(key(1), "operator-model").context_window == 64


def test_one_load_per_model_and_the_least_recently_used_is_retired(registry):
    models = {m.id: m for m in registry.visible(key(1))}

    async def scenario():
        a1, a2 = await asyncio.gather(registry.engine(models["ft:Base::ftjob-a"]),
                                      registry.engine(models["ft:Base::ftjob-a"]))
        assert a1 is a2 and registry.loads == ["ft:Base::ftjob-a"]
        op = await registry.engine(models["operator-model"])
        await registry.engine(models["ft:Base::ftjob-a"])  # a is now the most recent
        op.busy = True  # a request still running on it
        await registry.engine(models["ft:Base::ftjob-c"])
        return a1, op

    a, op = asyncio.run(scenario())
    assert registry.loaded() == ["ft:Base::ftjob-a", "ft:Base::ftjob-c"]
    time.sleep(0.3)
    assert not op.closed and not a.closed  # retired, but closed only once its request is done
    op.busy = False
    deadline = time.monotonic() + 5
    while not op.closed:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    registry.close()
    assert a.closed and registry.loaded() == []


def test_an_agent_may_use_its_projects_fine_tuned_models_only(registry):
    """Agents resolve ft: names per run's project (api AppModels): another project's model is unknown."""
    from mainspring.agents.journal import JournalError
    from mainspring.api.agent_models import AppModels
    from mainspring.api.upstream import Upstreams
    from mainspring.models import LocalModel

    resolve = AppModels(engine=None, upstreams=Upstreams(), finetuned=registry, configured_model="smollm2")
    mine = resolve("ft:Base::ftjob-a", 1)
    assert mine.model == "ft:Base::ftjob-a" and registry.loads == []  # loaded on the first call, not before
    local = asyncio.run(mine._model())
    assert isinstance(local, LocalModel) and local.engine.name == "ft:Base::ftjob-a"
    assert registry.loads == ["ft:Base::ftjob-a"]
    for project in (2, None):
        with pytest.raises(JournalError, match="unknown model 'ft:Base::ftjob-a'"):
            resolve("ft:Base::ftjob-a", project)
    assert resolve("operator-model", 2).model == "operator-model"  # an operator's model is everyone's


def test_a_jobs_checkpoint_is_its_projects_model_while_its_weights_exist(registry):
    """ft:...:ckpt-step-N names a checkpoint row of the job; found only for the job's project, only while the
    trainer's folder still holds its weights, never listed."""
    from mainspring.store.tables import FineTuningCheckpointRow

    data_dir = registry.settings.data_dir
    with session(registry.db) as s:
        s.add(FineTuningJobRow(id="ftjob-r", project_id=1, model="Base", suffix="s", training_file="f", seed=0,
                               status="paused", method_json="{}", config_json=json.dumps({"model": "smollm2"}),
                               attempts=1))
        s.flush()
        for step in (2, 4):
            s.add(FineTuningCheckpointRow(id=f"ftckpt_{step}", job_id="ftjob-r", step_number=step,
                                          path=f"fine_tuning/ftjob-r/checkpoints/step-{step:06d}"))
    for step in (2, 4):
        folder = data_dir / "fine_tuning" / "ftjob-r" / "checkpoints" / f"step-{step:06d}"
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text("{}")
        (folder / "weights.safetensors").write_bytes(b"")
    (data_dir / "fine_tuning" / "ftjob-r" / "checkpoints" / "step-000002" / "weights.safetensors").unlink()  # rotated

    m = registry.find(key(1), "ft:Base:s:ftjob-r:ckpt-step-4")
    assert m is not None and m.checkpoint == m.path and m.path.name == "step-000004"
    assert (m.base_spec, m.base, m.project_id, m.public) == ("smollm2", "Base", 1, False)
    for who, name in ((key(2), "ft:Base:s:ftjob-r:ckpt-step-4"), (None, "ft:Base:s:ftjob-r:ckpt-step-4"),
                      (key(1), "ft:Base:s:ftjob-r:ckpt-step-2"),  # its weights are gone
                      (key(1), "ft:Base:s:ftjob-r:ckpt-step-3"),  # no such checkpoint
                      (key(1), "ft:Other:s:ftjob-r:ckpt-step-4"), (key(1), "ft:Base::ftjob-r:ckpt-step-4")):
        assert registry.find(who, name) is None, name
    assert not any("ckpt" in x.id for x in registry.visible(key(1)))
