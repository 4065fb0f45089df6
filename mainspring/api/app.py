"""The HTTP app factory: /health, the OpenAI-compatible /v1 routes, Anthropic's /v1/messages, the agent runtime
and the fine-tuning runner."""

from __future__ import annotations

import asyncio
import inspect
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from mainspring import __version__
from mainspring.api.body_limit import BodyLimit
from mainspring.api.economics import Economics
from mainspring.api.errors import engine_stopped_error, error_body, install_error_handlers
from mainspring.api.finetuned import FineTunedModels
from mainspring.api.routes import api_router, console
from mainspring.billing.trace import TraceRecorder
from mainspring.api.upstream import Upstreams
from mainspring.config import Settings, get_settings


def _flush_kv_cache(eng) -> None:
    """Write the engine's cached prefix blocks to its KV disk tier (if any), so a restart keeps them.
    Under the engine lock: should close() have timed out mid-step, the step finishes first."""
    with eng._lock:
        eng.engine.flush_kv_cache()


def _build_engines(settings: Settings):
    """The standard engine and, when served, the "<model>-fast" one (int4 weights + speculative decoding, the
    same tokenizer), from one load of the weights."""
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.loader import load_model

    loaded = load_model(settings.model, settings.cache_dir)
    standard = LLMEngine(loaded, EngineConfig.from_settings(settings))
    if not settings.fast_variant:
        return standard, None
    from mainspring.engine.fast_variant import build_fast_engine

    return standard, build_fast_engine(settings, loaded, standard)


def create_app(settings: Settings | None = None, engine=None, agent_models=None, agent_tools=None,
               train_fn=None, scene_dialogue=None) -> FastAPI:
    """`engine` (an AsyncLLMEngine) may be given by tests; otherwise it loads at startup. `agent_models` (model
    name -> ChatModel) and `agent_tools` (name -> Tool) replace the agent runtime's defaults (tests), and
    `train_fn` the fine-tuning runner's trainer (mainspring.train.trainer.run_training). `scene_dialogue` serves
    /v1/scenes/threads (routes/scene_threads.py): the scenario layer's, which this layer may not import, so the
    caller above both gives it (cli.py `serve`); without it those routes answer 404 (`not_served`)."""
    settings = settings or get_settings()

    owns_engine = engine is None  # an engine given by the caller is the caller's to close

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if app.state.engine is None and settings.engine_replicas:
            from mainspring.cluster.replicated_engine import ReplicatedEngine

            # the model on Ray replicas behind the prefix-aware router; "-fast" is then served by them too
            app.state.engine = await asyncio.to_thread(ReplicatedEngine.start, settings)
        if app.state.engine is None:
            from mainspring.engine.async_engine import AsyncLLMEngine
            from mainspring.compute import compute_thread

            # on the compute thread, where the engines will step: torch keeps one thread pool (compute.py)
            standard, fast = await compute_thread().run(lambda: _build_engines(settings))
            app.state.engine = AsyncLLMEngine(standard)
            if fast is not None:
                app.state.fast_engine = AsyncLLMEngine(fast)
        app.state.started = time.time()
        from mainspring.api.batch_runner import BatchRunner  # needs the engine: started here, stopped first

        app.state.batch_runner = BatchRunner(app)
        await app.state.batch_runner.start()
        from mainspring.agents.runtime import AgentRuntime  # needs the engine, stopped before it
        from mainspring.api.agent_models import AppModels

        models = agent_models or AppModels(app.state.engine, app.state.upstreams, app.state.finetuned, settings.model)
        app.state.agents = AgentRuntime(settings, models=models, tools=agent_tools)
        if settings.serve_agent_worker:  # else `mainspring worker` processes drive the runs
            await app.state.agents.start()
        from mainspring.api import fine_tuning_results
        from mainspring.train.jobs import FineTuningRunner  # resumes the job a restart cut off

        db = app.state.economics.db

        def write_results(job_id: str) -> None:  # a job's metrics CSV goes to the Files store, which api owns
            fine_tuning_results.write(db, settings, job_id)

        app.state.fine_tuning = FineTuningRunner(settings, db, train_fn=train_fn, results=write_results)
        app.state.fine_tuning.start()
        yield
        await asyncio.to_thread(app.state.fine_tuning.stop)  # the job checkpoints; the next start resumes it
        if settings.serve_agent_worker:
            await app.state.agents.stop()
        await app.state.batch_runner.stop()
        app.state.finetuned.close()
        await app.state.upstreams.aclose()
        if owns_engine:
            engines = [e for e in (app.state.engine, app.state.fast_engine) if e is not None]
            for eng in engines:
                eng.close()
            for eng in engines:
                await asyncio.to_thread(_flush_kv_cache, eng)

    app = FastAPI(title="Mainspring", version=__version__, lifespan=lifespan)
    app.state.engine = engine
    app.state.fast_engine = None  # without its own engine, "-fast" is served by the standard one
    app.state.settings = settings
    app.state.economics = Economics(settings)
    app.state.trace_recorder = TraceRecorder(settings.record_trace) if settings.record_trace else None
    app.state.upstreams = Upstreams.load(settings.upstreams_file)  # OpenAI-compatible endpoints served as models
    app.state.finetuned = FineTunedModels(settings, app.state.economics.db)  # ft:... models, loaded on first use
    app.state.fine_tuning = None  # the FineTuningRunner, from startup on
    app.state.scene_dialogue = scene_dialogue  # a routes.scene_threads.SceneDialogue, or None
    app.state.started = time.time()
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=int(settings.max_request_mb * 2**20),
                       upload_bytes=int(settings.max_upload_mb * 2**20))
    app.include_router(api_router())
    app.include_router(console.router)  # the web console at / (static files; its data comes from /v1 with a key)

    @app.get("/health", response_model=None)
    async def health() -> dict | JSONResponse:
        engines = [e for e in (app.state.engine, getattr(app.state, "fast_engine", None)) if e is not None]
        stopped = [e.engine.name for e in engines
                   if getattr(e, "stopped", None) is not None]  # replicas heal themselves (cluster/)
        if stopped:  # a 503 that a supervisor acts on: only a restart brings the engine back
            return JSONResponse(error_body(engine_stopped_error(), False) | {"status": "engine stopped",
                                                                            "models": stopped}, status_code=503)
        eng = app.state.engine.engine
        stats = eng.stats()
        if inspect.isawaitable(stats):  # engine replicas answer over Ray (cluster/replicated_engine.py)
            stats = await stats
        out = {"status": "ok", "version": __version__, "model": eng.name, **stats}
        fast = getattr(getattr(app.state, "fast_engine", None), "engine", None)
        choice = getattr(fast, "kernel_choice", None)
        if fast is not None and choice is not None:  # which weights the -fast variant runs on this CPU, and why
            out["fast_variant"] = {"model": fast.name, "weights": choice.name, "reason": choice.reason,
                                   "ms_per_step": choice.ms_per_step, "accuracy": choice.accuracy,
                                   "cpu": choice.cpu, "from_cache": choice.from_cache,
                                   # int4 layers whose prefill runs the standard engine's linears (shared_prefill.py)
                                   "prefill_shared_layers": len(getattr(fast.quant_report, "shared_prefill", []))}
        return out

    return app
