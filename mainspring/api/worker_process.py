"""`mainspring worker`: agent runs and plans driven by a process that serves no HTTP.

Beside one or more API servers on the same database (Postgres for several machines), a worker process claims
runnable runs by lease, drives them with the same runtime the server embeds (agents/runtime.py: its worker
and, while it holds the deployment's lease, the plan scheduler) and the same models: the engine in this
process, or the engine replicas on Ray when `MAINSPRING_ENGINE_REPLICAS` is set, upstreams and fine-tuned
models. Any worker may die at any time: its leases expire and another takes its runs over. SIGTERM or SIGINT
stops it cleanly: runs in flight are released at their next step and resume elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Mapping
from typing import Any

from mainspring.config import Settings

log = logging.getLogger("mainspring.worker")


async def _engine(settings: Settings):
    if settings.engine_replicas:
        from mainspring.cluster.replicated_engine import ReplicatedEngine

        return await asyncio.to_thread(ReplicatedEngine.start, settings)
    from mainspring.compute import compute_thread
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.engine import LLMEngine

    return AsyncLLMEngine(await compute_thread().run(lambda: LLMEngine.from_settings(settings)))


async def run_worker(settings: Settings, stop: asyncio.Event | None = None, *, models: Any = None,
                     tools: Mapping[str, Any] | None = None) -> None:
    """Drive agent runs until `stop` is set (or SIGTERM / SIGINT arrives). `models` (a model resolver) and `tools`
    replace the server's (tests: scripted models; then no engine is loaded)."""
    from mainspring.agents.runtime import AgentRuntime
    from mainspring.api.agent_models import AppModels
    from mainspring.api.finetuned import FineTunedModels
    from mainspring.api.upstream import Upstreams
    from mainspring.store.db import init_db

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    engine = await _engine(settings) if models is None else None
    upstreams = Upstreams.load(settings.upstreams_file)
    finetuned = FineTunedModels(settings, init_db(settings.resolved_database_url()))
    runtime = AgentRuntime(settings, models=models or AppModels(engine, upstreams, finetuned, settings.model),
                           tools=tools)
    await runtime.start()
    log.info("worker %s driving runs on %s", runtime.worker.owner, settings.resolved_database_url())
    try:
        await stop.wait()
    finally:
        log.info("worker %s stopping", runtime.worker.owner)
        await runtime.stop()
        finetuned.close()
        await upstreams.aclose()
        if engine is not None:
            engine.close()
