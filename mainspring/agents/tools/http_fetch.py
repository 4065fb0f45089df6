"""`http_fetch`: GET one URL and return its text. Off unless the deployment enables it.

Caps: time (whole request, redirects included), bytes read, characters shown. Hosts that resolve to loopback,
private, link-local or otherwise non-public addresses are refused unless allowed, so a prompt-injected model
cannot reach the machine's own services or a cloud metadata endpoint. Redirects are followed by hand so that each
hop is checked. (A DNS answer that changes between our check and httpx's connect is not caught.)
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from html.parser import HTMLParser
from typing import Annotated
from urllib.parse import urljoin, urlsplit

import httpx
from pydantic import Field

from mainspring.agents.tools.base import ToolError, ToolResult, TransientToolError
from mainspring.agents.tools.decorator import FunctionTool, tool
from mainspring.config import Settings

MAX_BYTES = 1 << 20
TIMEOUT_S = 20.0
MAX_REDIRECTS = 5
SHOW_CHARS = 20_000
USER_AGENT = "mainspring-agent/0.1 (+http_fetch tool)"
TEXT_TYPES = re.compile(r"^(text/|application/(json|xml|xhtml\+xml|javascript|x-ndjson|ld\+json|.*\+json|.*\+xml))")


def http_fetch_tool(settings: Settings | None = None, *, allow_private_hosts: bool | None = None,
                    transport: httpx.AsyncBaseTransport | None = None) -> FunctionTool:
    """The tool; `allow_private_hosts` (default: setting `agent_http_allow_private`, else False) lets it reach
    loopback and private networks. `transport` replaces httpx's network transport (tests)."""
    allow_private = bool(getattr(settings, "agent_http_allow_private", False)) if allow_private_hosts is None \
        else allow_private_hosts
    max_bytes = int(getattr(settings, "agent_http_max_bytes", MAX_BYTES))
    timeout_s = float(getattr(settings, "agent_http_timeout_s", TIMEOUT_S))

    @tool(name="http_fetch", idempotent=True, retries=1, timeout_s=timeout_s + 5)
    async def http_fetch(url: str, max_chars: Annotated[int, Field(ge=100, le=100_000)] = SHOW_CHARS) -> ToolResult:
        """Fetch a web page or text file with HTTP GET and return its text (HTML is reduced to plain text).

        Args:
            url: an http:// or https:// URL
            max_chars: the most characters of text to return
        """
        try:
            async with asyncio.timeout(timeout_s):
                return await _fetch(url, max_chars, max_bytes, allow_private, transport)
        except TimeoutError:
            raise TransientToolError(f"fetching {url} took longer than {timeout_s:g} s") from None

    return http_fetch


async def _fetch(url: str, max_chars: int, max_bytes: int, allow_private: bool,
                 transport: httpx.AsyncBaseTransport | None) -> ToolResult:
    headers = {"User-Agent": USER_AGENT, "Accept": "text/*, application/json;q=0.9, */*;q=0.5"}
    # trust_env=False: no proxy or .netrc from the server's environment; the overall deadline is the caller's
    async with httpx.AsyncClient(transport=transport, follow_redirects=False, timeout=None, trust_env=False,
                                 headers=headers) as client:
        current = url
        for _ in range(MAX_REDIRECTS + 1):
            await check_url(current, allow_private)
            try:
                async with client.stream("GET", current) as response:
                    if response.is_redirect and "location" in response.headers:
                        current = urljoin(current, response.headers["location"])
                        continue
                    body, truncated = await _read_capped(response, max_bytes)
                    return _describe(url, current, response, body, truncated, max_chars)
            except httpx.TransportError as exc:
                raise TransientToolError(f"cannot fetch {current}: {type(exc).__name__}: {exc}") from exc
        raise ToolError(f"{url}: more than {MAX_REDIRECTS} redirects")


async def check_url(url: str, allow_private: bool) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolError(f"only http:// and https:// URLs with a host can be fetched, not {url!r}")
    if allow_private:
        return
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(parts.hostname, parts.port or 443,
                                                             type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ToolError(f"cannot resolve {parts.hostname}: {exc.strerror}") from exc
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if not address.is_global or address.is_multicast:
            raise ToolError(f"refused: {parts.hostname} is a private, loopback or reserved address ({address}); "
                            "http_fetch only reaches public hosts")


async def _read_capped(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            return b"".join(chunks)[:max_bytes], True
    return b"".join(chunks), False


def _describe(url: str, final_url: str, response: httpx.Response, body: bytes, truncated: bool,
              max_chars: int) -> ToolResult:
    content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    head = f"HTTP {response.status_code} {response.reason_phrase}, {content_type or 'no content type'}, " \
           f"{len(body)} bytes" + (" (download cut at the size limit)" if truncated else "")
    if final_url != url:
        head += f", redirected to {final_url}"
    data = {"url": url, "final_url": final_url, "status": response.status_code, "content_type": content_type,
            "bytes": len(body), "download_truncated": truncated}
    if content_type and not TEXT_TYPES.match(content_type):
        return ToolResult(f"{head}\n(binary content, not shown)", data=data, is_error=response.is_error)
    text = body.decode(response.encoding or "utf-8", errors="replace")
    if content_type in ("text/html", "application/xhtml+xml"):
        text = html_to_text(text)
    shown = text[:max_chars]
    data.update(text=shown, text_truncated=len(text) > max_chars)
    cut = f"\n[text cut at {max_chars} of {len(text)} characters]" if len(text) > max_chars else ""
    return ToolResult(f"{head}\n\n{shown}{cut}", data=data, is_error=response.is_error)


class _TextExtractor(HTMLParser):
    SKIP = {"script", "style", "noscript", "template", "svg"}
    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "pre",
             "blockquote", "title", "header", "footer", "table", "ul", "ol"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in self.SKIP:
            self.skipping += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP and self.skipping:
            self.skipping -= 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """Visible text of an HTML page, one block per line (scripts and styles dropped)."""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
