"""http_fetch against a server this test starts on 127.0.0.1: nothing here reaches the network."""

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from mainspring.agents.tools.base import ToolContext, TransientToolError
from mainspring.agents.tools.http_fetch import check_url, html_to_text, http_fetch_tool

from .conftest import call

PAGE = b"""<html><head><title>Docs</title><style>p {color: red}</style><script>alert('x')</script></head>
<body><h1>Welcome</h1><p>First &amp; foremost.</p><ul><li>one</li><li>two</li></ul></body></html>"""


class Handler(BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self):  # noqa: N802 (the http.server spelling)
        Handler.requests.append(self.path)
        routes = {
            "/page": (200, "text/html; charset=utf-8", PAGE),
            "/data.json": (200, "application/json", b'{"ok": true}'),
            "/big": (200, "text/plain", b"y" * (3 << 20)),
            "/image": (200, "image/png", b"\x89PNG\x00\x00"),
            "/missing": (404, "text/plain", b"no such page"),
        }
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/page")
            self.end_headers()
            return
        if self.path == "/loop":
            self.send_response(301)
            self.send_header("Location", "/loop")
            self.end_headers()
            return
        if self.path == "/slow":
            time.sleep(3)
        status, kind, body = routes.get(self.path, (200, "text/plain", b"slow"))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading at its size cap

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


local = http_fetch_tool(allow_private_hosts=True)
CTX = ToolContext("r", "c", "k", workspace=None)  # type: ignore[arg-type]


def test_html_is_reduced_to_text(server):
    result = call(local, {"url": f"{server}/page"}, CTX)
    assert result.content == (f"HTTP 200 OK, text/html, {len(PAGE)} bytes\n\n"
                              "Docs\n\nWelcome\n\nFirst & foremost.\n\none\n\ntwo")
    assert result.data["status"] == 200 and not result.is_error


def test_json_redirects_errors_and_binary(server):
    assert call(local, {"url": f"{server}/data.json"}, CTX).content.endswith('\n\n{"ok": true}')
    moved = call(local, {"url": f"{server}/moved"}, CTX)
    assert f"redirected to {server}/page" in moved.content and "Welcome" in moved.content
    missing = call(local, {"url": f"{server}/missing"}, CTX)
    assert missing.is_error and missing.content.startswith("HTTP 404 Not Found") and "no such page" in missing.content
    image = call(local, {"url": f"{server}/image"}, CTX)
    assert image.content == "HTTP 200 OK, image/png, 6 bytes\n(binary content, not shown)"
    loop = call(local, {"url": f"{server}/loop"}, CTX)
    assert loop.is_error and "more than 5 redirects" in loop.content


def test_size_and_character_caps(server):
    capped = http_fetch_tool(SimpleNamespace(agent_http_max_bytes=1000), allow_private_hosts=True)
    result = call(capped, {"url": f"{server}/big", "max_chars": 100}, CTX)
    assert result.data["bytes"] == 1000 and result.data["download_truncated"]
    assert "(download cut at the size limit)" in result.content
    assert result.content.endswith("y" * 100 + "\n[text cut at 100 of 1000 characters]")


def test_slow_servers_time_out_as_a_transient_error(server):
    quick = http_fetch_tool(SimpleNamespace(agent_http_timeout_s=0.5), allow_private_hosts=True)
    with pytest.raises(TransientToolError, match="took longer than 0.5 s"):
        call(quick, {"url": f"{server}/slow"}, CTX)


def test_private_hosts_and_other_schemes_are_refused_by_default(server):
    default = http_fetch_tool()
    before = len(Handler.requests)
    result = call(default, {"url": f"{server}/page"}, CTX)
    assert result.is_error and "refused: 127.0.0.1 is a private, loopback or reserved address" in result.content
    assert len(Handler.requests) == before  # the request was never sent
    for url in ("http://10.1.2.3/", "http://169.254.169.254/latest/meta-data", "http://[::1]:8080/",
                "http://0.0.0.0/", "http://192.168.0.1/"):
        with pytest.raises(Exception, match="refused"):
            asyncio.run(check_url(url, allow_private=False))
    for url in ("file:///etc/passwd", "ftp://example.org/x", "http:///nohost"):
        assert "only http:// and https://" in call(default, {"url": url}, CTX).content


def test_html_to_text_drops_scripts_and_keeps_blocks():
    assert html_to_text("<div>a<script>x()</script>b</div><p>c  d</p>") == "ab\n\nc d"
