"""Model output -> (content, tool calls): tagged, fenced or bare JSON calls; a forced call cut off
by max_tokens; and a streaming holder that passes content through until the text may be a call.

With tool_choice "auto" the model answers freely and a call is parsed out of its text if it wrote one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic_core import from_json

from mainspring.tool_calls.normalize import ToolChoice, ToolSpec, call_items, new_call_id
from mainspring.tool_calls.render import OPEN

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)
_ARGUMENTS_KEY = re.compile(r'"arguments"\s*:\s*')


@dataclass
class ParsedCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""
    # a forced call that max_tokens cut off: its arguments JSON text as far as the model wrote it
    # (`arguments` is then what of it parses); the answer's finish reason stays "length"
    partial: str | None = None

    @property
    def arguments_json(self) -> str:
        """The arguments as OpenAI sends them: a JSON document as a string (the cut text if partial)."""
        return self.partial if self.partial is not None else json.dumps(self.arguments, ensure_ascii=False)


def _as_calls(text: str, names: set[str], prefix: str) -> list[ParsedCall]:
    """JSON call objects ({"name", "arguments"|"parameters"}), one or a list, at the start of `text`."""
    try:
        obj, _ = json.JSONDecoder().raw_decode(text.strip())
    except ValueError:
        return []
    return [ParsedCall(name, args, new_call_id(prefix)) for name, args in call_items(obj, names)]


def parse_tool_calls(text: str, tools: list[ToolSpec], prefix: str = "call_") -> tuple[str | None, list[ParsedCall]]:
    """Split model output into (content before the calls or None, calls); no valid call -> (text, [])."""
    names = {t.name for t in tools}
    if OPEN in text:
        calls = [c for m in _TAGGED.finditer(text) for c in _as_calls(m.group(1), names, prefix)]
        if calls:
            return text[:text.index(OPEN)].strip() or None, calls
        return text, []
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    if body.startswith(("{", "[")):
        calls = _as_calls(body, names, prefix)
        if calls:
            return None, calls
    return text, []


def cut_call(text: str, tools: list[ToolSpec], choice: ToolChoice, prefix: str = "call_") -> ParsedCall:
    """The forced call in `text` that max_tokens cut off, as a partial call: the constrained output is
    a prefix of {"name": <tool>, "arguments": {...}}, so the name is known (or its unique completion,
    else the first tool it can still be) and the arguments are the JSON written so far."""
    allowed = [t.name for t in tools if choice.mode != "named" or t.name == choice.name]
    try:
        obj = from_json(text, allow_partial="trailing-strings")
    except ValueError:  # nothing written yet
        obj = None
    obj = obj if isinstance(obj, dict) else {}
    name = obj.get("name")
    so_far = name if isinstance(name, str) else ""
    names = [n for n in allowed if n == so_far] or [n for n in allowed if n.startswith(so_far)] or allowed
    key = _ARGUMENTS_KEY.search(text)  # tool names cannot contain quotes: the first match is the key
    arguments = obj.get("arguments")
    return ParsedCall(names[0], arguments if isinstance(arguments, dict) else {}, new_call_id(prefix),
                      partial=text[key.end():].rstrip() if key else "")


def parse_answer(text: str, tools: list[ToolSpec], choice: ToolChoice, finish_reason: str | None,
                 prefix: str = "call_") -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of a finished answer under `choice`: tool_choice "none" parses nothing, and
    a forced call cut off by max_tokens is a partial call rather than JSON leaked into the content."""
    if choice.mode == "none":
        return text, []
    content, calls = parse_tool_calls(text, tools, prefix)
    if not calls and choice.forced and finish_reason == "length":
        return None, [cut_call(text, tools, choice, prefix)]
    return content, calls


class ToolCallStream:
    """Streams content through until the output may be a tool call; that part is parsed at the end.

    Held back: everything once the text (after leading blanks) starts like a call ("{", "[", a code
    fence, "<tool_call>"), or from a "<tool_call>" tag on; and a tail that could be the start of
    that tag. With `hold_all` (a forced call) nothing is streamed as content.
    """

    def __init__(self, tools: list[ToolSpec], hold_all: bool = False, prefix: str = "call_",
                 choice: ToolChoice | None = None) -> None:
        self.tools, self.prefix, self.choice = tools, prefix, choice
        self.text, self.sent, self.holding = "", 0, hold_all

    def feed(self, delta: str) -> str:
        self.text += delta
        if self.holding:
            return ""
        lead = self.text.lstrip()
        if not lead:
            return ""
        if self.sent == 0 and (lead[0] in "{[`" or OPEN.startswith(lead[:len(OPEN)])):
            self.holding = True
            return ""
        tag = self.text.find(OPEN, self.sent)
        if tag >= 0:
            end, self.holding = tag, True
        else:
            end = len(self.text) - _partial_tag_suffix(self.text)
        out, self.sent = self.text[self.sent:end], max(self.sent, end)
        return out

    def finish(self, finish_reason: str | None = None) -> tuple[str, list[ParsedCall]]:
        """(content not yet streamed, parsed calls); with the stream's `choice`, a forced call cut
        off by max_tokens (finish_reason "length") is a partial call (see `parse_answer`)."""
        rest = self.text[self.sent:]
        if self.choice is not None:
            content, calls = parse_answer(rest, self.tools, self.choice, finish_reason, self.prefix)
        else:
            content, calls = parse_tool_calls(rest, self.tools, self.prefix)
        if calls:
            return content or "", calls
        return rest, []


def _partial_tag_suffix(text: str) -> int:
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-k:]):
            return k
    return 0


def finish_reason(calls: list[ParsedCall], engine_reason: str | None) -> str | None:
    """OpenAI's finish reason of an answer with `calls`: "tool_calls", except that a forced call which
    max_tokens cut off is still a (partial) call while the answer ended on the engine's "length"."""
    return "tool_calls" if calls and all(c.partial is None for c in calls) else engine_reason
