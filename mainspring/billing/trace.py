"""The privacy-safe request trace: one JSON object per line, token counts and content hashes only.

A trace line says what a request looked like to a prompt cache (which segments, in which order,
how long, whether two requests share one) without a single word of its text:

    {"t": 1718000000.0, "key": "key_…", "project": "3", "model": "SmolLM2-135M-Instruct",
     "tier": "standard", "cache_key": null, "output_tokens": 12, "max_output_tokens": 16,
     "latency_slo_s": 0, "segments": [{"id": "s0", "kind": "system", "tokens": 812,
     "hash": "9f1c…"}, …]}

The server writes it when `MAINSPRING_RECORD_TRACE` names a file; `mainspring sim` replays it
(mainspring/billing/simulator.py). Hashes are truncated SHA-256: equal content → equal hash, which
is all a prefix cache needs, and a 64-bit prefix gives nothing useful back to a reader.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from pathlib import Path
from typing import Any, Iterable, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SegmentKind = Literal["tools", "system", "document", "history", "user", "assistant"]
STABLE_KINDS = ("tools", "system", "document")  # shared across requests; the rest is per conversation
HASH_HEX = 16  # 64 bits: collisions are negligible for a trace, and nothing is recoverable from it


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and the line."""


class Segment(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=64)
    kind: SegmentKind
    tokens: int = Field(ge=0)
    hash: str = Field(min_length=1, max_length=128)


class TraceRequest(BaseModel):
    """One served request. `t` is unix seconds; `latency_slo_s` 0 means interactive (no slack known)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    t: float = Field(ge=0)
    key: str = ""
    project: str = ""
    model: str = Field(min_length=1)
    tier: Literal["standard", "fast", "batch"] = "standard"
    cache_key: str | None = None
    segments: list[Segment]
    output_tokens: int = Field(0, ge=0)
    max_output_tokens: int | None = Field(None, ge=0)
    latency_slo_s: float = Field(0, ge=0)

    @property
    def input_tokens(self) -> int:
        return sum(s.tokens for s in self.segments)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_HEX]


# ---- reading and writing ---------------------------------------------------------------------------
def parse_line(line: str, where: str) -> TraceRequest:
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise TraceError(f"{where}: not JSON ({exc})") from None
    try:
        return TraceRequest.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(line)'}: {e['msg']}" for e in exc.errors())
        raise TraceError(f"{where}: {problems}") from None


def read_trace(path: str | Path) -> list[TraceRequest]:
    """Every request of a JSONL trace, in file order; blank lines are skipped. Raises TraceError
    naming the line (1-based) of the first bad one."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"trace {p} is not UTF-8 text") from None
    out = [parse_line(line, f"{p} line {n}") for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not out:
        raise TraceError(f"trace {p} has no requests")
    return out


def dump_line(req: TraceRequest) -> str:
    return json.dumps(req.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False)


def write_trace(path: str | Path, requests: Iterable[TraceRequest]) -> None:
    Path(path).write_text("".join(dump_line(r) + "\n" for r in requests), encoding="utf-8")


class TraceRecorder:
    """Appends trace lines to one file from any thread.

    The file is opened per line (append mode) rather than held open: the server may run for days,
    an operator may move the file away, and a request costs far more than one open()."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, req: TraceRequest) -> None:
        line = dump_line(req) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(line)  # one write of a whole line under the lock: lines never interleave

    def record_call(self, segments: list[Segment], *, t: float, key: str, project: str, model: str, tier: str,
                    output_tokens: int, max_output_tokens: int | None, cache_key: str | None = None,
                    latency_slo_s: float = 0) -> None:
        """What the server knows after a call (the API's `after_call` hook)."""
        self.append(TraceRequest(t=t, key=key, project=project, model=model,
                                 tier=tier if tier in ("standard", "fast", "batch") else "standard",
                                 cache_key=cache_key, segments=segments, output_tokens=output_tokens,
                                 max_output_tokens=max_output_tokens, latency_slo_s=latency_slo_s))


# ---- messages -> segments --------------------------------------------------------------------------
class _Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, BaseModel):
        return obj.model_dump(exclude_none=True)
    return obj


def _canonical(obj: Any) -> str:
    return json.dumps(_plain(obj), sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _message_text(m: dict[str, Any]) -> str:
    """The content that reaches the prompt: text (or text parts) plus any tool calls of the turn."""
    content = m.get("content") or ""
    if not isinstance(content, str):  # OpenAI content parts
        content = "\n".join(p.get("text") or "" if isinstance(p, dict) else str(getattr(p, "text", "") or "")
                            for p in content)
    calls = m.get("tool_calls")
    return f"{content}\n{_canonical(calls)}" if calls else content


def _kinds(roles: list[str]) -> list[SegmentKind]:
    """Kind from role and position: system messages before the conversation are "system"; the last
    message is the request's own content ("user", or "assistant" for a prefill); everything between
    is "history"."""
    kinds: list[SegmentKind] = []
    opened = False
    for i, role in enumerate(roles):
        last = i == len(roles) - 1
        if role in ("system", "developer") and not opened:
            kinds.append("system")
            continue
        opened = True
        if last:
            kinds.append("assistant" if role == "assistant" else "user")
        else:
            kinds.append("history")
    return kinds


def segments_from_messages(messages: list[dict[str, Any]], tokenizer: _Encoder,
                           tools: list[Any] | None = None) -> list[Segment]:
    """One segment per tool definition and per message. tokens = the tokenizer's count of the text
    (the chat template's markup is not counted); hash = truncated SHA-256 of role and text, so the
    same message hashes the same whether it is this turn's question or next turn's history."""
    msgs = [_plain(m) for m in messages]
    segs: list[Segment] = []
    for i, tool in enumerate(tools or []):
        text = _canonical(tool)
        segs.append(Segment(id=f"tool{i}", kind="tools", tokens=len(tokenizer.encode(text)),
                            hash=content_hash("tool\n" + text)))
    for i, (m, kind) in enumerate(zip(msgs, _kinds([str(m.get("role", "")) for m in msgs]))):
        text = _message_text(m)
        segs.append(Segment(id=f"m{i}", kind=kind, tokens=len(tokenizer.encode(text)),
                            hash=content_hash(f"{m.get('role', '')}\n{text}")))
    return segs
