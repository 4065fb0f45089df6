"""A real uvicorn server on 127.0.0.1 serving the embedded model, shared by the API tests."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import pytest
import uvicorn


@dataclass
class Server:
    port: int
    app: object
    engine: object  # the AsyncLLMEngine

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def serve(app, engine) -> Iterator[Server]:
    """Run `app` on a real uvicorn server on 127.0.0.1 (a free port) in a background thread."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # the kernel picks a free port; uvicorn serves this very socket (no race)
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield Server(port, app, engine)
    finally:
        srv.should_exit = True
        thread.join(timeout=15)
        sock.close()


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
