"""Real uvicorn servers on 127.0.0.1 for tests: one helper, used by every test that needs HTTP."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

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


def wait_healthy(proc, url: str, log_path, timeout: float = 180.0) -> None:
    """Until the server subprocess `proc` answers `url`/health; fails with its log's tail if it exits first."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise AssertionError(open(log_path, errors="replace").read()[-3000:])
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the server at {url} did not come up within {timeout:.0f}s")
