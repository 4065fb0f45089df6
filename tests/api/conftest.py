"""A real uvicorn server on 127.0.0.1 serving the embedded model, shared by the API tests."""

from __future__ import annotations

import pytest

from tests.servers import serve  # also imported from here by the API tests


@pytest.fixture(scope="session")
def async_engine(embedded):
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine

    engine = AsyncLLMEngine(LLMEngine(embedded, EngineConfig(kv_cache_mb=256)))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def server(async_engine, tmp_path_factory):
    from mainspring.api.app import create_app
    from mainspring.config import Settings

    db = tmp_path_factory.mktemp("api-db") / "mainspring.db"
    app = create_app(Settings(database_url=f"sqlite:///{db}"), engine=async_engine)
    with serve(app, async_engine) as srv:
        yield srv


@pytest.fixture(scope="session")
def oai(server):
    import openai

    return openai.OpenAI(base_url=server.openai_url, api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def ant(server):
    import anthropic

    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)
