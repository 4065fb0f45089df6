"""The command line's HTTP client for the running server's agent API (`make up`), at
http://MAINSPRING_HOST:MAINSPRING_PORT. Every failure to reach the server, and every error it answers, ends the
command with a message and exit code 2 (mainspring.console.fail), never a traceback.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterator, NoReturn

import httpx
from httpx_sse import EventSource

from mainspring.config import Settings
from mainspring.console import fail
from mainspring.retry import backoff_delay

RECONNECTS = 5  # a dropped event stream is resumed (Last-Event-ID) this many times in a row


class Server:
    """The running server's agent API; every failure to reach it or every error it answers ends the command."""

    def __init__(self, api_key: str | None = None):
        s = Settings()
        host = "127.0.0.1" if s.host in ("", "0.0.0.0", "::") else s.host  # a bind-all address: connect locally
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{s.port}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def call(self, method: str, path: str, *, missing_ok: bool = False, **kwargs: Any) -> Any:
        try:
            r = self.http.request(method, path, **kwargs)
        except httpx.ConnectError:
            self.unreachable()
        except httpx.HTTPError as exc:
            fail(f"the server at {self.url} did not answer {method} {path}: {exc}")
        if r.status_code == 404 and missing_ok:
            return None
        if r.status_code >= 400:
            self.refused(r)
        return r.json() if "json" in r.headers.get("content-type", "") else r.text

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.call("GET", path, **kwargs)

    def post(self, path: str, body: dict | None = None, **kwargs: Any) -> Any:
        return self.call("POST", path, json=body or {}, **kwargs)

    def unreachable(self) -> NoReturn:
        fail(f"no server at {self.url} — start it with `make up`")

    def refused(self, r: httpx.Response) -> NoReturn:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:500] or r.reason_phrase
        if r.status_code == 401:
            message += " (set MAINSPRING_API_KEY or pass --api-key)"
        fail(f"{message} [HTTP {r.status_code}]")

    def events(self, run_id: str, after: int = 0) -> Iterator[dict]:
        """The run's events after `after`, live, until the run has ended; a dropped connection is resumed
        from the last event received, so nothing is missed or repeated."""
        return self.follow_events(f"/v1/runs/{run_id}/events", run_id, after)

    def follow_events(self, path: str, what: str, after: int = 0) -> Iterator[dict]:
        """A resumable SSE stream of events with ids (a run's, a plan's) after `after`, until it ends."""
        cursor, failures = after, 0
        while True:
            try:
                with self.http.stream("GET", path,
                                      headers={"Accept": "text/event-stream", "Last-Event-ID": str(cursor)},
                                      timeout=httpx.Timeout(30, read=60)) as r:
                    if r.status_code >= 400:
                        r.read()
                        self.refused(r)
                    for ev in run_events(EventSource(r)):
                        cursor, failures = ev["id"], 0
                        yield ev
                return
            except httpx.ConnectError:
                if failures >= RECONNECTS:
                    self.unreachable()
            except (httpx.ReadTimeout, httpx.ReadError, httpx.RemoteProtocolError) as exc:
                if failures >= RECONNECTS:
                    fail(f"lost the event stream of {what}: {exc}")
            failures += 1
            time.sleep(backoff_delay(failures, 0.25, 5))


def run_events(source: EventSource) -> Iterator[dict]:
    """The JSON `data` of each event of a run's stream (comments, `retry` and keep-alives carry none)."""
    for sse in source.iter_sse():
        if sse.data:
            yield json.loads(sse.data)
