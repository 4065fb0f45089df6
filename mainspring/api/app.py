"""The HTTP app factory. For now: health and the model list; the API issue grows the routes."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import FastAPI

from mainspring import __version__
from mainspring.config import Settings, get_settings


def create_app(settings: Settings | None = None, engine=None) -> FastAPI:
    """`engine` (an AsyncLLMEngine) may be given by tests; otherwise it loads at startup."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if app.state.engine is None:
            from mainspring.engine.async_engine import AsyncLLMEngine
            from mainspring.engine.engine import LLMEngine

            app.state.engine = AsyncLLMEngine(LLMEngine.from_settings(settings))
        app.state.started = time.time()
        yield
        app.state.engine.close()

    app = FastAPI(title="Mainspring", version=__version__, lifespan=lifespan)
    app.state.engine = engine

    @app.get("/health")
    async def health() -> dict:
        eng = app.state.engine.engine
        return {"status": "ok", "version": __version__, "model": eng.name, **eng.stats()}

    @app.get("/v1/models")
    async def models() -> dict:
        eng = app.state.engine.engine
        return {"object": "list", "data": [
            {"id": eng.name, "object": "model", "created": int(app.state.started), "owned_by": "mainspring"}]}

    return app
