"""Tools, tool_choice and messages of any protocol -> the one shape the other stages take."""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from mainspring.engine.errors import InvalidRequestError

_ALPHABET = string.ascii_letters + string.digits
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
          "function": "tool"}


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


def new_call_id(prefix: str = "call_") -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(24))


def call_items(value: Any, names: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments) for a decoded call object or list of them, all naming known tools; else [].

    Accepts {"name", "arguments"} and the {"name", "parameters"} spelling small models also use;
    arguments may be an object or a JSON string of one."""
    calls = []
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, dict) or item.get("name") not in names:
            return []
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return []
        if not isinstance(args, dict):
            return []
        calls.append((item["name"], args))
    return calls


# ---- tools and tool_choice ---------------------------------------------------------------------------
def openai_tools(tools: list[Any] | None) -> list[ToolSpec]:
    """OpenAI tools ({"type": "function", "function": {name, description, parameters}}; a bare
    function dict is accepted too) -> ToolSpecs."""
    specs = []
    for i, t in enumerate(tools or []):
        f = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise InvalidRequestError("each tool must be {'type': 'function', 'function': {'name': ...}}",
                                      param=f"tools[{i}]")
        specs.append(ToolSpec(f["name"], f.get("description") or "",
                              f.get("parameters") or {"type": "object", "properties": {}}))
    return specs


def openai_tool_choice(raw: Any, tools: list[ToolSpec]) -> ToolChoice:
    """"none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}; anything else is invalid."""
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(raw, str) and raw in ("none", "auto", "required"):
        choice = ToolChoice(raw)
    elif isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("function"), dict) \
            and isinstance(raw["function"].get("name"), str):
        choice = ToolChoice("named", raw["function"]["name"])
    else:
        raise InvalidRequestError(f"invalid tool_choice {json.dumps(raw)[:200]}: use \"none\", \"auto\", \"required\" "
                                  'or {"type": "function", "function": {"name": "..."}}', param="tool_choice")
    return _check(choice, tools)


def anthropic_tool_choice(raw: dict[str, Any] | None, tools: list[ToolSpec]) -> ToolChoice:
    """{"type": "auto" | "any" | "none"} or {"type": "tool", "name": ...} (Anthropic's vocabulary)."""
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    kind = raw.get("type")
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind or "")
    if mapped:
        choice = ToolChoice(mapped)
    elif kind == "tool" and isinstance(raw.get("name"), str):
        choice = ToolChoice("named", raw["name"])
    else:
        raise InvalidRequestError(f"invalid tool_choice {json.dumps(raw)[:200]}: type must be auto, any, tool or none",
                                  param="tool_choice")
    return _check(choice, tools)


def _check(choice: ToolChoice, tools: list[ToolSpec]) -> ToolChoice:
    if choice.forced and not tools:
        raise InvalidRequestError(f"tool_choice {choice.mode!r} needs a non-empty tools list", param="tool_choice")
    if choice.mode == "named" and choice.name not in {t.name for t in tools}:
        raise InvalidRequestError(f"tool_choice names the tool {choice.name!r}, which is not in tools "
                                  f"({', '.join(t.name for t in tools)})", param="tool_choice")
    if len({t.name for t in tools}) != len(tools):
        raise InvalidRequestError("tool names must be unique", param="tools")
    return choice


# ---- messages ------------------------------------------------------------------------------------------
def content_text(content: Any, where: str) -> str:
    """String content, or text parts joined by newlines; other part types are refused (text-only models)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("text") if isinstance(part, dict) else None
        if kind not in ("text", "input_text") or not isinstance(text, str):
            raise InvalidRequestError(f"content parts of type {kind!r} are not supported; this model reads text only",
                                      param=f"{where}.content[{j}]")
        texts.append(text)
    return "\n".join(texts)


def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages (dicts, as sent on the wire) -> normalized messages.

    Call arguments become objects; a tool result without a name gets its call's name."""
    out: list[dict[str, Any]] = []
    names_by_id: dict[str, str] = {}
    for i, m in enumerate(messages):
        role = _ROLES.get(m.get("role") or "")
        if role is None:
            raise InvalidRequestError(f"unknown role {m.get('role')!r}; use system, developer, user, assistant or "
                                      "tool", param=f"messages[{i}].role")
        msg: dict[str, Any] = {"role": role, "content": content_text(m.get("content"), f"messages[{i}]")}
        if m.get("name"):
            msg["name"] = m["name"]
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [_call(c, names_by_id, f"messages[{i}].tool_calls[{k}]")
                                 for k, c in enumerate(m["tool_calls"])]
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id")
            msg["name"] = m.get("name") or names_by_id.get(m.get("tool_call_id") or "", "")
        out.append(msg)
    return out


def _call(c: dict[str, Any], names_by_id: dict[str, str], where: str) -> dict[str, Any]:
    f = c.get("function") or {}
    name, args = f.get("name") or "", f.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise InvalidRequestError("tool call arguments must be a JSON object",
                                      param=f"{where}.function.arguments") from None
    call_id = c.get("id") or new_call_id()
    names_by_id[call_id] = name
    return {"id": call_id, "name": name, "arguments": args if args is not None else {}}
