"""The console in a real browser: Debian's chromium driven by Playwright, against a real server on 127.0.0.1.

Playwright cannot download its own browser here (no network), so it launches /usr/bin/chromium (apt package
`chromium`, installed by .ci/run); without it, or without the playwright package, these tests skip and say why.
The servers' agents are scripted (tests/api/test_agent_routes.py): what is under test is the page, not a model.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

CHROMIUM = "/usr/bin/chromium"
VIEWPORT = {"width": 1280, "height": 800}
TIMEOUT_MS = 20_000  # generous: the machine may be busy with other test workers


# One browser per test module, not per session: while Playwright's sync API is open, its event loop counts as
# running on the main thread, so every later test in the same worker that calls asyncio.run() failed ("cannot be
# called from a running event loop"; 3 such failures and a hung worker when xdist sent engine tests after web ones)
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium): the console's browser tests "
                    "need it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
    with sync_api.sync_playwright() as p:
        # root cannot use chromium's sandbox (the page is our own, from loopback); WebGL (the scene viewer) on
        # SwiftShader, the CPU renderer: no GPU is assumed
        b = p.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                              args=["--no-sandbox", "--no-proxy-server", "--use-angle=swiftshader",
                                    "--enable-unsafe-swiftshader"])
        yield b
        b.close()


class Console:
    """One browser page on the console, with every console error and failed page error it saw."""

    def __init__(self, page: Any, base_url: str, shots: Path) -> None:
        self.page, self.base_url, self.shots = page, base_url, shots
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.set_default_timeout(TIMEOUT_MS)

    def open(self, route: str = "") -> Any:
        self.page.goto(f"{self.base_url}/{route}")
        return self.page

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def console(browser, tmp_path) -> Iterator[Any]:
    def make(base_url: str, viewport: dict | None = None) -> Console:
        context = browser.new_context(viewport=viewport or VIEWPORT)
        contexts.append(context)
        return Console(context.new_page(), base_url, tmp_path)

    contexts: list[Any] = []
    yield make
    for c in contexts:
        c.close()
