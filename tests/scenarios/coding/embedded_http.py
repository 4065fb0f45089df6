"""The embedded SmolLM2 served over HTTP on 127.0.0.1 (the API app on the real engine), for the coding tests that
run the minibench or sample HumanEval-style completions through the OpenAI-compatible API."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from tests.servers import Server, serve


@contextmanager
def embedded_http(embedded, db_dir: Path) -> Iterator[Server]:
    from mainspring.api.app import create_app
    from mainspring.config import Settings
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine

    engine = AsyncLLMEngine(LLMEngine(embedded, EngineConfig(kv_cache_mb=256)))
    try:
        with serve(create_app(Settings(database_url=f"sqlite:///{db_dir / 'mainspring.db'}"), engine=engine),
                   engine) as srv:
            yield srv
    finally:
        engine.close()


def served_model(srv: Server) -> str:
    """The name the server serves the embedded model under (SmolLM2-135M-Instruct)."""
    return httpx.get(f"{srv.openai_url}/models").json()["data"][0]["id"]
