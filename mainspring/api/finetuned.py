"""Fine-tuned models the API serves: one Hugging Face folder each under `Settings.finetuned_path`, named by
its model id ("ft:<base>:<suffix>:<job id>"), as the fine-tuning runner publishes them or an operator
copies them in.

Who sees one: a model a fine-tuning job made belongs to that job's project (another project's callers
get a 404, as for its jobs); a folder no job made is the operator's and every caller sees it.

A job's checkpoints (`<model id>:ckpt-step-N`) are models too, found by name for the job's project while
their weights exist (finetuned_checkpoints.py): the base model with the checkpoint's weights applied on
load. They are not listed (a job has one per few steps), only served and retrievable.

An engine is loaded on first use (on a worker thread, with its own small KV pool) and kept; past
`finetuned_max_loaded` the least recently used one is retired: dropped from the table at once, closed
when its last request has finished.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from mainspring.api import finetuned_checkpoints
from mainspring.config import Settings
from mainspring.compute import compute_thread
from mainspring.store.db import session
from mainspring.store.tables import FineTuningJobRow

log = logging.getLogger(__name__)

RETIRE_GRACE_S = 5.0  # a request that resolved the engine just before it was retired still gets to add itself
RETIRE_MAX_WAIT_S = 600.0


@dataclass(frozen=True)
class FineTunedModel:
    id: str
    path: Path
    base: str | None  # the base model's name, from mainspring_export.json
    project_id: int | None  # the project of the job that made it
    public: bool  # no job made it: an operator's model, visible to every caller
    created: int
    context_window: int | None
    checkpoint: Path | None = None  # a job's checkpoint folder: `path` is that folder, not an HF one
    base_spec: str | None = None  # a checkpoint's base, as load_model takes it

    def visible_to(self, principal: Any) -> bool:
        return self.public or self.project_id == (principal.project_id if principal is not None else None)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class FineTunedModels:
    def __init__(self, settings: Settings, db: Engine) -> None:
        self.settings, self.db = settings, db
        self.root = settings.finetuned_path
        self._engines: OrderedDict[str, Any] = OrderedDict()  # model id -> AsyncLLMEngine, least recent first
        self._locks: dict[str, asyncio.Lock] = {}

    # ---- which models there are (worker threads: disk and database) -----------------------------------
    def scan(self, only: str | None = None) -> list[FineTunedModel]:
        """Every model folder (or just `only`), with its owner from the jobs table."""
        if only is not None:
            dirs = [self.root / only] if (self.root / only / "config.json").is_file() else []
        elif self.root.is_dir():
            dirs = sorted(p for p in self.root.iterdir()
                          if p.is_dir() and not p.name.startswith(".") and (p / "config.json").is_file())
        else:
            dirs = []
        if not dirs:
            return []
        with session(self.db, readonly=True) as s:
            owners = dict(s.execute(select(FineTuningJobRow.fine_tuned_model, FineTuningJobRow.project_id)
                                    .where(FineTuningJobRow.fine_tuned_model.in_([p.name for p in dirs]))).all())
        out = []
        for p in dirs:
            meta = _read_json(p / "mainspring_export.json")
            ctx = _read_json(p / "config.json").get("max_position_embeddings")
            out.append(FineTunedModel(p.name, p, meta.get("base"), owners.get(p.name), p.name not in owners,
                                      int(p.stat().st_mtime), ctx if isinstance(ctx, int) else None))
        return out

    def visible(self, principal: Any) -> list[FineTunedModel]:
        return [m for m in self.scan() if m.visible_to(principal)]

    def find(self, principal: Any, model_id: str) -> FineTunedModel | None:
        return self.find_for_project(principal.project_id if principal is not None else None, model_id)

    def find_for_project(self, project_id: int | None, model_id: str) -> FineTunedModel | None:
        if not model_id or "/" in model_id or "\0" in model_id or model_id.startswith("."):
            return None  # a name, never a path
        if finetuned_checkpoints.NAME.match(model_id):
            return self._checkpoint(project_id, model_id)
        return next((m for m in self.scan(only=model_id) if m.public or m.project_id == project_id), None)

    def _checkpoint(self, project_id: int | None, name: str) -> FineTunedModel | None:
        c = finetuned_checkpoints.find(self.db, self.settings.data_dir, project_id, name)
        if c is None:
            return None
        try:
            created = int((c.folder / finetuned_checkpoints.META).stat().st_mtime)
        except OSError:  # the trainer rotated it out just now
            return None
        return FineTunedModel(name, c.folder, c.base, c.project_id, False, created, None, checkpoint=c.folder,
                              base_spec=c.base_spec)

    # ---- engines -------------------------------------------------------------------------------------------
    async def engine(self, m: FineTunedModel) -> Any:
        """The model's engine, loaded on first use; retires the least recently used one past the cap."""
        eng = self._engines.get(m.id)
        if eng is not None:
            self._engines.move_to_end(m.id)
            return eng
        lock = self._locks.setdefault(m.id, asyncio.Lock())
        async with lock:  # one load per model, however many requests ask at once
            eng = self._engines.get(m.id)
            if eng is None:
                # on the compute thread, like every engine (mainspring/compute.py): the standard engine's steps
                # wait for the seconds the load takes, rather than every step after it running slower
                eng = await compute_thread().run(lambda: self._load(m))
                self._engines[m.id] = eng
                while len(self._engines) > self.settings.finetuned_max_loaded:
                    old_id, old = self._engines.popitem(last=False)
                    log.info("unloading fine-tuned model %s (more than %d loaded)", old_id,
                             self.settings.finetuned_max_loaded)
                    _retire(old)
            self._engines.move_to_end(m.id)
            return eng

    def loaded(self) -> list[str]:
        return list(self._engines)

    def _load(self, m: FineTunedModel) -> Any:
        from mainspring.engine.async_engine import AsyncLLMEngine
        from mainspring.engine.config import EngineConfig
        from mainspring.engine.engine import LLMEngine
        from mainspring.engine.loader import load_model

        t0 = time.perf_counter()
        if m.checkpoint is not None and m.base_spec is not None:
            base = load_model(m.base_spec, self.settings.cache_dir)
            loaded = dataclasses.replace(finetuned_checkpoints.apply(base, m.checkpoint), name=m.id)
        else:
            loaded = dataclasses.replace(load_model(m.path, self.settings.cache_dir), name=m.id)
        config = dataclasses.replace(EngineConfig.from_settings(self.settings),
                                     kv_cache_mb=self.settings.finetuned_kv_cache_mb, kv_disk_cache_mb=0)
        eng = AsyncLLMEngine(LLMEngine(loaded, config))
        log.info("loaded fine-tuned model %s in %.1f s", m.id, time.perf_counter() - t0)
        return eng

    def close(self) -> None:
        for eng in self._engines.values():
            eng.close()
        self._engines.clear()


def _retire(eng: Any) -> None:
    """Close `eng` once its requests are done, off the event loop."""
    def wait_then_close() -> None:
        time.sleep(RETIRE_GRACE_S)
        deadline = time.monotonic() + RETIRE_MAX_WAIT_S
        while eng.engine.has_unfinished() and time.monotonic() < deadline:
            time.sleep(0.5)
        eng.close()

    threading.Thread(target=wait_then_close, name="retire-finetuned", daemon=True).start()
