"""Tool calling on a model that may know nothing about tools.

Prompting: a chat template that handles `tools` itself (Qwen2.5, Llama 3.1, ...) gets them as
transformers passes them. Any other template (SmolLM2's, ChatML) gets a system-prompt section that
lists the tools as JSON schemas and shows the exact JSON to emit inside <tool_call> tags, and
earlier tool calls/results of the conversation are written into the turns in that same format.

Forcing: when a call is required ("required", a named tool, Anthropic "any"/"tool"), the output is
constrained by a JSON schema `{"name": <a tool name>, "arguments": <that tool's parameters>}`, so
even a 135M model produces a valid call. With "auto" the model answers freely and a tool call is
parsed out of its text if it wrote one.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from pydantic_core import from_json

from mainspring.api.errors import bad_request
from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.json_schema import prepare_schema
from mainspring.tool_calls import call_items

_ALPHABET = string.ascii_letters + string.digits
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)
_ARGUMENTS_KEY = re.compile(r'"arguments"\s*:\s*')


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # "none" | "auto" | "required" | "named"
    name: str | None = None

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "named")


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


def new_call_id(prefix: str = "call_") -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(24))


# ---- tool_choice ---------------------------------------------------------------------------------
def openai_tool_choice(raw: Any, tools: list[ToolSpec]) -> ToolChoice:
    """"none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}; anything else is a 400."""
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(raw, str) and raw in ("none", "auto", "required"):
        choice = ToolChoice(raw)
    elif isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("function"), dict) \
            and isinstance(raw["function"].get("name"), str):
        choice = ToolChoice("named", raw["function"]["name"])
    else:
        raise bad_request(f"invalid tool_choice {json.dumps(raw)[:200]}: use \"none\", \"auto\", \"required\" or "
                          '{"type": "function", "function": {"name": "..."}}', param="tool_choice")
    return _check(choice, tools, "tool_choice")


def anthropic_tool_choice(raw: dict[str, Any] | None, tools: list[ToolSpec]) -> ToolChoice:
    """{"type": "auto" | "any" | "none"} or {"type": "tool", "name": ...} (Anthropic's vocabulary)."""
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    kind = raw.get("type")
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if mapped:
        choice = ToolChoice(mapped)
    elif kind == "tool" and isinstance(raw.get("name"), str):
        choice = ToolChoice("named", raw["name"])
    else:
        raise bad_request(f"invalid tool_choice {json.dumps(raw)[:200]}: type must be auto, any, tool or none",
                          param="tool_choice")
    return _check(choice, tools, "tool_choice")


def _check(choice: ToolChoice, tools: list[ToolSpec], param: str) -> ToolChoice:
    if choice.forced and not tools:
        raise bad_request(f"tool_choice {choice.mode!r} needs a non-empty tools list", param=param)
    if choice.mode == "named" and choice.name not in {t.name for t in tools}:
        raise bad_request(f"tool_choice names the tool {choice.name!r}, which is not in tools "
                          f"({', '.join(t.name for t in tools)})", param=param)
    if len({t.name for t in tools}) != len(tools):
        raise bad_request("tool names must be unique", param="tools")
    return choice


# ---- prompting -----------------------------------------------------------------------------------
def template_handles_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in chat_template  # type: ignore[operator]


def _tools_section(tools: list[ToolSpec], choice: ToolChoice) -> str:
    listing = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters},
                                   ensure_ascii=False) for t in tools)
    if choice.mode == "named":
        when = f"Now call the function {choice.name}."
    elif choice.mode == "required":
        when = "Now call one of the functions."
    else:
        when = "Call a function only when it helps to answer; otherwise answer normally."
    return (f"# Tools\n\nYou can call the functions below, described as JSON schemas:\n<tools>\n{listing}\n</tools>\n\n"
            f"To call a function, reply with exactly this and nothing else, arguments as a JSON object:\n"
            f'{_OPEN}\n{{"name": "<function name>", "arguments": {{...}}}}\n{_CLOSE}\n\n{when}')


def _call_text(name: str, arguments: Any) -> str:
    return f'{_OPEN}\n{json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)}\n{_CLOSE}'


def template_messages(messages: list[dict[str, Any]], tools: list[ToolSpec], choice: ToolChoice,
                      chat_template: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Normalized messages -> (what the chat template gets, its `tools` argument).

    Normalized message: {"role", "content": str, "tool_calls": [{"id", "name", "arguments"}],
    "tool_call_id", "name"}. With tool_choice "none" the tools are left out of the prompt.
    """
    shown = tools if choice.mode != "none" else []
    if template_handles_tools(chat_template):
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [{"id": c["id"], "type": "function",
                                    "function": {"name": c["name"], "arguments": c["arguments"]}}
                                   for c in m["tool_calls"]]
            out.append(m)
        schema = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                    "parameters": t.parameters}} for t in shown]
        return out, schema or None
    out = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(_call_text(c["name"], c["arguments"]) for c in m["tool_calls"])
            content = f"{content}\n{calls}" if content else calls
        elif role == "tool":
            # templates without tool support know only system/user/assistant turns
            role, content = "user", f"<tool_response name=\"{m.get('name') or ''}\">\n{content}\n</tool_response>"
        out.append({"role": role, "content": content})
    if shown:
        section = _tools_section(shown, choice)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{section}"}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out, None


_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def _closed(schema: Any) -> Any:
    """Every object schema that lists its properties but says nothing of others, nested ones and
    $defs included, gets additionalProperties false (what OpenAI's strict mode requires): otherwise
    the grammar lets a small model invent keys until max_tokens runs out."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _closed(sub) for name, sub in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_closed(sub) for sub in out[key]]
    for key in _SCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = _closed(out[key])
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def call_schema(tools: list[ToolSpec], choice: ToolChoice) -> dict[str, Any]:
    """The JSON schema a forced call must match: one tool's name with that tool's own arguments.

    Each tool's parameters move under /properties/arguments of the wrapper, so their local $refs
    (Pydantic's "#/$defs/Model") are rebased there by `prepare_schema`."""
    chosen = [t for t in tools if choice.mode != "named" or t.name == choice.name]

    def one(t: ToolSpec, at: str) -> dict[str, Any]:
        try:
            arguments = prepare_schema(_closed(t.parameters), at=f"{at}/properties/arguments")
        except InvalidRequestError as e:
            raise bad_request(f"tool {t.name!r}: {e}", param="tools") from None
        return {"type": "object", "properties": {"name": {"const": t.name}, "arguments": arguments},
                "required": ["name", "arguments"], "additionalProperties": False}

    return one(chosen[0], "") if len(chosen) == 1 else {"anyOf": [one(t, f"/anyOf/{i}") for i, t in enumerate(chosen)]}


# ---- parsing ---------------------------------------------------------------------------------------
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
    if _OPEN in text:
        calls = [c for m in _TAGGED.finditer(text) for c in _as_calls(m.group(1), names, prefix)]
        if calls:
            return text[:text.index(_OPEN)].strip() or None, calls
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
    so_far = obj.get("name") if isinstance(obj.get("name"), str) else ""
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
        if self.sent == 0 and (lead[0] in "{[`" or _OPEN.startswith(lead[:len(_OPEN)])):
            self.holding = True
            return ""
        tag = self.text.find(_OPEN, self.sent)
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
    for k in range(min(len(_OPEN) - 1, len(text)), 0, -1):
        if _OPEN.startswith(text[-k:]):
            return k
    return 0
